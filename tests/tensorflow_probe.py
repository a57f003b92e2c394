"""Runs a module as `python -m` would and says, at exit, whether it loaded TensorFlow.

`probe_argv("luigi", ...)` is a command line for subprocess; the process prints
`LOADED_LINE` or `NOT_LOADED_LINE` last on its stdout, after the module's own exit.
"""

from __future__ import annotations

import sys

LOADED_LINE = "tensorflow loaded: True"
NOT_LOADED_LINE = "tensorflow loaded: False"
_PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("tensorflow loaded:", "tensorflow" in sys.modules, flush=True))
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def probe_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-c", _PROBE, module, *args]
