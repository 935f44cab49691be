# SPDX-License-Identifier: MIT
"""The staging room: what Client.copy_to_device / copy_from_device / configure_staging / staging_stats need
beneath them (issue 39): holding a Python buffer while C reads or writes it, reading a stream argument, the
settings and their sizes, and the counters as a dataclass. It stands on _lib only; _client.py calls it.

A staged copy moves bytes between ordinary (pageable) host memory and device memory through a small pinned
ring leased from pinbrokerd (libpinbroker's pb_copy_to_device / pb_copy_from_device): several threads copy
between the program's memory and ring slots while the GPU copies the slots, on the caller's stream.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import re
from typing import Any, Optional, Union

from . import _lib
from .errors import InvalidArgument

__all__ = ["StagingStats", "HostBuffer", "stream_handle", "parse_size", "staging_opts", "env_threshold",
           "DEFAULT_THRESHOLD"]

#: The threshold libpinbroker uses when neither pb_staging_configure nor $PINBROKER_STAGING_THRESHOLD sets
#: one (client/lib/pinbroker.h, docs/staging.md): smaller copies go to the driver as they are.
DEFAULT_THRESHOLD = 1 << 20
THRESHOLD_ENV = "PINBROKER_STAGING_THRESHOLD"


@dataclasses.dataclass(frozen=True)
class StagingStats:
    """What a client's staged copies did (struct pb_staging_stats)."""

    h2d_bytes: int  #: bytes staged host to device
    d2h_bytes: int  #: bytes staged device to host
    h2d_copies: int  #: copies staged host to device
    d2h_copies: int  #: copies staged device to host
    driver_copies: int  #: pageable copies at or over the threshold that went to the driver instead
    ring_bytes: int  #: the ring held now (0: none)
    ring_leases: int  #: rings acquired so far
    ring_revoked: int  #: rings the daemon revoked
    ring_refused: int  #: ring acquisitions refused
    busy_ns: int  #: time spent in staged copies, in nanoseconds

    @classmethod
    def from_c(cls, s: _lib.StagingStats) -> "StagingStats":
        return cls(**{name: int(getattr(s, name)) for name, _ in _lib.StagingStats._fields_})


# ---------------------------------------------------------------- sizes


def parse_size(value: Union[int, str], what: str) -> int:
    """A size in bytes: an int, or a string as the daemon's config takes one ("64M", "1G", "512K", "4096";
    K/M/G/T are powers of 1024, an optional "B" or "iB" after). Raises TypeError or InvalidArgument (EINVAL)
    naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be an int (bytes) or a size string like '64M', not {type(value).__name__}")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", value, re.IGNORECASE)
        if not m:
            raise InvalidArgument(errno.EINVAL, f"{what}={value!r} is not a size (e.g. 1048576, 512K, 64M, 1G)")
        value = int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))
    if value < 0:
        raise InvalidArgument(errno.EINVAL, f"{what} must not be negative (got {value})")
    return value


def env_threshold() -> int:
    """The threshold libpinbroker takes from $PINBROKER_STAGING_THRESHOLD, else the default. A value it
    would refuse (it then says so and uses the default) gives the default here too."""
    text = os.environ.get(THRESHOLD_ENV, "").strip()
    if not text:
        return DEFAULT_THRESHOLD
    try:
        return parse_size(text, "$" + THRESHOLD_ENV)
    except (TypeError, InvalidArgument):
        return DEFAULT_THRESHOLD


def staging_opts(ring: Any, slot: Any, threads: Any, threshold: Any) -> _lib.StagingOpts:
    """struct pb_staging_opts from configure_staging's arguments (None: 0, the environment or the default).
    Only types and signs are checked here; libpinbroker checks the ranges (and names the one it refuses)."""
    opts = _lib.StagingOpts()
    opts.ring_bytes = 0 if ring is None else parse_size(ring, "ring")
    opts.slot_bytes = 0 if slot is None else parse_size(slot, "slot")
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int, not {type(threads).__name__}")
        if threads < 0:
            raise InvalidArgument(errno.EINVAL, f"threads must not be negative (got {threads})")
        opts.threads = threads
    opts.threshold_bytes = 0 if threshold is None else parse_size(threshold, "threshold")
    return opts


# ---------------------------------------------------------------- streams


def stream_handle(stream: Any) -> Optional[int]:
    """The CUstream a stream argument names: None or 0 (the legacy default stream), an int handle, a torch
    stream (``torch.cuda.Stream``, ``ExternalStream``: its ``cuda_stream``), or an object with a ``ptr``
    (a CuPy stream). Returns None for the legacy default stream (C's NULL)."""
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise TypeError("stream must be None, an int CUstream handle or a CUDA stream object, not bool")
    if not isinstance(stream, int):
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            handle = getattr(stream, "ptr", None)
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise TypeError(f"stream must be None, an int CUstream handle, a torch.cuda.Stream or an object with "
                            f"an int .ptr, not {type(stream).__name__}")
        stream = handle
    if stream < 0:
        raise InvalidArgument(errno.EINVAL, f"a stream handle is not negative (got {stream})")
    return stream or None


# ---------------------------------------------------------------- holding a buffer while C uses it


class _PyBuffer(ctypes.Structure):
    """Py_buffer (Include/pybuffer.h), for PyObject_GetBuffer: the stable layout of Python 3."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),  # PyObject*, owned by the view until PyBuffer_Release
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_PyBUF_WRITABLE = 0x0001
_PyBUF_ND = 0x0008
_PyBUF_STRIDES = 0x0010 | _PyBUF_ND
_PyBUF_ANY_CONTIGUOUS = 0x0080 | _PyBUF_STRIDES

_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class HostBuffer:
    """A contiguous host buffer held (exported) while C reads it, or writes it with ``writable``: a bytearray
    cannot be resized and a numpy array keeps its memory until the ``with`` ends. ``address`` and ``nbytes``
    describe it. Raises TypeError for an object without the buffer protocol, a read-only one where writing is
    asked, or one that is not contiguous (C or Fortran order: its bytes are one range)."""

    def __init__(self, obj: Any, writable: bool, what: str) -> None:
        self._view = _PyBuffer()
        flags = _PyBUF_ANY_CONTIGUOUS | (_PyBUF_WRITABLE if writable else 0)
        try:
            _get_buffer(obj, ctypes.byref(self._view), flags)
        except (BufferError, TypeError, ValueError) as e:
            raise TypeError(self._why(obj, writable, what, e)) from None
        self._held = True
        self.address = int(self._view.buf or 0)
        self.nbytes = int(self._view.len)

    @staticmethod
    def _why(obj: Any, writable: bool, what: str, e: Exception) -> str:
        try:
            mv = memoryview(obj)
        except TypeError:
            return (f"{what} must support the buffer protocol (bytes, bytearray, memoryview, array.array, a numpy "
                    f"array; a torch tensor through pinbroker.torch), not {type(obj).__name__}")
        if writable and mv.readonly:
            return f"{what} is read-only ({type(obj).__name__}): the copy writes into it; pass a writable buffer"
        if not mv.contiguous:
            return (f"{what} is not contiguous ({type(obj).__name__} with strides {mv.strides}): copy it into a "
                    "contiguous buffer first (numpy.ascontiguousarray)")
        return f"{what}: {e}"

    def release(self) -> None:
        if self._held:
            self._held = False
            _release_buffer(ctypes.byref(self._view))

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


def check_device_pointer(dptr: Any) -> int:
    """A device pointer argument: a positive int (a CUdeviceptr), or an object with ``data_ptr()`` (a CUDA
    tensor) or ``__cuda_array_interface__``."""
    if isinstance(dptr, bool):
        raise TypeError("dptr must be an int device address, not bool")
    if not isinstance(dptr, int):
        cai = getattr(dptr, "__cuda_array_interface__", None)
        if isinstance(cai, dict) and isinstance(cai.get("data"), tuple):
            dptr = cai["data"][0]
        elif callable(getattr(dptr, "data_ptr", None)):
            dptr = dptr.data_ptr()
        else:
            raise TypeError(f"dptr must be an int device address (a CUdeviceptr), a CUDA tensor or an object with "
                            f"__cuda_array_interface__, not {type(dptr).__name__}")
    if dptr <= 0 or dptr >= 1 << 64:
        raise InvalidArgument(errno.EINVAL, f"dptr must be a device address above 0 (got {dptr:#x})")
    return int(dptr)


def device_capacity(dptr: Any) -> Optional[int]:
    """The bytes a device argument holds, where it says (a CUDA tensor, __cuda_array_interface__); else None."""
    if isinstance(dptr, int):
        return None
    try:
        if callable(getattr(dptr, "data_ptr", None)) and callable(getattr(dptr, "nelement", None)):
            return int(dptr.nelement()) * int(dptr.element_size())
        cai = getattr(dptr, "__cuda_array_interface__", None)
        if isinstance(cai, dict) and cai.get("strides") is None:
            import numpy

            n = 1
            for d in cai.get("shape", ()):
                n *= int(d)
            return n * numpy.dtype(cai["typestr"]).itemsize
    except Exception:
        return None
    return None
