"""The one module that reads TF_CONFIG: the cluster, the strategy, who is chief, where to write.

Model Garden's distribute_utils in spirit. A worker learns everything about its cluster from
TF_CONFIG, so the same entry point runs as a local process, in a container or in a Kubernetes
TFJob pod. Without TF_CONFIG the process is a cluster of one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the launcher reads TF_CONFIG's helpers here without loading TensorFlow
    import tensorflow as tf

TF_CONFIG_ENV = "TF_CONFIG"
ATTEMPT_ENV = "TRAIN_ATTEMPT"
# Test-only fault injection (train.callbacks, train.backup): a launch's workers get these
# variables from its environment whichever backend starts them.
FAULT_ENV_PREFIX = "TRAIN_FAULT_"
# The hold of train.callbacks, which a simulated night killed in Train holds at.
HOLD_ENV = FAULT_ENV_PREFIX + "HOLD_AT_STEP"
# How a held worker's log says so: "<HOLDING> <global step> until SIGTERM".
HOLDING = "FAULT holding at step"
# Where workers that refuse each other's settings meet before they exit (check_workers_agree),
# and how long one waits there for the others.
REFUSAL_BARRIER = "nightly_trainer/settings_refused"
REFUSAL_BARRIER_MS = 30_000


class ClusterError(ValueError):
    """TF_CONFIG is malformed or describes a cluster this stage cannot run."""


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the cluster. `worker_index` 0 is the chief and reads shard 0."""

    worker_index: int
    num_workers: int
    task_type: str = "worker"

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0


def tf_config_json(addresses: list[str], worker_index: int) -> str:
    """The TF_CONFIG of worker `worker_index` in a cluster of `addresses` (worker 0 is chief)."""
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": worker_index}}
    )


def read_cluster(environ: Mapping[str, str] = os.environ) -> ClusterInfo:
    """Reads TF_CONFIG; a TFJob's separate `chief` job counts as worker 0.

    Raises:
        ClusterError: TF_CONFIG is not JSON or lacks the cluster or task.
    """
    raw = environ.get(TF_CONFIG_ENV, "")
    if not raw:
        return ClusterInfo(worker_index=0, num_workers=1)
    try:
        doc = json.loads(raw)
        cluster, task = doc["cluster"], doc["task"]
        chiefs = list(cluster.get("chief", []))
        workers = list(cluster.get("worker", []))
        task_type, index = str(task["type"]), int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise ClusterError(f"{TF_CONFIG_ENV} is malformed ({e}): {raw[:200]}") from None
    if task_type not in ("chief", "worker") or len(chiefs) > 1:
        raise ClusterError(
            f"{TF_CONFIG_ENV} task type {task_type!r} with {len(chiefs)} chiefs: "
            "this stage runs MultiWorkerMirroredStrategy on 'worker' (and at most one 'chief')"
        )
    offset = len(chiefs)
    worker_index = 0 if task_type == "chief" else index + offset
    return ClusterInfo(worker_index, len(chiefs) + len(workers), task_type)


def attempt_number(environ: Mapping[str, str] = os.environ) -> int:
    """How many times the launcher has restarted the cluster before this process (0 = first)."""
    return int(environ.get(ATTEMPT_ENV, "0"))


def kernel_library() -> str:
    """The CPU kernels this process's TensorFlow runs: "oneDNN" or "Eigen" (its fallback).

    Decided once, when TensorFlow is imported, from TF_ENABLE_ONEDNN_OPTS (train/__init__.py
    sets it unless the user did) and the CPU; the two round differently, so workers and a
    resumed run must use the same one.
    """
    from tensorflow.python.util import _pywrap_util_port

    return "oneDNN" if _pywrap_util_port.IsMklEnabled() else "Eigen"


def configure_threads(threads: int) -> None:
    """Pins TF's thread pools; must run before the TF runtime starts."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def make_strategy() -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy from TF_CONFIG, ring all-reduce, no blanket timeout.

    The timeout goes on the collectives that every step and epoch must pass
    (`timed_collectives`), not on all of them: TF parks one timer thread per timed collective
    for the whole timeout. With Keras's per-step metric collectives (gone since the train
    step stopped reading metrics across workers) a blanket timeout piled up thousands of
    sleeping threads until thread creation failed ("Resource temporarily unavailable") after
    ~10 epochs. The untimed rest (metric reads at epoch ends, saves) run after a timed
    all-reduce, which is the one that fails first when a peer has vanished.
    """
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    # TF's coordination service installs a SIGTERM handler that only notes a preemption, so
    # a stopped worker would linger until SIGKILL. Recovery comes from the launcher's restart
    # and the backup instead: let SIGTERM end the process again.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return strategy


def timed_collectives(timeout_seconds: float) -> tf.distribute.experimental.CommunicationOptions:
    """Options for the gradient and validation all-reduces: a vanished peer fails them in time."""
    import tensorflow as tf

    return tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeout_seconds,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    )


def scratch_dir(info: ClusterInfo) -> str:
    """A fresh local folder for saves every worker must take part in; the caller removes it.

    Only the chief copies what it saved there to the real paths; the other workers' saves
    exist only so that the collectives inside a save line up, and are thrown away.
    """
    return tempfile.mkdtemp(prefix=f"train-worker{info.worker_index}-")


def may_write_real_paths(info: ClusterInfo) -> bool:
    """Only the chief writes model, checkpoint, history, config and TensorBoard files."""
    return info.is_chief


def _setting_digest(value: Any) -> int:
    """A 63-bit digest of one setting's value, as a collective can carry it."""
    text = json.dumps(value, sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def check_workers_agree(
    strategy: tf.distribute.Strategy,
    info: ClusterInfo,
    settings: Mapping[str, Any],
    options: tf.distribute.experimental.CommunicationOptions,
) -> None:
    """Refuses to train when another worker holds other values of `settings`.

    The launcher starts every worker with one command line, but a TFJob's pods are started
    one by one, each with its own flags and its own CPU: a pod with another learning rate, or
    one where `--precision auto` settled on another policy, would mix two trainings into one
    all-reduce without any error. Each worker all-gathers a digest of every setting (one
    collective, before anything is built) and all of them see the same table.

    Raises:
        ClusterError: naming the settings that differ, the workers that differ from this one
            and this worker's values.
    """
    import tensorflow as tf

    if info.num_workers < 2:
        return
    names = sorted(settings)
    mine = [info.worker_index] + [_setting_digest(settings[name]) for name in names]
    row = tf.constant([mine], tf.int64)

    def gather() -> tf.Tensor:
        return tf.distribute.get_replica_context().all_gather(row, axis=0, options=options)

    # In a graph traced as written: run eagerly, the all-gather would wrap itself in a
    # tf.function that autograph converts, a quarter of a second of a slow CPU for one
    # collective in every worker.
    gather_table = tf.function(lambda: strategy.run(gather), autograph=False)
    table = strategy.experimental_local_results(gather_table())[0].numpy()
    by_worker = {int(r[0]): list(r[1:]) for r in table}
    others = {
        name: sorted(w for w, digests in by_worker.items() if digests[i] != mine[i + 1])
        for i, name in enumerate(names)
    }
    differ = {name: workers for name, workers in others.items() if workers}
    if not differ:
        return
    # A worker pulls the other workers' rows from them: one that left as soon as its own
    # gather ended could go before a peer had pulled its row, and that peer would then fail on
    # a closed socket instead of refusing. Every worker has the same table, so all of them
    # refuse: they wait here until all have it. Whatever the barrier answers (the chief, which
    # serves it, may leave before the answer reaches the others), this worker refuses.
    from tensorflow.python.eager import context

    with contextlib.suppress(tf.errors.OpError):
        context.context().wait_at_barrier(REFUSAL_BARRIER, REFUSAL_BARRIER_MS)
    workers = sorted({w for ws in differ.values() for w in ws})
    here = ", ".join(f"{name}={settings[name]!r}" for name in differ)
    hint = ""
    if "precision" in differ:
        hint += "; where CPUs differ in AMX-BF16, name the policy instead of --precision auto"
    if "kernels" in differ:
        hint += "; set TF_ENABLE_ONEDNN_OPTS alike for every worker (unset means 1)"
    raise ClusterError(
        f"worker {info.worker_index} and worker(s) {', '.join(map(str, workers))} were started "
        f"with different {', '.join(differ)} (worker {info.worker_index} has {here}): start "
        f"every worker with the same settings{hint}"
    )
