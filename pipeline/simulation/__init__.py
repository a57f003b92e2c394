"""Simulated nights of the pipeline with faults injected: `python -m pipeline.simulate`."""
