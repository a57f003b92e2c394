"""Tools that drive the pipeline from outside it: demos and measurements, not a night's run."""
