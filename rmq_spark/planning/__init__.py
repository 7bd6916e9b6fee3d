"""Which queues move where, checked before anything moves (driver side).

Discovery and pre-flight of the brokers (`discovery.py`, the blue-green topology copy
in `topology.py`), the pre-flight of the executors' Python (`executor_preflight.py`),
and the partition plan (`plan.py`, the only Spark here besides the executor check).
"""
