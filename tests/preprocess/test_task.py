"""The Luigi task: parameters map onto the stage's command line; luigi.cfg supplies values."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import pytest

from pipeline.preprocess_task import Preprocess, preprocess_args
from tests import factories


def test_command_maps_every_parameter():
    task = Preprocess(
        date=datetime.date(2026, 1, 31),
        output_root="gs://bucket/runs",
        num_workers=3,
        validation_fraction=0.2,
        manual_dir="/src",
        beam_args="--runner=DataflowRunner --project=p",
        train_split="train[:90%]",
        eval_split="train[90%:]",
    )
    command = task.command()
    assert command[:3] == [sys.executable, "-m", "preprocess"]
    assert command[3:] == preprocess_args(
        output_root="gs://bucket/runs",
        date="2026-01-31",
        dataset="fashion_mnist",
        num_workers=3,
        validation_fraction=0.2,
        data_dir=".cache/tensorflow_datasets",
        manual_dir="/src",
        beam_args="--runner=DataflowRunner --project=p",
        train_split="train[:90%]",
        eval_split="train[90%:]",
    )
    assert "--train_split=train[:90%]" in command and "--eval_split=train[90%:]" in command
    assert "--validation_fraction=0.2" in command and "--manual_dir=/src" in command
    assert command[-2:] == ["--runner=DataflowRunner", "--project=p"]
    assert task.output().path == "gs://bucket/runs/2026-01-31/data/manifest.json"


def test_stage_parses_the_command():
    from preprocess import config

    args = preprocess_args(
        "runs", "2026-01-31", "mnist", 4, 0.25, "/tfds", seed="7", eval_split="test[:50%]"
    )
    parser = argparse.ArgumentParser(allow_abbrev=False)
    config.add_arguments(parser)
    known, beam_args = parser.parse_known_args(args[1:] + ["--runner=DirectRunner"])
    cfg = config.config_from_args(known)
    assert (cfg.dataset, cfg.num_workers, cfg.validation_fraction, cfg.seed) == (
        "mnist",
        4,
        0.25,
        "7",
    )
    assert (cfg.train_split, cfg.eval_split, cfg.resize) == ("train", "test[:50%]", "")
    assert beam_args == ["--runner=DirectRunner"]


@pytest.mark.e2e
def test_luigi_runs_preprocess_on_tiny_data(tiny_tfds, tiny_sources, tmp_path):
    manual_dir, sums = tiny_sources
    result = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "luigi"),
            "--module",
            "pipeline",
            "Preprocess",
            "--local-scheduler",
            "--date=2026-01-31",
            f"--output-root={tmp_path}",
            f"--data-dir={tiny_tfds}",
            f"--manual-dir={manual_dir}",
            f"--manual-checksums={sums}",
        ],
        capture_output=True,
        text=True,
        cwd=factories.PROJECT_ROOT,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(tmp_path / "2026-01-31" / "data" / "manifest.json") as f:
        doc = json.load(f)
    # num_workers and validation_fraction: the defaults (luigi.cfg leaves them).
    assert doc["num_workers"] == 2 and doc["parameters"]["validation_fraction"] == 0.1
    assert doc["splits"]["train"]["examples_per_worker"] == 135
    assert doc["splits"]["eval"]["num_examples"] == 100
