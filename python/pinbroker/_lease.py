# SPDX-License-Identifier: MIT
"""The lease room: Kind, Priority, the memory of one lease and the views that keep it mapped (_Mapping), Lease.

The bottom layer over _lib, with the helpers every room uses (_raise, _dec, _priority). It imports no other
room: a mapping reaches the Client that holds it only through the methods :class:`_Owner` names, which
_client.Client provides.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import math
import mmap
import os
import threading
import weakref
from typing import Any, Iterable, List, Optional, Protocol, Sequence, Tuple, Union

from . import _lib
from .errors import BrokerError, InvalidArgument, UnknownLease, error_from_errno

__all__ = ["Kind", "Priority", "Lease"]


class Kind(str, enum.Enum):
    """What a lease's memory is. Compares equal to its string value (``lease.kind == "pinned"``)."""

    PINNED = "pinned"  #: broker memory, locked and registered with CUDA: full-speed async copies
    LOCKED = "locked"  #: broker memory, locked but not CUDA-registered (no GPU or no driver here)
    FALLBACK = "fallback"  #: ordinary pageable memory: the broker refused or is not running

    def __str__(self) -> str:
        return self.value


class Priority(str, enum.Enum):
    """Which leases the daemon revokes first under pressure."""

    NORMAL = "normal"
    CRITICAL = "critical"  #: revoked last
    BEST_EFFORT = "best-effort"  #: revoked first

    def __str__(self) -> str:
        return self.value


_KIND_BY_C = {_lib.PB_MEM_PINNED: Kind.PINNED, _lib.PB_MEM_LOCKED: Kind.LOCKED, _lib.PB_MEM_FALLBACK: Kind.FALLBACK}
_PRIO_TO_C = {
    Priority.NORMAL: _lib.PB_PRIORITY_NORMAL,
    Priority.CRITICAL: _lib.PB_PRIORITY_CRITICAL,
    Priority.BEST_EFFORT: _lib.PB_PRIORITY_BEST_EFFORT,
}
_PRIO_BY_C = {v: k for k, v in _PRIO_TO_C.items()}


def _priority(p: Union[str, Priority, None]) -> Priority:
    if p is None:
        return Priority.NORMAL
    if isinstance(p, Priority):
        return p
    key = str(p).lower().replace("_", "-")
    for member in Priority:
        if member.value == key:
            return member
    raise ValueError(f"priority must be one of 'normal', 'critical', 'best-effort', not {p!r}")


def _raise(r: int, what: str, lease_context: bool = False) -> None:
    """Raise the exception for C return value r, with pb_last_error()'s message (read on this thread).

    lease_context: ENOENT names a lease or token (UnknownLease), not a missing daemon."""
    msg = _lib.last_error()
    if not msg or msg == "no error":
        msg = f"{what}: {_lib.strerror(r)}"
    if lease_context and abs(r) == errno.ENOENT:
        raise UnknownLease(errno.ENOENT, msg)
    raise error_from_errno(r, msg)


def _dec(b: Optional[bytes]) -> Optional[str]:
    return None if b is None else b.decode("utf-8", "replace")


def _page_size() -> int:
    return mmap.PAGESIZE


# ---------------------------------------------------------------- the memory of one lease and its views


class _Owner(Protocol):
    """What a _Mapping needs of the Client that holds it (the lease room does not import the client room)."""

    def _track(self, m: "_Mapping") -> None: ...

    def _release_mapping(self, m: "_Mapping") -> None: ...

    def _share(self, m: "_Mapping", uids: List[int]) -> str: ...


class _ViewToken:
    """Held by each exported view (through its ctypes array): counts live views of a mapping."""

    __slots__ = ("mapping",)

    def __init__(self, mapping: "_Mapping") -> None:
        self.mapping = mapping  # counted by _Mapping.array(), under its lock

    def __del__(self) -> None:
        try:
            self.mapping._view_closed()
        except Exception:  # a finaliser must not raise; the lease stays until the client closes
            pass


class _Mapping:
    """One pb_lease (or, without the library, one anonymous mmap) and the count of views that use it.

    The memory goes back (pb_release) once the Lease has been released, or garbage collected, *and*
    the last view of it is gone: a view never outlives its memory.
    """

    def __init__(
        self,
        client: Optional[_Owner],
        ptr: Optional[int],
        *,
        pymem: Optional[mmap.mmap] = None,
        reason: Optional[str] = None,
    ) -> None:
        self.client = client
        self.ptr = ptr
        self.pymem = pymem
        self.lock = threading.Lock()
        self.registering = False  # register_slice is in the driver, outside the lock
        self.registered_cv = threading.Condition(self.lock)  # notified when it is done
        self.views = 0
        self.released = False  # the Lease let it go: free once views == 0
        self.freed = False
        self.idle = False
        self.lease_ref: Optional[weakref.ReferenceType] = None
        self.pid = os.getpid()
        if ptr is not None:
            lib = _lib.load()
            self.address = int(lib.pb_lease_data(ptr) or 0)
            self.nbytes = int(lib.pb_lease_size(ptr))
            self.kind = _KIND_BY_C.get(lib.pb_lease_kind(ptr), Kind.FALLBACK)
            self.id = int(lib.pb_lease_id(ptr)) or None
            self.fallback_reason = _dec(lib.pb_lease_fallback_reason(ptr))
            self.cuda_registered = bool(lib.pb_lease_cuda_registered(ptr))
            piece_fn = _lib.optional("pb_lease_cuda_piece_bytes")
            self.cuda_piece_bytes = int(piece_fn(ptr)) if piece_fn is not None else 0
            self.hugetlb = bool(lib.pb_lease_hugetlb(ptr))
            self.page_size = int(lib.pb_lease_page_size(ptr))
            self.chunks = int(lib.pb_lease_chunks(ptr))
        else:
            assert pymem is not None
            self.nbytes = len(pymem)
            self.address = ctypes.addressof(ctypes.c_char.from_buffer(pymem))
            self.kind = Kind.FALLBACK
            self.id = None
            self.fallback_reason = reason
            self.cuda_registered = False
            self.cuda_piece_bytes = 0
            self.hugetlb = False
            self.page_size = _page_size()
            self.chunks = 0
        if client is not None and ptr is not None:
            client._track(self)

    def array(self) -> ctypes.Array:
        """A new ctypes array over the memory that counts as a view for as long as it (or a memoryview of it) lives."""
        with self.lock:
            # Counted under the same lock as the check, so a release() racing with this cannot free the
            # memory between the two.
            if self.released or self.freed:
                raise ValueError(f"{self.describe()} was released: its memory can no longer be viewed")
            self.views += 1
        token = _ViewToken(self)  # from here on its __del__ uncounts the view, whatever happens below
        typ = ctypes.c_ubyte * self.nbytes
        arr = typ.from_buffer(self.pymem) if self.pymem is not None else typ.from_address(self.address)
        arr._pinbroker_view = token  # type: ignore[attr-defined]
        return arr

    def describe(self) -> str:
        return f"lease {self.id}" if self.id else f"fallback lease at {self.address:#x}"

    def register_slice(self, offset: int, length: int, mapped: bool) -> None:
        fn = _lib.optional("pb_lease_register_slice")
        if fn is None:
            raise NotImplementedError(f"the libpinbroker loaded from {_lib.path()} has no pb_lease_register_slice: "
                                      "registering a slice needs a newer libpinbroker")
        for what, v in (("offset", offset), ("length", length)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TypeError(f"{what} must be a non-negative int, not {v!r}")
        busy = BrokerError(errno.EBUSY, f"another thread is registering a slice of {self.describe()} with CUDA "
                                        "now; one registration per process: use that one")
        with self.lock:
            if self.released or self.freed or self.ptr is None:
                raise ValueError(f"{self.describe()} is released or ordinary memory: it has no slice to register")
            if self.registering:
                raise busy
            # Claimed under the lock, the driver call made outside it: a release waits for it in free().
            self.registering = True
        kind: Optional[Kind] = None
        try:
            r = fn(self.ptr, offset, length, _lib.PB_ACQUIRE_MAPPED if mapped else 0)
            if r == -errno.EBUSY:
                raise busy
            if r < 0:
                _raise(r, f"registering slice [{offset}, +{length}) of {self.describe()} with CUDA",
                       lease_context=True)
            lib = _lib.load()
            kind = _KIND_BY_C.get(lib.pb_lease_kind(self.ptr), Kind.FALLBACK)
            registered = bool(lib.pb_lease_cuda_registered(self.ptr))
        finally:
            with self.lock:
                if kind is not None:
                    self.kind, self.cuda_registered = kind, registered
                self.registering = False
                self.registered_cv.notify_all()

    @property
    def cuda_slice(self) -> Optional[Tuple[int, int]]:
        fn = _lib.optional("pb_lease_cuda_slice") if self.ptr is not None else None
        if fn is None:
            return None
        with self.lock:
            if self.freed:
                return None
            off, length = ctypes.c_size_t(), ctypes.c_size_t()
            return (int(off.value), int(length.value)) if fn(self.ptr, ctypes.byref(off), ctypes.byref(length)) else None

    def _view_closed(self) -> None:
        with self.lock:
            self.views -= 1
            go = self.released and self.views == 0
        if go:
            self.free()

    def release(self) -> bool:
        """The Lease is done with it: free now, or when the last view goes. True if freed now."""
        with self.lock:
            if self.released:
                return self.freed
            self.released = True
            go = self.views == 0
        if go:
            self.free()
        return go

    def free(self) -> None:
        """pb_release, once; a no-op once the client closed (pb_disconnect freed it) or in a forked child."""
        with self.lock:
            # The library's memory is not let go under a registration in progress (register_slice).
            self.registered_cv.wait_for(lambda: not self.registering)
            if self.freed:
                return
            self.freed = True
        if self.pid != os.getpid():
            return  # a fork's copy: the parent owns the lease and its connection
        if self.pymem is not None:
            self.pymem = None  # the mmap goes with the last reference
            return
        client = self.client
        if client is None:
            _lib.load().pb_release(None, self.ptr)  # fallback memory, no connection
            return
        client._release_mapping(self)

    def __del__(self) -> None:
        # Reached only with no Lease and no view left.
        try:
            self.free()
        except Exception:
            pass


# ---------------------------------------------------------------- Lease


class Lease:
    """Memory lent by pinbrokerd (or ordinary memory, for a fallback), mapped into this process.

    Views (:meth:`memoryview`, :meth:`numpy`, :meth:`tensor`) share the memory without copying and keep
    it mapped: :meth:`release` gives the lease back at once when no view is alive, and otherwise when the
    last view is garbage collected, so a view is never left pointing at unmapped memory. A lease that is
    garbage collected unreleased is released the same way. Raw addresses (:attr:`address`, handed to C
    or CUDA) are not views: using one after release is undefined, as with a freed buffer.

    A Lease is a context manager: ``with client.acquire(n) as lease: ...`` releases it on exit.
    Leases come from :meth:`Client.acquire`, :meth:`Client.attach` and the ``acquire_or_fallback``
    functions, not from this constructor. In a forked child the inherited mapping and its views stay
    usable, and ``release()`` there does nothing: the parent holds the lease.
    """

    def __init__(self, mapping: _Mapping, *, requested_nbytes: int, label: Optional[str], priority: Priority,
                 attached: bool = False) -> None:
        self._mapping: Optional[_Mapping] = mapping
        self._m = mapping  # read-only facts stay available after release
        self.requested_nbytes = requested_nbytes
        self.label = label
        self.priority = priority
        #: True for a lease attached with Client.attach (another process holds it).
        self.attached = attached
        mapping.lease_ref = weakref.ref(self)

    # -- facts

    @property
    def id(self) -> Optional[int]:
        """The daemon's lease id (as in ``pinctl leases``); None for fallback memory."""
        return self._m.id

    @property
    def nbytes(self) -> int:
        """Bytes mapped: the requested size rounded up to the lease's page size."""
        return self._m.nbytes

    @property
    def kind(self) -> Kind:
        """:class:`Kind`: "pinned", "locked" or "fallback"."""
        return self._m.kind

    @property
    def fallback_reason(self) -> Optional[str]:
        """Why this is ordinary memory (the broker's refusal, or why there is no broker); None otherwise."""
        return self._m.fallback_reason

    @property
    def cuda_registered(self) -> bool:
        """True when the range is registered with CUDA (cuMemHostRegister) in this process."""
        return self._m.cuda_registered

    @property
    def cuda_piece_bytes(self) -> int:
        """0 when the range is registered with CUDA in one call (or not registered); else the stride of the
        pieces it was registered in. The driver refuses one registration of 512 GiB or more (r580), so a lease
        above $PINBROKER_CUDA_REGISTER_PIECE (256 GiB by default) is registered as pieces starting every that
        many bytes from :attr:`address`. Split a single copy that crosses a piece boundary at the boundary:
        across two registrations the driver may refuse it or copy it at pageable speed. Always 0 with a
        library that predates pieces."""
        return self._m.cuda_piece_bytes

    @property
    def cuda_slice(self) -> Optional[Tuple[int, int]]:
        """(offset, length) when only that slice is registered with CUDA here (:meth:`register_slice`), else None."""
        return self._m.cuda_slice

    def register_slice(self, offset: int, length: int, *, mapped: bool = False) -> None:
        """Register with CUDA only ``[offset, offset + length)`` of a lease mapped with ``cuda=False``: the part
        this process copies from, so that the ranks of one shared region register it once in all. ``offset`` is a
        multiple of :attr:`page_size`; ``length`` is rounded up to whole pages. Raises InvalidArgument (misaligned,
        out of range, not broker memory, already registered here) or the driver's error (no usable driver: ENODEV);
        BrokerError (EBUSY) while another thread is registering a slice of this lease (one of two concurrent
        calls registers); a library without slices raises NotImplementedError."""
        self._check()
        self._m.register_slice(offset, length, mapped)

    @property
    def hugetlb(self) -> bool:
        """True when every chunk is on 2 MiB huge pages."""
        return self._m.hugetlb

    @property
    def page_size(self) -> int:
        return self._m.page_size

    @property
    def chunks(self) -> int:
        """memfd chunks mapped back to back; 0 for fallback memory."""
        return self._m.chunks

    @property
    def address(self) -> int:
        """The start address, for C or CUDA calls. Not a view: it does not keep the memory mapped."""
        self._check()
        return self._m.address

    @property
    def released(self) -> bool:
        """True once :meth:`release` was called (the memory may still be mapped for live views)."""
        return self._mapping is None

    @property
    def stale(self) -> bool:
        """True when the daemon no longer counts this lease (it restarted clean): still mapped here, but not
        brokered; release it and acquire again. Always False with a library older than shared leases."""
        m = self._m
        fn = _lib.optional("pb_lease_stale") if m.ptr is not None else None
        if fn is None or m.pid != os.getpid():
            return False
        with m.lock:  # free() marks freed under the lock before pb_release: the handle is valid here
            return False if m.freed else bool(fn(m.ptr))

    @property
    def views(self) -> int:
        """How many views of this lease are alive (they keep its memory mapped)."""
        return self._m.views

    # -- views

    def memoryview(self) -> memoryview:
        """A writable, flat memoryview (format "B") of all :attr:`nbytes` bytes. No copy."""
        self._check()
        return memoryview(self._m.array()).cast("B")

    def numpy(self, dtype: Any = "uint8", shape: Union[int, Sequence[int], None] = None, offset: int = 0) -> Any:
        """A numpy array over the lease (``numpy.frombuffer``, no copy), from byte ``offset``.

        ``shape`` None gives a 1-D array of as many items as fit.
        """
        import numpy as np

        dt = np.dtype(dtype)
        count, shp = self._extent(dt.itemsize, shape, offset)
        arr = np.frombuffer(self.memoryview(), dtype=dt, count=count, offset=offset)
        return arr.reshape(shp)

    def tensor(self, dtype: Any = None, shape: Union[int, Sequence[int], None] = None, offset: int = 0) -> Any:
        """A torch CPU tensor over the lease (``torch.frombuffer``, no copy), from byte ``offset``.

        ``dtype`` defaults to torch.uint8. ``tensor.is_pinned()`` is True where CUDA registered the range
        (:attr:`kind` "pinned"); with a CPU-only torch, or kind "locked"/"fallback", it is False.
        """
        import torch

        dt = torch.uint8 if dtype is None else dtype
        itemsize = torch.empty((), dtype=dt).element_size()
        count, shp = self._extent(itemsize, shape, offset)
        t = torch.frombuffer(self.memoryview(), dtype=dt, count=count, offset=offset)
        return t.view(shp)

    def _extent(self, itemsize: int, shape: Union[int, Sequence[int], None], offset: int) -> Tuple[int, Tuple[int, ...]]:
        if offset < 0 or offset > self.nbytes:
            raise ValueError(f"offset {offset} is outside the lease's {self.nbytes} bytes")
        if shape is None:
            n = (self.nbytes - offset) // itemsize
            return n, (n,)
        shp = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        n = math.prod(shp)
        if n * itemsize > self.nbytes - offset:
            raise ValueError(
                f"shape {shp} of {itemsize}-byte items needs {n * itemsize} bytes from offset {offset}; "
                f"the lease has {self.nbytes}"
            )
        return n, shp

    # -- life cycle

    def release(self) -> bool:
        """Give the lease back. Idempotent.

        Returns True when the memory went back now, False when live views keep it mapped: it then goes
        back when the last of them is garbage collected (drop them first to meet a revoke deadline).
        """
        m, self._mapping = self._mapping, None
        if m is None:
            return self._m.freed
        return m.release()

    def set_idle(self, idle: bool = True) -> None:
        """Tell the daemon this lease is idle (revoke it first) or busy again.

        With no revoke callback set on the client, an idle lease is released when it is revoked.
        """
        self._check()
        self._m.idle = bool(idle)
        if self._m.ptr is not None:
            r = _lib.load().pb_lease_set_idle(self._m.ptr, 1 if idle else 0)
            if _lib.has_sharing() and r < 0:  # an int only since shared leases; void before
                _raise(r, f"marking {self._m.describe()} {'idle' if idle else 'busy'}")

    def share(self, uids: Iterable[int] = ()) -> str:
        """A share token another process (of this uid, or of one of ``uids``) passes to :meth:`Client.attach`.

        The lease is counted once and lives until its last attacher releases it. Needs a libpinbroker with
        pb_lease_share (NotImplementedError otherwise).
        """
        self._check()
        m = self._m
        if m.client is None or m.ptr is None or m.kind == Kind.FALLBACK:
            raise InvalidArgument(errno.EINVAL, f"{m.describe()} is ordinary memory of this process: it cannot be shared")
        return m.client._share(m, list(uids))

    def _check(self) -> None:
        if self._mapping is None:
            raise ValueError(f"{self._m.describe()} was released")

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else f"{self.views} views"
        extra = f", reason={self.fallback_reason!r}" if self.fallback_reason else ""
        return f"<pinbroker.Lease id={self.id} {self.kind.value} {self.nbytes} bytes label={self.label!r} {state}{extra}>"
