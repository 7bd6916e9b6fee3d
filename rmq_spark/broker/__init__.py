"""RabbitMQ access and knowledge: connection settings, exact counts, the management API.

Driver side mostly (blocking connections, HTTP); `connection.py` and the pure
`delivery_limit.py` are shared with the executors' engine in `rmq_spark.transfer`.
"""
