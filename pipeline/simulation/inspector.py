"""The simulation's TensorFlow side, in a child process: what is served, and how it scores.

It also rewrites a drop with its images inverted (the drifted-drop fault).

    python -m pipeline.simulation.inspector    # one JSON request a line on stdin

The simulation starts it once and keeps it (TensorFlow is imported once, never in the
simulation's own process, which starts every night). Each request is a JSON object with an
`op`; each answer one JSON line: the op's result, or `{"error": ...}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import IO, Any

from contract import atomic, pointer, spawn

SERVED = "served"
INVERT = "invert"


def served_state(
    output_root: str, export_base: str, model_name: str, eval_files: list[str]
) -> dict[str, Any]:
    """How the pointer and the served versions agree, and how the newest version scores.

    Returns:
        `problems` (evaluate.served's), the pointer's `date` and `version`, the
        `newest_version` served, the pointer's night's `metrics_accuracy` and
        `metrics_examples`, and the newest version's `served_accuracy` and `served_examples`
        on `eval_files` (None while nothing is served).
    """
    from evaluate import served

    state: dict[str, Any] = {
        "problems": served.problems(output_root, export_base, model_name),
        "date": None,
        "version": None,
        "newest_version": None,
        "metrics_accuracy": None,
        "metrics_examples": None,
        "served_accuracy": None,
        "served_examples": None,
    }
    current = pointer.read(output_root)
    versions = served.served_versions(export_base, model_name)
    if versions:
        state["newest_version"] = versions[-1]
    if current is None or not versions:
        return state
    state["date"] = current.get("date")
    state["version"] = served.pointer_version(current, output_root)
    metrics = atomic.read_json(pointer.resolve(output_root, str(current["metrics_path"])))
    state["metrics_accuracy"] = metrics["accuracy"]
    state["metrics_examples"] = metrics["num_examples"]
    newest = os.path.join(served.model_dir(export_base, model_name), str(versions[-1]))
    state["served_accuracy"], state["served_examples"] = score(newest, eval_files)
    return state


def score(version_dir: str, eval_files: list[str]) -> tuple[float, int]:
    """The accuracy of a served SavedModel on TFRecord files of examples, through its
    tf.Example signature, as TF Serving would be asked; and how many examples."""
    import tensorflow as tf

    from contract import records
    from evaluate import signatures

    loaded = tf.saved_model.load(version_dir)
    serve = loaded.signatures[signatures.EXAMPLE_SIGNATURE]
    serialized = list(tf.data.TFRecordDataset(eval_files).as_numpy_iterator())
    spec = {records.LABEL_KEY: records.feature_spec()[records.LABEL_KEY]}
    labels = tf.io.parse_example(tf.constant(serialized), spec)[records.LABEL_KEY].numpy()
    class_ids = serve(**{signatures.EXAMPLES_INPUT: tf.constant(serialized)})["class_ids"].numpy()
    hits = int((class_ids == labels).sum())
    return (hits / len(labels) if len(labels) else 0.0), len(labels)


def invert_drop(path: str) -> int:
    """Rewrites a drop with every image's pixels inverted (255 - value), labels kept.

    Returns:
        How many examples it holds.
    """
    import tensorflow as tf

    from contract import records

    examples = []
    for serialized in tf.data.TFRecordDataset([path]).as_numpy_iterator():
        example = tf.train.Example.FromString(serialized)
        image = example.features.feature[records.IMAGE_KEY].bytes_list
        image.value[0] = bytes(255 - b for b in image.value[0])
        examples.append(example.SerializeToString(deterministic=True))
    staging = f"{path}.tmp-{os.getpid()}"
    with tf.io.TFRecordWriter(staging) as writer:
        for serialized in examples:
            writer.write(serialized)
    os.replace(staging, path)
    return len(examples)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Carries out one request."""
    op = request.get("op")
    if op == SERVED:
        return served_state(
            request["output_root"],
            request["export_base"],
            request["model_name"],
            request["eval_files"],
        )
    if op == INVERT:
        return {"examples": invert_drop(request["path"])}
    return {"error": f"unknown op {op!r}"}


def main() -> int:
    """Answers requests until stdin ends; stray output of TensorFlow goes to stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    for line in sys.stdin:
        try:
            reply = answer(json.loads(line))
        except Exception as e:  # noqa: BLE001 - the simulation names the failed check
            reply = {"error": f"{type(e).__name__}: {' '.join(str(e).split())}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    return 0


class Inspector:
    """The simulation's handle on the child: `ask(request)` sends one, returns its answer."""

    def __init__(self, log_path: str, env: dict[str, str]) -> None:
        self._log: IO[str] = open(log_path, "a")  # noqa: SIM115 - closed in close()
        # Forked from the simulation's fork server when one serves: TensorFlow comes imported.
        self._process = spawn.popen(
            [sys.executable, "-m", "pipeline.simulation.inspector"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """The child's answer to `request`.

        Raises:
            RuntimeError: the child has died, or answered with an error.
        """
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline().decode()
        if not line:
            raise RuntimeError(
                f"the inspector exited ({self._process.poll()}); see {self._log.name}"
            )
        reply = dict(json.loads(line))
        if "error" in reply:
            raise RuntimeError(str(reply["error"]))
        return reply

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


if __name__ == "__main__":
    sys.exit(main())
