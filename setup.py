"""Lets Beam's --setup_file ship this project's code to remote workers (metadata: pyproject)."""

from setuptools import setup

setup()
