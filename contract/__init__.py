"""The written contract between stages: file layout, record format and manifest schema.

Stages talk only through files on disk; every name they share lives here, so no stage
imports another stage's internals.
"""
