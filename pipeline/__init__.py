"""Luigi tasks of the nightly pipeline: `luigi --module pipeline FullRun --local-scheduler`."""
