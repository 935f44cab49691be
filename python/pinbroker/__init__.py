# SPDX-License-Identifier: MIT
"""pinbroker: borrow pinned, CUDA-registered host memory from pinbrokerd, from Python.

A thin ctypes binding over libpinbroker.so (found through $PINBROKER_LIBRARY, the build tree of a source
checkout, then the dynamic linker as libpinbroker.so.1)::

    import pinbroker

    with pinbroker.connect() as client, client.acquire(64 << 20, label="staging") as lease:
        batch = lease.tensor(torch.uint8, (64, 3, 224, 224))   # no copy; is_pinned() where CUDA registered it

    lease = pinbroker.acquire_or_fallback(64 << 20)            # never fails for lack of a daemon
    print(lease.kind, lease.fallback_reason)

Errors are OSError subclasses (:mod:`pinbroker.errors`) carrying errno and the daemon's message.
From the shell, ``python3 -m pinbroker status`` and ``python3 -m pinbroker doctor`` (:mod:`pinbroker.__main__`).
"""

# The rooms (each imports only those above it): _lib (ctypes) <- _staging (buffers, streams and settings of
# staged copies) <- _lease (Kind, Priority, Lease) <- _status
# (status and admin calls) <- _client (Client, Registration, the module functions) <- _region (named shared
# regions).
from ._client import (
    Client,
    Registration,
    RevokeCallback,
    acquire_or_fallback,
    connect,
    cuda_available,
    library_path,
)
from ._lease import Kind, Lease, Priority
from ._reserve import Reservation
from ._staging import StagingStats
from ._status import Bound, Headroom
from ._region import prune_regions, region_path, remove_region, shared_region
from .errors import (
    BrokerError,
    BudgetExhausted,
    InvalidArgument,
    LibraryNotFound,
    LimitReached,
    MemoryPressure,
    NotConnected,
    PermissionDenied,
    ProtocolError,
    QuotaExceeded,
    ShuttingDown,
    Timeout,
    TooLarge,
    Stale,
    UnknownLease,
)

__version__ = "0.2.0"

__all__ = [
    "Bound",
    "Client",
    "Headroom",
    "Kind",
    "Lease",
    "Priority",
    "Registration",
    "Reservation",
    "StagingStats",
    "RevokeCallback",
    "acquire_or_fallback",
    "connect",
    "cuda_available",
    "library_path",
    "prune_regions",
    "region_path",
    "remove_region",
    "shared_region",
    "BrokerError",
    "BudgetExhausted",
    "InvalidArgument",
    "LibraryNotFound",
    "LimitReached",
    "MemoryPressure",
    "NotConnected",
    "PermissionDenied",
    "ProtocolError",
    "QuotaExceeded",
    "ShuttingDown",
    "Timeout",
    "TooLarge",
    "Stale",
    "UnknownLease",
]
