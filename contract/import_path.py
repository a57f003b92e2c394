"""Import paths `package.module:function`: their form, and finding the function without running it.

The train stage imports a model given this way (train.user_model); the pipeline checks it here
before it schedules anything, without importing the module (which would load TensorFlow and
run the user's code in the scheduler): the module's file is found as `import` would find it,
and its top level is read for the name.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys

SEPARATOR = ":"


class ImportPathError(ValueError):
    """An import path is malformed, its module is missing, or the module lacks the name."""


def is_import_path(text: str) -> bool:
    """Whether `text` names a function by import path rather than by a built-in name."""
    return SEPARATOR in text


def split(text: str) -> tuple[str, str]:
    """(module name, function name) of `package.module:function`.

    Raises:
        ImportPathError: the text is not of that form.
    """
    module_name, _, function_name = text.partition(SEPARATOR)
    if not all(part.isidentifier() for part in [*module_name.split("."), function_name]):
        raise ImportPathError(
            f"model {text!r} is not an import path of the form package.module:function"
        )
    return module_name, function_name


def add_working_folder() -> None:
    """Puts the current folder on sys.path (last), as `python -m` puts it (first) for the
    stages: a module beside the folder the pipeline runs from is found everywhere."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())


def not_found(module_name: str) -> ImportPathError:
    return ImportPathError(
        f"model module {module_name!r} not found: put its folder on PYTHONPATH or run from "
        "the folder that holds it"
    )


def no_function(module_name: str, function_name: str) -> ImportPathError:
    return ImportPathError(f"model module {module_name!r} has no function {function_name!r}")


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """The names a module's top level binds, and whether a star import may bind more."""
    names: set[str] = set()
    star = False
    statements: list[ast.AST] = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                star = star or alias.name == "*"
                names.add(alias.asname or alias.name.split(".")[0])
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):  # if, try, with, for
                statements.extend(getattr(node, field, []))
    return names, star


def check(text: str) -> None:
    """Finds the module of `package.module:function` and the function's name in it.

    Only the parent packages run (as `import` runs them); the module itself is read, not run.

    Raises:
        ImportPathError: the form is wrong, the module is not found, or its top level binds no
            such name.
    """
    module_name, function_name = split(text)
    found = _module_names(module_name)
    if found is None:
        return  # compiled or namespace: only importing it tells
    names, star = found
    if function_name not in names and not star:
        raise no_function(module_name, function_name)


def defines(text: str, name: str) -> bool | None:
    """Whether the module of `package.module:function` binds `name` at its top level, read
    without running it; None when only importing it could tell.

    Raises:
        ImportPathError: the form is wrong or the module is not found.
    """
    found = _module_names(split(text)[0])
    if found is None:
        return None
    names, star = found
    return True if name in names else (None if star else False)


def _module_names(module_name: str) -> tuple[set[str], bool] | None:
    """The names a module's top level binds and whether a star import may bind more, read
    from its source; None for a compiled or namespace module.

    Raises:
        ImportPathError: the module is not found, or its parent package or source fails.
    """
    add_working_folder()
    try:
        spec = importlib.util.find_spec(module_name)
    except ModuleNotFoundError:
        spec = None
    except Exception as e:  # noqa: BLE001 - a parent package's failure is one line
        raise ImportPathError(
            f"model module {module_name!r} failed to import: {type(e).__name__}: {e}"
        ) from None
    if spec is None:
        raise not_found(module_name)
    if spec.origin is None or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        try:
            tree = ast.parse(f.read(), spec.origin)
        except SyntaxError as e:
            raise ImportPathError(
                f"model module {module_name!r} failed to import: SyntaxError: {e}"
            ) from None
    return _top_level_names(tree)
