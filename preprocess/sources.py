"""Preparing a TFDS dataset offline from manually placed files checked against recorded sums."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib
import inspect
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums

from contract import atomic
from preprocess import scaled_dataset
from preprocess.errors import BadInputError, PreprocessError

SOURCES_DIR = pathlib.Path(__file__).resolve().parent / "sources"
PREPARE_LOCK = ".prepare.lock"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What the stage needs to know about a prepared image-classification dataset."""

    name: str
    version: str
    dataset_dir: str
    image_key: str
    label_key: str
    image_shape: list[int]
    class_names: list[str]
    split_sizes: dict[str, int]
    adapter: str = "tfds"


def recorded_checksums_path(dataset: str) -> str:
    """The project's sums file for a dataset's manual files (`sources/<dataset>.sha256`).

    A builder that is made from another dataset's files names it in `SOURCE_SUMS`
    (`fashion_mnist_scaled/x10` uses `sources/fashion_mnist.sha256`).
    """
    name = split_name(dataset)[0]
    with contextlib.suppress(PreprocessError):
        cls = builder_class(dataset)
        name = getattr(cls, "SOURCE_SUMS", cls.name)
    return str(SOURCES_DIR / f"{name}.sha256")


def split_name(dataset: str) -> tuple[str, str | None]:
    """'name/config' into (name, config); config is None for a plain name."""
    name, _, config = dataset.partition("/")
    return name, config or None


def read_sums_file(path: str) -> dict[str, str]:
    """Reads a `sha256sum`-format file into {file name: hex sha256}.

    Raises:
        PreprocessError: the file is missing or a line is malformed.
    """
    if not tf.io.gfile.exists(path):
        raise PreprocessError(f"checksum file not found: {path} (record the manual files' sums)")
    sums: dict[str, str] = {}
    with tf.io.gfile.GFile(path, "r") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2 or len(parts[0]) != 64:
                raise PreprocessError(f"{path}:{number}: expected '<sha256>  <file name>'")
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


def verify_manual_files(manual_dir: str, sums: dict[str, str], sums_path: str) -> dict[str, int]:
    """Checks every recorded file in `manual_dir` against its sum; returns {file name: size}.

    Raises:
        PreprocessError: naming the first file that is missing or differs.
    """
    sizes = {}
    for name, expected in sorted(sums.items()):
        path = os.path.join(manual_dir, name)
        if not tf.io.gfile.exists(path):
            raise PreprocessError(
                f"source file missing: {path} (run `make dataset` or point --manual_dir at it)"
            )
        digest = atomic.sha256_file(path)
        if digest != expected:
            raise PreprocessError(
                f"source file checksum mismatch: {path} has sha256 {digest}, "
                f"{sums_path} records {expected}"
            )
        sizes[name] = tf.io.gfile.stat(path).length
    return sizes


def builder_class(dataset: str) -> type[Any]:
    """The TFDS builder class of `dataset`: a registered 'name' or 'name/config', or a user's
    builder imported by path, 'tfds:my_pkg.my_module[:MyBuilder][/config]'.

    Raises:
        BadInputError: no TFDS dataset has that name, or the path names no builder.
    """
    name = split_name(dataset)[0]
    if name.startswith("tfds:"):
        return _imported_builder(name.removeprefix("tfds:"))
    try:
        return tfds.builder_cls(name)
    except tfds.core.registered.DatasetNotFoundError:
        raise BadInputError(
            f"unknown TFDS dataset '{name}': check the name in the TFDS catalog "
            "(tfds.list_builders()), or name your own builder as tfds:my_pkg.my_module"
        ) from None


def _imported_builder(path: str) -> type[Any]:
    """The builder class at 'my_pkg.my_module' (its only one) or 'my_pkg.my_module:MyBuilder'.

    Raises:
        BadInputError: the module does not import, or holds no such builder.
    """
    module_name, _, class_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's module's
        raise BadInputError(
            f"cannot import the TFDS builder module '{module_name}': {type(e).__name__}: {e} "
            "(is it on PYTHONPATH?)"
        ) from None
    builders = {
        name: value
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, tfds.core.DatasetBuilder)
        and value.__module__ == module.__name__
    }
    if class_name:
        if class_name not in builders:
            raise BadInputError(
                f"module '{module_name}' has no TFDS builder class '{class_name}' "
                f"(its builders: {', '.join(sorted(builders)) or 'none'})"
            )
        return builders[class_name]
    if len(builders) != 1:
        raise BadInputError(
            f"module '{module_name}' defines {len(builders)} TFDS builders "
            f"({', '.join(sorted(builders)) or 'none'}): name one as "
            f"tfds:{module_name}:<BuilderClass>"
        )
    return next(iter(builders.values()))


def _builder_kwargs(cls: type[Any], dataset: str) -> dict[str, Any]:
    """The `config=` a builder of `dataset` is made with (none for a plain name).

    Raises:
        PreprocessError: the dataset has no such config, or needs one and none is named.
    """
    name, config = split_name(dataset)
    if cls is scaled_dataset.FashionMnistScaled and config is None:
        raise PreprocessError(
            f"'{name}' needs a scale: name it '{name}/x<N>' (x1 = 60,000 train examples, "
            "x10, x100 or any whole N)"
        )
    if config is None:
        return {}
    if cls.get_builder_config(config.split(":")[0]) is None:
        known = ", ".join(sorted(cls.builder_configs)) or "none"
        raise BadInputError(
            f"TFDS dataset '{name}' has no config '{config}' (its configs: {known}): "
            f"pass --dataset {name}/<config>"
        )
    return {"config": config}


def _offline_builder(
    cls: type[Any], manual_dir: str, sums_path: str, data_dir: str, kwargs: dict[str, Any]
) -> Any:
    """A builder of `cls` whose download checksums are the project's recorded ones.

    The subclass is never registered, so nothing global (TFDS's registry, its checksum files in
    site-packages) changes; TFDS still checks every file against the sums we hand it.
    """
    sums = read_sums_file(sums_path)
    sizes = verify_manual_files(manual_dir, sums, sums_path)
    url_infos = {}
    for url, info in cls.url_infos.items():
        filename = info.filename or url.rsplit("/", 1)[-1]
        if filename not in sums:
            raise PreprocessError(f"{sums_path} records no sum for {filename}, which TFDS needs")
        url_infos[url] = checksums.UrlInfo(
            size=tfds.core.units.Size(sizes[filename]), checksum=sums[filename], filename=filename
        )
    local_cls = type(
        cls.__name__,
        (cls,),
        {"name": cls.name, "url_infos": url_infos, "__module__": cls.__module__},
        skip_registration=True,
    )
    return local_cls(data_dir=data_dir, **kwargs)


def prepare_dataset(
    dataset: str,
    data_dir: str,
    manual_dir: str | None = None,
    manual_checksums: str | None = None,
) -> Any:
    """Builds `dataset` into `data_dir` with TFDS's own builder, reusing it when already there.

    Runs on one machine that build the same local `data_dir` at once take turns: the first
    builds, the others reuse what it built.

    Args:
        dataset: TFDS dataset name, e.g. 'fashion_mnist', or 'name/config' such as
            'fashion_mnist_scaled/x10'.
        data_dir: TFDS data folder.
        manual_dir: folder with the dataset's downloaded files; None downloads through TFDS.
        manual_checksums: sha256sum-format file with the manual files' sums; default
            `preprocess/sources/<dataset>.sha256`.

    Returns:
        The prepared TFDS builder.

    Raises:
        PreprocessError: unknown dataset, missing or mismatching source files.
    """
    cls = builder_class(dataset)
    kwargs = _builder_kwargs(cls, dataset)
    builder = cls(data_dir=data_dir, **kwargs)
    if builder.is_prepared():
        return builder
    with _prepare_lock(data_dir):
        builder = cls(data_dir=data_dir, **kwargs)
        if builder.is_prepared():  # built by the run that held the lock before us
            return builder
        return _build(builder, kwargs, dataset, data_dir, manual_dir, manual_checksums)


@contextlib.contextmanager
def _prepare_lock(data_dir: str) -> Iterator[None]:
    """Holds `<data_dir>/.prepare.lock` while a dataset is built there.

    Two runs building one dataset at once (two FullRuns on a fresh cache) would race in TFDS's
    rename of its temporary folder and one would fail. The lock is a `flock`, freed by the
    kernel however its holder ends, and it holds per machine: a gs:// data_dir is not locked.
    """
    if "://" in data_dir:
        yield
        return
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, PREPARE_LOCK), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(
    builder: Any,
    kwargs: dict[str, Any],
    dataset: str,
    data_dir: str,
    manual_dir: str | None,
    manual_checksums: str | None,
) -> Any:
    """Builds `dataset` into `data_dir` (see `prepare_dataset`); returns the prepared builder."""
    cls = type(builder)
    built_from_manual_files = not cls.url_infos and cls.MANUAL_DOWNLOAD_INSTRUCTIONS
    if not manual_dir:
        if built_from_manual_files:
            raise PreprocessError(
                f"TFDS dataset '{dataset}' is built from files placed by hand: pass "
                f"--manual_dir ({cls.MANUAL_DOWNLOAD_INSTRUCTIONS.strip()})"
            )
        builder.download_and_prepare()
        return builder
    sums_path = manual_checksums or recorded_checksums_path(dataset)
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
    if built_from_manual_files:
        # TFDS does not check manual files itself: the recorded sums are checked here.
        verify_manual_files(manual_dir, read_sums_file(sums_path), sums_path)
        builder.download_and_prepare(download_config=download_config)
        return builder
    if not cls.url_infos:
        raise PreprocessError(
            f"TFDS dataset '{dataset}' does not declare its download files; "
            "run without --manual_dir so TFDS downloads it"
        )
    offline = _offline_builder(cls, manual_dir, sums_path, data_dir, kwargs)
    offline.download_and_prepare(download_config=download_config)
    return cls(data_dir=data_dir, **kwargs)


def dataset_name(builder: Any) -> str:
    """The name `--dataset` takes for this builder: 'name', or 'name/config' when it has one."""
    config = builder.builder_config
    return f"{builder.name}/{config.name}" if config is not None else str(builder.name)


def describe(builder: Any) -> DatasetSpec:
    """The spec of a prepared builder whose features are one image and one class label.

    Raises:
        PreprocessError: the dataset is not image classification with a fixed image shape.
    """
    features = builder.info.features
    images = [k for k, v in features.items() if isinstance(v, tfds.features.Image)]
    labels = [k for k, v in features.items() if isinstance(v, tfds.features.ClassLabel)]
    name = dataset_name(builder)
    if len(images) != 1 or len(labels) != 1:
        raise BadInputError(
            f"TFDS dataset '{name}' is not image classification: this stage needs exactly one "
            f"Image and one ClassLabel feature, it has {sorted(features.keys())}"
        )
    shape = list(features[images[0]].shape)
    if any(d is None for d in shape):
        raise BadInputError(
            f"TFDS dataset '{name}' has images of variable shape {shape}: "
            "pick a dataset with a fixed image shape"
        )
    dataset_dir = str(builder.data_dir)
    if "://" not in dataset_dir:
        # Beam workers may run in another working directory.
        dataset_dir = os.path.abspath(dataset_dir)
    return DatasetSpec(
        name=name,
        version=str(builder.info.version),
        dataset_dir=dataset_dir,
        image_key=images[0],
        label_key=labels[0],
        image_shape=[int(d) for d in shape],
        class_names=list(features[labels[0]].names),
        split_sizes={k: int(v.num_examples) for k, v in builder.info.splits.items()},
    )
