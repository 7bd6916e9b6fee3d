"""`python -m rmq_spark.devtools.local_brokers start|stop|cleanup ...`."""

from rmq_spark.devtools.local_brokers.commands import main

raise SystemExit(main())
