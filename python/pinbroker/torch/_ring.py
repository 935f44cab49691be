# SPDX-License-Identifier: MIT
"""The ring room of pinbroker.torch: one leased ring of equal slots shared by the main process and its workers
(_Ring), this process's connection for rings and the revoke dispatch to them (_Broker), and the two helpers that
find a tensor's slot (slot_of, record_stream).

The bottom layer of the package: it imports no other room of it. The slot states below are what the shared
state array holds; the collate room takes and gives back slots through _Ring's methods.
"""

from __future__ import annotations

import collections.abc
import ctypes
import itertools
import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

__all__ = ["record_stream", "slot_of"]

# Slot states in the shared state array (index 0 is the ring's "closed" flag).
_FREE = 0
_ISSUED = 1  # taken by a worker (or the main process with num_workers=0) that is collating into it
_MAIN = 2  # back in the main process: yielded and held, or waiting for its CUDA events
_POLL_S = 0.0005
_WATCH_S = 1.0  # how often a process with rings checks that pinbrokerd still answers

_ring_ids = itertools.count(1)


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
