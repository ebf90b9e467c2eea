"""Benchmarks of the sandbox against peer judges (see docs/BENCHMARKS.md).

`python -m benchmarks.sandbox_throughput --help` runs the throughput benchmark; `peers.py` holds
our re-implementations of the peers' dispatch models (Cobalt-style, LiveCodeBench-style).
"""
