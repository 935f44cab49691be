# SPDX-License-Identifier: MIT
"""Named shared regions: one leased buffer that every rank of a job maps, charged once (issue 26, item 2).

The pattern LLM servers use for a KV-cache offload region is "rank 0 creates a /dev/shm file, every rank maps
it and registers all of it with CUDA": the first rank faults and pins every page, and each rank then pins the
same pages again. A named region instead takes the memory from the daemon's warm pool, already faulted and
locked, as one shared lease: the first rank to ask acquires it and shares it, every later rank attaches to it.
The daemon counts it once, to the creator's uid, and it lives until the last rank lets go.

The rendezvous is a folder of the owner's, ``pinbroker-regions-<owner uid>`` in ``$PINBROKER_REGION_DIR``
(default /dev/shm), 0755, that only the owner can write. In it, ``<name>.lock`` (0600) serialises the owner's
ranks: under an exclusive flock a rank attaches to the token in ``<name>.token`` (0644, replaced whole by a
rename) or, when there is none or its lease is gone (a stale file from an earlier run), acquires, shares and
writes a new one. Ranks of another uid never lock: they read the token until it names a live lease, up to the
timeout, so they may start before the owner's.

Trust: the folder and the token must belong to the owner and be writable by nobody else, or they are refused;
otherwise a planted token could hand a rank another uid's memory to write its data into. Other uids cannot
open the lock file, so they cannot hold the owner's ranks up.
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


def _base() -> str:
    return os.environ.get("PINBROKER_REGION_DIR") or "/dev/shm"


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise InvalidArgument(errno.EINVAL, f"region name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -")


def region_path(name: str, owner_uid: Optional[int] = None) -> str:
    """The token file of region ``name`` owned by ``owner_uid`` (default: this process's uid)."""
    _check_name(name)
    uid = os.geteuid() if owner_uid is None else int(owner_uid)
    return os.path.join(_base(), f"pinbroker-regions-{uid}", f"{name}.token")


def _trusted(st: os.stat_result, path: str, owner: int, want_dir: bool) -> None:
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    if not kind_ok or st.st_uid != owner or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionDenied(errno.EPERM, f"{path} is not a {'folder' if want_dir else 'plain file'} of uid "
                               f"{owner} that only it can write (owner {st.st_uid}, mode "
                               f"{stat.S_IMODE(st.st_mode):o}): not trusted; remove it, or set "
                               "$PINBROKER_REGION_DIR to another folder")


def _owner_dir(owner: int, deadline: float) -> str:
    """The owner's rendezvous folder: made by the owner, waited for by others, and checked."""
    d = os.path.join(_base(), f"pinbroker-regions-{owner}")
    while True:
        if owner == os.geteuid():
            try:
                os.mkdir(d, 0o755)
                os.chmod(d, 0o755)  # whatever the umask: other uids named in uids read in it
            except FileExistsError:
                pass
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise Timeout(errno.ETIMEDOUT, f"{d}: uid {owner} did not make it in time (start the owner's rank "
                              "first, or give it a longer timeout)") from None
            time.sleep(0.02)
            continue
        _trusted(st, d, owner, True)
        return d


def _read_token(path: str, owner: int) -> Tuple[str, int]:
    """The token and size in the token file; ("", 0) when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return "", 0
    try:
        _trusted(os.fstat(fd), path, owner, False)
        words = os.read(fd, 256).decode("ascii", "replace").split()
    finally:
        os.close(fd)
    if len(words) == 2 and words[1].isdigit():
        return words[0], int(words[1])
    return "", 0


def _attach_live(c: Client, name: str, token: str, nbytes: int, label: str) -> Optional[Lease]:
    """The region's lease, attached; None when its lease is gone. InvalidArgument when it is too small."""
    try:
        lease = c.attach(token, label=label)
    except (UnknownLease, Stale):
        return None  # every rank let go, or an earlier run's file
    except InvalidArgument as e:
        raise InvalidArgument(errno.EEXIST, f"region {name!r}: this connection already maps it ({e}); use "
                              "the lease the first call returned") from None
    if lease.nbytes < nbytes:
        size = lease.nbytes
        lease.release()
        raise InvalidArgument(errno.EINVAL, f"region {name!r} exists with {size} bytes, fewer than the {nbytes} "
                              "asked for; release it everywhere (or use another name)")
    return lease


def _lock(fd: int, name: str, deadline: float, timeout: float) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Timeout(errno.ETIMEDOUT, f"region {name!r}: another rank held its lock for {timeout:g} s") \
                    from None
            time.sleep(0.01)


def _publish(path: str, token: str, nbytes: int) -> None:
    """Replace the token file whole: a reader sees the old token or the new one, never half of one."""
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: other uids named in uids read it
        os.write(fd, f"{token} {nbytes}\n".encode("ascii"))
    finally:
        os.close(fd)
    os.rename(tmp, path)


def shared_region(name: str, nbytes: int, *, client: Optional[Client] = None, uids: Iterable[int] = (),
                  owner_uid: Optional[int] = None, label: Optional[str] = None, timeout: float = 60.0,
                  wait: bool = True) -> Tuple[Lease, bool]:
    """The shared region ``name`` of at least ``nbytes``: (lease, created).

    The first rank of the owner's uid to call acquires the lease (from the warm pool, registered with CUDA
    where CUDA is) and shares it with ``uids``; every later rank, of this uid or of one of ``uids`` naming the
    owner as ``owner_uid``, attaches to it. ``created`` says which this call did. The lease is counted once, to
    the owner's uid, and lives until the last rank releases it (or exits). A region that exists with fewer
    bytes raises InvalidArgument. ``wait`` waits for memory (up to the daemon's acquire timeout) instead of
    failing at once when the budget is short; ``timeout`` bounds the wait for the owner's rank and the lock.
    """
    if nbytes <= 0:
        raise InvalidArgument(errno.EINVAL, f"region {name!r}: nbytes must be positive, not {nbytes}")
    _check_name(name)
    owner = os.geteuid() if owner_uid is None else int(owner_uid)
    deadline = time.monotonic() + timeout
    d = _owner_dir(owner, deadline)
    token_path = os.path.join(d, f"{name}.token")
    tag = label or f"region:{name}"
    c = client or connect()
    if owner != os.geteuid():
        # Another uid's region: wait for a token that names a live lease (the owner's rank may come later).
        while True:
            token, _ = _read_token(token_path, owner)
            lease = _attach_live(c, name, token, nbytes, tag) if token else None
            if lease is not None:
                return lease, False
            if time.monotonic() >= deadline:
                raise Timeout(errno.ETIMEDOUT, f"region {name!r} of uid {owner}: no live lease in {timeout:g} s "
                              "(its owner's rank makes it, and must name this uid in uids=)")
            time.sleep(0.05)
    fd = os.open(os.path.join(d, f"{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        _lock(fd, name, deadline, timeout)
        token, _ = _read_token(token_path, owner)
        lease = _attach_live(c, name, token, nbytes, tag) if token else None
        if lease is not None:
            return lease, False
        lease = c.acquire(nbytes, label=tag, wait=wait)
        try:
            _publish(token_path, lease.share(uids), lease.nbytes)
        except BaseException:
            lease.release()
            raise
        return lease, True
    finally:
        os.close(fd)  # drops the flock


def remove_region(name: str) -> bool:
    """Remove this uid's files of region ``name`` (ranks that attached keep their mapping). True if removed."""
    path = region_path(name)
    removed = False
    for p in (path, path[: -len(".token")] + ".lock"):
        try:
            os.unlink(p)
            removed = True
        except FileNotFoundError:
            pass
    return removed
