"""Memory-mapped indexed arrays in the Megatron-LM / DeepSpeed ``.bin`` + ``.idx`` layout, so the
files written here and by DeepSpeed's data analyzer are read by either side.

``<prefix>.bin`` holds the items' elements back to back. ``<prefix>.idx`` is, little-endian:
the 9-byte magic ``MMIDIDX\\0\\0``, version (u64, 1), dtype code (u8, table below), item count n
(u64), document count d (u64), then n item sizes (int32, in elements), n byte offsets into the
``.bin`` (int64), and d document boundaries (int64, item indices; the first is 0).

Only the ``mmap`` implementation is provided; the ``lazy``/``cached`` formats of old Megatron are
refused by name.
"""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import torch

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# dtype code on disk -> numpy dtype (the codes are the format's; 6-8 have no torch twin)
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.uint16,
          7: np.uint32, 8: np.uint64}
_TORCH = {torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
          torch.int32: np.int32, torch.int64: np.int64}
valid_dtypes = set(DTYPES.values()) | set(_TORCH)


def numpy_dtype(dtype) -> type:
    """The numpy scalar type for a numpy or torch dtype the format can store."""
    if dtype in _TORCH:
        return _TORCH[dtype]
    for np_type in DTYPES.values():
        if np.dtype(dtype) == np.dtype(np_type):
            return np_type
    raise ValueError(f"{dtype}: not storable in an indexed dataset; use one of "
                     f"{sorted(np.dtype(t).name for t in DTYPES.values())}")


def code(dtype) -> int:
    np_type = numpy_dtype(dtype)
    return next(c for c, t in DTYPES.items() if t is np_type)


def index_file_path(prefix_path: str) -> str:
    return prefix_path + ".idx"


def data_file_path(prefix_path: str) -> str:
    return prefix_path + ".bin"


def write_index(path: str, dtype, sizes, doc_idx) -> None:
    np_type = numpy_dtype(dtype)
    sizes = np.asarray(sizes, dtype=np.int64)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:  # exclusive scan of the byte sizes
        pointers[1:] = np.cumsum(sizes[:-1] * np.dtype(np_type).itemsize)
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", code(np_type)))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.astype(np.int32).tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(np.asarray(doc_idx, dtype=np.int64).tobytes(order="C"))


class Index:
    """The parsed ``.idx`` file: ``dtype``, ``sizes``, ``pointers`` and ``doc_idx``."""

    def __init__(self, path: str, skip_warmup: bool = True):
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise ValueError(f"{path}: not an mmap indexed-dataset index (bad magic)")
            version, = struct.unpack("<Q", f.read(8))
            if version != VERSION:
                raise ValueError(f"{path}: index version {version}; only {VERSION} is known")
            dtype_code, = struct.unpack("<B", f.read(1))
            if dtype_code not in DTYPES:
                raise ValueError(f"{path}: unknown dtype code {dtype_code}")
            self.dtype = DTYPES[dtype_code]
            count, = struct.unpack("<Q", f.read(8))
            doc_count, = struct.unpack("<Q", f.read(8))
            offset = f.tell()
        buffer = np.memmap(path, mode="r", order="C")
        self.sizes = np.frombuffer(buffer, dtype=np.int32, count=count, offset=offset)
        offset += self.sizes.nbytes
        self.pointers = np.frombuffer(buffer, dtype=np.int64, count=count, offset=offset)
        offset += self.pointers.nbytes
        self.doc_idx = np.frombuffer(buffer, dtype=np.int64, count=doc_count, offset=offset)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i):
        return self.pointers[i], self.sizes[i]


class MMapIndexedDataset(torch.utils.data.Dataset):
    """Item ``i`` is a numpy view of the ``.bin``; a contiguous slice gives a list of them."""

    def __init__(self, path: str, skip_warmup: bool = False):
        super().__init__()
        self._do_init(path)

    def _do_init(self, path: str) -> None:
        self._path = path
        self._index = Index(index_file_path(path))
        size = os.path.getsize(data_file_path(path))
        # np.memmap refuses an empty file: an index of empty items needs no data
        self._bin = np.memmap(data_file_path(path), mode="r", order="C") if size else \
            np.zeros(0, dtype=np.uint8)

    def __getstate__(self):
        return self._path

    def __setstate__(self, state):
        self._do_init(state)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, idx):
        if isinstance(idx, (int, np.integer)):
            if idx < 0:
                idx += len(self)
            if not 0 <= idx < len(self):
                raise IndexError(f"item {idx} of {len(self)}")
            return self.get(int(idx))
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("slices of an indexed dataset must be contiguous")
            return [self.get(i) for i in range(start, stop)]
        raise TypeError(f"index an indexed dataset with an int or a slice, not {type(idx)}")

    def get(self, idx: int, offset: int = 0, length=None) -> np.ndarray:
        """Item ``idx``, or ``length`` of its elements from ``offset``."""
        pointer, size = self._index[idx]
        length = int(size) - offset if length is None else length
        start = int(pointer) + offset * np.dtype(self.dtype).itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=start)

    @property
    def sizes(self):
        return self._index.sizes

    def size(self, index: int) -> int:
        return self._index.sizes[index]

    @property
    def doc_idx(self):
        return self._index.doc_idx

    def get_doc_idx(self):
        return self._index.doc_idx

    def set_doc_idx(self, doc_idx) -> None:
        self._index.doc_idx = doc_idx

    @property
    def dtype(self):
        return self._index.dtype

    @property
    def supports_prefetch(self) -> bool:
        return False

    @staticmethod
    def exists(path: str) -> bool:
        return os.path.exists(index_file_path(path)) and os.path.exists(data_file_path(path))


class MMapIndexedDatasetBuilder:
    """Writes items to ``out_file`` (the ``.bin``) as they come; ``finalize(idx_path)`` writes
    the index. ``end_document()`` closes a document (the analyzer ends one per file)."""

    def __init__(self, out_file: str, dtype=np.int64):
        self._dtype = numpy_dtype(dtype)
        self._data_file = open(out_file, "wb")
        self._sizes: list = []
        self._doc_idx = [0]

    def add_item(self, tensor) -> None:
        array = tensor.numpy() if torch.is_tensor(tensor) else np.asarray(tensor)
        self.add_item_numpy(array)

    def add_items(self, arrays) -> None:
        for array in arrays:
            self.add_item_numpy(np.asarray(array))

    def add_item_numpy(self, array) -> None:
        array = np.asarray(array, dtype=self._dtype)
        self._data_file.write(array.tobytes(order="C"))
        self._sizes.append(array.size)

    def end_document(self) -> None:
        self._doc_idx.append(len(self._sizes))

    def merge_file_(self, another_prefix: str) -> None:
        """Append the items and documents of the indexed dataset at ``another_prefix``."""
        index = Index(index_file_path(another_prefix))
        if index.dtype is not self._dtype:
            raise ValueError(f"{another_prefix}: dtype {np.dtype(index.dtype).name}, this "
                             f"builder writes {np.dtype(self._dtype).name}")
        offset = len(self._sizes)
        self._sizes.extend(int(s) for s in index.sizes)
        self._doc_idx.extend(int(d) + offset for d in index.doc_idx[1:])
        with open(data_file_path(another_prefix), "rb") as f:
            shutil.copyfileobj(f, self._data_file)

    def finalize(self, index_file: str) -> None:
        self._data_file.close()
        write_index(index_file, self._dtype, self._sizes, self._doc_idx)


def _best_fitting_dtype(vocab_size=None):
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def _only_mmap(impl: str) -> None:
    if impl not in ("mmap", "infer"):
        raise ValueError(f"indexed dataset impl {impl!r}: only 'mmap' is provided (the lazy and "
                         "cached formats of old Megatron are not)")


def get_available_dataset_impl() -> list:
    return ["mmap"]


def infer_dataset_impl(path: str):
    if not MMapIndexedDataset.exists(path):
        return None
    with open(index_file_path(path), "rb") as f:
        return "mmap" if f.read(len(MAGIC)) == MAGIC else None


def make_builder(out_file: str, impl: str = "mmap", vocab_size=None) -> MMapIndexedDatasetBuilder:
    _only_mmap(impl)
    return MMapIndexedDatasetBuilder(out_file, dtype=_best_fitting_dtype(vocab_size))


def make_dataset(path: str, impl: str = "mmap", skip_warmup: bool = False):
    """The dataset at ``path`` (without .bin/.idx), or None when its files are not there."""
    _only_mmap(impl)
    if not MMapIndexedDataset.exists(path):
        return None
    return MMapIndexedDataset(path, skip_warmup)


def dataset_exists(path: str, impl: str = "mmap") -> bool:
    _only_mmap(impl)
    return MMapIndexedDataset.exists(path)
