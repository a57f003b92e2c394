"""docs/extending.md's walk-through, run as written: a generated image folder and the example
model module (examples/my_model.py) from nothing to a blessed model through the luigi CLI."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from contract import layout
from tests.factories import PROJECT_ROOT

pytestmark = pytest.mark.e2e

DATE = "2026-02-01"
RETCODE_SCHEDULING_ERROR = 35  # luigi.cfg [retcode]
EXAMPLE_MODEL = "examples.my_model:build_model"
# The walk-through's flags (docs/extending.md), with a smaller folder and fewer epochs.
WALK_THROUGH_FLAGS = [
    f"--Train-model={EXAMPLE_MODEL}",
    '--Train-hparams={"width": 8}',
    "--Train-epochs=4",
    "--Train-lr-schedule=plateau",
    "--Train-warmup-epochs=0",
    "--Train-label-smoothing=0",
    "--Train-augment=off",
    "--Train-per-worker-batch-size=8",
    "--Train-learning-rate=0.01",
    "--Train-precision=float32",
    "--Train-histogram-freq-steps=0",
    "--Evaluate-min-accuracy=0.8",
    "--Preprocess-beam-args=--runner=DirectRunner --direct_num_workers=1",
]


def luigi_env() -> dict[str, str]:
    """The test process's environment when luigi starts (the session's fork server included,
    so the stages fork from it), without PYTHONPATH: the example module is found from the
    folder luigi runs in, as a user's is."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def luigi_full_run(output_root: pathlib.Path, image_folder: pathlib.Path, *flags: str):
    command = [sys.executable, "-m", "luigi", "--module", "pipeline", "FullRun"]
    command += ["--local-scheduler", f"--date={DATE}", f"--output-root={output_root}"]
    command += [f"--dataset=imagefolder:{image_folder}", "--num-workers=2", *flags]
    return subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        env=luigi_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("shapes")
    subprocess.run(
        [sys.executable, "examples/make_image_folder.py", str(root), "--per-class", "80"],
        cwd=PROJECT_ROOT,
        check=True,
        capture_output=True,
    )
    return root


def read_json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def test_the_walk_through_trains_the_users_model_to_a_blessing(tmp_path, image_folder):
    result = luigi_full_run(tmp_path, image_folder, *WALK_THROUGH_FLAGS)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    run = tmp_path / DATE

    config = read_json(run / "train" / layout.TRAIN_CONFIG_FILE)
    module = PROJECT_ROOT / "examples" / "my_model.py"
    assert config["model"] == EXAMPLE_MODEL and config["hparams"] == {"width": 8}
    assert config["model_file"] == str(module)
    assert config["model_sha256"] == hashlib.sha256(module.read_bytes()).hexdigest()

    with zipfile.ZipFile(run / "train" / layout.MODEL_FILE) as archive:
        saved = json.loads(archive.read("config.json"))
    # luigi.cfg's test-time flips wrap the user's model: its layers are one level down.
    (wrapped,) = [layer for layer in saved["config"]["layers"] if "layers" in layer["config"]]
    layers = {layer["config"]["name"]: layer for layer in wrapped["config"]["layers"]}
    assert layers["centred_pixels"]["module"] == "examples.my_model"  # the user's own layer
    assert layers["shape_features"]["config"]["filters"] == 8  # from --Train-hparams

    metrics = read_json(run / "evaluate" / layout.METRICS_FILE)
    assert sorted(metrics["per_class"]) == ["bar", "column", "square"]
    blessing = read_json(run / "evaluate" / layout.BLESSING_FILE)
    assert blessing["blessed"] is True, blessing
    # Exported for serving, custom layer and all: the export loads and checks it itself.
    assert list((tmp_path / "serving" / "nightly").glob("*/saved_model.pb"))


def test_a_missing_model_function_is_refused_before_anything_runs(tmp_path, image_folder):
    flags = [f for f in WALK_THROUGH_FLAGS if not f.startswith("--Train-model=")]
    result = luigi_full_run(
        tmp_path, image_folder, "--Train-model=examples.my_model:build_it", *flags
    )
    assert result.returncode == RETCODE_SCHEDULING_ERROR, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: model module 'examples.my_model' has no function 'build_it'"]
    assert not (tmp_path / DATE / "data").exists()  # Preprocess never ran
