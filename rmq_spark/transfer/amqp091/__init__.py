"""AMQP 0-9-1 at the byte level, over pika's private internals (inbound reader, wire writes)."""
