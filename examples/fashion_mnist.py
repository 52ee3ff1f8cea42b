"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (offline, no downloads).

The package ships the four original IDX gz files under ``/usr/share/datasets/fashion-mnist``
(see docs/spec/offline-assets.md, "Fashion-MNIST"). ``AMCT_FASHION_MNIST_DIR`` points elsewhere.
"""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import torch

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
ENV_VAR = "AMCT_FASHION_MNIST_DIR"

# Statistics of x/255 over the training images (docs/spec/offline-assets.md).
MEAN = 0.2860
STD = 0.3530

CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IDX_UBYTE = 0x08  # IDX type code for unsigned bytes; the only one Fashion-MNIST uses


def fashion_mnist_dir(root: str | os.PathLike | None = None) -> Path:
    """The data folder: ``root`` if given, else ``$AMCT_FASHION_MNIST_DIR``, else the Debian path."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get(ENV_VAR) or FASHION_MNIST_DIR)


def fashion_mnist_available(root: str | os.PathLike | None = None) -> bool:
    """True when all four IDX gz files are present (contents are not checked)."""
    folder = fashion_mnist_dir(root)
    return all((folder / name).is_file() for pair in _FILES.values() for name in pair)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read a gzip-compressed IDX file of unsigned bytes, checking magic, dims and byte count.

    Raises ``ValueError`` naming the file when it is truncated, not gzip, or not a uint8 IDX file.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise
    except (EOFError, OSError, zlib.error) as exc:
        # A truncated gzip stream raises EOFError; a non-gzip file raises BadGzipFile (an OSError).
        raise ValueError(f"{path}: not a readable gzip IDX file ({exc})") from exc
    if len(data) < 4:
        raise ValueError(f"{path}: IDX header truncated ({len(data)} bytes)")
    if data[0] != 0 or data[1] != 0 or data[2] != _IDX_UBYTE:
        raise ValueError(f"{path}: bad IDX magic {data[:4].hex()} (expected 000008NN, uint8 data)")
    ndim = data[3]
    if not 1 <= ndim <= 4:
        raise ValueError(f"{path}: IDX header declares {ndim} dimensions (expected 1..4)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: IDX header truncated ({len(data)} bytes, need {header})")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = int(np.prod(dims))
    actual = len(data) - header
    if actual != expected:
        raise ValueError(
            f"{path}: IDX payload has {actual} bytes but dims {dims} need {expected} (truncated or corrupt)"
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def _load_arrays(folder: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    # The file stamps are part of the cache key so a rewritten file is parsed again.
    stamps = tuple(os.stat(os.path.join(folder, name)).st_mtime_ns for name in _FILES[split])
    return _parse_split(folder, split, stamps)


@functools.lru_cache(maxsize=8)
def _parse_split(folder: str, split: str, stamps: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    del stamps  # cache key only
    image_name, label_name = _FILES[split]
    images = read_idx(os.path.join(folder, image_name))
    labels = read_idx(os.path.join(folder, label_name))
    image_file = os.path.join(folder, image_name)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"{image_file}: expected images of shape [N, 28, 28], got {list(images.shape)}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(f"{os.path.join(folder, label_name)}: {labels.shape[0]} labels for {images.shape[0]} images")
    if labels.size and int(labels.max()) >= len(CLASSES):
        raise ValueError(f"{os.path.join(folder, label_name)}: label {int(labels.max())} out of range 0..9")
    return images, labels


def load_fashion_mnist(
    split: str = "train",
    limit: int | None = None,
    root: str | os.PathLike | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load a Fashion-MNIST split as ``(images, labels)``.

    ``images`` is float32 ``[N, 1, 28, 28]``, normalised as ``(x/255 - 0.2860) / 0.3530``;
    ``labels`` is int64 ``[N]``. ``limit`` keeps the first ``limit`` samples (file order).
    Parsed arrays are cached per process; the returned tensors are fresh each call.
    """
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    folder = fashion_mnist_dir(root)
    missing = [name for name in _FILES[split] if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {folder} (missing {', '.join(missing)}); "
            f"install it with `apt-get install dataset-fashion-mnist` or set {ENV_VAR}"
        )
    images, labels = _load_arrays(str(folder.resolve()), split)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32))
    x = x.div_(255.0).sub_(MEAN).div_(STD).unsqueeze_(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y
