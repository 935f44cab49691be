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

- ``fork`` (Linux's default before Python 3.14): the ring is leased before the workers fork, but libpinbroker maps
  leases MADV_DONTFORK (a child must not keep a lease's memory past its end), so a worker finds it not inherited
  (/proc/self/maps) and attaches as below; with an older library that let it inherit, it uses the inherited mapping.
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

# The rooms, each importing only those before it: _ring (the leased ring, its slots, the broker connection)
# <- _collate (collating into a slot, the layout a worker sends back) <- _loader (DataLoader and its iterator).
from ._loader import DataLoader, PinnedDataLoader
from ._ring import _MAIN, _Broker, record_stream, slot_of  # _Broker, _MAIN: for the tests and python/bench

# torch's CUDA host allocator backed by pinbrokerd (pin_memory=True everywhere): see pinbroker/torch_alloc.py,
# which stays a module of its own so that importing it (the PINBROKER_TORCH start-up hook) does not import this
# package, numpy or torch.utils.data.
from ..torch_alloc import HostAllocator, allocator_stats, install, install_from_env, uninstall

# Staged copies of pageable tensors through a pinned ring (issue 39): install() patches Tensor.cuda/to/cpu/copy_
# (staging=True); these work without it, and install_staging() alone needs no host allocator (any torch with CUDA).
from ..torch_staging import copy_, to_device, to_host
from ..torch_staging import install as install_staging
from ..torch_staging import reason as staging_reason
from ..torch_staging import stats as staging_stats
from ..torch_staging import uninstall as uninstall_staging

__all__ = ["DataLoader", "PinnedDataLoader", "record_stream", "slot_of", "HostAllocator", "allocator_stats",
           "install", "install_from_env", "uninstall", "to_device", "to_host", "copy_", "install_staging",
           "uninstall_staging", "staging_reason", "staging_stats"]
