"""`rmq-spark replay`: parked rows back into queues (docs/parking.md, "Replaying")."""
