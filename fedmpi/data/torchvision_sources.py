"""The MNIST family and CIFAR, read from `data.root` in their official on-disk formats.

fedmpi parses the files itself and never lets a data file run code:
- MNIST, Fashion-MNIST, EMNIST: the uncompressed idx-ubyte files under `ROOT/<Name>/raw/`, parsed here
  (magic, sizes, length checked). torchvision's classes are not used for reading, because they prefer
  legacy `processed/*.pt` files (read with torch.load) over `raw/` when both exist.
- CIFAR-10/100: the python batches are pickles. They are read by `_BatchUnpickler`, which resolves only
  the numpy names an array's pickle refers to (array reconstruction, ndarray, dtype) and a latin-1-only
  stand-in for `_codecs.encode` (how Python 3 writes bytes at protocol 2); any other global (os.system,
  builtins.eval, ...) is refused before it is called, so a crafted batch cannot run code. The official
  MD5 sums are not checked, by choice: copies that differ byte-wise from the official archive (and the
  small files the tests write) load too, and with the restricted reader a file that is not what it
  claims can only fail to load. The data is then checked: uint8 pixels (so no NaN), 3072 per image,
  one integer label per image.
torchvision is used only to download (`data.download: true`), where it checks the archives' MD5 sums.
Images become normalised float32 N x C x H x W in one vectorised step (never per sample through PIL).
Where files are missing the error lists exactly which files were expected where, and how to get them.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.input_files import check_input, open_input
from fedmpi.data.cifar_batches import read_cifar_batch
from fedmpi.data.dataset import Dataset
from fedmpi.mpi.topology import share_of

# Per-channel mean and standard deviation of each training set (pixel values scaled to [0, 1]).
NORMALISATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "emnist": ((0.1751,), (0.3332,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
EMNIST_SPLITS = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10}
IDX_UBYTE = 0x08        # the idx type code of unsigned bytes, the only one the official files use
MNIST_SIDE = 28


def _normalise(images_nchw_uint8, name):
    """uint8 N x C x H x W (any strides) -> contiguous float32 (x / 255 - mean_c) / std_c. Done in place with
    torch's vectorised kernels: a data set of 60,000 images takes well under a second."""
    import torch

    mean, std = (torch.tensor(v, dtype=torch.float32).view(1, -1, 1, 1) for v in NORMALISATION[name])
    out = torch.empty(images_nchw_uint8.shape, dtype=torch.float32)
    out.copy_(torch.from_numpy(images_nchw_uint8))
    return out.div_(255.0).sub_(mean).div_(std).numpy()


def _require_root(data, layout):
    root = data.root
    if not root:
        raise InputError(f"data.root is not set: data.name = {data.name!r} reads its files from a folder "
                         f"laid out as {layout}; set data.root to that folder (with data.download: true "
                         f"torchvision fetches the files there where a network exists)")
    return root


def _missing(folder, names):
    return [n for n in names if not os.path.isfile(os.path.join(folder, n))]


def _check_files(data, folder, names, how):
    """Lists every expected file that is missing, so the user sees all of them at once; one that is there but
    not a regular file (a FIFO, a link to a device) is refused by name."""
    for name in names:
        path = os.path.join(folder, name)
        if os.path.exists(path) and not os.path.isdir(path):
            check_input(path, f"{path} (under data.root = {show(data.root, 300)})")
    missing = _missing(folder, names)
    if missing:
        raise InputError(f"data.name = {data.name!r}: expected {', '.join(missing)} in {folder} "
                         f"(data.root = {show(data.root, 300)}); {how}")


def _download(name, folder, how, fetch):
    """Runs torchvision's download (`fetch()`) when data.download is on and files are missing."""
    try:
        fetch()
    except Exception as e:  # noqa: BLE001 - torchvision raises many types for network and archive problems
        raise InputError(f"data.name = {name!r}: download into {folder} failed: {type(e).__name__}: "
                         f"{str(e)[:300]}; {how}") from None


# --- the MNIST family (idx-ubyte files) -------------------------------------------------------------

MNIST_HOW = ("set data.download: true on a machine with network (torchvision fetches the files there), or copy "
             "the uncompressed idx files there")


def _idx_header(path, ndim):
    """(shape, data offset) from an idx file's header alone (`_check_idx`)."""
    try:
        with open_input(path, f"{path} (under data.root)") as fh:
            head = fh.read(4 + 4 * ndim)
            size = os.fstat(fh.fileno()).st_size
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    return _check_idx(path, head, size, ndim)


def _check_idx(path, head, size, ndim):
    """(shape, data offset) from the first bytes `head` of an idx file of `size` bytes, checked: the idx magic,
    unsigned bytes in `ndim` dimensions, and a length that matches the header."""
    if len(head) < 4 or head[:2] != b"\0\0":
        raise InputError(f"{path}: not an idx file (it must start with two zero bytes, a type code and the "
                         f"number of dimensions); {MNIST_HOW}")
    if head[2] != IDX_UBYTE or head[3] != ndim:
        raise InputError(f"{path}: idx type 0x{head[2]:02x} with {head[3]} dimensions; expected unsigned bytes "
                         f"(0x08) with {ndim} dimensions as in the official files")
    header = 4 + 4 * ndim
    if len(head) < header:
        raise InputError(f"{path}: truncated idx header")
    shape = struct.unpack(f">{ndim}I", head[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    if size - header != expected:
        raise InputError(f"{path}: its header announces {shape} = {expected} bytes of data, the file holds "
                         f"{size - header}; the file is truncated or not an idx file")
    return shape, header


def read_idx(path, ndim):
    """The uint8 array of an idx file with `ndim` dimensions; InputError naming the file otherwise."""
    try:
        with open_input(path, f"{path} (under data.root)") as fh:
            data = bytearray(os.fstat(fh.fileno()).st_size)     # writable, so torch can take the array as is
            data = data[: fh.readinto(data)]
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    shape, offset = _check_idx(path, bytes(data[: 4 + 4 * ndim]), len(data), ndim)
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def _idx_pair(folder, images_name, labels_name):
    images = read_idx(os.path.join(folder, images_name), 3)
    labels = read_idx(os.path.join(folder, labels_name), 1)
    if images.shape[1:] != (MNIST_SIDE, MNIST_SIDE):
        raise InputError(f"{os.path.join(folder, images_name)}: images are {images.shape[1]}x{images.shape[2]}, "
                         f"expected {MNIST_SIDE}x{MNIST_SIDE}")
    if len(images) != len(labels):
        raise InputError(f"{folder}: {images_name} holds {len(images)} images but {labels_name} "
                         f"{len(labels)} labels")
    return images, labels.astype(np.int64)


def _idx_dataset(data, cls_name, subdir, names, transpose=False, **kwargs):
    root = _require_root(data, f"DATA_ROOT/{subdir}/raw/{names[0]}, ...")
    folder = os.path.join(root, subdir, "raw")
    if data.download and _missing(folder, names):
        _download(data.name, folder, MNIST_HOW, lambda: _torchvision_fetch(cls_name, root, **kwargs))
    _check_files(data, folder, names, MNIST_HOW)
    train_x, train_y = _idx_pair(folder, names[0], names[1])
    test_x, test_y = _idx_pair(folder, names[2], names[3])

    def images(x):
        x = x[:, None]
        # EMNIST's files store each image transposed; swap back so that letters stand upright.
        return _normalise(x.transpose(0, 1, 3, 2) if transpose else x, data.name)

    return images(train_x), train_y, images(test_x), test_y


def _torchvision_fetch(cls_name, root, **attrs):
    """torchvision's own download of an MNIST-family data set into ROOT/<Name>/raw (MD5-checked archives),
    without its constructor, which would then read the files (or legacy processed/*.pt) itself."""
    import torchvision.datasets as tvd

    cls = getattr(tvd, cls_name)
    ds = cls.__new__(cls)
    ds.root = os.path.expanduser(root)
    for k, v in attrs.items():
        setattr(ds, k, v)
    ds.download()


def mnist(data) -> Dataset:
    arrays = _idx_dataset(data, "MNIST", "MNIST", IDX_FILES)
    return Dataset("mnist", *arrays, num_classes=10)


def fashion_mnist(data) -> Dataset:
    arrays = _idx_dataset(data, "FashionMNIST", "FashionMNIST", IDX_FILES)
    return Dataset("fashion_mnist", *arrays, num_classes=10)


def _emnist_names(split):
    if split not in EMNIST_SPLITS:
        raise ConfigError(f"data.split = {show(split)}: EMNIST has the splits {', '.join(EMNIST_SPLITS)}")
    return tuple(f"emnist-{split}-{part}-{kind}-ubyte" for part in ("train", "test")
                 for kind in ("images-idx3", "labels-idx1"))


def emnist(data) -> Dataset:
    split = data.split
    arrays = _idx_dataset(data, "EMNIST", "EMNIST", _emnist_names(split), transpose=True, split=split)
    return Dataset("emnist", *arrays, num_classes=EMNIST_SPLITS[split])


# --- the MNIST family written straight into a node's shared arrays (fedmpi.data.shared) ------------------

IDX_FAMILY = {
    # name: (folder under data.root, file names (train images, labels, test images, labels), transposed, classes)
    "mnist": lambda data: ("MNIST", IDX_FILES, False, 10),
    "fashion_mnist": lambda data: ("FashionMNIST", IDX_FILES, False, 10),
    "emnist": lambda data: ("EMNIST", _emnist_names(data.split), True, EMNIST_SPLITS[data.split]),
}
IDX_CHUNK = 8192        # images normalised at a time while filling: a few MB of temporary memory


def _idx_files(data):
    """(folder, names, transposed, classes) of an MNIST-family source whose files are all there."""
    subdir, names, transposed, classes = IDX_FAMILY[data.name](data)
    root = _require_root(data, f"DATA_ROOT/{subdir}/raw/{names[0]}, ...")
    folder = os.path.join(root, subdir, "raw")
    _check_files(data, folder, names, MNIST_HOW)
    return folder, names, transposed, classes


def idx_streamable(data):
    """The files are there (a download, which `data.download` may ask for, goes through the loader)."""
    if not data.root:
        return False
    subdir, names, _, _ = IDX_FAMILY[data.name](data)
    return not _missing(os.path.join(data.root, subdir, "raw"), names)


def idx_specs(data) -> dict:
    """The arrays of an MNIST-family source (as `dataset.from_arrays` names them), from the files' headers."""
    folder, names, _, _ = _idx_files(data)
    (n_train, h, w), _ = _idx_header(os.path.join(folder, names[0]), 3)
    (n_test, h2, w2), _ = _idx_header(os.path.join(folder, names[2]), 3)
    for path, (side_h, side_w) in ((names[0], (h, w)), (names[2], (h2, w2))):
        if (side_h, side_w) != (MNIST_SIDE, MNIST_SIDE):
            raise InputError(f"{os.path.join(folder, path)}: images are {side_h}x{side_w}, expected "
                             f"{MNIST_SIDE}x{MNIST_SIDE}")
    for images, labels, count in ((names[0], names[1], n_train), (names[2], names[3], n_test)):
        (n_labels,), _ = _idx_header(os.path.join(folder, labels), 1)
        if n_labels != count:
            raise InputError(f"{folder}: {images} holds {count} images but {labels} {n_labels} labels")
    side = (1, MNIST_SIDE, MNIST_SIDE)
    return {"x_train": ((n_train, *side), np.float32), "y_train": ((n_train,), np.int64),
            "x_test": ((n_test, *side), np.float32), "y_test": ((n_test,), np.int64),
            "users_index": ((0,), np.int64), "users_offsets": ((0,), np.int64), "num_classes": ((1,), np.int64)}


def idx_fill(data, arrays, part, parts):
    """Part `part` of `parts` reads its share of the rows of each file and normalises them in place, chunk by
    chunk, with `_normalise`'s operations (so every value equals the whole-file loader's)."""
    import torch

    folder, names, transposed, classes = _idx_files(data)
    mean, std = (torch.tensor(v, dtype=torch.float32).view(1, -1, 1, 1) for v in NORMALISATION[data.name])
    for x_name, y_name, images, labels in (("x_train", "y_train", names[0], names[1]),
                                           ("x_test", "y_test", names[2], names[3])):
        x, y = arrays[x_name], arrays[y_name]
        _, offset = _idx_header(os.path.join(folder, images), 3)
        lo, hi = share_of(len(x), part, parts)
        for start in range(lo, hi, IDX_CHUNK):
            stop = min(hi, start + IDX_CHUNK)
            check_input(os.path.join(folder, images), f"{os.path.join(folder, images)} (under data.root)")
            raw = np.fromfile(os.path.join(folder, images), dtype=np.uint8, count=(stop - start) * MNIST_SIDE ** 2,
                              offset=offset + start * MNIST_SIDE ** 2).reshape(-1, 1, MNIST_SIDE, MNIST_SIDE)
            out = torch.from_numpy(x[start:stop])
            out.copy_(torch.from_numpy(raw.transpose(0, 1, 3, 2) if transposed else raw))
            out.div_(255.0).sub_(mean).div_(std)
        _, offset = _idx_header(os.path.join(folder, labels), 1)
        lo, hi = share_of(len(y), part, parts)
        check_input(os.path.join(folder, labels), f"{os.path.join(folder, labels)} (under data.root)")
        y[lo:hi] = np.fromfile(os.path.join(folder, labels), dtype=np.uint8, count=hi - lo, offset=offset + lo)
    if part == 0:
        arrays["num_classes"][:] = classes


# --- CIFAR (python pickled batches, read by the restricted unpickler of fedmpi.data.cifar_batches) -----------

CIFAR = {
    # name: (folder, train files, test files, label key, classes, torchvision class (for its download))
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels", 10,
                "CIFAR10"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", 100, "CIFAR100"),
}
CIFAR_SITE = "https://www.cs.toronto.edu/~kriz/"


def _cifar(data) -> Dataset:
    subdir, train_files, test_files, label_key, classes, cls_name = CIFAR[data.name]
    names = tuple(train_files + test_files)
    root = _require_root(data, f"DATA_ROOT/{subdir}/{names[0]}, ...")
    folder = os.path.join(root, subdir)
    archive = data.name.replace("cifar", "cifar-") + "-python.tar.gz"
    how = (f"set data.download: true on a machine with network, or unpack {archive} ({CIFAR_SITE}{archive}) in "
           f"data.root, which creates {subdir}/")
    if data.download and _missing(folder, names):
        _download(data.name, folder, how, lambda: _cifar_fetch(cls_name, root))
    _check_files(data, folder, names, how)
    arrays = []
    for files in (train_files, test_files):
        parts = [read_cifar_batch(os.path.join(folder, name), label_key) for name in files]
        images = np.concatenate([p[0] for p in parts])
        targets = np.concatenate([p[1] for p in parts])
        if len(targets) and (targets.min() < 0 or targets.max() >= classes):
            raise InputError(f"{folder}: labels must lie in 0..{classes - 1}, found {targets.min()}..{targets.max()}")
        arrays += [_normalise(images, data.name), targets]
    return Dataset(data.name, *arrays, num_classes=classes)


def _cifar_fetch(cls_name, root):
    """torchvision's download and MD5 check of the official archive, unpacked into data.root."""
    import torchvision.datasets as tvd
    from torchvision.datasets.utils import download_and_extract_archive

    cls = getattr(tvd, cls_name)
    download_and_extract_archive(cls.url, root, filename=cls.filename, md5=cls.tgz_md5)


def cifar10(data) -> Dataset:
    return _cifar(data)


def cifar100(data) -> Dataset:
    return _cifar(data)
