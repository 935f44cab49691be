# SPDX-License-Identifier: MIT
"""pinbroker's exceptions: OSError subclasses carrying the errno libpinbroker returned and its message."""

from __future__ import annotations

import errno as _errno
from typing import Dict, Type

__all__ = [
    "BrokerError",
    "BudgetExhausted",
    "QuotaExceeded",
    "MemoryPressure",
    "TooLarge",
    "Timeout",
    "NotConnected",
    "ShuttingDown",
    "PermissionDenied",
    "LimitReached",
    "InvalidArgument",
    "ProtocolError",
    "LibraryNotFound",
    "UnknownLease",
    "Stale",
    "error_from_errno",
]


class BrokerError(OSError):
    """Base of pinbroker's errors. ``errno`` is the C library's errno; ``strerror`` (and ``str()``) holds
    the library's message for this failure, in the daemon's own words when the daemon refused."""


class BudgetExhausted(BrokerError):
    """ENOSPC: the host's pinned budget is lent out right now; wait=True waits for some to come back."""


class QuotaExceeded(BrokerError):
    """EDQUOT: this uid already holds its quota (the daemon's uid-quota)."""


class MemoryPressure(BrokerError):
    """EBUSY (host memory tight) or EAGAIN (critical): the daemon lends nothing new until it eases.

    ``critical`` is True for EAGAIN."""

    @property
    def critical(self) -> bool:
        return self.errno == _errno.EAGAIN


class TooLarge(BrokerError):
    """EFBIG: larger than the budget or quota could ever allow; waiting will not help."""


class Timeout(BrokerError, TimeoutError):
    """ETIMEDOUT: an acquire with wait=True timed out."""


class NotConnected(BrokerError, ConnectionError):
    """ENOENT / ECONNREFUSED / ECONNRESET / ENOTCONN: no daemon at the socket, or the connection was lost."""


class ShuttingDown(NotConnected):
    """ESHUTDOWN: the daemon is shutting down."""


class PermissionDenied(BrokerError, PermissionError):
    """EACCES / EPERM: the socket's permissions, an admin request by a non-admin, or another uid's lease.

    Refused on connect, the message says so and what to do: "permission denied on SOCKET: add your user to the
    pinbroker group (or the daemon's socket-group) ...", with the socket's mode and group, or the folder on the
    way that shuts this user out."""


class LimitReached(BrokerError):
    """EUSERS: the daemon's connection or lease limit for this uid or connection is reached."""


class InvalidArgument(BrokerError, ValueError):
    """EINVAL: a size of 0, or an argument the daemon rejects."""


class UnknownLease(BrokerError, LookupError):
    """ENOENT from attach: an unknown, forged, mistyped or stale share token (its lease was released or is
    being revoked). Ask the holder for a fresh token."""


class Stale(BrokerError):
    """ESTALE: the lease was revoked and given back, or the daemon restarted clean and no longer counts it;
    release it and acquire again."""


class LibraryNotFound(BrokerError):
    """ELIBACC: libpinbroker.so could not be loaded; the message lists every place that was tried and names the
    package to install (pinbroker._lib.DEBIAN_PACKAGE) and $PINBROKER_LIBRARY."""


class ProtocolError(BrokerError):
    """EPROTO / EPROTONOSUPPORT / EIO: the library and the daemon disagree (upgrade one of them)."""


_BY_ERRNO: Dict[int, Type[BrokerError]] = {
    _errno.ENOSPC: BudgetExhausted,
    _errno.EDQUOT: QuotaExceeded,
    _errno.EBUSY: MemoryPressure,
    _errno.EAGAIN: MemoryPressure,
    _errno.EFBIG: TooLarge,
    _errno.ETIMEDOUT: Timeout,
    _errno.ENOENT: NotConnected,
    _errno.ECONNREFUSED: NotConnected,
    _errno.ECONNRESET: NotConnected,
    _errno.ENOTCONN: NotConnected,
    _errno.ESHUTDOWN: ShuttingDown,
    _errno.EACCES: PermissionDenied,
    _errno.EPERM: PermissionDenied,
    _errno.EUSERS: LimitReached,
    _errno.EINVAL: InvalidArgument,
    _errno.EPROTO: ProtocolError,
    _errno.EPROTONOSUPPORT: ProtocolError,
    _errno.EIO: ProtocolError,
    _errno.ESTALE: Stale,
}


def error_from_errno(err: int, message: str) -> BrokerError:
    """The exception for a C return value (a negative errno, or its absolute value) and its message."""
    err = abs(err)
    return _BY_ERRNO.get(err, BrokerError)(err, message)
