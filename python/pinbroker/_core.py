# SPDX-License-Identifier: MIT
"""Client and Lease: pinbrokerd's leases as Python objects over libpinbroker (ctypes), views that keep them alive."""

from __future__ import annotations

import atexit
import ctypes
import enum
import errno
import math
import mmap
import os
import sys
import threading
import traceback
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _lib
from .errors import BrokerError, InvalidArgument, LibraryNotFound, NotConnected, UnknownLease, error_from_errno

__all__ = [
    "Kind",
    "Priority",
    "Lease",
    "Client",
    "connect",
    "acquire_or_fallback",
    "cuda_available",
    "library_path",
    "RevokeCallback",
]


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

#: ``callback(lease, deadline_ms)``, called from libpinbroker's receiver thread.
RevokeCallback = Callable[["Lease", int], Any]


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
        client: Optional["Client"],
        ptr: Optional[int],
        *,
        pymem: Optional[mmap.mmap] = None,
        reason: Optional[str] = None,
    ) -> None:
        self.client = client
        self.ptr = ptr
        self.pymem = pymem
        self.lock = threading.Lock()
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


# ---------------------------------------------------------------- Client

_clients: "weakref.WeakValueDictionary[int, Client]" = weakref.WeakValueDictionary()
_next_key = 1
_key_lock = threading.Lock()
_in_callback = threading.local()


def _revoke_trampoline(c: Optional[int], l: Optional[int], deadline_ms: int, userdata: Optional[int]) -> int:
    """pb_revoke_fn: runs on libpinbroker's receiver thread; ctypes takes the GIL for it."""
    try:
        client = _clients.get(int(userdata or 0))
        if client is not None and l is not None:
            _in_callback.active = True
            try:
                client._dispatch_revoke(int(l), int(deadline_ms))
            finally:
                _in_callback.active = False
    except BaseException:  # never let an exception reach the C receiver thread
        try:
            sys.stderr.write("pinbroker: internal error handling a revoke:\n" + traceback.format_exc())
        except Exception:
            pass
    return 0


# One C callback for every client, alive for the life of the module: libpinbroker may call it until
# pb_disconnect returns. userdata is the client's key in _clients.
_REVOKE_CFUNC = _lib.REVOKE_FN(_revoke_trampoline)


class Registration:
    """A budget charge for memory the process owns (:meth:`Client.register`), like a budgeted
    cudaHostRegister. A context manager: ``with client.register(addr, n): ...`` unregisters on exit."""

    def __init__(self, client: "Client", handle: int, address: int, nbytes: int, label: Optional[str]) -> None:
        self._client = client
        self._handle: Optional[int] = handle
        self.address = address
        self.nbytes = nbytes
        self.label = label
        lib = _lib.load()
        # Read now: after Client.close() the handle is the library's to free.
        #: The bytes charged: every page the range touches.
        self.charged_bytes = int(lib.pb_lease_size(handle))
        #: The daemon's lease id of the charge.
        self.id = int(lib.pb_lease_id(handle))

    def unregister(self) -> None:
        """Unregister from CUDA (unless charge-only) and give the charge back. Idempotent, and a no-op once
        the client is closed (closing gave every charge back)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._client._unregister(handle)

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unregister()

    def __repr__(self) -> str:
        return f"<pinbroker.Registration {self.nbytes} bytes at {self.address:#x}{'' if self._handle else ' (gone)'}>"


class Client:
    """One connection to pinbrokerd (:func:`connect`). Thread-safe; a context manager (``close()`` on exit).

    Closing the client (or interpreter exit) gives back every lease it holds, views or not: do not use
    views of its leases afterwards. A forked child must not use its parent's Client: connect again.
    """

    def __init__(self, ptr: int, path: Optional[str]) -> None:
        global _next_key
        self._ptr: Optional[int] = ptr
        self.path = path or os.environ.get("PINBROKER_SOCKET") or "/run/pinbroker/pinbroker.sock"
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False
        self._mappings: Dict[int, weakref.ReferenceType] = {}
        self._registrations: set = set()  # pb_register handles not yet given back
        self._revoke_cb: Optional[RevokeCallback] = None
        self._warned_no_callback = False
        with _key_lock:
            self._key = _next_key
            _next_key += 1
        _clients[self._key] = self
        # Installed always, so the library never unmaps an idle lease behind a live Python view.
        _lib.load().pb_set_revoke_callback(ptr, _REVOKE_CFUNC, self._key)

    # -- bookkeeping: C calls run outside any Python lock (the receiver thread may call back meanwhile);
    #    close() waits until none is in flight before pb_disconnect frees the client.

    def _enter(self) -> int:
        if self._pid != os.getpid():
            raise NotConnected(errno.ENOTCONN, f"this Client belongs to process {self._pid} (this is a fork of it): "
                               "call pinbroker.connect() again in this process")
        with self._cond:
            if self._closed or self._ptr is None:
                raise NotConnected(errno.ENOTCONN, f"the Client of {self.path} is closed")
            self._busy += 1
            return self._ptr

    def _leave(self) -> None:
        with self._cond:
            self._busy -= 1
            if self._busy == 0:
                self._cond.notify_all()

    def _track(self, m: _Mapping) -> None:
        with self._cond:
            self._mappings[m.ptr] = weakref.ref(m)  # type: ignore[index]

    def _release_mapping(self, m: _Mapping) -> None:
        try:
            ptr = self._enter()
        except NotConnected:
            return  # closed: pb_disconnect gave it back
        try:
            with self._cond:
                self._mappings.pop(m.ptr, None)  # type: ignore[arg-type]
            r = _lib.load().pb_release(ptr, m.ptr)
            if r < 0 and r != -errno.ECONNRESET:
                sys.stderr.write(f"pinbroker: releasing {m.describe()}: {_lib.last_error()}\n")
        finally:
            self._leave()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: Optional[float] = None) -> None:
        """Give back every lease of this client and disconnect. Idempotent.

        Waits for calls in flight on other threads (an acquire with wait=True, up to its timeout), or at
        most ``timeout`` seconds, after which it leaves the connection to the kernel to close at exit.
        """
        self._close(timeout, release_each=True)

    def _close(self, timeout: Optional[float], release_each: bool) -> None:
        # release_each: a RELEASE and its answer per lease before pb_disconnect. pb_disconnect only
        # pipelines them, and the daemon drops the connection when it cannot send the first answer,
        # so the rest stay counted until this process exits: fine at exit, a leak in a process that
        # lives on. At exit a daemon that does not answer must not hang us: no waiting there.
        if getattr(_in_callback, "active", False):
            raise RuntimeError("Client.close() cannot run inside its revoke callback (the callback runs on "
                               "the thread that close() waits for); release the lease there and close later")
        with self._cond:
            if self._closed:
                return
            self._closed = True
            mine = self._pid == os.getpid()
            if mine and not self._cond.wait_for(lambda: self._busy == 0, timeout):
                return
            ptr, self._ptr = self._ptr, None
            mappings = [r() for r in self._mappings.values()]
            self._mappings.clear()
            registrations = list(self._registrations)
            self._registrations.clear()
        lib = _lib.load()
        for handle in registrations:
            if mine and ptr and release_each:
                lib.pb_release(ptr, handle)
        for m in mappings:
            if m is None:
                continue
            with m.lock:
                if m.freed:
                    continue
                m.freed = True  # from here the handle is ours to release, or pb_disconnect's to free
            if mine and ptr and release_each:
                lib.pb_release(ptr, m.ptr)
        _clients.pop(self._key, None)
        if mine and ptr:
            lib.pb_disconnect(ptr)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close(timeout=5)
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<pinbroker.Client {self.path} {'closed' if self._closed else 'connected'}>"

    # -- acquiring

    def acquire(
        self,
        nbytes: int,
        label: Optional[str] = None,
        priority: Union[str, Priority] = "normal",
        wait: bool = False,
        timeout: Optional[float] = None,
        *,
        cuda: bool = True,
        cache: bool = True,
    ) -> Lease:
        """Borrow at least ``nbytes`` of pinned memory from the daemon.

        ``label`` shows in ``pinctl status``/``leases``; ``priority`` is "normal", "critical" or
        "best-effort". ``wait`` waits for memory instead of failing at once, up to ``timeout`` seconds
        (None: the daemon's acquire-timeout-ms); a timeout implies wait. ``cuda=False`` skips CUDA
        registration; ``cache=False`` never reuses a buffer from the client cache.

        Raises BudgetExhausted, QuotaExceeded, MemoryPressure, TooLarge, Timeout, LimitReached,
        NotConnected, ... (see :mod:`pinbroker.errors`).
        """
        opts, prio = self._opts(nbytes, label, priority, wait, timeout, cuda, cache)
        ptr = self._enter()
        try:
            ret = ctypes.c_void_p()
            r = _lib.load().pb_acquire(ptr, nbytes, ctypes.byref(opts), ctypes.byref(ret))
            if r < 0:
                _raise(r, f"acquiring {nbytes} bytes")
            m = _Mapping(self, int(ret.value))
        finally:
            self._leave()
        return Lease(m, requested_nbytes=nbytes, label=label, priority=prio)

    def acquire_or_fallback(
        self,
        nbytes: int,
        label: Optional[str] = None,
        priority: Union[str, Priority] = "normal",
        wait: bool = False,
        timeout: Optional[float] = None,
        *,
        cuda: bool = True,
        cache: bool = True,
    ) -> Lease:
        """Like :meth:`acquire`, but never fails for lack of pinned memory: when the daemon refuses, or this
        client is closed or its daemon gone, returns ordinary memory, ``kind == "fallback"``, with the
        reason in ``fallback_reason``. Raises MemoryError only when even that allocation fails."""
        opts, prio = self._opts(nbytes, label, priority, wait, timeout, cuda, cache)
        try:
            ptr: Optional[int] = self._enter()
        except NotConnected:
            return _fallback_lease(None, nbytes, label, prio, opts)
        try:
            return _fallback_lease(self, nbytes, label, prio, opts, ptr)
        finally:
            self._leave()

    @staticmethod
    def _opts(nbytes: int, label: Optional[str], priority: Union[str, Priority], wait: bool,
              timeout: Optional[float], cuda: bool, cache: bool) -> Tuple[_lib.AcquireOpts, Priority]:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            raise TypeError(f"nbytes must be an int, not {type(nbytes).__name__}")
        if nbytes < 0:
            raise InvalidArgument(errno.EINVAL, f"nbytes must not be negative (got {nbytes})")
        prio = _priority(priority)
        opts = _lib.AcquireOpts()
        opts.priority = _PRIO_TO_C[prio]
        opts.label = label.encode("utf-8") if label is not None else None
        if timeout is not None:
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0 seconds (got {timeout})")
            wait = True
            opts.timeout_ms = max(1, min(int(math.ceil(timeout * 1000)), 0xFFFFFFFF))
        if wait:
            opts.flags |= _lib.PB_ACQUIRE_WAIT
        if not cuda:
            opts.flags |= _lib.PB_ACQUIRE_NO_CUDA
        if not cache:
            opts.flags |= _lib.PB_ACQUIRE_NO_CACHE
        return opts, prio

    # -- registrations (budgeted cudaHostRegister)

    def register(self, address: int, nbytes: int, label: Optional[str] = None, *, cuda: bool = True,
                 mapped: bool = False) -> "Registration":
        """Charge ``nbytes`` of memory this process owns, at ``address``, to the budget, and register it with
        CUDA (``cuda=False``: charge only, the caller registers it). Every page the range touches is charged;
        the charge is never revoked and goes back with :meth:`Registration.unregister`, at close, or when the
        process exits. ``mapped`` registers it DEVICEMAP too. Raises BudgetExhausted, TooLarge, ... like
        :meth:`acquire`.
        """
        if not isinstance(address, int) or not isinstance(nbytes, int) or address <= 0 or nbytes <= 0:
            raise InvalidArgument(errno.EINVAL, f"register needs a positive address and size (got {address!r}, {nbytes!r})")
        opts = _lib.AcquireOpts()
        opts.label = label.encode("utf-8") if label is not None else None
        if not cuda:
            opts.flags |= _lib.PB_REGISTER_CHARGE_ONLY
        if mapped:
            opts.flags |= _lib.PB_ACQUIRE_MAPPED
        fn = _lib.optional("pb_register")
        if fn is None:
            raise InvalidArgument(errno.ENOSYS, "this libpinbroker has no pb_register: install a newer one")
        ptr = self._enter()
        try:
            ret = ctypes.c_void_p()
            r = fn(ptr, address, nbytes, ctypes.byref(opts), ctypes.byref(ret))
            if r < 0:
                _raise(r, f"registering {nbytes} bytes at {address:#x}")
            reg = Registration(self, int(ret.value), address, nbytes, label)
            with self._cond:
                self._registrations.add(int(ret.value))
            return reg
        finally:
            self._leave()

    def _unregister(self, handle: int) -> None:
        try:
            ptr = self._enter()
        except NotConnected:
            return  # closed: the close gave the charge back
        try:
            with self._cond:
                if handle not in self._registrations:
                    return
                self._registrations.discard(handle)
            r = _lib.optional("pb_unregister")(ptr, handle)
            if r < 0:
                _raise(r, "unregistering")
        finally:
            self._leave()

    def report_unbrokered(self, nbytes: int) -> None:
        """Tell the daemon this process pins ``nbytes`` outside the broker (replaces the last report)."""
        fn = _lib.optional("pb_report_unbrokered")
        if fn is None:
            raise InvalidArgument(errno.ENOSYS, "this libpinbroker has no pb_report_unbrokered: install a newer one")
        ptr = self._enter()
        try:
            r = fn(ptr, nbytes)
            if r < 0:
                _raise(r, "reporting unbrokered bytes")
        finally:
            self._leave()

    # -- shared leases

    def _share(self, m: _Mapping, uids: List[int]) -> str:
        fn = _lib.optional("pb_lease_share")
        if fn is None:
            raise NotImplementedError(
                f"the libpinbroker loaded from {_lib.path()} has no pb_lease_share: shared leases need a newer "
                "libpinbroker (and pinbrokerd); upgrade both, or point PINBROKER_LIBRARY at a newer build"
            )
        arr = (ctypes.c_uint32 * max(1, len(uids)))(*uids)
        token = ctypes.create_string_buffer(_lib.PB_SHARE_TOKEN_LEN)
        ptr = self._enter()
        try:
            r = fn(ptr, m.ptr, arr if uids else None, len(uids), token)
            if r < 0:
                _raise(r, f"sharing {m.describe()}")
        finally:
            self._leave()
        return token.value.decode("ascii")

    def attach(self, token: Union[str, bytes], label: Optional[str] = None) -> Lease:
        """Map a lease another process shared with :meth:`Lease.share`. Its release detaches this process;
        the lease lives until its last attacher lets it go. Raises PermissionDenied (EACCES/EPERM) for a uid
        without a grant, NotConnected (ENOENT) for a forged or stale token."""
        fn = _lib.optional("pb_attach")
        if fn is None:
            raise NotImplementedError(
                f"the libpinbroker loaded from {_lib.path()} has no pb_attach: shared leases need a newer "
                "libpinbroker (and pinbrokerd); upgrade both, or point PINBROKER_LIBRARY at a newer build"
            )
        if isinstance(token, (bytes, bytearray)):
            token = bytes(token).decode("ascii", "replace")
        if not isinstance(token, str):
            raise TypeError(f"token must be the str from Lease.share(), not {type(token).__name__}")
        ptr = self._enter()
        try:
            ret = ctypes.c_void_p()
            r = fn(ptr, token.encode("ascii", "replace"), ctypes.byref(ret))
            if r < 0:
                _raise(r, "attaching a shared lease", lease_context=True)
            m = _Mapping(self, int(ret.value))
        finally:
            self._leave()
        lease = Lease(m, requested_nbytes=m.nbytes, label=label, priority=Priority.NORMAL, attached=True)
        return lease

    # -- revocation

    def on_revoke(self, callback: Optional[RevokeCallback]) -> Optional[RevokeCallback]:
        """Call ``callback(lease, deadline_ms)`` when the daemon revokes one of this client's leases.

        It runs on libpinbroker's receiver thread (holding the GIL, like any Python thread): stop using
        the lease and call ``lease.release()`` before ``deadline_ms``, or soon after from another thread.
        Keep it short: no other reply from the daemon arrives while it runs. An exception in it is
        printed to stderr and the lease is released (views keep its memory mapped until dropped).
        ``None`` restores the default: idle leases (:meth:`Lease.set_idle`) are released, others warned
        about. Returns ``callback``, so it works as a decorator.
        """
        if callback is not None and not callable(callback):
            raise TypeError("on_revoke takes a callable(lease, deadline_ms) or None")
        self._revoke_cb = callback
        return callback

    def _dispatch_revoke(self, ptr: int, deadline_ms: int) -> None:
        with self._cond:
            ref = self._mappings.get(ptr)
        m = ref() if ref is not None else None
        if m is None:
            return
        lease = m.lease_ref() if m.lease_ref is not None else None
        if lease is None:
            # The Lease object is gone and only views hold the memory: it is released already.
            m.release()
            return
        cb = self._revoke_cb
        if cb is None:
            if m.idle:
                lease.release()
                return
            if not self._warned_no_callback:
                self._warned_no_callback = True
                warnings.warn(
                    f"pinbrokerd revoked lease {m.id} (deadline {deadline_ms} ms) and this client has no revoke "
                    "callback: release it in time (set one with Client.on_revoke), or the daemon's "
                    "revoke-enforce applies",
                    RuntimeWarning,
                    stacklevel=1,
                )
            return
        try:
            cb(lease, deadline_ms)
        except BaseException:
            try:
                sys.stderr.write(
                    f"pinbroker: the revoke callback {cb!r} raised for lease {m.id}; releasing the lease:\n"
                    + traceback.format_exc()
                )
            except Exception:
                pass
            lease.release()

    # -- status and administration

    def status(self, leases: bool = False) -> Dict[str, Any]:
        """The daemon's status as a dict: summary figures, "clients", "signals", "transitions",
        "revocations", and with ``leases=True`` a "leases" list. Non-admins see only their own uid's rows
        under the daemon's status-visibility = own."""
        ptr = self._enter()
        try:
            lib = _lib.load()
            st = ctypes.POINTER(_lib.Status)()
            r = lib.pb_status_query(ptr, _lib.PB_STATUS_LEASES if leases else 0, ctypes.byref(st))
            if r < 0:
                _raise(r, "querying the daemon's status")
            try:
                return _status_dict(st.contents, leases)
            finally:
                lib.pb_status_free(st)
        finally:
            self._leave()

    def leases(self) -> List[Dict[str, Any]]:
        """Every lease row the daemon shows this caller (all of them for an admin), page by page."""
        ptr = self._enter()
        try:
            lib = _lib.load()
            out: List[Dict[str, Any]] = []
            cursor = 0
            while True:
                rows = ctypes.c_void_p()
                n = ctypes.c_size_t()
                nxt = ctypes.c_uint64()
                r = lib.pb_leases_page(ptr, cursor, 0, ctypes.byref(rows), ctypes.byref(n), ctypes.byref(nxt))
                if r < 0:
                    _raise(r, "listing leases")
                try:
                    out += _lease_rows(rows.value, n.value)
                finally:
                    lib.pb_lease_info_free(rows, n.value)
                cursor = nxt.value
                if cursor == 0:
                    return out
        finally:
            self._leave()

    def revoke(self, lease_id: Optional[int] = None, *, uid: Optional[int] = None, all: bool = False,
               deadline_ms: int = 0) -> List[int]:
        """Revoke (admin): one lease, every lease of ``uid``, or ``all``. ``deadline_ms`` 0 is the daemon's
        revoke-deadline-ms. Returns the ids revoked. Raises PermissionDenied for a non-admin."""
        given = (lease_id is not None) + (uid is not None) + bool(all)
        if given != 1:
            raise ValueError("revoke takes exactly one of lease_id, uid= or all=True")
        what = _lib.PB_REVOKE_LEASE if lease_id is not None else _lib.PB_REVOKE_UID if uid is not None else _lib.PB_REVOKE_ALL
        ptr = self._enter()
        try:
            lib = _lib.load()
            ids = ctypes.POINTER(ctypes.c_uint64)()
            n = ctypes.c_size_t()
            r = lib.pb_admin_revoke(ptr, what, lease_id or 0, uid or 0, deadline_ms, ctypes.byref(ids), ctypes.byref(n))
            if r < 0:
                _raise(r, "revoking")
            try:
                return [int(ids[i]) for i in range(n.value)]
            finally:
                if ids:
                    _libc_free(ids)
        finally:
            self._leave()

    def set(self, key: str, value: str) -> None:
        """Change a reloadable daemon setting (admin), e.g. ``client.set("budget", "8G")``."""
        ptr = self._enter()
        try:
            r = _lib.load().pb_admin_set(ptr, key.encode(), str(value).encode())
            if r < 0:
                _raise(r, f"setting {key}")
        finally:
            self._leave()

    def set_cache_limit(self, nbytes: int) -> None:
        """Keep up to ``nbytes`` of released leases mapped for a fast re-acquire (0 disables)."""
        ptr = self._enter()
        try:
            _lib.load().pb_set_cache_limit(ptr, nbytes)
        finally:
            self._leave()


def _libc_free(p: Any) -> None:
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    libc.free(ctypes.cast(p, ctypes.c_void_p))


def _lease_rows(ptr: Optional[int], n: int) -> List[Dict[str, Any]]:
    if not ptr or n == 0:
        return []
    rows = ctypes.cast(ptr, ctypes.POINTER(_lib.row_types()[1]))
    return [_lease_info(rows[i]) for i in range(n)]


def _lease_info(li: Any) -> Dict[str, Any]:
    """One pb_lease_info row; with a library that has shared leases, also shared, holder_detached,
    attachers and attacher_pids."""
    d = {
        "id": int(li.id),
        "pid": int(li.pid),
        "uid": int(li.uid),
        "bytes": int(li.bytes),
        "label": _dec(li.label) or "",
        "age_ms": int(li.age_ms),
        "priority": _PRIO_BY_C.get(li.priority, Priority.NORMAL).value,
        "state": _dec(li.state) or "",
        "idle_ms": int(li.idle_ms),
        "deadline_left_ms": int(li.deadline_left_ms),
    }
    if hasattr(li, "attachers"):
        d["shared"] = bool(li.shared)
        d["holder_detached"] = bool(li.holder_detached)
        d["attachers"] = int(li.attachers)
        d["attacher_pids"] = [int(li.attacher_pids[i]) for i in range(min(li.n_attacher_pids, _lib.PB_LEASE_INFO_PIDS))]
    if hasattr(li, "registration"):
        d["registration"] = bool(li.registration)
        d["no_revoke"] = bool(li.no_revoke)
    if hasattr(li, "numa_node"):
        d["numa_node"] = int(li.numa_node) if li.numa_node >= 0 else None
        d["misplaced"] = bool(li.misplaced)
    if hasattr(li, "job"):
        d["job"] = _dec(li.job) or None
    return d


_STATUS_LISTS = ("clients", "leases", "signals", "transitions", "revocations")


def _status_dict(s: _lib.Status, with_leases: bool) -> Dict[str, Any]:
    """struct pb_status as a dict: every summary field by its C name, and the row arrays as lists."""
    d: Dict[str, Any] = {}
    for name, _typ in _lib.Status._fields_:
        if name.startswith("n_") or name in _STATUS_LISTS:
            continue
        v = getattr(s, name)
        d[name] = _dec(v) if isinstance(v, bytes) or v is None and name.endswith(("version", "state", "mode")) else v
    d["hugetlb"] = bool(s.hugetlb)
    if _lib.has_registration():
        ext = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusRegistration)).contents
        for name in ("registered_bytes", "no_revoke_bytes", "unbrokered_bytes"):
            d[name] = int(getattr(ext, name))
    cgroups = None
    if _lib.has_numa():
        pages = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusPages)).contents
        d["page_kind"] = _dec(pages.page_kind) or "unknown"
        for name in ("thp_bytes", "thp_failures", "hugetlb_bytes", "huge_pages_free_bytes"):
            d[name] = int(getattr(pages, name))
        d["nodes"] = [
            {"node": n.node, "idle_bytes": n.idle_bytes, "lent_bytes": n.lent_bytes,
             "misplaced_bytes": n.misplaced_bytes, "gpus": n.gpus, "mem_free_bytes": n.mem_free_bytes}
            for n in (pages.nodes[i] for i in range(pages.n_nodes))
        ]
    if _lib.has_status_jobs():
        ext = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusJobs)).contents
        d["jobs"] = [
            {"job": _dec(j.job), "bytes": j.bytes, "leases": j.leases,
             "quota_bytes": j.quota_bytes if j.has_quota else None, "rule": _dec(j.rule) or None,
             "source": _dec(j.source) or None}
            for j in (ext.jobs[i] for i in range(ext.n_jobs))
        ]
        cgroups = ext.client_cgroups
    d["clients"] = []
    if s.clients and s.n_clients:
        rows = ctypes.cast(s.clients, ctypes.POINTER(_lib.row_types()[0]))
        for i in range(s.n_clients):
            c = rows[i]
            row = {"pid": c.pid, "uid": c.uid, "leases": c.leases, "bytes": c.bytes, "labels": _dec(c.labels) or "",
                   "name": _dec(c.name) or ""}
            if hasattr(c, "attached"):
                row["attached"] = int(c.attached)
            if hasattr(c, "unbrokered_bytes"):
                row["unbrokered_bytes"] = int(c.unbrokered_bytes)
            if cgroups:
                row["cgroup"] = _dec(cgroups[i]) or None
            d["clients"].append(row)
    d["signals"] = [
        {"name": _dec(g.name), "value": g.value, "tight": g.tight, "critical": g.critical, "unit": _dec(g.unit),
         "available": bool(g.available)}
        for g in (s.signals[i] for i in range(s.n_signals))
    ]
    for key in ("transitions", "revocations"):
        arr, n = getattr(s, key), getattr(s, "n_" + key)
        d[key] = [{"age_ms": arr[i].age_ms, "text": _dec(arr[i].text)} for i in range(n)]
    if with_leases:
        d["leases"] = _lease_rows(s.leases, s.n_leases)
    return d


# ---------------------------------------------------------------- module functions


def connect(path: Optional[str] = None) -> Client:
    """Connect to pinbrokerd at ``path`` (None: $PINBROKER_SOCKET, else /run/pinbroker/pinbroker.sock).

    Raises NotConnected (no daemon there), PermissionDenied (socket permissions), ProtocolError (version
    mismatch), or LibraryNotFound (libpinbroker is not installed).
    """
    lib = _lib.load()
    ret = ctypes.c_void_p()
    r = lib.pb_connect(path.encode() if path else None, ctypes.byref(ret))
    if r < 0:
        _raise(r, f"connecting to {path or 'pinbrokerd'}")
    return Client(int(ret.value), path)


def _fallback_lease(client: Optional[Client], nbytes: int, label: Optional[str], prio: Priority,
                    opts: _lib.AcquireOpts, ptr: Optional[int] = None) -> Lease:
    """pb_acquire_or_fallback on ptr (None: no connection), wrapped."""
    lib = _lib.load()
    p = lib.pb_acquire_or_fallback(ptr, nbytes, ctypes.byref(opts))
    if not p:
        if nbytes == 0:  # libpinbroker refuses size 0 with EINVAL, as pb_acquire does
            raise InvalidArgument(errno.EINVAL, _lib.last_error())
        raise MemoryError(_lib.last_error())
    kind = _KIND_BY_C.get(lib.pb_lease_kind(p), Kind.FALLBACK)
    m = _Mapping(client if kind != Kind.FALLBACK else None, int(p))
    return Lease(m, requested_nbytes=nbytes, label=label, priority=prio)


_default: Optional[Client] = None
_default_lock = threading.Lock()


def acquire_or_fallback(
    nbytes: int,
    label: Optional[str] = None,
    priority: Union[str, Priority] = "normal",
    wait: bool = False,
    timeout: Optional[float] = None,
    *,
    path: Optional[str] = None,
    cuda: bool = True,
) -> Lease:
    """Pinned memory from a process-wide default client when a daemon answers, ordinary memory otherwise.

    Never raises for lack of a daemon, a refusal, or even a missing libpinbroker: the lease then has
    ``kind == "fallback"`` and says why in ``fallback_reason``. The default client connects on first use
    (and again after a failed attempt) to ``path`` or $PINBROKER_SOCKET.
    """
    global _default
    prio = _priority(priority)
    try:
        _lib.load()
    except LibraryNotFound as e:
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int (got {nbytes!r})") from None
        if nbytes == 0:
            raise InvalidArgument(errno.EINVAL, "size 0: a lease needs at least 1 byte") from None
        size = max(1, -(-nbytes // _page_size()) * _page_size())
        return Lease(_Mapping(None, None, pymem=mmap.mmap(-1, size), reason=f"no libpinbroker: {e.strerror}"),
                     requested_nbytes=nbytes, label=label, priority=prio)
    with _default_lock:
        c = _default
        if c is None or c.closed or c._pid != os.getpid():
            try:
                c = _default = connect(path)
            except BrokerError:
                c = _default = None
    if c is None:
        opts, _ = Client._opts(nbytes, label, prio, wait, timeout, cuda, True)
        return _fallback_lease(None, nbytes, label, prio, opts)
    return c.acquire_or_fallback(nbytes, label, prio, wait, timeout, cuda=cuda)


def cuda_available() -> Tuple[bool, str]:
    """(usable, reason): whether libpinbroker can register leases with CUDA in this process, and why not."""
    reason = ctypes.c_char_p()
    ok = _lib.load().pb_cuda_available(ctypes.byref(reason))
    return bool(ok), _dec(reason.value) or ""


def library_path() -> str:
    """The libpinbroker file in use (loading it if need be)."""
    _lib.load()
    return _lib.path() or ""


# ---------------------------------------------------------------- process life


def _after_fork_in_child() -> None:
    # The child shares its parent's sockets: it must never RELEASE or disconnect on them (a shutdown()
    # would cut the parent's connection). Its Clients refuse to work; inherited mappings stay usable.
    global _default
    _default = None


def _at_exit() -> None:
    # Before interpreter teardown: no receiver thread may call into Python once finalisation starts.
    # A call still in flight on a daemon thread (an acquire waiting for memory) is given 1 s; past that
    # the connection is left to the kernel, which gives the leases back as the process exits.
    for c in list(_clients.values()):
        if c._pid == os.getpid():
            try:
                c._close(timeout=1, release_each=False)
            except Exception:
                pass


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
