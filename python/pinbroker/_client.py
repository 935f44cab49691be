# SPDX-License-Identifier: MIT
"""The client room: Client (one connection to pinbrokerd), Registration, the revoke callback's trampoline, and the
module functions (connect, acquire_or_fallback, cuda_available, library_path) with their fork and exit hooks.

It stands on the lease room (_lease.py: Lease and its _Mapping) and the status room (_status.py: the status
and admin calls); neither imports this one.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import math
import mmap
import os
import sys
import threading
import traceback
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _lib, _reserve, _staging, _status
from ._lease import _KIND_BY_C, _PRIO_TO_C, Kind, Lease, Priority, _dec, _Mapping, _page_size, _priority, _raise
from .errors import BrokerError, InvalidArgument, LibraryNotFound, NotConnected, PermissionDenied

__all__ = ["Client", "Registration", "RevokeCallback", "connect", "acquire_or_fallback", "cuda_available",
           "library_path"]

#: The socket of a daemon installed with its units (pb_connect's default).
DEFAULT_SOCKET = "/run/pinbroker/pinbroker.sock"

#: ``callback(lease, deadline_ms)``, called from libpinbroker's receiver thread.
RevokeCallback = Callable[["Lease", int], Any]

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
        shared = _lib.optional("pb_lease_shared_memory")
        #: True when the range is shared memory (a /dev/shm file, a memfd): the daemon charges every
        #: process's registrations of that file once, so charged_bytes may be more than this one adds.
        self.shared_memory = bool(shared(handle)) if shared else False

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
        self.path = socket_path(path)
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False
        self._mappings: Dict[int, weakref.ReferenceType] = {}
        self._registrations: set = set()  # pb_register handles not yet given back
        self._revoke_cb: Optional[RevokeCallback] = None
        self._staging_threshold: Optional[int] = None  # configure_staging's, else the environment's
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

    # -- reservations for a group of ranks

    def reserve(self, name: str, shares: int, share_bytes: int, *, wait: bool = False,
                timeout: Optional[float] = None) -> "_reserve.Reservation":
        """Reserve ``shares`` x ``share_bytes`` for a group of ranks, all or nothing, or join the group's
        reservation: every rank of a job (same uid and job cgroup) calls this with the same ``name``, ``shares``
        and ``share_bytes``; the first charges the whole group's bytes to the budget and the quotas at once, the
        others join it. Then each rank takes its share with :meth:`Reservation.acquire`.

        Refused at once, with the reason, when the whole does not fit now (BudgetExhausted, QuotaExceeded,
        TooLarge, MemoryPressure; nothing is charged then, never part of it), unless ``wait`` (or a ``timeout``
        in seconds): then it waits among the waiting acquires, in their order. InvalidArgument when a
        reservation of that name exists with other shares or share bytes."""
        if not isinstance(shares, int) or not isinstance(share_bytes, int) or shares <= 0 or share_bytes <= 0:
            raise ValueError(f"shares and share_bytes must be ints above 0 (got {shares!r}, {share_bytes!r})")
        timeout_ms = 0
        if timeout is not None:
            if timeout < 0:
                raise ValueError(f"timeout must be >= 0 seconds (got {timeout})")
            wait = True
            timeout_ms = max(1, min(int(math.ceil(timeout * 1000)), 0xFFFFFFFF))
        ptr = self._enter()
        try:
            return _reserve.reserve(self, ptr, name, shares, share_bytes, wait, timeout_ms)
        finally:
            self._leave()

    def reservations(self) -> Dict[str, Any]:
        """The reservations this caller may see (its uid's; all for an admin), as ``pinctl reservations
        --json`` has them: {"reserved_bytes", "reservations": [...]}."""
        ptr = self._enter()
        try:
            return _reserve.listing(ptr)
        finally:
            self._leave()

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

    def attach(self, token: Union[str, bytes], label: Optional[str] = None, *, cuda: bool = True) -> Lease:
        """Map a lease another process shared with :meth:`Lease.share`. Its release detaches this process;
        the lease lives until its last attacher lets it go. ``cuda=False`` maps it without registering it with
        CUDA (then :meth:`Lease.register_slice` registers this process's part). Raises PermissionDenied
        (EACCES/EPERM) for a uid without a grant, NotConnected (ENOENT) for a forged or stale token."""
        fn = _lib.optional("pb_attach") if cuda else _lib.optional("pb_attach_opts")
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
            if cuda:
                r = fn(ptr, token.encode("ascii", "replace"), ctypes.byref(ret))
            else:
                opts = _lib.AcquireOpts()
                opts.flags = _lib.PB_ACQUIRE_NO_CUDA
                r = fn(ptr, token.encode("ascii", "replace"), ctypes.byref(opts), ctypes.byref(ret))
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
        """The daemon's status as a dict: with ``leases=True``, the document ``pinctl status --json`` prints, with
        the same keys and the same nulls (summary figures, "nodes", "unbrokered_uids", "signals", "transitions",
        "revocations", "clients", "jobs" and "leases"); without, the same less "leases". Non-admins see only
        their own uid's rows under the daemon's status-visibility = own."""
        ptr = self._enter()
        try:
            return _status.query(ptr, leases)
        finally:
            self._leave()

    def headroom(self, no_revoke: bool = False, *, registration: bool = False) -> _status.Headroom:
        """How much this client may still acquire now, from one state of the daemon: ``.available`` bytes (an
        acquire of that many is granted now, one of a page more refused), ``.bounds`` (each a ``Bound`` with
        ``kind``, ``limit``, ``used``, ``left`` and ``reason``) and ``.binding``, the bound that binds. Size a
        host pool from it rather than from /proc/meminfo. ``no_revoke=True`` asks for a never-revoked lease
        (the max-no-revoke-per-uid cap binds too); ``registration=True`` for what ``register`` may charge."""
        ptr = self._enter()
        try:
            return _status.headroom(ptr, no_revoke, registration)
        finally:
            self._leave()

    def leases(self) -> List[Dict[str, Any]]:
        """Every lease row the daemon shows this caller (all of them for an admin), page by page."""
        ptr = self._enter()
        try:
            return _status.lease_pages(ptr)
        finally:
            self._leave()

    def revoke(self, lease_id: Optional[int] = None, *, uid: Optional[int] = None, all: bool = False,
               deadline_ms: int = 0, reservation: Optional[int] = None) -> List[int]:
        """Revoke (admin): one lease, every lease of ``uid``, or ``all``; or end ``reservation`` (an id) and
        revoke the leases taken from it. ``deadline_ms`` 0 is the daemon's revoke-deadline-ms. Returns the ids
        revoked. Raises PermissionDenied for a non-admin."""
        given = (lease_id is not None) + (uid is not None) + bool(all) + (reservation is not None)
        if given != 1:
            raise ValueError("revoke takes exactly one of lease_id, uid=, all=True or reservation=")
        ptr = self._enter()
        try:
            if reservation is not None:
                return _status.admin_revoke_reservation(ptr, reservation, deadline_ms)
            return _status.admin_revoke(ptr, lease_id, uid, all, deadline_ms)
        finally:
            self._leave()

    def set(self, key: str, value: str) -> None:
        """Change a reloadable daemon setting (admin), e.g. ``client.set("budget", "8G")``."""
        ptr = self._enter()
        try:
            _status.admin_set(ptr, key, value)
        finally:
            self._leave()

    def set_cache_limit(self, nbytes: int) -> None:
        """Keep up to ``nbytes`` of released leases mapped for a fast re-acquire (0 disables)."""
        ptr = self._enter()
        try:
            _lib.load().pb_set_cache_limit(ptr, nbytes)
        finally:
            self._leave()


    # -- staged copies (issue 39): pageable host memory to and from the device through a pinned ring

    def _staging_fn(self, name: str) -> Any:
        fn = _lib.optional(name)
        if fn is None:
            raise NotImplementedError(
                f"the libpinbroker loaded from {_lib.path()} has no {name}: staged copies need a newer "
                "libpinbroker; upgrade it, or point PINBROKER_LIBRARY at a newer build"
            )
        return fn

    def configure_staging(self, ring: Union[int, str, None] = None, slot: Union[int, str, None] = None,
                          threads: Optional[int] = None, threshold: Union[int, str, None] = None) -> None:
        """Settings of this client's staged copies, before its first one (pb_staging_configure): ``ring`` the
        pinned ring's size, ``slot`` one slot of it (the pipeline's unit; ring/slot >= 2), ``threads`` the host
        threads copying to and from slots, ``threshold`` the smallest copy staged. Sizes are bytes or strings
        such as "64M"; None keeps $PINBROKER_STAGING_RING / _SLOT / _THREADS / _THRESHOLD, else the default.
        Raises InvalidArgument (EINVAL) for a value out of range, naming it; BrokerError (EBUSY) once this
        client holds a ring."""
        opts = _staging.staging_opts(ring, slot, threads, threshold)
        fn = self._staging_fn("pb_staging_configure")
        ptr = self._enter()
        try:
            r = fn(ptr, ctypes.byref(opts))
            if r == -errno.EBUSY:
                raise BrokerError(errno.EBUSY, f"configure_staging: {_lib.last_error() or 'a ring is held'}: set "
                                  "the staging settings before the client's first staged copy")
            if r < 0:
                _raise(r, "configuring staged copies")
            self._staging_threshold = opts.threshold_bytes or _staging.env_threshold()
        finally:
            self._leave()

    @property
    def staging_threshold(self) -> int:
        """The smallest copy this client stages (configure_staging's threshold, else the environment's or the
        default): pinbroker.torch hands smaller ones to torch at once."""
        return self._staging_threshold or _staging.env_threshold()

    def staging_stats(self) -> "_staging.StagingStats":
        """What this client's staged copies did (pb_staging_stats): a :class:`pinbroker.StagingStats`."""
        fn = self._staging_fn("pb_staging_stats")
        out = _lib.StagingStats()
        ptr = self._enter()
        try:
            r = fn(ptr, ctypes.byref(out))
            if r < 0:
                _raise(r, "reading the staging counters")
        finally:
            self._leave()
        return _staging.StagingStats.from_c(out)

    def copy_to_device(self, dptr: Any, src: Any, stream: Any = None) -> None:
        """Copy the bytes of ``src`` (a contiguous buffer: bytes, bytearray, memoryview, a numpy array) to device
        memory at ``dptr`` (an int CUdeviceptr, or a CUDA tensor / an object with __cuda_array_interface__,
        whose size is then checked), through this client's staging ring (pb_copy_to_device).

        Same results as cuMemcpyHtoDAsync from pageable memory, sooner: returns once ``src`` may be reused;
        the copy is ordered on ``stream`` (None or 0: the legacy default stream; an int handle, a
        torch.cuda.Stream) and may still run on the GPU. Pinned or small buffers, a stream being captured, no
        ring: the driver copies it as it is. Needs a current CUDA context (the one dptr belongs to). Raises
        BrokerError: ENODEV (no CUDA driver), EIO (the driver failed the copy: the message names its error)."""
        d = _staging.check_device_pointer(dptr)
        handle = _staging.stream_handle(stream)
        with _staging.HostBuffer(src, writable=False, what="src") as buf:
            self._check_room(dptr, buf.nbytes)
            fn = self._staging_fn("pb_copy_to_device")
            ptr = self._enter()
            try:
                r = fn(ptr, d, buf.address or None, buf.nbytes, handle)
                if r < 0:
                    _raise(r, f"copying {buf.nbytes} bytes to the device at {d:#x}")
            finally:
                self._leave()

    def copy_from_device(self, dst: Any, dptr: Any, stream: Any = None) -> None:
        """Copy ``len(dst)`` bytes (all of a contiguous writable buffer: bytearray, memoryview, a numpy array)
        from device memory at ``dptr`` into ``dst`` through this client's staging ring (pb_copy_from_device).
        Returns when the data is in ``dst``, ordered on ``stream`` as :meth:`copy_to_device` is."""
        d = _staging.check_device_pointer(dptr)
        handle = _staging.stream_handle(stream)
        with _staging.HostBuffer(dst, writable=True, what="dst") as buf:
            self._check_room(dptr, buf.nbytes)
            fn = self._staging_fn("pb_copy_from_device")
            ptr = self._enter()
            try:
                r = fn(ptr, buf.address or None, d, buf.nbytes, handle)
                if r < 0:
                    _raise(r, f"copying {buf.nbytes} bytes from the device at {d:#x}")
            finally:
                self._leave()

    def _copy_raw(self, to_device: bool, dptr: int, host: int, nbytes: int, stream: Optional[int]) -> None:
        """pb_copy_to_device / pb_copy_from_device on raw addresses (pinbroker.torch: tensors' data_ptr())."""
        fn = self._staging_fn("pb_copy_to_device" if to_device else "pb_copy_from_device")
        ptr = self._enter()
        try:
            r = fn(ptr, dptr, host, nbytes, stream) if to_device else fn(ptr, host, dptr, nbytes, stream)
            if r < 0:
                _raise(r, f"copying {nbytes} bytes {'to' if to_device else 'from'} the device at {dptr:#x}")
        finally:
            self._leave()

    @staticmethod
    def _check_room(dptr: Any, nbytes: int) -> None:
        room = _staging.device_capacity(dptr)
        if room is not None and nbytes > room:
            raise InvalidArgument(errno.EINVAL, f"the host buffer has {nbytes} bytes, the device side only {room}")


# ---------------------------------------------------------------- module functions


def connect(path: Optional[str] = None) -> Client:
    """Connect to pinbrokerd at ``path`` (None: $PINBROKER_SOCKET, else /run/pinbroker/pinbroker.sock).

    Raises NotConnected (no daemon there), PermissionDenied (socket permissions), ProtocolError (version
    mismatch), or LibraryNotFound (libpinbroker is not installed).
    """
    lib = _lib.load()
    ret = ctypes.c_void_p()
    r = lib.pb_connect(path.encode() if path else None, ctypes.byref(ret))
    if r in (-errno.EACCES, -errno.EPERM):
        # The library says "no broker at ...": there is one, this user may not reach it.
        raise PermissionDenied(-r, _permission_advice(socket_path(path)))
    if r < 0:
        _raise(r, f"connecting to {path or 'pinbrokerd'}")
    return Client(int(ret.value), path)


def socket_path(path: Optional[str] = None) -> str:
    """The socket connect(path) uses: path, else $PINBROKER_SOCKET, else /run/pinbroker/pinbroker.sock."""
    return path or os.environ.get("PINBROKER_SOCKET") or DEFAULT_SOCKET


def _permission_advice(path: str) -> str:
    """What a user refused on connect is to do: the socket's group, or the folder on the way that shuts them out
    (the first one, walking from /, that this process may not enter), as pinctl's explain_eacces says."""
    head = (f"permission denied on {path}: add your user to the pinbroker group (or the daemon's socket-group) "
            "and log in again, or run as root")
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts)):
        folder = os.sep.join(parts[:i]) or os.sep
        if not os.access(folder, os.X_OK):
            try:
                st = os.stat(folder)
                what = f"mode {st.st_mode & 0o7777:04o}, group {_group(st.st_gid)}"
            except OSError:
                what = "its mode unknown"
            return f"{head}; the folder {folder} ({what}) does not let this user in: it must open to that group"
    try:
        st = os.stat(path)
        return f"{head} (the socket is mode {st.st_mode & 0o7777:04o}, group {_group(st.st_gid)})"
    except OSError:
        return head


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


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
    # would cut the parent's connection). Its Clients refuse to work; it inherits no lease's mapping (the library
    # maps them MADV_DONTFORK), so it never keeps the parent's memory past the lease's end.
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
