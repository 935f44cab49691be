# SPDX-License-Identifier: MIT
"""A drop-in ``torch.utils.data.DataLoader`` whose workers collate straight into a pinned ring leased from pinbrokerd.

Usage::

    from pinbroker.torch import DataLoader

    loader = DataLoader(dataset, batch_size=64, num_workers=8, shuffle=True)
    for batch in loader:                      # tensors are already pinned: batch["x"].is_pinned()
        x = batch["x"].cuda(non_blocking=True)
        ...

How it works. When an iterator starts (before its workers start), the main process leases one ring of
``slots`` slots from the broker, each big enough for one batch; the library registers the ring with CUDA.
A worker takes a free slot, collates the batch's tensors directly into it (``torch.stack(..., out=slot)``)
and sends back only the slot number and a small layout (dtypes, shapes, offsets, and the non-tensor leaves
such as strings). The main process yields tensors that view the slot: they are pinned, so no pin thread runs
and nothing is copied on the host. Only the batch's structure crosses the worker queue.

How workers reach the ring:

- ``fork`` (Linux's default before Python 3.14): the ring is leased before the workers fork, so they inherit
  the mapping. A worker checks that it did (/proc/self/maps: a range marked MADV_DONTFORK is not inherited)
  and otherwise attaches as below.
- ``spawn`` / ``forkserver``: each worker attaches to the ring with a share token (``Lease.share()`` and
  ``Client.attach()``, shared leases), over its own connection to the broker, with ``PINBROKER_NO_CUDA=1``:
  only the main process, which copies to the GPU, registers the ring with CUDA. Where the library or the
  daemon has no shared leases, those loaders behave like ``DataLoader(pin_memory=True)`` and say so once.
  (The library closes a lease's memfds once mapped, and reopening a mapping through /proc/PID/map_files
  needs CAP_SYS_ADMIN, so there is no fd-passing fallback that works for ordinary users.)

Lifetime contract of a yielded batch. The tensors of a batch view their slot. The slot is reused only when
both hold:

1. the program has let go of every tensor that views the slot, including views made from them (``x[0]``,
   ``x.view(...)``): the slot is tracked through the tensors' shared storage, not through the batch object;
   a loop variable holds the previous batch until it is rebound, which the default slot count allows for;
2. the CUDA work that may read the slot has completed. When the last reference goes, an event is recorded on
   the current CUDA stream (if this process has a CUDA context), which covers ``x.cuda(non_blocking=True)``
   issued on that stream (of the current device). Copies issued on another stream or device must be
   announced with :func:`record_stream` (``pinbroker.torch.record_stream(batch, stream)``) before the batch
   is dropped, as ``Tensor.record_stream`` is for the caching allocator.

Keeping a batch therefore never corrupts it: a program that holds many batches only makes the later ones
take torch's path (counted in :attr:`DataLoader.stats` as ``ring full``). Writing into a yielded batch is
allowed; it is your memory until you drop it.

When the ring cannot be used, the loader behaves exactly like ``torch.utils.data.DataLoader`` with
``pin_memory=True`` (pinning only where CUDA is available, as torch does), and warns once per loader:

- no daemon, or the broker refused the ring (budget, quota, pressure): the whole iterator takes torch's path;
- a batch larger than its slot: that batch takes torch's path; the next iterator sizes its slots from the
  largest batch seen;
- the ring is revoked mid-epoch: workers stop writing into it (an attached worker also gives its mapping
  back, from its own revoke callback, once the batch it is writing is done), batches already collated into
  slots are copied out and yielded in order, the ring is given back as soon as no slot is held (before the
  deadline, unless the program itself keeps a batch past it: the ring is never unmapped under a live
  tensor), and the epoch continues on torch's path. Persistent workers stay on torch's path for the
  loader's life; other loaders lease a new ring at their next iterator;
- the daemon dies: the ring's memory stays mapped and valid; within a second (a liveness check) the ring is
  closed as if revoked and the epoch continues on torch's path; the next iterator finds no daemon and takes
  torch's path from the start.

Slot sizing. Without ``slot_bytes``, the first iterator sizes slots from one sample (``dataset[0]``, read in
the main process with the random-number generators' states saved and restored, so the epoch's order and
augmentations are unchanged) times ``batch_size`` times ``headroom``; later iterators use the largest batch
seen when that is bigger. Iterable datasets are not probed: their first iterator takes torch's path and
measures. The ring has ``slots`` slots, by default ``prefetch_factor * num_workers + 4``: every batch in
flight, plus the one being consumed, the one before it, and two whose copies may still be in flight.
"""

from __future__ import annotations

import collections.abc
import ctypes
import itertools
import multiprocessing
import os
import random
import re
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils.data
from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate

# torch's CUDA host allocator backed by pinbrokerd (pin_memory=True everywhere): see torch_alloc.py.
from .torch_alloc import HostAllocator, allocator_stats, install, install_from_env, uninstall

__all__ = ["DataLoader", "PinnedDataLoader", "record_stream", "slot_of", "HostAllocator", "allocator_stats",
           "install", "install_from_env", "uninstall"]

# Slot states in the shared state array (index 0 is the ring's "closed" flag).
_FREE = 0
_ISSUED = 1  # taken by a worker (or the main process with num_workers=0) that is collating into it
_MAIN = 2  # back in the main process: yielded and held, or waiting for its CUDA events

_ALIGN_BYTES = 64  # every leaf starts on a cache line (and on any dtype's alignment)
# Leaves this large start on a page: a copy engine reading from a 64-byte-aligned start ran at 0.90x of
# torch's (page-aligned) pinned tensors on the H200 (48.5 against 53.8 GB/s at 38.5 MB).
_PAGE_ALIGN_MIN_BYTES = 64 * 1024
_PAGE_BYTES = 4096
_DEFAULT_HEADROOM = 1.25
_DEFAULT_SLOT_WAIT_S = 0.05  # how long a worker waits for a free slot before taking torch's path
_POLL_S = 0.0005
_WATCH_S = 1.0  # how often a process with rings checks that pinbrokerd still answers

_np_str_obj_array_pattern = re.compile(r"[SaUO]")
_string_classes = (str, bytes)

_ring_ids = itertools.count(1)
_elem_size_cache: Dict[torch.dtype, int] = {}


def _elem_size(dtype: torch.dtype) -> int:
    size = _elem_size_cache.get(dtype)
    if size is None:
        size = torch.empty((), dtype=dtype).element_size()
        _elem_size_cache[dtype] = size
    return size


def _align(n: int) -> int:
    return (n + _ALIGN_BYTES - 1) & ~(_ALIGN_BYTES - 1)


def _leaf_align(off: int, nbytes: int) -> int:
    """Where a leaf of nbytes starts at or after off: a page for large leaves, else a cache line."""
    if nbytes >= _PAGE_ALIGN_MIN_BYTES:
        return (off + _PAGE_BYTES - 1) & ~(_PAGE_BYTES - 1)
    return _align(off)


def _leaf_bytes(nbytes: int) -> int:
    """Bytes a leaf may take in a slot, with the worst-case padding before it."""
    return _align(nbytes) + (_PAGE_BYTES if nbytes >= _PAGE_ALIGN_MIN_BYTES else 0)


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


# --------------------------------------------------------------------------------------------- the broker


class _Broker:
    """This process's one connection for DataLoader rings, and the revoke dispatch to rings."""

    _lock = threading.Lock()
    _client: Any = None
    _client_pid = 0
    _rings: Dict[int, "_Ring"] = {}  # id(lease) -> ring
    _watcher: Optional[threading.Thread] = None
    _watcher_pid = 0

    @classmethod
    def client(cls) -> Any:
        """The connection, made on first use (and again in a forked child); raises OSError without a daemon."""
        import pinbroker

        with cls._lock:
            if cls._client is None or cls._client_pid != os.getpid():
                if cls._client_pid != os.getpid():
                    # A client inherited through fork is the parent's (its receiver thread does not exist
                    # here), and so are its rings.
                    cls._rings = {}
                cls._client = None
                client = pinbroker.connect()
                on_revoke = getattr(client, "on_revoke", None)
                if on_revoke is not None:
                    on_revoke(cls._on_revoke)
                cls._client = client
                cls._client_pid = os.getpid()
            return cls._client

    @classmethod
    def register(cls, lease: Any, ring: "_Ring") -> None:
        with cls._lock:
            cls._rings[id(lease)] = ring
            if cls._watcher is None or cls._watcher_pid != os.getpid() or not cls._watcher.is_alive():
                cls._watcher_pid = os.getpid()
                cls._watcher = threading.Thread(target=cls._watch, name="pinbroker-ring-watch", daemon=True)
                cls._watcher.start()

    @classmethod
    def _watch(cls) -> None:
        """Every second while rings exist: if the daemon is gone, close them (their memory stays valid)."""
        while True:
            time.sleep(_WATCH_S)
            with cls._lock:
                if cls._watcher_pid != os.getpid():
                    return
                rings = list(cls._rings.values())
                client = cls._client
            if not rings or client is None or cls.alive(client):
                continue
            with cls._lock:
                if cls._client is client:
                    cls._client = None  # the next ring connects anew (to a restarted daemon, say)
            for ring in rings:
                ring.revoke(None, why="pinbrokerd went away")

    @staticmethod
    def alive(client: Any) -> bool:
        try:
            client.status()
            return True
        except OSError:
            return False

    @classmethod
    def forget_if_dead(cls) -> None:
        """Drop a connection that no longer answers, so the next ring connects anew."""
        with cls._lock:
            client = cls._client
        if client is not None and not cls.alive(client):
            with cls._lock:
                if cls._client is client:
                    cls._client = None

    @classmethod
    def unregister(cls, lease: Any) -> None:
        with cls._lock:
            cls._rings.pop(id(lease), None)

    @classmethod
    def _on_revoke(cls, lease: Any, deadline_ms: Any = None, *rest: Any) -> None:
        """The library's revoke callback (its receiver thread): close the ring; a thread gives it back."""
        with cls._lock:
            ring = cls._rings.get(id(lease))
            if ring is None:
                for r in cls._rings.values():
                    if r.owns(lease):
                        ring = r
                        break
        if ring is not None:
            ring.revoke(deadline_ms if isinstance(deadline_ms, (int, float)) else None)


# ----------------------------------------------------------------------------------------------- the ring


def _maps_signature(addr: int, nbytes: int) -> Optional[List[Tuple[int, int, str, str]]]:
    """The /proc/self/maps entries over [addr, addr + nbytes): (start, end, inode, path) each, or None without
    /proc. What a forked worker compares, to tell the ring it inherited from memory mapped there since."""
    if not addr:
        return []
    end = addr + nbytes
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if hi > addr and lo < end:
                    out.append((lo, hi, parts[4], parts[5].strip() if len(parts) > 5 else ""))
    except OSError:
        return None
    return out


class _Ring:
    """One leased ring of equal slots, shared by the main process and its workers.

    The main process owns the lease. Workers see the ring's mapping (inherited through fork, or attached
    by token) and a small shared state array: index 0 is the "closed" flag, 1 + i is slot i's state.
    Only the main process frees a slot it got back; a worker frees only a slot it took and did not fill.
    """

    def __init__(
        self,
        lease: Any,
        slot_bytes: int,
        n_slots: int,
        ctx: Any,
        token: Optional[bytes],
        label: str,
    ) -> None:
        self.id = next(_ring_ids)
        self.owner_pid = os.getpid()
        self.lease = lease
        self.slot_bytes = slot_bytes
        self.n_slots = n_slots
        self.token = token
        self.label = label
        self.mv: Optional[memoryview] = lease.memoryview()
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mv)) if not self.mv.readonly else 0
        self.nbytes = slot_bytes * n_slots
        self.maps_sig = _maps_signature(self.addr, self.nbytes)
        self.kind = str(getattr(lease, "kind", "?"))
        self.state = ctx.RawArray("i", n_slots + 1)
        # Recursive: a slot's finaliser (which frees it) can run from a garbage collection that starts while
        # this thread already holds the lock.
        self.mp_lock = ctx.RLock()
        # Main-process only (not pickled): held slots and their CUDA events.
        self._cond = threading.Condition()
        self._events: Dict[int, List[Any]] = {}
        self._pending: Dict[int, List[Any]] = {}
        self._views: Dict[int, Any] = {}  # slot -> the weakref.finalize of its yielded view
        self.revoking = False
        self.revoke_why = ""
        self.revoke_deadline: Optional[float] = None
        self.released = False
        self._releaser: Optional[threading.Thread] = None
        self._warned_overdue = False
        self.ring_u8 = torch.frombuffer(self.mv, dtype=torch.uint8)
        # Worker side (per process): the mapping it uses and how it got it.
        self._child_mv: Optional[memoryview] = None
        self._child_lease: Any = None
        self._child_u8: Optional[torch.Tensor] = None
        self._child_pid = 0
        self._child_unmapped = False
        self._child_revoked = False
        self._child_lock = threading.Lock()
        self._rr = 0

    # -- pickling: what a spawn/forkserver worker gets

    def __getstate__(self) -> Dict[str, Any]:
        return {
            "id": self.id,
            "owner_pid": self.owner_pid,
            "slot_bytes": self.slot_bytes,
            "n_slots": self.n_slots,
            "token": self.token,
            "label": self.label,
            "nbytes": self.nbytes,
            "state": self.state,
            "mp_lock": self.mp_lock,
        }

    def __setstate__(self, st: Dict[str, Any]) -> None:
        self.__dict__.update(st)
        self.lease = None
        self.mv = None
        self.addr = 0
        self.ring_u8 = None
        self.revoking = False
        self.released = False
        self._child_mv = None
        self._child_lease = None
        self._child_u8 = None
        self._child_pid = 0
        self._child_unmapped = False
        self._child_revoked = False
        self._child_lock = threading.Lock()
        self._rr = 0

    def owns(self, lease: Any) -> bool:
        return lease is self.lease or (
            getattr(lease, "id", None) is not None and getattr(lease, "id", None) == getattr(self.lease, "id", -1)
        )

    # -- worker side

    def closed(self) -> bool:
        return self.state[0] != 0

    def local_u8(self) -> Optional[torch.Tensor]:
        """The ring as a uint8 tensor in this process, or None when this process cannot map it."""
        pid = os.getpid()
        if pid == self.owner_pid:
            return self.ring_u8 if not self.released else None
        if self._child_pid == pid:
            return self._child_u8
        self._child_pid = pid
        self._child_u8 = None
        if self.mv is not None and self._inherited():
            # Forked: the mapping and its Python view came along.
            self._child_mv = self.mv
            self._child_u8 = self.ring_u8
            return self._child_u8
        # Spawned, or forked without the mapping (a range marked MADV_DONTFORK is not inherited).
        self.addr = 0
        if self.token is None:
            return None
        try:
            import pinbroker

            # A worker only writes into the ring: registering it with CUDA here would start a CUDA context
            # in every worker. (Read when the library first looks for the driver, which in a spawned worker
            # is this attach.)
            os.environ.setdefault("PINBROKER_NO_CUDA", "1")
            client = pinbroker.connect()
            # A revoke reaches every mapper: this worker lets go of its mapping in time, by itself.
            client.on_revoke(self._child_on_revoke)
            lease = client.attach(self.token, label=self.label)
            mv = lease.memoryview()
        except (OSError, AttributeError, ValueError, NotImplementedError) as e:
            warnings.warn(
                f"pinbroker DataLoader worker {pid}: cannot attach to the ring ({e}); this worker takes "
                "torch's path",
                RuntimeWarning,
            )
            return None
        self._child_client = client
        self._child_lease = lease
        self._child_mv = mv
        self._child_u8 = torch.frombuffer(mv, dtype=torch.uint8)
        return self._child_u8

    def _child_on_revoke(self, lease: Any, deadline_ms: Any = None) -> None:
        """A worker's revoke callback (its library's receiver thread): give the attachment back, after the
        batch being written, if any (the main process reads that slot through its own mapping)."""
        with self._child_lock:
            self._child_revoked = True
            self.child_drop_mapping()

    def _inherited(self) -> bool:
        """In a forked worker: the ring's own mapping is here (not a hole, nor something mapped into one)."""
        here = _maps_signature(self.addr, self.nbytes)
        if here is None or self.maps_sig is None:
            return True  # no /proc to tell: trust fork semantics
        return bool(here) and here == self.maps_sig

    def child_drop_mapping(self) -> None:
        """In a worker, once the ring is closed: stop mapping it (attached: release; forked: PROT_NONE)."""
        if os.getpid() == self.owner_pid or self._child_unmapped or self._child_pid != os.getpid():
            return
        self._child_unmapped = True
        self._child_u8 = None
        if self._child_lease is not None:
            self._child_mv = None
            try:
                self._child_lease.release()
            except (OSError, ValueError):
                pass
            self._child_lease = None
        elif self.addr and self.nbytes:
            # The inherited mapping would keep the broker's pages in this process after the main process gave
            # them back; replace it in place with an inaccessible one (never a hole something else could reuse).
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
            prot_none, map_private, map_anonymous, map_fixed = 0, 0x02, 0x20, 0x10
            libc.mmap(self.addr, self.nbytes, prot_none, map_private | map_anonymous | map_fixed, -1, 0)

    def take_slot(self, wait_s: float) -> Tuple[Optional[int], str]:
        """A free slot for this process to collate into, or (None, reason)."""
        deadline = time.monotonic() + wait_s
        n = self.n_slots
        while True:
            with self.mp_lock:
                if self.state[0]:
                    return None, "revoked"
                for k in range(n):
                    i = (self._rr + k) % n
                    if self.state[1 + i] == _FREE:
                        self.state[1 + i] = _ISSUED
                        self._rr = i + 1
                        return i, ""
            if time.monotonic() >= deadline:
                return None, "ring full"
            time.sleep(_POLL_S)

    def untake_slot(self, slot: int) -> None:
        """Give back a slot this process took and did not fill."""
        with self.mp_lock:
            if self.state[1 + slot] == _ISSUED:
                self.state[1 + slot] = _FREE
        self._notify()

    # -- main side

    def mark_main(self, slot: int) -> None:
        with self.mp_lock:
            self.state[1 + slot] = _MAIN

    def free_slot(self, slot: int) -> None:
        with self.mp_lock:
            self.state[1 + slot] = _FREE
        self._notify()

    def _notify(self) -> None:
        if os.getpid() == self.owner_pid:
            with self._cond:
                self._cond.notify_all()

    def record(self, slot: int, stream: Any) -> None:
        """Add an event on stream that must complete before slot is reused."""
        ev = torch.cuda.Event()
        ev.record(stream)
        with self._cond:
            self._events.setdefault(slot, []).append(ev)

    def on_dropped(self, slot: int) -> None:
        """The last tensor viewing slot is gone (any thread): free it now, or once its CUDA events complete."""
        with self._cond:
            events = self._events.pop(slot, [])
            self._views.pop(slot, None)
        try:
            if torch.cuda.is_initialized():  # no CUDA context here: no copy can be reading the slot
                ev = torch.cuda.Event()
                ev.record(torch.cuda.current_stream())
                events.append(ev)
        except RuntimeError:
            pass
        if events:
            with self._cond:
                self._pending[slot] = events
                self._cond.notify_all()
            self.poll()
        else:
            self.free_slot(slot)

    def poll(self) -> None:
        """Free the slots whose CUDA events have all completed."""
        with self._cond:
            done = [s for s, evs in self._pending.items() if all(e.query() for e in evs)]
            for s in done:
                del self._pending[s]
        for s in done:
            self.free_slot(s)

    def slot_view(self, slot: int) -> torch.Tensor:
        """A uint8 tensor over slot whose storage, when collected, frees the slot (the lifetime contract)."""
        arr = np.frombuffer(self.mv, dtype=np.uint8, count=self.slot_bytes, offset=slot * self.slot_bytes)
        fin = weakref.finalize(arr, self.on_dropped, slot)
        fin.atexit = False
        self._views[slot] = fin
        return torch.from_numpy(arr)

    def plain_slot_view(self, slot: int) -> torch.Tensor:
        off = slot * self.slot_bytes
        return self.ring_u8[off : off + self.slot_bytes]

    def in_use(self) -> int:
        with self.mp_lock:
            return sum(1 for i in range(self.n_slots) if self.state[1 + i] != _FREE)

    def reconcile(self) -> None:
        """No worker runs and no iterator is active: slots a worker took but never returned are free again, and
        so are slots back in the main process with no view alive and no CUDA work pending (an exception, such as
        torch's worker-death signal, can land between marking a slot and viewing it, or inside its finaliser)."""
        with self._cond:
            unviewed = [i for i in range(self.n_slots) if i not in self._pending and
                        not (i in self._views and self._views[i].alive)]
        with self.mp_lock:
            for i in range(self.n_slots):
                if self.state[1 + i] == _ISSUED or (self.state[1 + i] == _MAIN and i in unviewed):
                    self.state[1 + i] = _FREE
        self._notify()

    def revoke(self, deadline_ms: Optional[float], why: str = "pinbrokerd revoked the pinned ring") -> None:
        """The broker wants the ring back (receiver thread): close it; a thread releases it when no slot is held."""
        with self.mp_lock:
            self.state[0] = 1
        with self._cond:
            if self.revoking or self.released:
                return
            self.revoking = True
            self.revoke_why = why
            self.revoke_deadline = time.monotonic() + (deadline_ms / 1000.0 if deadline_ms else 5.0)
            self._releaser = threading.Thread(target=self._release_when_free, name="pinbroker-ring-release", daemon=True)
            self._releaser.start()

    def close(self) -> None:
        """Stop handing out slots and give the lease back once no slot is held (now, if none is)."""
        with self.mp_lock:
            self.state[0] = 1
        with self._cond:
            if self.released or self._releaser is not None:
                return
            if not any(self.state[1 + i] for i in range(self.n_slots)):
                self._release_locked()
                return
            self._releaser = threading.Thread(target=self._release_when_free, name="pinbroker-ring-release", daemon=True)
            self._releaser.start()

    def _release_when_free(self) -> None:
        with self._cond:
            while not self.released:
                busy = [i for i in range(self.n_slots) if self.state[1 + i] != _FREE]
                if not busy:
                    self._release_locked()
                    return
                if (
                    self.revoke_deadline is not None
                    and not self._warned_overdue
                    and time.monotonic() > self.revoke_deadline - 0.5
                ):
                    self._warned_overdue = True
                    warnings.warn(
                        f"pinbroker DataLoader: the revoked ring ({self.label}) cannot be given back: "
                        f"{len(busy)} slot(s) are still held by batches the program keeps or by workers; the "
                        "broker may enforce its revoke deadline. Drop batches promptly (del batch).",
                        RuntimeWarning,
                    )
                self._cond.wait(0.01)
                if self._pending:
                    self._cond.release()
                    try:
                        self.poll()
                    finally:
                        self._cond.acquire()

    def _release_locked(self) -> None:
        self.released = True
        lease = self.lease
        self.lease = None
        self.ring_u8 = None
        self.mv = None
        if lease is not None:
            _Broker.unregister(lease)
            try:
                lease.release()
            except OSError:
                pass


# ---------------------------------------------------------------------------------- collating into a slot


class _NoRoom(Exception):
    pass


class _Arena:
    """Bump allocation of aligned leaves inside one slot."""

    def __init__(self, slot_u8: torch.Tensor) -> None:
        self.buf = slot_u8
        self.cap = slot_u8.numel()
        self.off = 0

    def take(self, dtype: torch.dtype, shape: Sequence[int]) -> Tuple[int, torch.Tensor]:
        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * _elem_size(dtype)
        off = _leaf_align(self.off, nbytes)
        if off + nbytes > self.cap:
            raise _NoRoom()
        self.off = off + nbytes
        return off, self.buf[off : off + nbytes].view(dtype).view(tuple(shape))


# Layout descriptors: what crosses the worker queue instead of the batch.
#   ("T", offset, dtype, shape)          a tensor in the slot
#   ("V", value)                          a leaf that travels as it is (strings, odd types: torch's own way)
#   ("M", type, [(key, desc), ...])       a mapping, rebuilt as type(dict) (or a dict when type refuses)
#   ("N", type, [desc, ...])              a namedtuple
#   ("L", [desc, ...])                    a list
#   ("S", type, [desc, ...])              another sequence, rebuilt as type(list) (or a list)


def _tensor_leaf(t: torch.Tensor, arena: _Arena) -> Tuple[Any, ...]:
    off, out = arena.take(t.dtype, t.shape)
    out.copy_(t)
    return ("T", off, t.dtype, tuple(t.shape))


def _collate_into(batch: Sequence[Any], arena: _Arena) -> Tuple[Any, ...]:
    """default_collate(batch), written into arena; returns the layout. Mirrors torch's rules leaf by leaf."""
    elem = batch[0]
    elem_type = type(elem)
    if isinstance(elem, torch.Tensor):
        if (
            elem.layout != torch.strided
            or any(b.requires_grad for b in batch)
            or getattr(elem, "is_nested", False)
            or type(elem) is not torch.Tensor
        ):
            return ("V", default_collate(batch))
        off, out = arena.take(elem.dtype, (len(batch),) + tuple(elem.shape))
        torch.stack(batch, 0, out=out)
        return ("T", off, elem.dtype, tuple(out.shape))
    if elem_type.__module__ == "numpy" and elem_type.__name__ != "str_" and elem_type.__name__ != "string_":
        if elem_type.__name__ in ("ndarray", "memmap"):
            if _np_str_obj_array_pattern.search(elem.dtype.str) is not None:
                return ("V", default_collate(batch))  # raises torch's own TypeError
            return _collate_into([torch.as_tensor(b) for b in batch], arena)
        if elem.shape == ():
            return _tensor_leaf(torch.as_tensor(batch), arena)
        return ("V", default_collate(batch))
    if isinstance(elem, float):
        return _tensor_leaf(torch.tensor(batch, dtype=torch.float64), arena)
    if isinstance(elem, int):
        return _tensor_leaf(torch.tensor(batch), arena)
    if isinstance(elem, _string_classes):
        return ("V", batch)
    if isinstance(elem, collections.abc.Mapping):
        return ("M", elem_type, [(key, _collate_into([d[key] for d in batch], arena)) for key in elem])
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return ("N", elem_type, [_collate_into(samples, arena) for samples in zip(*batch)])
    if isinstance(elem, collections.abc.Sequence):
        it = iter(batch)
        elem_size = len(next(it))
        if not all(len(e) == elem_size for e in it):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        parts = [_collate_into(samples, arena) for samples in transposed]
        if isinstance(elem, tuple) or elem_type is list:
            return ("L", parts)
        return ("S", elem_type, parts)
    return ("V", default_collate(batch))  # raises torch's TypeError for what it cannot collate


def _describe_into(obj: Any, arena: _Arena) -> Tuple[Any, ...]:
    """The layout of an already collated batch (a custom collate_fn's output), copying its tensors into arena."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.requires_grad or type(obj) is not torch.Tensor:
            return ("V", obj)
        return _tensor_leaf(obj, arena)
    if isinstance(obj, collections.abc.Mapping):
        return ("M", type(obj), [(k, _describe_into(v, arena)) for k, v in obj.items()])
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return ("N", type(obj), [_describe_into(v, arena) for v in obj])
    if type(obj) is list:
        return ("L", [_describe_into(v, arena) for v in obj])
    if type(obj) is tuple:
        return ("S", tuple, [_describe_into(v, arena) for v in obj])
    return ("V", obj)


def _build(desc: Tuple[Any, ...], base: torch.Tensor, copy: bool) -> Any:
    """The batch for a layout, its tensors viewing base (or copies of it, with copy)."""
    tag = desc[0]
    if tag == "T":
        _, off, dtype, shape = desc
        numel = 1
        for d in shape:
            numel *= d
        t = base[off : off + numel * _elem_size(dtype)].view(dtype).view(shape)
        return t.clone() if copy else t
    if tag == "V":
        return desc[1]
    if tag == "M":
        d = {k: _build(v, base, copy) for k, v in desc[2]}
        if desc[1] is dict:
            return d
        try:
            return desc[1](d)
        except TypeError:
            return d
    if tag == "N":
        return desc[1](*(_build(v, base, copy) for v in desc[2]))
    if tag == "L":
        return [_build(v, base, copy) for v in desc[1]]
    if tag == "S":
        items = [_build(v, base, copy) for v in desc[2]]
        try:
            return desc[1](items)
        except TypeError:
            return items
    raise ValueError(f"pinbroker DataLoader: unknown layout tag {tag!r}")


def _nbytes(obj: Any) -> int:
    """Bytes a batch takes in a slot, counting alignment."""
    if isinstance(obj, torch.Tensor):
        return _leaf_bytes(obj.numel() * obj.element_size())
    if isinstance(obj, np.ndarray):
        return _leaf_bytes(obj.nbytes)
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return _ALIGN_BYTES
    if isinstance(obj, collections.abc.Mapping):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


class _SlotBatch:
    """What a worker returns for a batch collated into a slot."""

    __slots__ = ("ring_id", "slot", "desc", "used")

    def __init__(self, ring_id: int, slot: int, desc: Tuple[Any, ...], used: int) -> None:
        self.ring_id = ring_id
        self.slot = slot
        self.desc = desc
        self.used = used

    def __reduce__(self) -> Any:
        return (_SlotBatch, (self.ring_id, self.slot, self.desc, self.used))


class _TorchPath:
    """A batch collated the usual way (it travels as torch sends batches), with why."""

    __slots__ = ("batch", "reason", "nbytes")

    def __init__(self, batch: Any, reason: str, nbytes: int) -> None:
        self.batch = batch
        self.reason = reason
        self.nbytes = nbytes

    def __reduce__(self) -> Any:
        return (_TorchPath, (self.batch, self.reason, self.nbytes))


class _RingCollate:
    """The collate_fn the workers run: into a slot when the ring is there, torch's way otherwise."""

    def __init__(self, collate_fn: Optional[Callable[[Any], Any]], slot_wait_s: float) -> None:
        self.user_collate = collate_fn
        self.slot_wait_s = slot_wait_s
        self.ring: Optional[_Ring] = None  # set by the loader before the workers start

    def _plain(self, samples: Any) -> Any:
        return (self.user_collate or default_collate)(samples)

    def __call__(self, samples: Any) -> Any:
        ring = self.ring
        if ring is None:
            return self._plain(samples)
        with ring._child_lock:  # a worker's revoke callback waits for the batch being written
            if ring.closed():
                ring.child_drop_mapping()
                return _TorchPath(self._plain(samples), "revoked", 0)
            if ring._child_revoked:
                return _TorchPath(self._plain(samples), "revoked", 0)
            u8 = ring.local_u8()
            if u8 is None:
                return _TorchPath(self._plain(samples), "worker cannot map the ring", 0)
            slot, why = ring.take_slot(self.slot_wait_s)
            if slot is None:
                if why == "revoked":
                    ring.child_drop_mapping()
                return _TorchPath(self._plain(samples), why, 0)
            off = slot * ring.slot_bytes
            arena = _Arena(u8[off : off + ring.slot_bytes])
            del u8  # only the ring holds views of an attachment, so a revoke can let go of it
            try:
                if self.user_collate is None:
                    desc = _collate_into(samples, arena)
                else:
                    desc = _describe_into(self.user_collate(samples), arena)
            except _NoRoom:
                ring.untake_slot(slot)
                out = self._plain(samples)
                return _TorchPath(out, "too big", _nbytes(out))
            except BaseException:
                ring.untake_slot(slot)
                raise
            return _SlotBatch(ring.id, slot, desc, arena.off)


# ------------------------------------------------------------------------------------------- the loader


def _probe_batch_bytes(dataset: Any, batch_size: Optional[int]) -> Optional[int]:
    """Bytes of one batch estimated from dataset[0], leaving every random-number generator as it was."""
    if batch_size is None or isinstance(dataset, IterableDataset):
        return None
    try:
        if len(dataset) == 0:
            return None
    except TypeError:
        return None
    py_state = random.getstate()
    np_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    try:
        sample = dataset[0]
    except Exception:  # noqa: BLE001 - any failure just means "not probed"; the epoch will report it properly
        return None
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
    per_sample = _nbytes(sample)
    if per_sample == 0:
        return None
    return per_sample * batch_size + 4096


_DL_PARAMS = None


def _dl_params() -> List[str]:
    global _DL_PARAMS
    if _DL_PARAMS is None:
        import inspect

        params = inspect.signature(torch.utils.data.DataLoader.__init__).parameters.values()
        _DL_PARAMS = [
            p.name for p in params if p.name != "self" and p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
        ]
    return _DL_PARAMS


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` (same arguments) with batches collated into a pinned, broker-leased ring.

    Extra keyword-only arguments:

    - ``slots``: slots in the ring (default ``prefetch_factor * num_workers + 4``, 4 with no workers);
    - ``slot_bytes``: bytes per slot (default: sized from the first sample, see the module docstring);
    - ``headroom``: factor over the estimated batch size (default 1.25);
    - ``label``: the lease's label in ``pinctl status`` (default ``"dataloader"``);
    - ``slot_wait_s``: how long a worker waits for a free slot before taking torch's path (default 0.05).

    ``pin_memory`` defaults to True: it is what the loader does when it cannot use the ring (like torch, only
    where CUDA is available). Batches from the ring are pinned whatever it says.

    :attr:`stats` counts ring and torch-path batches (with reasons). :meth:`close` gives the ring back
    (also done when the loader is collected, once no batch of it is held). The lifetime of yielded batches is
    in the module docstring: a slot is reused only after every tensor viewing it is gone and the CUDA work
    recorded for it (current stream at drop time, plus :func:`record_stream`) is done.
    """

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        slots: Optional[int] = None,
        slot_bytes: Optional[int] = None,
        headroom: float = _DEFAULT_HEADROOM,
        label: str = "dataloader",
        slot_wait_s: float = _DEFAULT_SLOT_WAIT_S,
        **kwargs: Any,
    ) -> None:
        names = _dl_params()
        if len(args) > len(names) - 1:
            raise TypeError(f"DataLoader takes at most {len(names)} positional arguments")
        for name, value in zip(names[1:], args):
            if name in kwargs:
                raise TypeError(f"DataLoader got multiple values for argument '{name}'")
            kwargs[name] = value
        self._pb_user_pin = bool(kwargs.pop("pin_memory", True))
        user_collate = kwargs.pop("collate_fn", None)
        self._pb_collate = _RingCollate(user_collate, slot_wait_s)
        self._pb_slots = slots
        self._pb_slot_bytes = slot_bytes
        self._pb_headroom = headroom
        self._pb_label = label
        self._pb_ring: Optional[_Ring] = None
        self._pb_inner: Any = None
        self._pb_inner_ring: Optional[_Ring] = None
        self._pb_live: "weakref.WeakSet[_PinnedIter]" = weakref.WeakSet()
        self._pb_seen_max = 0
        self._pb_warned: set = set()
        self._pb_stats: Dict[str, Any] = {"ring_batches": 0, "torch_path_batches": 0, "reasons": {}}
        self._pb_user_collate = user_collate
        super().__init__(dataset, collate_fn=self._pb_collate, pin_memory=self._pb_user_pin, **kwargs)
        self._pb_finalizer = weakref.finalize(self, DataLoader._close_ring, self._pb_collate)
        self._pb_finalizer.atexit = False

    # -- public

    @property
    def stats(self) -> Dict[str, Any]:
        """Counters: ring_batches, torch_path_batches, reasons {why: count}, and the ring (slots, slot_bytes, kind)."""
        out = dict(self._pb_stats)
        out["reasons"] = dict(self._pb_stats["reasons"])
        ring = self._pb_ring
        out["ring"] = (
            None
            if ring is None or ring.released
            else {"slots": ring.n_slots, "slot_bytes": ring.slot_bytes, "kind": ring.kind, "in_use": ring.in_use()}
        )
        return out

    def close(self) -> None:
        """Give the ring back (at once, or when the last held batch is dropped), and stop persistent workers
        (they map the ring). Later iterators start workers and lease a ring anew."""
        inner, self._pb_inner = self._pb_inner, None
        if inner is not None:
            shutdown = getattr(inner, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self._pb_inner_ring = None
        ring, self._pb_ring = self._pb_ring, None
        if ring is not None:
            if not any(it.active for it in self._pb_live):
                ring.reconcile()
            ring.close()

    @staticmethod
    def _close_ring(collate: _RingCollate) -> None:
        ring, collate.ring = collate.ring, None
        if ring is not None and ring.owner_pid == os.getpid():
            ring.reconcile()  # no iterator outlives its loader: what workers took will not come back
            ring.close()

    # -- iteration

    def _warn_once(self, key: str, message: str, stacklevel: int = 3) -> None:
        """Warn once per loader and kind, pointing at the program's line (its next() or its iter())."""
        if key in self._pb_warned:
            return
        self._pb_warned.add(key)
        warnings.warn(f"pinbroker DataLoader: {message}", RuntimeWarning, stacklevel=stacklevel)

    def _count(self, ring: bool, reason: str = "") -> None:
        if ring:
            self._pb_stats["ring_batches"] += 1
        else:
            self._pb_stats["torch_path_batches"] += 1
            r = self._pb_stats["reasons"]
            r[reason] = r.get(reason, 0) + 1

    def _start_method(self) -> str:
        ctx = self.multiprocessing_context
        if ctx is None:
            return multiprocessing.get_start_method()
        return ctx.get_start_method()

    def _mp_ctx(self) -> Any:
        return self.multiprocessing_context or multiprocessing.get_context()

    def _wanted_slot_bytes(self) -> Optional[int]:
        if self._pb_slot_bytes:
            return _round_up(int(self._pb_slot_bytes), _ALIGN_BYTES)
        est = _probe_batch_bytes(self.dataset, self.batch_size) if self._pb_seen_max == 0 else None
        need = max(est or 0, self._pb_seen_max)
        if need == 0:
            return None
        return _round_up(int(need * self._pb_headroom) + _ALIGN_BYTES, 4096)

    def _ensure_ring(self) -> Optional[_Ring]:
        """The ring for a new set of workers (kept, resized or leased anew), or None for torch's path."""
        if self.batch_size is None and self.batch_sampler is None:
            return None  # no automatic batching: per-sample conversion is torch's business
        want = self._wanted_slot_bytes()
        ring = self._pb_ring
        if ring is not None and (ring.released or ring.revoking or (want and ring.slot_bytes < want)):
            if any(it.active for it in self._pb_live):
                return ring if not (ring.released or ring.revoking) else None
            self.close()
            ring = None
        if ring is not None:
            return ring
        if want is None:
            self._warn_once("unsized", "cannot size ring slots before seeing a batch; this iterator takes torch's "
                            "path and measures (pass slot_bytes= to start at once)", stacklevel=4)
            return None
        method = "none" if self.num_workers == 0 else self._start_method()
        n_slots = self._pb_slots or (self.prefetch_factor or 2) * max(self.num_workers, 0) + 4
        try:
            client = _Broker.client()
            import pinbroker

            lease = client.acquire(want * n_slots, label=self._pb_label)
            kind = str(getattr(lease, "kind", ""))
            if "FALLBACK" in kind.upper():
                lease.release()
                raise OSError(getattr(lease, "fallback_reason", "the broker gave ordinary memory"))
            token = None
            if method == "fork":
                # Not needed where fork inherits the ring; a worker that finds it missing attaches instead.
                try:
                    token = lease.share()
                except (NotImplementedError, OSError):
                    token = None
            elif method in ("spawn", "forkserver"):
                try:
                    token = lease.share()
                except NotImplementedError:
                    lease.release()
                    self._warn_once(
                        "noshare",
                        f"{method} workers need shared leases, which this libpinbroker lacks; behaving like "
                        "torch.utils.data.DataLoader(pin_memory=True) (use the fork start method, or a newer "
                        "library and daemon)", stacklevel=4)
                    return None
                except OSError as e:
                    lease.release()
                    self._warn_once("noshare", f"the broker refused to share the ring with {method} workers ({e}); "
                                    "behaving like torch.utils.data.DataLoader(pin_memory=True)", stacklevel=4)
                    return None
            ring = _Ring(lease, want, n_slots, self._mp_ctx(), token, self._pb_label)
            _Broker.register(lease, ring)
            del pinbroker
        except OSError as e:
            _Broker.forget_if_dead()
            self._warn_once("refused", f"no pinned ring from pinbrokerd ({e}); behaving like "
                            "torch.utils.data.DataLoader(pin_memory=True)", stacklevel=4)
            return None
        self._pb_ring = ring
        return ring

    def __iter__(self) -> "_PinnedIter":  # type: ignore[override]
        persistent = self.persistent_workers and self.num_workers > 0
        if persistent and self._pb_inner is not None:
            self._pb_inner._reset(self)
            ring = self._pb_inner_ring
            if ring is not None and not ring.released and not any(it.active for it in self._pb_live):
                ring.reconcile()
            it = _PinnedIter(self, self._pb_inner, ring)
            self._pb_live.add(it)
            return it
        if not any(it.active for it in self._pb_live) and self._pb_ring is not None:
            self._pb_ring.reconcile()
        ring = self._ensure_ring()
        self._pb_collate.ring = ring
        # Ring batches are pinned already: the pin thread would only copy them.
        self.pin_memory = self._pb_user_pin if ring is None else False
        try:
            inner = self._get_iterator()
        finally:
            self.pin_memory = self._pb_user_pin
        if persistent:
            self._pb_inner = inner
            self._pb_inner_ring = ring
        it = _PinnedIter(self, inner, ring)
        self._pb_live.add(it)
        return it


PinnedDataLoader = DataLoader


class _PinnedIter:
    """Turns what the workers return (slot layouts, or torch-path batches) into the batches the program sees."""

    def __init__(self, loader: DataLoader, inner: Any, ring: Optional[_Ring]) -> None:
        self._loader = loader
        self._inner = inner
        self._ring = ring
        self.active = True
        # Where torch would pin: only when asked, and with CUDA here.
        self._pin = loader._pb_user_pin and torch.cuda.is_available()
        self._pin_device = getattr(loader, "pin_memory_device", "") or None
        self._revoke_warned = False

    def __iter__(self) -> "_PinnedIter":
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def _pinned(self, batch: Any) -> Any:
        if not self._pin:
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch, self._pin_device) if self._pin_device else pin_memory(batch)

    def __next__(self) -> Any:
        ring = self._ring
        if ring is not None and not ring.released:
            ring.poll()
        try:
            item = next(self._inner)
        except BaseException:
            self.active = False
            raise
        loader = self._loader
        if isinstance(item, _SlotBatch):
            if ring is None or item.ring_id != ring.id:
                raise RuntimeError("pinbroker DataLoader: a worker filled a slot of an unknown ring")
            ring.mark_main(item.slot)
            loader._pb_seen_max = max(loader._pb_seen_max, item.used)
            loader._count(True)
            if ring.revoking:
                self._warn_revoked()
                batch = _build(item.desc, ring.plain_slot_view(item.slot), copy=True)
                ring.free_slot(item.slot)
                return self._pinned(batch)
            return _build(item.desc, ring.slot_view(item.slot), copy=False)
        if isinstance(item, _TorchPath):
            loader._count(False, item.reason)
            if item.reason == "too big":
                loader._pb_seen_max = max(loader._pb_seen_max, item.nbytes)
                loader._warn_once(
                    "toobig",
                    f"a batch of {item.nbytes} bytes does not fit a {ring.slot_bytes if ring else 0}-byte slot; "
                    "such batches take torch's path (the next iterator sizes slots from the largest batch; or pass "
                    "slot_bytes=)",
                )
            elif item.reason == "revoked":
                self._warn_revoked()
            elif item.reason == "worker cannot map the ring":
                loader._warn_once(
                    "nomap",
                    "a worker cannot map the pinned ring (a forked worker did not inherit it, and it cannot attach "
                    "to it); its batches take torch's path",
                )
            elif item.reason == "ring full":
                loader._warn_once(
                    "full",
                    "every ring slot is held (batches kept by the program, or copies still in flight); such batches "
                    "take torch's path. Drop batches sooner, or pass slots=",
                )
            return self._pinned(item.batch)
        if ring is not None:
            loader._count(False, "no ring")
        elif loader._pb_seen_max == 0:
            loader._pb_seen_max = _nbytes(item)  # an unsized loader measures its first batch for the next ring
        return item

    def _warn_revoked(self) -> None:
        if not self._revoke_warned:
            self._revoke_warned = True
            why = self._ring.revoke_why if self._ring is not None else ""
            self._loader._warn_once(
                "revoked",
                f"{why or 'the pinned ring was closed'}; the rest of this epoch takes torch's path "
                "(DataLoader(pin_memory=True))",
            )

    def __del__(self) -> None:
        self.active = False


# ------------------------------------------------------------------------------------------------ helpers


def slot_of(tensor: torch.Tensor) -> Optional[Tuple["_Ring", int]]:
    """The (ring, slot number) a yielded tensor views, or None for a tensor outside every ring (diagnostics)."""
    ptr = tensor.data_ptr()
    for ring in list(_Broker._rings.values()):
        if ring.released or ring.ring_u8 is None:
            continue
        base = ring.ring_u8.data_ptr()
        if base <= ptr < base + ring.nbytes:
            return ring, (ptr - base) // ring.slot_bytes
    return None


def record_stream(batch: Any, stream: Any = None) -> None:
    """Announce CUDA work on stream (default: the current one) that reads batch's slot(s).

    Call it after issuing copies from the batch on a stream other than the current one, before dropping the
    batch: the slot is reused only after an event recorded now on that stream has completed. Leaves that do
    not come from a pinned ring are ignored (``Tensor.record_stream`` is for device tensors).
    """
    if stream is None:
        stream = torch.cuda.current_stream()
    seen = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            hit = slot_of(obj)
            if hit is not None and (id(hit[0]), hit[1]) not in seen:
                seen.add((id(hit[0]), hit[1]))
                hit[0].record(hit[1], stream)
        elif isinstance(obj, collections.abc.Mapping):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(batch)
