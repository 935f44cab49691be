# SPDX-License-Identifier: MIT
"""Named shared regions: one leased buffer that every rank of a job maps, charged once (issue 26, item 2).

The pattern LLM servers use for a KV-cache offload region is "rank 0 creates a /dev/shm file, every rank maps
it and registers all of it with CUDA": the first rank faults and pins every page, and each rank then pins the
same pages again. A named region instead takes the memory from the daemon's warm pool, already faulted and
locked, as one shared lease: the first rank to ask acquires it and shares it, every later rank attaches to it.
The daemon counts it once, to the creator's uid, and it lives until the last rank lets go.

The rendezvous is a small file, ``pinbroker-region-<owner uid>-<name>``, in ``$PINBROKER_REGION_DIR`` (default
/dev/shm). It holds the share token. A rank takes an exclusive flock on it, then attaches to the token it finds,
or, when there is none or its lease is gone (a stale file from an earlier run), acquires, shares and writes a
new one. The lock makes "who creates" one decision among ranks started at once.

Trust: a token found in a file is attached only if the file belongs to the uid that should own the region
(this uid, or ``owner_uid``) and no other uid can write it; otherwise a planted token could hand a rank
another uid's memory to write its data into.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from typing import Iterable, Optional, Tuple

from ._client import Client, connect
from ._lease import Lease
from .errors import InvalidArgument, PermissionDenied, Stale, Timeout, UnknownLease

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def region_path(name: str, owner_uid: Optional[int] = None) -> str:
    """The rendezvous file of region ``name`` owned by ``owner_uid`` (default: this process's uid)."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise InvalidArgument(errno.EINVAL, f"region name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    uid = os.geteuid() if owner_uid is None else int(owner_uid)
    base = os.environ.get("PINBROKER_REGION_DIR") or "/dev/shm"
    return os.path.join(base, f"pinbroker-region-{uid}-{name}")


def _open_rendezvous(path: str, owner: int, timeout: float) -> int:
    """Open the rendezvous file: create it when this uid owns the region, else wait for the owner to."""
    deadline = time.monotonic() + timeout
    while True:
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            if owner == os.geteuid():
                return os.open(path, flags | os.O_CREAT, 0o644)
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise Timeout(errno.ETIMEDOUT, f"region file {path}: uid {owner} did not create it in {timeout:g} s "
                              "(start the owner's rank first, or give it a longer timeout)") from None
            time.sleep(0.02)
        except OSError as e:
            raise PermissionDenied(e.errno or errno.EACCES, f"region file {path}: {e.strerror}; it must be a "
                                   "plain file of the region's owner (remove a stray one)") from None


def _trusted(fd: int, path: str, owner: int) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionDenied(errno.EPERM, f"region file {path} is not a plain file of uid {owner} that only it can "
                               f"write (owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): its token is not "
                               "trusted; remove the file")


def _read_token(fd: int) -> Tuple[str, int]:
    os.lseek(fd, 0, os.SEEK_SET)
    words = os.read(fd, 256).decode("ascii", "replace").split()
    if len(words) == 2 and words[1].isdigit():
        return words[0], int(words[1])
    return "", 0


def shared_region(name: str, nbytes: int, *, client: Optional[Client] = None, uids: Iterable[int] = (),
                  owner_uid: Optional[int] = None, label: Optional[str] = None, timeout: float = 60.0,
                  wait: bool = True) -> Tuple[Lease, bool]:
    """The shared region ``name`` of at least ``nbytes``: (lease, created).

    The first rank to call acquires the lease (from the warm pool, registered with CUDA where CUDA is) and
    shares it with this uid and ``uids``; every later rank, of this uid or of one of ``uids`` naming this
    uid as ``owner_uid``, attaches to it. ``created`` says which this call did. The lease is counted once,
    to the owner's uid, and lives until the last rank releases it (or exits). A region that exists with
    fewer bytes raises InvalidArgument. ``wait`` waits for memory (up to the daemon's acquire timeout)
    instead of failing at once when the budget is short.
    """
    if nbytes <= 0:
        raise InvalidArgument(errno.EINVAL, f"region {name!r}: nbytes must be positive, not {nbytes}")
    owner = os.geteuid() if owner_uid is None else int(owner_uid)
    path = region_path(name, owner)
    c = client or connect()
    fd = _open_rendezvous(path, owner, timeout)
    try:
        _trusted(fd, path, owner)
        fcntl.flock(fd, fcntl.LOCK_EX)
        token, size = _read_token(fd)
        if token:
            if size < nbytes:
                raise InvalidArgument(errno.EINVAL, f"region {name!r} exists with {size} bytes, fewer than the "
                                      f"{nbytes} asked for; release it everywhere (or use another name)")
            try:
                return c.attach(token, label=label or f"region:{name}"), False
            except (UnknownLease, Stale):
                pass  # its lease is gone (every rank let go, or an earlier run): make a new one
            except InvalidArgument as e:
                raise InvalidArgument(errno.EEXIST, f"region {name!r}: this connection already maps it ({e}); use "
                                      "the lease the first call returned") from None
        if owner != os.geteuid():
            raise Timeout(errno.EAGAIN, f"region {name!r} of uid {owner} has no live lease: its owner's rank must "
                          "create it first")
        lease = c.acquire(nbytes, label=label or f"region:{name}", wait=wait)
        try:
            token = lease.share(uids)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{token} {lease.nbytes}\n".encode("ascii"), 0)
        except BaseException:
            lease.release()
            raise
        return lease, True
    finally:
        os.close(fd)  # drops the flock


def remove_region(name: str) -> bool:
    """Remove this uid's rendezvous file of ``name`` (ranks that attached keep their mapping). True if removed."""
    try:
        os.unlink(region_path(name))
        return True
    except FileNotFoundError:
        return False
