"""The train stage's settings: one typed dataclass, read from and written to JSON."""

from __future__ import annotations

import dataclasses
import math
import posixpath
from typing import Any

from contract import atomic, dates, import_path, layout, run_lock
from contract.settings import SettingsError

MAX_RESTARTS = 2  # whole-cluster restarts after a worker dies, unless told otherwise

AUGMENTATIONS = ("off", "flip-shift")
TEST_TIME_AUGMENTATIONS = ("off", "flip")
LR_SCHEDULES = ("plateau", "cosine")
# Keras dtype policies, or "auto": the one that trains fastest on this machine's CPU
# (TrainConfig.resolved). Variables stay float32 either way.
PRECISIONS = ("float32", "mixed_bfloat16", "auto")
WARM_STARTS = ("off", "last-blessed")
# CPU flags (Linux /proc/cpuinfo) under which "auto" computes in bfloat16: AMX's bfloat16 tiles.
# Without them oneDNN's bfloat16 convolutions were no faster than float32 (BENCHMARKS.md).
BFLOAT16_CPU_FLAGS = frozenset({"amx_bf16"})


# The hooks a model module given by import path may define beside its model function.
OPTIMIZER_HOOK = "build_optimizer"
LOSS_HOOK = "build_loss"


class ConfigError(SettingsError):
    """A training setting is out of range or unknown."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; the same value goes to every worker.

    A field's metadata (help, choices) makes its `python -m train` flag and its Luigi Train
    parameter (contract.settings): a new setting is declared here and nowhere else. Its
    metadata also says what role it plays, and every list that must agree is derived from it:

    - `shapes_training` (every field): whether another value makes another model. Those that
      do enter the backup's fingerprint (a resume with other values is refused;
      `fingerprinted_as` names a field that enters it through a derived value instead) and
      FullRun's "settings changed" check of a finished run; those that do not (where files
      go, how often to save or log, how long to wait) enter neither.
    - `settled_by_launcher`: filled in by the launcher from `warm_start`, not by the user.
    """

    data_dir: str = dataclasses.field(
        metadata={
            "shapes_training": False,
            "help": "The run's shard set: the folder holding manifest.json (local or gs://).",
        }
    )
    train_dir: str = dataclasses.field(
        metadata={
            "shapes_training": False,
            "help": "Where the model, history, backups and TensorBoard logs go (local or gs://).",
        }
    )
    output_root: str = dataclasses.field(
        default="",
        metadata={
            "shapes_training": False,
            "help": "The run's output root, given with --date (the Luigi Train task gives both): "
            "a last-blessed warm start reads its latest.json and run history. Empty: the run "
            "the train dir lies in, <root>/<date>/train.",
        },
    )
    date: str = dataclasses.field(
        default="",
        metadata={
            "shapes_training": False,
            "help": "The run's date, YYYY-MM-DD, given with --output-root.",
        },
    )
    model: str = dataclasses.field(
        default="cnn",
        metadata={
            "shapes_training": True,
            "help": "A built-in model by name (cnn, cnn2, cnn3, mlp), or your own model "
            "function by import path, package.module:function (docs/extending.md).",
        },
    )
    epochs: int = dataclasses.field(
        default=15, metadata={"shapes_training": True, "help": "Most epochs to train (at least 1)."}
    )
    per_worker_batch_size: int = dataclasses.field(
        default=256,
        metadata={
            "shapes_training": True,
            "help": "Examples per step on each worker; the global batch is this times the "
            "number of workers.",
        },
    )
    learning_rate: float = dataclasses.field(
        default=3e-3, metadata={"shapes_training": True, "help": "Adam's initial learning rate."}
    )
    validation_batch_size: int = dataclasses.field(
        default=500,
        metadata={
            "shapes_training": True,
            "help": "Examples per validation step; changes speed, never the metrics.",
        },
    )
    early_stopping_patience: int = dataclasses.field(
        default=4,
        metadata={
            "shapes_training": True,
            "help": "Epochs without a better val_loss before training stops (the best weights "
            "are kept); 0 turns early stopping off.",
        },
    )
    reduce_lr_patience: int = dataclasses.field(
        default=2,
        metadata={
            "shapes_training": True,
            "help": "plateau schedule: epochs without a better val_loss before the learning "
            "rate is multiplied by reduce_lr_factor; 0 off.",
        },
    )
    reduce_lr_factor: float = dataclasses.field(
        default=0.5,
        metadata={
            "shapes_training": True,
            "help": "plateau schedule: what the learning rate is multiplied by.",
        },
    )
    save_freq_steps: int = dataclasses.field(
        default=100,
        metadata={
            "shapes_training": False,
            "help": "Steps between backups under <train_dir>/backup/; a restart loses at most "
            "this many.",
        },
    )
    scalar_freq_steps: int = dataclasses.field(
        default=50,
        metadata={
            "shapes_training": False,
            "help": "Steps between TensorBoard scalar summaries; 0 for epochs only.",
        },
    )
    histogram_freq_steps: int = dataclasses.field(
        default=200,
        metadata={
            "shapes_training": False,
            "help": "Steps between TensorBoard histograms of the all-reduced gradients; 0 off.",
        },
    )
    seed: int = dataclasses.field(
        default=0,
        metadata={
            "shapes_training": True,
            "help": "Seeds weight initialisation, the input order, augmentation and dropout: "
            "the same seed, worker count and machine give the same model.",
        },
    )
    collective_timeout_seconds: float = dataclasses.field(
        default=60.0,
        metadata={
            "shapes_training": False,
            "help": "Seconds a worker waits in the gradient or validation all-reduce for a "
            "vanished peer before failing (each timed collective holds a timer thread this long).",
        },
    )
    threads_per_worker: int = dataclasses.field(
        default=1,
        metadata={"shapes_training": True, "help": "TensorFlow threads of each worker process."},
    )
    input_memory_budget_mb: int = dataclasses.field(
        default=1024,
        metadata={
            "shapes_training": True,
            "fingerprinted_as": "input",
            "help": "MB of a worker's train files held in memory; larger shard sets are "
            "streamed from disk.",
        },
    )
    augment: str = dataclasses.field(
        default="off",
        metadata={
            "shapes_training": True,
            "help": "On-the-fly augmentation of training batches, seeded like the input order "
            "(validation and evaluation never): flip-shift makes random horizontal flips and "
            "shifts of up to 2 pixels.",
            "choices": AUGMENTATIONS,
        },
    )
    lr_schedule: str = dataclasses.field(
        default="plateau",
        metadata={
            "shapes_training": True,
            "help": "plateau: ReduceLROnPlateau on val_loss; cosine: linear warm-up over "
            "warmup_epochs, then cosine decay to 0 at the last epoch's end.",
            "choices": LR_SCHEDULES,
        },
    )
    warmup_epochs: int = dataclasses.field(
        default=0,
        metadata={
            "shapes_training": True,
            "help": "cosine schedule: warm-up epochs, fewer than epochs.",
        },
    )
    label_smoothing: float = dataclasses.field(
        default=0.0,
        metadata={
            "shapes_training": True,
            "help": "Label smoothing of the training loss, in [0, 1).",
        },
    )
    test_time_augment: str = dataclasses.field(
        default="off",
        metadata={
            "shapes_training": True,
            "help": "flip: the exported model averages its probabilities on each image and on "
            "its left-right mirror; validation scores that model, so the best epoch is chosen "
            "on it.",
            "choices": TEST_TIME_AUGMENTATIONS,
        },
    )
    precision: str = dataclasses.field(
        default="float32",
        metadata={
            "shapes_training": True,
            "help": "Keras dtype policy: mixed_bfloat16 computes in bfloat16 with float32 "
            "variables, softmax and loss (faster where the CPU has AMX, or on a recent GPU; "
            "the exported model keeps it); auto: mixed_bfloat16 where the CPU reports "
            "AMX-BF16, float32 elsewhere, settled before any worker starts.",
            "choices": PRECISIONS,
        },
    )
    hparams: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata={
            "shapes_training": True,
            "fingerprinted_as": "model_code",
            "help": "Hyperparameters handed to a model given by import path (and to its "
            """optimizer and loss hooks), as a JSON object: '{"width": 64}'. Built-in models """
            "take none.",
        },
    )
    warm_start: str = dataclasses.field(
        default="off",
        metadata={
            "shapes_training": True,
            "help": "off: fresh weights; last-blessed: start from the model the latest pointer "
            "names, or cold (logged, recorded in history.json) when there is none, it is "
            "missing, fails its sha256 or does not fit the model and input.",
            "choices": WARM_STARTS,
        },
    )
    warm_start_learning_rate: float = dataclasses.field(
        default=0.0,
        metadata={
            "shapes_training": True,
            "help": "The (peak) learning rate of a run that starts warm; 0: learning_rate.",
        },
    )
    warm_start_finetune_epochs: int = dataclasses.field(
        default=0,
        metadata={
            "shapes_training": True,
            "help": "cosine schedule: a run that starts warm first fine-tunes the starting "
            "model for this many epochs, its rate falling from "
            "warm_start_finetune_learning_rate to 0, which takes it past the starting model's "
            "accuracy early; the schedule (warm-up, cosine) then runs its epochs. 0: no "
            "fine-tune.",
        },
    )
    warm_start_finetune_learning_rate: float = dataclasses.field(
        default=0.0,
        metadata={
            "shapes_training": True,
            "help": "The fine-tune's starting rate (warm_start_finetune_epochs); 0: a tenth "
            "of the warm run's peak rate.",
        },
    )
    # Settled by the launcher from warm_start before any worker starts (train.warm_start).
    warm_start_from: str = dataclasses.field(
        default="",
        metadata={
            "shapes_training": True,
            "settled_by_launcher": True,
            "help": "Set by the launcher: the model file a warm start loads.",
        },
    )
    warm_start_sha256: str = dataclasses.field(
        default="",
        metadata={
            "shapes_training": True,
            "settled_by_launcher": True,
            "help": "Set by the launcher: that file's sha256.",
        },
    )
    warm_start_date: str = dataclasses.field(
        default="",
        metadata={
            "shapes_training": True,
            "settled_by_launcher": True,
            "help": "Set by the launcher: the date of that model's run.",
        },
    )
    allow_host_network: bool = dataclasses.field(
        default=False,
        metadata={
            "shapes_training": False,
            "help": "Let a local cluster's workers train on the host's network (their gRPC "
            "ports, without authentication, then listen on every interface) where their own "
            "private network namespace cannot be made or cannot reach the data; without it "
            "such a run stops.",
        },
    )
    cold_start_reason: str = dataclasses.field(
        default="",
        metadata={
            "shapes_training": True,
            "settled_by_launcher": True,
            "help": "Set by the launcher: why last-blessed starts cold.",
        },
    )

    def run_dir(self) -> str:
        """The folder of the run this config trains (its date lock's): `<root>/<date>` as the
        task gave them (--output-root, --date), or, for a launch given only its folders, the
        folder its train dir lies in."""
        if self.output_root:
            return layout.run_dir(self.output_root, self.date)
        return run_lock.run_dir_of_train_dir(self.train_dir)

    def run(self) -> tuple[str, str]:
        """(output root, date) of the run this config trains, as `run_dir` finds it."""
        if self.output_root:
            return self.output_root, self.date
        run_dir = self.run_dir()
        return posixpath.dirname(run_dir) or "/", posixpath.basename(run_dir)

    def check(self) -> None:
        """Raises ConfigError naming the first setting that is out of range."""
        if bool(self.output_root) != bool(self.date):
            given, missing = (
                ("output_root", "date") if self.output_root else ("date", "output_root")
            )
            raise ConfigError(
                f"{given} is given without {missing}: the run is both (--output-root and --date)"
            )
        if self.date:
            try:
                dates.parse(self.date)
            except dates.DateError as e:
                raise ConfigError(str(e)) from None
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{field.name} must be a finite number, got {value}")
        positive = (
            "epochs",
            "per_worker_batch_size",
            "validation_batch_size",
            "save_freq_steps",
            "threads_per_worker",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in (
            "scalar_freq_steps",
            "histogram_freq_steps",
            "early_stopping_patience",
            "reduce_lr_patience",
            "input_memory_budget_mb",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 (off) or more, got {getattr(self, name)}")
        if self.seed < 0:
            raise ConfigError(f"seed must be 0 or more, got {self.seed}")
        choices = {
            "augment": AUGMENTATIONS,
            "test_time_augment": TEST_TIME_AUGMENTATIONS,
            "lr_schedule": LR_SCHEDULES,
            "precision": PRECISIONS,
            "warm_start": WARM_STARTS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if not 0 <= self.warmup_epochs < self.epochs:
            raise ConfigError(
                f"warmup_epochs must be in [0, epochs={self.epochs}), got {self.warmup_epochs}"
            )
        if not self.warm_start_finetune_learning_rate >= 0:
            raise ConfigError(
                "warm_start_finetune_learning_rate must be 0 (a tenth of the peak rate) or "
                f"positive, got {self.warm_start_finetune_learning_rate}"
            )
        finetune = self.warm_start_finetune_epochs
        if finetune < 0:
            raise ConfigError(f"warm_start_finetune_epochs must be 0 (off) or more, got {finetune}")
        # A run with warm start off never fine-tunes: luigi.cfg's value must not stop it.
        if finetune and self.warm_start != "off" and self.lr_schedule != "cosine":
            raise ConfigError(
                "warm_start_finetune_epochs needs lr_schedule = cosine (a plateau run's rate "
                "is lowered by the plateau alone): set it to 0"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        # Read from the model module's source, not run: refused before any work is done. A
        # module that is not found is named by the model's own check.
        if self.label_smoothing > 0 and import_path.is_import_path(self.model):
            try:
                own_loss = import_path.defines(self.model, LOSS_HOOK)
            except import_path.ImportPathError:
                own_loss = False
            if own_loss:
                raise ConfigError(label_smoothing_with_own_loss(self.model))
        if not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be positive, got {self.learning_rate}")
        if not self.warm_start_learning_rate >= 0:
            raise ConfigError(
                "warm_start_learning_rate must be 0 (learning_rate) or positive, "
                f"got {self.warm_start_learning_rate}"
            )
        if self.warm_start == "off" and (self.warm_start_from or self.cold_start_reason):
            raise ConfigError("warm_start_from is set, but warm_start is off: drop one")
        if self.warm_start_from and not self.warm_start_sha256:
            raise ConfigError(f"warm_start_from {self.warm_start_from} needs warm_start_sha256")
        if not 0.0 < self.reduce_lr_factor < 1.0:
            raise ConfigError(
                f"reduce_lr_factor must be in (0, 1) (the rate is multiplied by it), "
                f"got {self.reduce_lr_factor}"
            )
        if not self.collective_timeout_seconds > 0:
            raise ConfigError("collective_timeout_seconds must be positive")
        if not isinstance(self.hparams, dict) or not all(isinstance(k, str) for k in self.hparams):
            raise ConfigError(f"hparams must be a JSON object, got {self.hparams!r}")

    def resolved(self, cpu_flags: frozenset[str] | None = None) -> TrainConfig:
        """This config with precision "auto" replaced by the policy it stands for here:
        mixed_bfloat16 where the CPU has BFLOAT16_CPU_FLAGS, else float32."""
        if self.precision != "auto":
            return self
        return dataclasses.replace(self, precision=auto_precision(cpu_flags))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Builds a config from a dict, naming any key this version does not know."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown training settings: {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def read(cls, path: str) -> TrainConfig:
        return cls.from_dict(atomic.read_json(path))

    def write(self, path: str) -> None:
        atomic.write_json_atomic(path, self.to_dict())


def auto_precision(cpu_flags: frozenset[str] | None = None) -> str:
    """The policy precision "auto" stands for on a CPU with `cpu_flags` (default: this one)."""
    flags = read_cpu_flags() if cpu_flags is None else cpu_flags
    return "mixed_bfloat16" if flags >= BFLOAT16_CPU_FLAGS else "float32"


def read_cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's feature flags; none where the file is missing (not Linux)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def fields_where(**metadata: object) -> tuple[str, ...]:
    """The names of TrainConfig's fields whose metadata has these values, in field order."""
    return tuple(
        f.name
        for f in dataclasses.fields(TrainConfig)
        if all(f.metadata.get(key, False) == value for key, value in metadata.items())
    )


# The fields the launcher fills in from warm_start (train.warm_start), not the user.
WARM_START_SETTLED = fields_where(settled_by_launcher=True)
# The settings that shape training: FullRun compares them with a finished run's config.json.
SHAPING_SETTINGS = fields_where(shapes_training=True)


def label_smoothing_with_own_loss(model: str) -> str:
    """Why label_smoothing cannot go with a model module that brings its own loss."""
    return (
        f"label_smoothing is for the built-in loss, and {model} comes with its own "
        f"{LOSS_HOOK}: set label_smoothing 0 (--Train-label-smoothing 0) and smooth in that loss"
    )
