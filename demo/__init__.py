"""`wok demo`: a live page of the batching pipeline (see docs/demo.md)."""
