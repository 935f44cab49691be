# SPDX-License-Identifier: MIT
"""The loader room of pinbroker.torch: DataLoader (torch's, with its batches collated into a pinned ring), how
it sizes and leases the ring, and the iterator that turns what workers send back into the batches the program
sees (_PinnedIter). The package's docstring (pinbroker/torch/__init__.py) states the lifetime contract.

The top layer: it stands on the ring room (_ring.py) and the collate room (_collate.py); neither imports it.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import warnings
import weakref
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.utils.data
from torch.utils.data import IterableDataset

from ._collate import _ALIGN_BYTES, _build, _nbytes, _RingCollate, _SlotBatch, _TorchPath
from ._ring import _Broker, _Ring

__all__ = ["DataLoader", "PinnedDataLoader"]

_DEFAULT_HEADROOM = 1.25
_DEFAULT_SLOT_WAIT_S = 0.05  # how long a worker waits for a free slot before taking torch's path


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


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
