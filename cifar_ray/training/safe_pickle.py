"""A pickle reader for CIFAR-10 batch files that cannot run code from the file.

CIFAR batches are pickles, and a crafted one (in a shared data_dir, say) could execute anything on
every node that loads it. `BatchUnpickler` resolves globals only through BATCH_GLOBALS, and even
numpy's own constructors are not on it: `numpy.ndarray(shape, dtype('O'), buffer)` called from a
pickle makes an object array whose pointers are the file's bytes. So the names numpy pickles map to
small stand-ins that build arrays only with `np.frombuffer(raw, plain numeric dtype)`.
"""

from __future__ import annotations

import pickle
import re
import reprlib

import numpy as np

SHOW = reprlib.Repr()  # for values from a crafted file: quoted, on one line, cut short
SHOW.maxstring = SHOW.maxother = 80


class Refused(pickle.UnpicklingError):
    """A batch pickle asked for something a CIFAR batch never holds."""

    def __init__(self, what: str):
        super().__init__(
            f"refused to load {what} (a CIFAR batch holds only numeric numpy arrays, lists, strings and numbers)"
        )


class _NumpyDtype:
    """Stands in for numpy.dtype while unpickling. numpy's own accepts any pickled state, object fields
    included, and an array of such a dtype built from the file's bytes holds forged pointers."""

    def __init__(self, spec: object, align: object = False, copy: object = False):
        if isinstance(spec, bytes):  # Python 2 pickles, read with encoding="bytes"
            spec = spec.decode("latin-1")
        if not isinstance(spec, str) or not re.fullmatch(r"[biuf][1248]", spec):
            raise Refused(f"a numpy array of dtype {SHOW.repr(spec)}")
        self.dtype = np.dtype(spec)

    def __setstate__(self, state: tuple) -> None:
        order = state[1]  # (version, byte order, ...): the rest describes structured dtypes only
        self.dtype = self.dtype.newbyteorder(order.decode("latin-1") if isinstance(order, bytes) else order)


class NumpyArray:
    """Stands in for numpy.ndarray while unpickling: `_reconstruct` makes one and its pickled state
    becomes `.array`, built from raw bytes. numpy.ndarray itself, called from a pickle, can wrap any bytes."""

    array: np.ndarray | None = None

    def __setstate__(self, state: tuple) -> None:
        shape, dtype, fortran, raw = state[-4:]  # (version,) shape, dtype, Fortran order, raw bytes
        self.array = _array_from_bytes(raw, dtype, shape, "F" if fortran else "C")


def _array_from_bytes(raw: object, dtype: object, shape: object, order: object = "C") -> np.ndarray:
    """numpy's `_frombuffer` (protocol 5), and how every array of a batch is built."""
    if not isinstance(dtype, _NumpyDtype):
        raise Refused(f"a numpy array of dtype {SHOW.repr(dtype)}")
    return np.frombuffer(raw, dtype.dtype).reshape(shape, order=order)


def _reconstruct(cls: object, shape: object, typecode: object) -> NumpyArray:
    if cls is not NumpyArray:
        raise Refused(f"a numpy array of type {SHOW.repr(cls)}")
    return NumpyArray()


def _scalar(dtype: object, raw: object) -> np.generic:
    return _array_from_bytes(raw, dtype, ())[()]


def _latin1(text: object, encoding: object) -> bytes:
    """How Python 3 pickles bytes at protocols 0-2: _codecs.encode(text, 'latin1')."""
    if encoding != "latin1":
        raise Refused(f"_codecs.encode to {SHOW.repr(encoding)}")
    return text.encode("latin1")


# Every global a batch pickle may name, as (module, name), and what it loads as. numpy 1.x (and the
# official Python 2 archive) write numpy.core, numpy 2.x numpy._core; neither's own functions are used.
BATCH_GLOBALS = {
    ("numpy", "ndarray"): NumpyArray,
    ("numpy", "dtype"): _NumpyDtype,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("numpy.core.numeric", "_frombuffer"): _array_from_bytes,
    ("numpy._core.numeric", "_frombuffer"): _array_from_bytes,
    ("_codecs", "encode"): _latin1,
}


class BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR batch without running code from the file: globals resolve only through BATCH_GLOBALS."""

    def find_class(self, module: str, name: str) -> object:
        try:
            return BATCH_GLOBALS[module, name]
        except KeyError:
            raise Refused(SHOW.repr(f"{module}.{name}")) from None


def load(handle) -> object:
    """The batch pickle in `handle` (read as Python 2 str -> bytes, as the official archive needs), with
    its arrays as numpy arrays. Raises Refused for anything a batch never holds."""
    return _plain(BatchUnpickler(handle, encoding="bytes").load())


def _plain(value: object) -> object:
    """The stand-ins replaced by what they stand for (batches nest arrays only in dicts and lists)."""
    if isinstance(value, NumpyArray):
        return value.array
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
