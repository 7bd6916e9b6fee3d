"""The dev harness, not used by a transfer: local brokers, RabbitMQ roots, the demo.

Importable from a source checkout (`make demo`, the tests, bench/); not in the wheel
or the package zip shipped to executors.
"""
