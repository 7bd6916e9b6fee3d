"""Parking: a queue's messages into the ledger's `parked` Delta table (`rmq-spark park`).

docs/parking.md is the user's page. `run.py` runs a park (discovery of the sources, the
movers with the table as their destination, the commits, the verdicts), `table.py` is
the table on the driver (create, commit, read with Spark or pyarrow), `verdicts.py` says
what the rows prove (pure), `command.py` is the subcommand. The executors' side is
`transfer/parked.py` (the table behind the engine's DestinationLink) and
`transfer/parked_rows.py` (the rows and their durable files). `replay/` puts a parked
run's rows back into queues (`rmq-spark replay`, from the driver).
"""
