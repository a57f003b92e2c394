"""Fake output roots for retention tests: each night's folders with the files each stage leaves
(sizes chosen, contents made up), served versions, quarantine, superseded folders, the pointer.

Paths go through contract.gfile, so a root may be local or a URL (TensorFlow's ram://).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json

from contract import gfile, layout, ledger, manifest, pointer
from pipeline.retention_plan import QUARANTINE_STAMP_FORMAT, Target
from pipeline.supersede import STAMP_FORMAT, SUPERSEDED_DIR

MODEL_NAME = "nightly"
# Bytes of the files retention may remove; everything else a night leaves is small.
SHARD_BYTES = 50_000
CHECKPOINT_BYTES = 20_000
MODEL_BYTES = 4_000
SAVED_MODEL_BYTES = 6_000


def night_time(date: str, hour: int = 3) -> datetime.datetime:
    """When a night's run ends: `hour` o'clock UTC of its date."""
    day = datetime.date.fromisoformat(date)
    return datetime.datetime.combine(day, datetime.time(hour), datetime.UTC)


def write(path: str, content: bytes | int | dict) -> None:
    """A file of `content`: bytes, that many made-up bytes, or a JSON object."""
    if isinstance(content, int):
        data = hashlib.sha256(path.encode()).digest() * (content // 32 + 1)
        content = data[:content]
    elif isinstance(content, dict):
        content = json.dumps(content).encode()
    gfile.makedirs(path.rsplit("/", 1)[0])
    with gfile.GFile(path, "wb") as f:
        f.write(content)


def read_bytes(path: str) -> bytes:
    with gfile.GFile(path, "rb") as f:
        return f.read()


@dataclasses.dataclass
class FakeRoot:
    """An output root with its served folder at `<root>/serving/nightly`."""

    root: str

    @property
    def target(self) -> Target:
        return Target(self.root, layout.join(self.root, "serving"), MODEL_NAME)

    def run_dir(self, date: str) -> str:
        return layout.run_dir(self.root, date)

    def model(self, date: str) -> str:
        return layout.join(layout.train_dir(self.root, date), layout.MODEL_FILE)

    def night(
        self, date: str, finished: bool = True, blessed: bool = True, move_pointer: bool = True
    ) -> int | None:
        """Writes a night; a finished blessed one is pushed and (by default) pointed at.

        An unfinished night stopped in training: its shard set and backup are there, no model.

        Returns:
            The served version pushed, or None.
        """
        data, train = layout.data_dir(self.root, date), layout.train_dir(self.root, date)
        write(layout.join(data, layout.MANIFEST_FILE), {"num_workers": 1})
        write(layout.join(data, manifest.DATA_GATE_FILE), {"status": "passed"})
        write(layout.join(data, manifest.STATISTICS_FILE), 100)
        write(layout.join(data, "train", "worker-00000-of-00001.tfrecord"), SHARD_BYTES)
        write(layout.join(layout.logs_dir(self.root, date), "train.log"), 200)
        write(layout.join(train, "logs", "worker-0.log"), 200)
        if not finished:
            write(layout.join(train, layout.BACKUP_DIR, "ckpt-1.index"), CHECKPOINT_BYTES)
            return None
        write(layout.join(train, layout.MODEL_FILE), MODEL_BYTES)
        write(layout.join(train, layout.HISTORY_FILE), {"epochs_completed": 1})
        write(layout.join(train, layout.TRAIN_CONFIG_FILE), {"epochs": 1})
        write(layout.join(train, layout.TENSORBOARD_DIR, "train", "events.out"), 300)
        write(layout.join(train, layout.FINAL_CHECKPOINT_DIR, "ckpt.index"), CHECKPOINT_BYTES)
        version = int(date.replace("-", "")) * 100 if blessed else None
        self.evaluation(date, blessed, version)
        if version is not None:
            self.push(version, date)
            if move_pointer:
                self.point_at(date, version)
        return version

    def evaluation(self, date: str, blessed: bool, version: int | None) -> None:
        evaluate = layout.evaluate_dir(self.root, date)
        write(layout.join(evaluate, "report.md"), 300)
        write(layout.join(evaluate, layout.BLESSING_FILE), {"blessed": blessed})
        write(layout.join(evaluate, layout.PUSH_FILE), {"pushed": blessed, "version": version})
        model = {"path": f"{date}/train/{layout.MODEL_FILE}", "sha256": "0" * 64}
        write(layout.join(evaluate, layout.METRICS_FILE), {"accuracy": 0.9, "model": model})

    def version_dir(self, version: int) -> str:
        return layout.join(self.target.served_dir, str(version))

    def push(self, version: int, date: str) -> None:
        folder = self.version_dir(version)
        write(layout.join(folder, "saved_model.pb"), SAVED_MODEL_BYTES)
        write(layout.join(folder, "variables", "variables.index"), 100)
        write(layout.join(folder, "assets.extra", "nightly_push.json"), {"date": date})

    def point_at(self, date: str, version: int | None, model_path: str | None = None) -> None:
        evaluate = layout.evaluate_dir(self.root, date)
        pointer.write(
            self.root,
            {
                "date": date,
                "model_path": model_path or self.model(date),
                "metrics_path": layout.join(evaluate, layout.METRICS_FILE),
                "model_sha256": "0" * 64,
                "accuracy": 0.9,
                "loss": 0.3,
                "dataset": "fashion_mnist",
                **({} if version is None else {"version": version}),
            },
        )

    def supersede(self, date: str, when: datetime.datetime) -> str:
        """A `--force-stage train` of the night at `when`: its old train and evaluate folders."""
        folder = layout.join(self.run_dir(date), SUPERSEDED_DIR, when.strftime(STAMP_FORMAT))
        write(layout.join(folder, "train", layout.MODEL_FILE), MODEL_BYTES)
        write(layout.join(folder, "train", layout.FINAL_CHECKPOINT_DIR, "c.index"), 5_000)
        write(layout.join(folder, "evaluate", layout.METRICS_FILE), {"accuracy": 0.8})
        return folder

    def quarantine(self, version: int, when: datetime.datetime) -> str:
        """A version taken out of service at `when`, as evaluate.served leaves it."""
        name = f"{version}-{when.strftime(QUARANTINE_STAMP_FORMAT)}"
        folder = layout.join(self.target.quarantine_dir, name)
        write(layout.join(folder, "saved_model.pb"), SAVED_MODEL_BYTES)
        write(layout.join(folder, "assets.extra", "nightly_push.json"), {"version": version})
        note = {"version": version, "quarantined_utc": when.isoformat()}
        write(layout.join(folder, layout.QUARANTINE_NOTE_FILE), note)
        return folder

    def size(self) -> int:
        return ledger.folder_bytes(self.root)

    def files(self) -> set[str]:
        """Every file under the root, relative to it, but the locks' (a local root's pointer
        lock lies in it)."""
        found = set()
        for folder, _, names in gfile.walk(self.root):
            rel = folder[len(self.root) :].strip("/")
            found |= {f"{rel}/{name}" if rel else name for name in names}
        found = {name for name in found if not name.endswith(".lock")}
        # ram:// lists by prefix: `nightly.quarantine/...` shows as a `nightly/.quarantine` file.
        return {name for name in found if gfile.exists(layout.join(self.root, name))}

    def served(self) -> list[int]:
        """The versions in the served folder."""
        names = gfile.listdir(self.target.served_dir)
        return sorted(int(n.rstrip("/")) for n in names if n.rstrip("/").isdigit())
