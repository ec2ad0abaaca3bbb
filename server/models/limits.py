"""Limits the demo models share."""

# The most requests a demo model queues; beyond it a request is refused at once with
# RESOURCE_EXHAUSTED. Unbounded, an overload the server cannot drain grows its memory for as
# long as it lasts: about 25 KiB per waiting call (10,000 calls behind a stalled mlp instance
# added 248 MiB of RSS), and 795 MiB of RSS after a 10 s step at 4,500 QPS against the mlp's
# ~4,000 on the 2-core machine. 4,096 is about a second of that capacity: past any latency
# objective a caller would still wait for, so never reached while one is met.
# `--demo-option MODEL.max_queue_size=0` lifts the bound.
MAX_QUEUE_SIZE = 4096
