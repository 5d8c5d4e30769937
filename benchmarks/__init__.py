"""dmlgraph's benchmarks: each goal a ratio against a baseline run side by side (medians).

Not part of the wheel: run from a checkout with `make bench` (or `python -m benchmarks`).
"""
