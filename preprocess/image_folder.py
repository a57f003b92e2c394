"""The image-folder adapter: `ROOT/<class name>/*.png|jpg` (or `ROOT/<split>/<class name>/...`).

Classes are the sorted class folder names, as `tf.keras.utils.image_dataset_from_directory`
and TFDS's `ImageFolder` take them; with split folders, the sorted union over the splits. A
flat tree is one split, `train`. Paths are read through tf.io.gfile, so ROOT may be gs://.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections.abc import Iterator

import tensorflow as tf

from contract import layout, records
from preprocess.errors import BadInputError
from preprocess.images import ImageShaper, decode

ADAPTER = "imagefolder"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
FLAT_SPLIT = "train"
READ_THREADS = 16  # files fetched at once by a reader (object stores answer slowly, in parallel)
READ_WINDOW = 256  # files held in memory at once by a reader

Listing = dict[str, list[tuple[str, int]]]  # split -> [(image path, class index)], in order


def _subfolders(folder: str) -> list[str]:
    return sorted(
        name.rstrip("/")
        for name in tf.io.gfile.listdir(folder)
        if tf.io.gfile.isdir(layout.join(folder, name.rstrip("/")))
    )


def _images(folder: str) -> list[str]:
    return sorted(
        layout.join(folder, name)
        for name in tf.io.gfile.listdir(folder)
        if name.lower().endswith(IMAGE_EXTENSIONS)
    )


def list_folder(root: str) -> tuple[Listing, list[str]]:
    """Every image of the tree by split, and the class names.

    The tree is flat (`ROOT/<class>/<image>`, one split `train`) when a folder under ROOT holds
    images itself, and split by folder (`ROOT/<split>/<class>/<image>`) otherwise.

    Raises:
        BadInputError: ROOT is missing, holds no images, or has fewer than two classes.
    """
    root = root.rstrip("/")
    if not tf.io.gfile.isdir(root):
        raise BadInputError(f"image folder {root} does not exist (or is not a folder)")
    top = _subfolders(root)
    flat = any(_images(layout.join(root, name)) for name in top)
    trees = {FLAT_SPLIT: root} if flat else {split: layout.join(root, split) for split in top}
    by_split = {split: {c: _images(layout.join(tree, c)) for c in _subfolders(tree)}
                for split, tree in trees.items()}  # fmt: skip
    class_names = sorted({c for classes in by_split.values() for c in classes})
    if not any(paths for classes in by_split.values() for paths in classes.values()):
        raise BadInputError(
            f"image folder {root} holds no {'/'.join(IMAGE_EXTENSIONS)} images: lay it out as "
            f"{root}/<class name>/<image> (or {root}/<split>/<class name>/<image>)"
        )
    if len(class_names) < 2:
        raise BadInputError(
            f"image folder {root} has {len(class_names)} class folder "
            f"({', '.join(repr(c) for c in class_names)}): a classifier needs at least two, "
            f"one folder per class ({root}/<class name>/<image>)"
        )
    index = {name: i for i, name in enumerate(class_names)}
    listing = {
        split: [(path, index[c]) for c, paths in sorted(classes.items()) for path in paths]
        for split, classes in by_split.items()
    }
    return {split: files for split, files in listing.items() if files}, class_names


def listing_version(listing: Listing) -> str:
    """A version for the manifest: the count and a digest of the listed paths and labels."""
    digest = hashlib.sha256()
    for split, files in sorted(listing.items()):
        for path, label in files:
            digest.update(f"{split}\0{path}\0{label}\n".encode())
    total = sum(len(files) for files in listing.values())
    return f"{total} files, listing sha256 {digest.hexdigest()[:16]}"


def read_bytes(path: str) -> bytes:
    """A file's bytes (local or gs://)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def reference_image(listing: Listing, train_split: str) -> tuple[str, list[int]]:
    """The first image of the train split (or of the first split) and its [H, W, C]."""
    split = train_split if train_split in listing else sorted(listing)[0]
    path = listing[split][0][0]
    return path, list(decode(read_bytes(path), 0, path).shape)


class ImageFolderReader:
    """Reads a range of one split's listed images as encoded records.

    Files are fetched by a pool of threads and decoded in order; every image is decoded with
    the reference image's channels (a grey PNG among RGB ones is made RGB) and brought to the
    set's size by `shaper`.
    """

    def __init__(self, listing: Listing, shaper: ImageShaper, batch_size: int):
        self._listing = listing
        self._shaper = shaper
        self._batch_size = batch_size

    def setup(self) -> None:
        pass

    def read_range(self, split: str, start: int, end: int) -> Iterator[list[bytes]]:
        files = self._listing[split][start:end]
        channels = self._shaper.shape[2]
        batch: list[bytes] = []
        with concurrent.futures.ThreadPoolExecutor(READ_THREADS) as pool:
            for begin in range(0, len(files), READ_WINDOW):
                window = files[begin : begin + READ_WINDOW]
                fetched = pool.map(read_bytes, [path for path, _ in window])
                for (path, label), data in zip(window, fetched, strict=True):
                    image = self._shaper.conform(decode(data, channels, path), path)
                    batch.append(records.encode_example(image, label))
                    if len(batch) == self._batch_size:
                        yield batch
                        batch = []
        if batch:
            yield batch
