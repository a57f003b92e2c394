"""Benchmarks: each `bench_*.py` module measures a candidate against a baseline in the same run."""
