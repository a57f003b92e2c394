"""A saved model's own code: the user classes a `.keras` file names, imported from their modules.

tf_keras saves a custom layer by class name and module (`examples.my_model`) but, loading a
functional model, finds only classes registered with `register_keras_serializable` in a module
already imported, or given as `custom_objects`. Every stage that loads the train stage's
model.keras passes it `custom_objects(path)`; the module must be importable there as it was in
training (the same PYTHONPATH, or the folder the pipeline runs from).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import zipfile
from collections.abc import Iterator
from typing import Any

from contract import gfile

KERAS_CONFIG_MEMBER = "config.json"  # inside a .keras zip
BUILT_IN_MODULES = ("keras", "tf_keras", "builtins")


class ModelCodeError(ValueError):
    """A module a saved model's layers come from does not import."""


def _custom_objects(node: Any) -> Iterator[tuple[str, str, str | None]]:
    """(module, class name, registered name) of every object not from Keras in a config."""
    if isinstance(node, dict):
        module, class_name = node.get("module"), node.get("class_name")
        if (
            isinstance(module, str)
            and isinstance(class_name, str)
            and module.split(".")[0] not in BUILT_IN_MODULES
        ):
            yield module, class_name, node.get("registered_name")
        for value in node.values():
            yield from _custom_objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _custom_objects(value)


def _saved_custom_objects(model_path: str) -> list[tuple[str, str, str | None]]:
    with gfile.GFile(model_path, "rb") as f, zipfile.ZipFile(f) as archive:
        config = json.loads(archive.read(KERAS_CONFIG_MEMBER))
    return sorted(set(_custom_objects(config)), key=str)


def model_modules(model_path: str) -> list[str]:
    """The modules, other than Keras's own, that the `.keras` file's objects come from."""
    return sorted({module for module, _, _ in _saved_custom_objects(model_path)})


def custom_objects(model_path: str) -> dict[str, Any]:
    """The user classes a saved model's layers are made of, imported from their modules, by
    class name and registered name: `tf_keras.models.load_model`'s `custom_objects`.

    Raises:
        ModelCodeError: naming the module that does not import, or the class it lacks.
    """
    found: dict[str, Any] = {}
    entries = _saved_custom_objects(model_path)
    if entries and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # where `python -m` stages found it in training
    for module_name, class_name, registered_name in entries:
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # noqa: BLE001 - whatever the user's code raises is one line
            raise ModelCodeError(
                f"{model_path} has layers from module {module_name!r}, which does not import "
                f"here ({type(e).__name__}: {e}): put its folder on PYTHONPATH, or run from "
                "the folder that holds it, as in training"
            ) from None
        value: Any = module
        for part in class_name.split("."):
            value = getattr(value, part, None)
        if value is None:
            raise ModelCodeError(
                f"{model_path} has a layer {class_name!r} that module {module_name!r} no "
                "longer defines: load it with the code it was trained with"
            )
        found[class_name] = value
        if registered_name:
            found[registered_name] = value
    return found
