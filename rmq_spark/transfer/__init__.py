"""The engine: what runs on the executors to move one queue (no Spark beyond executor.py).

`executor.py` is the movers' Spark task; `mover.py` runs the movers; `window.py`
and `byte_window.py` are their pure bookkeeping; `refusals.py` reads broker refusals.
`amqp091/` holds the protocol-level code over pika's internals.
"""
