# SPDX-License-Identifier: MIT
"""The reservation room: Reservation, an all-or-nothing reservation of N shares of B bytes for a group of ranks
(Client.reserve), and the listing of the reservations alive. It stands on the lease room (_lease.py) and the
library's calls (_lib.py); the client room calls it, never the other way round.
"""

from __future__ import annotations

import ctypes
import errno
from typing import Any, Dict, List, Optional

from . import _lib
from ._lease import Lease, Priority, _Mapping, _raise
from ._status import _libc_free
from .errors import NotConnected

__all__ = ["Reservation"]


def _fn(name: str) -> Any:
    fn = _lib.optional(name)
    if fn is None:
        raise NotConnected(errno.EOPNOTSUPP, f"this libpinbroker has no {name}: reservations need 0.2.0 or later")
    return fn


class Reservation:
    """A group's reservation, joined on one Client: ``shares`` x ``share_bytes`` held for the group, of which this
    rank takes one share with :meth:`acquire`. A context manager: ``with client.reserve(...) as r:`` releases it on
    exit (for every rank: untaken shares go back to the budget; leases taken stay until released).

    Ends also when every connection that joined it closes, or when an admin revokes it
    (``pinctl revoke --reservation ID``)."""

    def __init__(self, client: Any, rid: int, name: str, shares: int, share_bytes: int) -> None:
        self._client = client
        #: The daemon's id, as ``pinctl reservations`` shows it.
        self.id = rid
        self.name = name
        self.shares = shares
        self.share_bytes = share_bytes
        self._released = False

    def acquire(self, nbytes: Optional[int] = None, label: Optional[str] = None, *, cuda: bool = True) -> Lease:
        """This rank's share: a pinned lease of ``nbytes`` (default: the whole share) from the reserved bytes,
        without racing other ranks or jobs. Raises InvalidArgument (more than a share, or the reservation is
        gone) or LimitReached (every share taken already)."""
        n = self.share_bytes if nbytes is None else nbytes
        opts = _lib.AcquireOpts()
        opts.label = (label if label is not None else self.name).encode("utf-8")
        if not cuda:
            opts.flags |= _lib.PB_ACQUIRE_NO_CUDA
        ptr = self._client._enter()
        try:
            ret = ctypes.c_void_p()
            r = _fn("pb_acquire_from")(ptr, self.id, n, ctypes.byref(opts), ctypes.byref(ret))
            if r < 0:
                _raise(r, f"taking a share of {n} bytes of reservation {self.id} ({self.name})")
            m = _Mapping(self._client, int(ret.value))
        finally:
            self._client._leave()
        return Lease(m, requested_nbytes=n, label=label or self.name, priority=Priority.NORMAL)

    def release(self) -> None:
        """End the reservation for the whole group: its untaken shares go back to the budget. Idempotent; a
        reservation already gone (released by another rank, revoked) is not an error."""
        if self._released:
            return
        self._released = True
        ptr = self._client._enter()
        try:
            r = _fn("pb_reservation_release")(ptr, self.id)
            if r < 0 and abs(r) != errno.ENOENT:
                _raise(r, f"releasing reservation {self.id}")
        finally:
            self._client._leave()

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.release()
        except NotConnected:
            pass

    def __repr__(self) -> str:
        return (f"<pinbroker.Reservation {self.id} {self.name!r}: {self.shares} x {self.share_bytes} bytes"
                f"{' (released)' if self._released else ''}>")


def reserve(client: Any, ptr: int, name: str, shares: int, share_bytes: int, wait: bool,
            timeout_ms: int) -> Reservation:
    """pb_reserve on ptr (Client.reserve checked the arguments)."""
    rid = ctypes.c_uint64()
    flags = _lib.PB_ACQUIRE_WAIT if wait else 0
    r = _fn("pb_reserve")(ptr, name.encode("utf-8"), shares, share_bytes, flags, timeout_ms, ctypes.byref(rid))
    if r < 0:
        _raise(r, f"reserving {shares} x {share_bytes} bytes as {name!r}")
    return Reservation(client, int(rid.value), name, shares, share_bytes)


def listing(ptr: int) -> Dict[str, Any]:
    """pb_reservations: {"reserved_bytes", "reservations": [rows as pinctl reservations --json has them]}."""
    rows = ctypes.POINTER(_lib.ReservationInfo)()
    n = ctypes.c_size_t()
    held = ctypes.c_uint64()
    r = _fn("pb_reservations")(ptr, ctypes.byref(rows), ctypes.byref(n), ctypes.byref(held))
    if r < 0:
        _raise(r, "listing reservations")
    out: List[Dict[str, Any]] = []
    try:
        for i in range(n.value):
            x = rows[i]
            out.append({"id": int(x.id), "uid": int(x.uid), "job": x.job.decode("utf-8", "replace") or None,
                        "name": x.name.decode("utf-8", "replace"), "shares": int(x.shares),
                        "share_bytes": int(x.share_bytes), "taken": int(x.taken),
                        "bytes_reserved": int(x.bytes_reserved), "state": x.state.decode("utf-8", "replace"),
                        "members": int(x.members), "age_ms": int(x.age_ms)})
    finally:
        if rows:
            _libc_free(rows)
    return {"reserved_bytes": int(held.value), "reservations": out}
