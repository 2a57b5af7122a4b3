"""Fashion-MNIST for the baseline scripts: found where `nanoddp train` looks, read from IDX files.

The search order is nanoddp's own (src/data/locate.rs), so a baseline and nanoddp beside it
read the same files: the folder named by --data, else by $NANODDP_DATA (then the only folder
considered), else Debian's /usr/share/datasets/fashion-mnist (`apt-get install
dataset-fashion-mnist`), else ./data/fashion-mnist. Each file may be gzipped (`name.gz`) or not.
Unlike nanoddp, there is no fallback to the small subset in tests/data/: a baseline that
quietly trained on 1% of the data would print misleading figures (name the subset with
--data to use it on purpose).
"""

import gzip
import os
import struct

import numpy as np

DATA_ENV = "NANODDP_DATA"
SYSTEM_FOLDERS = ["/usr/share/datasets/fashion-mnist", "data/fashion-mnist"]
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


class DataNotFound(Exception):
    """No folder holding the four files; the message says where it looked and how to fix it."""


def _file(folder, name):
    for path in (os.path.join(folder, name + ".gz"), os.path.join(folder, name)):
        if os.path.isfile(path):
            return path
    return None


def _complete(folder):
    return all(_file(folder, name) for name in FILES.values())


def locate(explicit=None):
    """The data folder: `explicit` (from --data), else $NANODDP_DATA, else the system folders."""
    named = explicit or os.environ.get(DATA_ENV) or None
    if named:
        how = f"--data {named}" if explicit else f"{DATA_ENV}={named}"
        if not _complete(named):
            missing = [n for n in FILES.values() if not _file(named, n)]
            raise DataNotFound(f"{how}: no {', '.join(missing)} (.gz or uncompressed) there")
        return named
    for folder in SYSTEM_FOLDERS:
        if _complete(folder):
            return folder
    raise DataNotFound(f"Fashion-MNIST not found in {' or '.join(SYSTEM_FOLDERS)}: "
                       f"apt-get install dataset-fashion-mnist, or pass --data DIR / set {DATA_ENV}")


def read_idx(path):
    """An unsigned-byte IDX file (gzipped or not) as a numpy uint8 array of its own shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4:
        raise ValueError(f"{path}: too short for an IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    offset = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(raw) - offset != count:
        raise ValueError(f"{path}: expected {count} payload bytes, found {len(raw) - offset}")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def load(folder):
    """{'train_images': uint8 [N, 28, 28], 'train_labels': uint8 [N], 'test_images', 'test_labels'}."""
    return {key: read_idx(_file(folder, name)) for key, name in FILES.items()}
