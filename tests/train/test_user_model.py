"""A model by import path: its input spec, hparams and hooks, its code in the resume fingerprint,
and every way it can be wrong refused in one line before any worker starts."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import textwrap
import zipfile

import pytest
import tensorflow as tf
import tf_keras

from contract import atomic, import_path, layout, manifest, model_code
from contract.import_path import ImportPathError
from pipeline import train_task
from tests.train.conftest import SMALL_RUN, write_small_shard_set
from tests.train.test_bad_input import fails_with, launch_args
from train import backup, models, user_model, worker
from train.config import ConfigError, TrainConfig

_names = itertools.count()

GOOD_MODULE = """
import tf_keras as keras

def build_model(input_spec, hparams):
    inputs = keras.Input(shape=input_spec.shape, dtype=input_spec.dtype, name="image")
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(hparams.get("width", 4), name="user_width")(x)
    outputs = keras.layers.Dense(input_spec.num_classes, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.seen_class_names = input_spec.class_names
    return model
"""
HOOKS = """
def build_optimizer(learning_rate, hparams):
    return keras.optimizers.SGD(learning_rate, momentum=hparams["momentum"])

def build_loss(hparams):
    return keras.losses.SparseCategoricalCrossentropy(name="user_loss")
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Writes a module of the given source on sys.path; returns its (fresh) name."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def write(source: str) -> str:
        name = f"user_model_{next(_names)}_{os.getpid()}"
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


@pytest.fixture
def data_and_train(tmp_path):
    data_dir, train_dir = str(tmp_path / "data"), str(tmp_path / "train")
    write_small_shard_set(data_dir)
    return data_dir, train_dir


def refused_before_any_worker(capsys, data_and_train, model: str, message: str, **flags) -> None:
    data_dir, train_dir = data_and_train
    fails_with(capsys, launch_args(data_dir, train_dir, model=model, **flags), message)
    assert not os.path.exists(os.path.join(train_dir, "logs"))  # no worker was started


def test_a_missing_module_is_one_line(capsys, data_and_train):
    refused_before_any_worker(
        capsys, data_and_train, "no_such_package.models:build", "model module "
        "'no_such_package.models' not found: put its folder on PYTHONPATH"
    )  # fmt: skip


def test_a_missing_function_is_one_line(capsys, data_and_train, user_module):
    name = user_module(GOOD_MODULE)
    refused_before_any_worker(
        capsys, data_and_train, f"{name}:build_it", f"model module '{name}' has no function "
        "'build_it'"
    )  # fmt: skip


def test_a_module_failing_to_import_is_one_line(capsys, data_and_train, user_module):
    name = user_module("import no_such_dependency\n")
    refused_before_any_worker(
        capsys, data_and_train, f"{name}:build_model",
        f"model module '{name}' failed to import: No module named 'no_such_dependency'",
    )  # fmt: skip


def test_a_function_returning_no_model_is_one_line(capsys, data_and_train, user_module):
    name = user_module("def build_model(input_spec, hparams):\n    return None\n")
    refused_before_any_worker(
        capsys, data_and_train, f"{name}:build_model",
        f"{name}:build_model returned builtins.NoneType, not a tf_keras Model",
    )  # fmt: skip


def test_a_model_of_the_wrong_output_is_one_line(capsys, data_and_train, user_module):
    source = GOOD_MODULE.replace("input_spec.num_classes, activation", "3, activation")
    name = user_module(source)
    refused_before_any_worker(
        capsys, data_and_train, f"{name}:build_model", "with outputs [(3,)], not one of (10,)"
    )


def test_a_hook_returning_no_optimizer_is_one_line(capsys, data_and_train, user_module):
    name = user_module(
        GOOD_MODULE + "\ndef build_optimizer(learning_rate, hparams):\n    return 1\n"
    )
    refused_before_any_worker(
        capsys, data_and_train, f"{name}:build_model",
        f"{name}.build_optimizer returned builtins.int, not a tf_keras optimizer",
    )  # fmt: skip


def test_hparams_are_for_models_by_import_path(capsys, data_and_train):
    refused_before_any_worker(
        capsys, data_and_train, "mlp", "the built-in model 'mlp' takes no hparams (got width)",
        hparams='{"width": 3}',
    )  # fmt: skip


def test_hparams_must_be_a_json_object(capsys, data_and_train):
    refused_before_any_worker(
        capsys, data_and_train, "mlp", "expected a JSON object", hparams="[1, 2]"
    )


def test_label_smoothing_is_refused_beside_a_loss_hook(capsys, data_and_train, user_module):
    name = user_module(GOOD_MODULE + HOOKS)
    refused_before_any_worker(
        capsys, data_and_train, f"{name}:build_model",
        "label_smoothing is for the built-in loss", label_smoothing=0.1,
    )  # fmt: skip


def test_the_model_gets_the_input_spec_hparams_and_hooks(data_and_train, user_module):
    data_dir, train_dir = data_and_train
    name = user_module(GOOD_MODULE + HOOKS)
    hparams = {"width": 7, "momentum": 0.5}
    config = TrainConfig(data_dir, train_dir, model=f"{name}:build_model", hparams=hparams)
    shard_manifest = manifest.read_manifest(data_dir)
    core, _, trainer = worker.build_trainer(config, shard_manifest, tf.distribute.get_strategy())
    assert core.get_layer("user_width").units == 7
    assert core.input_shape == (None, *shard_manifest["image_shape"])
    assert core.seen_class_names == tuple(shard_manifest["class_names"])
    assert type(trainer.optimizer).__name__ == "SGD" and trainer.optimizer.momentum == 0.5
    assert trainer.loss.name == "user_loss"


def test_the_modules_code_is_in_the_fingerprint_and_refuses_a_resume(
    capsys, data_and_train, user_module, tmp_path
):
    data_dir, train_dir = data_and_train
    name = user_module(GOOD_MODULE)
    config = TrainConfig(
        data_dir,
        train_dir,
        model=f"{name}:build_model",
        **{k: v for k, v in SMALL_RUN.items() if k != "model"},
    )
    shard_manifest = manifest.read_manifest(data_dir)
    before = backup.fingerprint(config, shard_manifest, 2)
    folder = backup.backup_dir(train_dir)
    os.makedirs(folder)
    atomic.write_json_atomic(os.path.join(folder, backup.SETTINGS_FILE), before)
    atomic.write_json_atomic(os.path.join(folder, backup.STATE_FILE), {"checkpoint": "ckpt-1"})
    backup.check_resume_settings(config, shard_manifest, 2)  # the same code resumes
    path = tmp_path / "user_code" / f"{name}.py"
    path.write_text(path.read_text().replace('"user_width"', '"user_width_2"'))
    after = backup.fingerprint(config, shard_manifest, 2)
    assert before["model_sha256"] != after["model_sha256"]
    fails_with(
        capsys,
        launch_args(data_dir, train_dir, model=f"{name}:build_model"),
        f"the backup in {folder} was made with other settings (model_sha256 "
        f"'{before['model_sha256']}' -> '{after['model_sha256']}')",
    )


def test_the_source_names_the_file_and_its_hash(user_module, tmp_path):
    name = user_module(GOOD_MODULE)
    source = user_model.source(f"{name}:build_model")
    path = tmp_path / "user_code" / f"{name}.py"
    assert source["model_file"] == str(path)
    assert source["model_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert user_model.source("mlp") == {}


def test_an_import_path_of_the_wrong_form_is_refused():
    with pytest.raises(ConfigError, match="not an import path of the form package.module:function"):
        models.check_name("my-package.models:build")


def test_the_luigi_task_refuses_a_missing_module_before_scheduling(tmp_path, capsys):
    task = train_task.Train(output_root=str(tmp_path), model="no_such_package.models:build")
    with pytest.raises(ImportPathError, match="'no_such_package.models' not found"):
        task.complete()
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert "model module 'no_such_package.models' not found" in line
    assert os.listdir(tmp_path) == []


def test_a_saved_model_naming_a_module_that_does_not_import_is_one_line(tmp_path):
    path = str(tmp_path / layout.MODEL_FILE)
    layer = {"module": "no_such_package.layers", "class_name": "Custom", "config": {}}
    model = {"module": "keras", "class_name": "Functional", "config": {"layers": [layer]}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(model_code.KERAS_CONFIG_MEMBER, json.dumps(model))
    assert model_code.model_modules(path) == ["no_such_package.layers"]
    with pytest.raises(model_code.ModelCodeError, match="module 'no_such_package.layers', which"):
        model_code.custom_objects(path)


def test_a_saved_model_with_an_unregistered_user_layer_loads(tmp_path, user_module):
    name = user_module(
        """
        import tf_keras as keras

        class Doubled(keras.layers.Layer):
            def call(self, x):
                return 2.0 * x

        def build_model(input_spec, hparams):
            inputs = keras.Input(shape=input_spec.shape, name="image")
            x = keras.layers.Flatten()(Doubled(name="doubled")(inputs))
            outputs = keras.layers.Dense(input_spec.num_classes, activation="softmax")(x)
            return keras.Model(inputs, outputs)
        """
    )
    spec = user_model.InputSpec((4, 4, 1), "float32", 2, ("a", "b"))
    model = user_model.build(f"{name}:build_model", spec, {})
    path = str(tmp_path / layout.MODEL_FILE)
    model.save(path)
    del sys.modules[name]  # as in the evaluate stage's own process
    assert model_code.model_modules(path) == [name]
    custom = model_code.custom_objects(path)
    assert list(custom) == ["Doubled"]
    loaded = tf_keras.models.load_model(path, compile=False, custom_objects=custom)
    assert type(loaded.get_layer("doubled")).__module__ == name


@pytest.mark.parametrize(
    "source",
    [
        "def build_model(input_spec, hparams):\n    pass\n",
        "try:\n    from tf_keras import Model as build_model\nexcept ImportError:\n    pass\n",
        "if True:\n    build_model = print\n",
        "from os.path import *\n",  # may bind anything: only importing it tells
    ],
    ids=["def", "import-in-try", "assign-in-if", "star-import"],
)
def test_the_pipeline_finds_the_function_without_running_the_module(user_module, source):
    name = user_module("raise SystemExit('the module ran')\n" + source)
    import_path.check(f"{name}:build_model")
    assert name not in sys.modules


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def build(input_spec, hparams):\n    pass\n", "has no function 'build_model'"),
        ("class A:\n    def build_model(self):\n        pass\n", "has no function 'build_model'"),
        ("def build_model(:\n", "failed to import: SyntaxError"),
    ],
    ids=["other-name", "a-method", "syntax-error"],
)
def test_the_pipeline_refuses_what_the_module_lacks(user_module, source, message):
    name = user_module(source)
    with pytest.raises(ImportPathError, match=message):
        import_path.check(f"{name}:build_model")


def test_the_luigi_task_refuses_a_missing_function_before_scheduling(tmp_path, user_module):
    name = user_module(GOOD_MODULE)
    task = train_task.Train(output_root=str(tmp_path), model=f"{name}:build_it")
    with pytest.raises(ImportPathError, match=f"model module '{name}' has no function 'build_it'"):
        task.complete()
    train_task.Train(output_root=str(tmp_path), model=f"{name}:build_model").complete()


def test_the_launchers_model_names_are_the_models_built():
    from train import checks

    assert sorted(checks.BUILT_IN_MODELS) == sorted(models.MODELS)


def test_a_loss_hook_beside_label_smoothing_is_refused_before_any_work():
    # luigi.cfg's recipe smooths labels; the walk-through's module brings its own loss. The
    # Luigi task refuses the pair while luigi decides what to run, before Preprocess.
    import datetime

    from pipeline import Train

    task = Train(
        date=datetime.date(2026, 1, 31),
        output_root="runs",
        model="examples.my_model:build_model",
        label_smoothing=0.1,
    )
    with pytest.raises(ConfigError, match="--Train-label-smoothing 0"):
        task.check_parameters()
    Train(
        date=datetime.date(2026, 1, 31),
        output_root="runs",
        model="examples.my_model:build_model",
        label_smoothing=0.0,
    ).check_parameters()
