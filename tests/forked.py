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
) -> subprocess.CompletedProcess[str]:
    """Runs `argv` in the project's root to its end; its exit code, stdout and stderr."""
    if os.path.realpath(os.getcwd()) != os.path.realpath(PROJECT_ROOT):
        # The fork server starts programs in the caller's folder.
        return subprocess.run(
            list(argv),
            cwd=PROJECT_ROOT,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=start_new_session,
        )
    return spawn.run(argv, env, timeout=timeout, start_new_session=start_new_session)
