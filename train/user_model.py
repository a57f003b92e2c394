"""Models by import path (`package.module:function`): importing them, their hooks, their code.

The function is called as `function(input_spec, hparams)` with an `InputSpec` read from the
shard set's manifest and the run's `--hparams` dict, and returns an uncompiled tf_keras model
that takes raw 0-255 pixels (float32, `input_spec.shape`) to `num_classes` probabilities.

Optional hooks, found by name in the same module (docs/extending.md):

- `build_optimizer(learning_rate, hparams)` returns a tf_keras optimizer; `learning_rate` is
  the run's rate, a float or the cosine schedule, to pass on so the schedule and the plateau
  still apply (default: Adam).
- `build_loss(hparams)` returns a tf_keras loss on integer labels and the probabilities
  (default: sparse categorical cross-entropy, smoothed by `--label-smoothing`).

The module is imported from `sys.path` (PYTHONPATH) or the folder the pipeline runs from,
which `python -m train` puts first on every worker's path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from contract import import_path as paths
from train.config import LOSS_HOOK, OPTIMIZER_HOOK, ConfigError

SEPARATOR = paths.SEPARATOR
# The images a model receives: pixel values 0-255 as float32 (train.data casts the shards' uint8).
INPUT_DTYPE = "float32"


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """What a model by import path is told about its input and output."""

    shape: tuple[int, ...]  # (height, width, channels), no batch axis
    dtype: str
    num_classes: int
    class_names: tuple[str, ...]  # by label index

    @classmethod
    def from_manifest(cls, shard_manifest: dict[str, Any]) -> InputSpec:
        num_classes = int(shard_manifest["num_classes"])
        names = shard_manifest.get("class_names") or [str(i) for i in range(num_classes)]
        return cls(
            shape=tuple(int(n) for n in shard_manifest["image_shape"]),
            dtype=INPUT_DTYPE,
            num_classes=num_classes,
            class_names=tuple(str(name) for name in names),
        )


def is_import_path(model: str) -> bool:
    """Whether `model` names a function by import path rather than a built-in model."""
    return paths.is_import_path(model)


def split_import_path(model: str) -> tuple[str, str]:
    """(module name, function name) of `package.module:function`.

    Raises:
        ConfigError: the text is not of that form.
    """
    try:
        return paths.split(model)
    except paths.ImportPathError as e:
        raise ConfigError(str(e)) from None


def import_module(module_name: str) -> ModuleType:
    """Imports the user's module, from sys.path or the current folder as `python -m` would.

    Raises:
        ConfigError: the module cannot be found or fails while importing.
    """
    paths.add_working_folder()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name + ".").startswith(e.name + "."):
            raise ConfigError(str(paths.not_found(module_name))) from None
        raise ConfigError(f"model module {module_name!r} failed to import: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever the user's code raises is one line
        raise ConfigError(
            f"model module {module_name!r} failed to import: {type(e).__name__}: {e}"
        ) from None


@dataclasses.dataclass(frozen=True)
class UserModel:
    """A model function by import path and the hooks its module defines."""

    import_path: str
    module: ModuleType
    function: Callable[..., Any]
    build_optimizer: Callable[..., Any] | None
    build_loss: Callable[..., Any] | None

    @property
    def file(self) -> str:
        return os.path.abspath(inspect.getfile(self.module))

    def source(self) -> dict[str, str]:
        """The module's file and the sha256 of its content: what a resume must find again."""
        with open(self.file, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return {"model_file": self.file, "model_sha256": digest}


def _hook(module: ModuleType, name: str) -> Callable[..., Any] | None:
    hook = getattr(module, name, None)
    if hook is not None and not callable(hook):
        raise ConfigError(f"{module.__name__}.{name} is not a function")
    return hook


def resolve(import_path: str) -> UserModel:
    """Imports `package.module:function` and finds its hooks.

    Raises:
        ConfigError: the module is missing or fails to import, or lacks the function.
    """
    module_name, function_name = split_import_path(import_path)
    module = import_module(module_name)
    function = getattr(module, function_name, None)
    if function is None:
        raise ConfigError(str(paths.no_function(module_name, function_name)))
    if not callable(function):
        raise ConfigError(f"{import_path} is not a function")
    return UserModel(
        import_path,
        module,
        function,
        _hook(module, OPTIMIZER_HOOK),
        _hook(module, LOSS_HOOK),
    )


def check_model(model: Any, import_path: str, spec: InputSpec) -> None:
    """Checks what the function returned against the input spec.

    Raises:
        ConfigError: not a tf_keras model, or the wrong input or output shape.
    """
    import tf_keras as keras

    if not isinstance(model, keras.Model):
        kind = f"{type(model).__module__}.{type(model).__qualname__}"
        hint = " (a Keras 3 model: build it with tf_keras)" if kind.startswith("keras") else ""
        raise ConfigError(f"{import_path} returned {kind}, not a tf_keras Model{hint}")
    inputs = [tuple(shape[1:]) for shape in _shapes(model.input_shape)]
    if len(inputs) != 1 or inputs[0] != spec.shape:
        raise ConfigError(
            f"{import_path} returned a model taking {inputs}, not one input of shape "
            f"{spec.shape}: build it on keras.Input(shape=input_spec.shape)"
        )
    outputs = [tuple(shape[1:]) for shape in _shapes(model.output_shape)]
    if outputs != [(spec.num_classes,)]:
        raise ConfigError(
            f"{import_path} returned a model with outputs {outputs}, not one of "
            f"({spec.num_classes},): end it with Dense(input_spec.num_classes, "
            "activation='softmax')"
        )


def _shapes(shape: Any) -> list[tuple[Any, ...]]:
    return [tuple(s) for s in shape] if isinstance(shape, list) else [tuple(shape)]


def build(import_path: str, spec: InputSpec, hparams: dict[str, Any]) -> Any:
    """Calls the model function and checks what it returned (call inside the strategy's scope).

    Raises:
        ConfigError: the function is missing, raised, or returned something other than a
            model of the spec's input and output shapes.
    """
    user = resolve(import_path)
    try:
        model = user.function(spec, dict(hparams))
    except Exception as e:  # noqa: BLE001 - the user's code's failure is one line
        raise ConfigError(f"{import_path} raised {type(e).__name__}: {e}") from None
    check_model(model, import_path, spec)
    return model


def optimizer(import_path: str, learning_rate: Any, hparams: dict[str, Any]) -> Any | None:
    """The module's `build_optimizer(learning_rate, hparams)`, or None without that hook
    (call inside the strategy's scope).

    Raises:
        ConfigError: the hook raised, or returned no tf_keras optimizer.
    """
    import tf_keras as keras

    hook = resolve(import_path).build_optimizer
    if hook is None:
        return None
    name = f"{import_path.partition(SEPARATOR)[0]}.{OPTIMIZER_HOOK}"
    try:
        value = hook(learning_rate, dict(hparams))
    except Exception as e:  # noqa: BLE001 - the user's code's failure is one line
        raise ConfigError(f"{name} raised {type(e).__name__}: {e}") from None
    if not isinstance(value, keras.optimizers.Optimizer):
        raise ConfigError(
            f"{name} returned {type(value).__module__}.{type(value).__qualname__}, not a "
            "tf_keras optimizer (tf_keras.optimizers.Optimizer; the legacy ones do not fit)"
        )
    return value


def loss(import_path: str, hparams: dict[str, Any]) -> Any | None:
    """The module's `build_loss(hparams)`, or None without that hook.

    Raises:
        ConfigError: the hook raised, or returned neither a tf_keras loss nor a function.
    """
    import tf_keras as keras

    hook = resolve(import_path).build_loss
    if hook is None:
        return None
    name = f"{import_path.partition(SEPARATOR)[0]}.{LOSS_HOOK}"
    try:
        value = hook(dict(hparams))
    except Exception as e:  # noqa: BLE001 - the user's code's failure is one line
        raise ConfigError(f"{name} raised {type(e).__name__}: {e}") from None
    if not (isinstance(value, keras.losses.Loss) or callable(value)):
        raise ConfigError(f"{name} returned {value!r}, not a tf_keras loss")
    return value


def source(model: str) -> dict[str, str]:
    """The file and sha256 of a model's module by import path; empty for a built-in model."""
    return resolve(model).source() if is_import_path(model) else {}


def has_loss_hook(model: str) -> bool:
    """Whether `model` is a function by import path whose module defines `build_loss`."""
    return is_import_path(model) and resolve(model).build_loss is not None
