"""Dead-letter redrive: each dead-lettered message back to the queue it died in (docs/redrive.md).

Pure pieces, pika- and Spark-free, so the executors' engine can use them per batch:

- `origin.py`: which queue a message goes back to, read from its `x-death` header;
- `headers.py`: the header policy, a byte-level rewrite of the content-header property block
  (broker-owned headers kept, removed or moved under `rmq-spark-death`; `original-expiration`
  restored or not), every other property and header left byte for byte;
- `decider.py`: the per-message decision (moved, and where; or kept, and why).
"""
