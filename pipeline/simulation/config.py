"""What a simulation runs with, where it keeps things, and the luigi.cfg its nights read."""

from __future__ import annotations

import configparser
import dataclasses
import datetime
import os

from pipeline.config_file import RETCODES
from pipeline.simulation import faults

# The recipe every night trains with: a small model on small drops, so a night takes seconds.
MODEL = "mlp"
BATCH_SIZE = 32
SAVE_FREQ_STEPS = 20  # backups inside an epoch, so a night killed in Train resumes from one
MIN_ACCURACY = 0.5
MAX_REGRESSION = 0.05
# What one bad night trains with (faults.WORSE_MODEL): nothing learnt, from scratch.
WORSE_RECIPE = ("--Train-warm-start=off", "--Train-learning-rate=1e-06")
# [Retention]: every kind that grows with the nights is bounded by a count or an age.
RETENTION = {
    "keep_shard_sets": 3,
    "keep_checkpoints": False,
    "keep_blessed_models": 5,
    "not_blessed_model_days": 14,
    "keep_served_versions": 3,
    "quarantine_days": 30,
    "superseded_days": 30,
}
MODEL_NAME = "nightly"
EMAIL_TO = "ops@example.com"
# Fashion-MNIST's train split, dealt into the drops.
TRAIN_EXAMPLES = 60000
MAX_PER_DAY = 400


@dataclasses.dataclass(frozen=True)
class Settings:
    """One simulation's settings.

    Attributes:
        root: the folder everything goes in (absolute).
        nights: how many consecutive dates.
        start: the first night's date, YYYY-MM-DD.
        plan: night number -> the faults injected on it.
        per_day: examples in each daily drop.
        test_examples: the fixed evaluation set's size.
        window_days: the rolling window each night trains on.
        epochs: Train epochs a night.
        seed: seeds the deal of examples into drops.
        disk_mb: the size of the output root's tmpfs.
        tmpfs: whether to try a tmpfs at all (else a full disk is a file-size limit).
        fork_server: whether the nights' stages fork from one warm fork server (else each is
            a process of its own, as a night without one runs).
    """

    root: str
    nights: int
    start: str
    plan: faults.Plan
    per_day: int = MAX_PER_DAY
    test_examples: int = 500
    window_days: int = 3
    epochs: int = 2
    seed: int = 0
    disk_mb: int = 2048
    tmpfs: bool = True
    fork_server: bool = True

    @property
    def drops(self) -> str:
        return os.path.join(self.root, "drops")

    @property
    def disk(self) -> str:
        """The output root's filesystem: a tmpfs mounted here when the machine allows it."""
        return os.path.join(self.root, "disk")

    @property
    def output_root(self) -> str:
        return os.path.join(self.disk, "runs")

    @property
    def export_base(self) -> str:
        return os.path.join(self.output_root, "serving")

    @property
    def config_path(self) -> str:
        return os.path.join(self.root, "luigi.cfg")

    @property
    def logs(self) -> str:
        """Each attempt's output, `<date>-<n>.log`."""
        return os.path.join(self.root, "logs")

    @property
    def eval_files(self) -> list[str]:
        return [os.path.join(self.drops, "test", "test-00000.tfrecord")]

    def dates(self) -> list[str]:
        first = datetime.date.fromisoformat(self.start)
        return [(first + datetime.timedelta(days=n)).isoformat() for n in range(self.nights)]

    def drop_file(self, date: str) -> str:
        return os.path.join(self.drops, date, "part-00000.tfrecord")


def default_start(nights: int, today: datetime.date | None = None) -> str:
    """The first night such that the last is yesterday (UTC): rollbacks refuse future dates."""
    today = today or datetime.datetime.now(datetime.UTC).date()
    return (today - datetime.timedelta(days=nights)).isoformat()


def default_per_day(nights: int) -> int:
    """MAX_PER_DAY, or fewer when the train split cannot fill that many nights."""
    return min(MAX_PER_DAY, TRAIN_EXAMPLES // nights)


def dataset(drops: str) -> str:
    """The --dataset value that reads make_drops' folder: dated drops, the fixed test files."""
    return f"drops:train={drops}/{{YYYY}}-{{MM}}-{{DD}}/*.tfrecord,test={drops}/test/*.tfrecord"


def luigi_config(settings: Settings, webhook_url: str, smtp_port: int) -> configparser.ConfigParser:
    """Everything the nights read: the recipe, thresholds, alerts, retention, exit codes.

    Only [email] sender is set there: with a receiver, luigi would e-mail each failed task
    too, beside [Notify]'s one alert per night and outcome.
    """
    config = configparser.ConfigParser(interpolation=None)
    config.read_dict(
        {
            "core": {"log_level": "INFO"},
            "retcode": {name: str(code) for name, code in RETCODES.items()},
            "Preprocess": {
                "output_root": settings.output_root,
                "dataset": dataset(settings.drops),
                "raw_image_shape": "28x28x1",
                "window_days": str(settings.window_days),
                "num_workers": "1",
                "beam_args": "--runner=DirectRunner --direct_num_workers=1",
            },
            # The first nights' windows are not full yet.
            "DataGate": {"min_window_days": "1"},
            "Train": {
                "model": MODEL,
                "epochs": str(settings.epochs),
                "warmup_epochs": "0",
                "per_worker_batch_size": str(BATCH_SIZE),
                "save_freq_steps": str(SAVE_FREQ_STEPS),
                "warm_start": "last-blessed",
            },
            "Evaluate": {
                "min_accuracy": str(MIN_ACCURACY),
                "max_regression": str(MAX_REGRESSION),
                "export_base": settings.export_base,
                "model_name": MODEL_NAME,
            },
            "Notify": {
                "webhook_url": webhook_url,
                "email_to": EMAIL_TO,
                "timeout_seconds": "10",
                "retries": "1",
                "backoff_seconds": "0.5",
            },
            "smtp": {"host": "127.0.0.1", "port": str(smtp_port), "no_tls": "true"},
            "email": {"sender": "nightly-trainer@example.com"},
            "Retention": {name: str(value).lower() for name, value in RETENTION.items()},
        }
    )
    return config


def write_luigi_config(settings: Settings, webhook_url: str, smtp_port: int) -> str:
    """Writes `<root>/luigi.cfg`; returns its path."""
    with open(settings.config_path, "w") as f:
        f.write("# Written by python -m pipeline.simulate: what every simulated night reads.\n")
        luigi_config(settings, webhook_url, smtp_port).write(f)
    return settings.config_path
