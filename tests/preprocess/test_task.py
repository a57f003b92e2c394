"""The Luigi task: parameters map onto the stage's command line; luigi.cfg supplies values."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import pytest

from pipeline.preprocess_task import Preprocess
from tests import factories


def parse_stage_command(command: list[str]):
    """What `python -m preprocess run` makes of a command: its config and Beam's flags."""
    from preprocess import config

    parser = argparse.ArgumentParser(allow_abbrev=False)
    config.add_arguments(parser)
    known, beam_args = parser.parse_known_args(command[4:])
    return config.config_from_args(known), beam_args


def test_command_gives_the_stage_every_parameter():
    task = Preprocess(
        date=datetime.date(2026, 1, 31),
        output_root="gs://bucket/runs",
        num_workers=3,
        validation_fraction=0.2,
        manual_dir="/src",
        beam_args="--runner=DataflowRunner --project=p",
        train_split="train[:90%]",
        eval_split="train[90%:]",
        seed=7,
    )
    command = task.command()
    assert command[:4] == [sys.executable, "-m", "preprocess", "run"]
    cfg, beam_args = parse_stage_command(command)
    assert (cfg.output_root, cfg.date, cfg.num_workers) == ("gs://bucket/runs", "2026-01-31", 3)
    assert (cfg.validation_fraction, cfg.manual_dir, cfg.seed) == (0.2, "/src", 7)
    assert (cfg.train_split, cfg.eval_split, cfg.resize) == ("train[:90%]", "train[90%:]", "")
    assert cfg.overwrite is False
    assert beam_args == ["--runner=DataflowRunner", "--project=p"]
    assert task.output().path == "gs://bucket/runs/2026-01-31/data/manifest.json"


def test_stage_takes_beams_spelling_and_a_bare_bool_flag():
    command = [sys.executable, "-m", "preprocess", "run", "--output_root=r", "--date=2026-01-31"]
    command += ["--num_workers=4", "--max-bytes-per-file", "9", "--overwrite", "--runner=X"]
    cfg, beam_args = parse_stage_command(command)
    assert (cfg.num_workers, cfg.max_bytes_per_file, cfg.overwrite) == (4, 9, True)
    assert beam_args == ["--runner=X"]


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
