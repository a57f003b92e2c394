"""Benchmarks: each `bench_*.py` module measures a candidate against a baseline in the same run."""

import os

# What the bench measures in its own process (the profile) runs the stage's kernels
# (train/__init__.py), decided when TensorFlow is first imported; subprocesses get theirs from
# bench_train.stage_env.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
