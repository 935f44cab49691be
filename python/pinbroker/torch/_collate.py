# SPDX-License-Identifier: MIT
"""The collate room of pinbroker.torch: what a worker runs (_RingCollate) to collate a batch straight into a
ring slot, following default_collate's rules leaf by leaf, and the small layout it sends back instead of the
batch (_SlotBatch), or a batch collated torch's way with the reason (_TorchPath); _build turns a layout back
into the batch, its tensors viewing the slot. Also the slot layout's alignment rules (_Arena, _nbytes).

It uses the ring room (_ring.py) only through _Ring's methods, and imports nothing else of the package.
"""

from __future__ import annotations

import collections.abc
import re
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate

from ._ring import _Ring

_ALIGN_BYTES = 64  # every leaf starts on a cache line (and on any dtype's alignment)
# Leaves this large start on a page: a copy engine reading from a 64-byte-aligned start ran at 0.90x of
# torch's (page-aligned) pinned tensors on the H200 (48.5 against 53.8 GB/s at 38.5 MB).
_PAGE_ALIGN_MIN_BYTES = 64 * 1024
_PAGE_BYTES = 4096

_np_str_obj_array_pattern = re.compile(r"[SaUO]")
_string_classes = (str, bytes)

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
