"""`subprocess.run(argv, capture_output=True, text=True)` for a `python -m` program a test
starts, forked from the test process's fork server when one serves (contract.spawn): it skips
TensorFlow's import as the pipeline's own stages do, and otherwise runs as a process of its
own would (the server refuses what it could not run the same way)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from contract import spawn
from tests.factories import PROJECT_ROOT


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    start_new_session: bool = False,
    cwd: str | os.PathLike[str] = PROJECT_ROOT,
) -> subprocess.CompletedProcess[str]:
    """Runs `argv` in `cwd` (the project's root unless told) to its end; its exit code, stdout
    and stderr."""
    return spawn.run(
        argv, env, timeout=timeout, start_new_session=start_new_session, cwd=os.fspath(cwd)
    )
