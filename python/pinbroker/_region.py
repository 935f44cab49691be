# SPDX-License-Identifier: MIT
"""Named shared regions: one leased buffer that every rank of a job maps, charged once (issue 26, item 2).

The pattern LLM servers use for a KV-cache offload region is "rank 0 creates a /dev/shm file, every rank maps
it and registers all of it with CUDA": the first rank faults and pins every page, and each rank then pins the
same pages again. A named region instead takes the memory from the daemon's warm pool, already faulted and
locked, as one shared lease: the first rank to ask acquires it and shares it, every later rank attaches to it.
The daemon counts it once, to the creator's uid, and it lives until the last rank lets go.

The rendezvous is a folder of the owner's in ``$PINBROKER_REGION_DIR`` (default /dev/shm), 0755, that only the
owner can write, named ``pinbroker-regions-<owner uid>-<daemon key>-<16 random hex digits>``. No part of the
region's path can be guessed before the owner makes it: in a folder every uid may write (/dev/shm), a name
another uid can predict is one it can take first, and a plant at a fixed name once kept every uid's regions
from being made. Ranks find the folder by listing: an entry counts only if it is a folder (not a link) of the
owner's that nobody else can write, holding the owner's ``.ready`` file (the commit), so what other uids plant
there is passed over: never trusted, and never in the way. The owner's first rank makes its folder private
(0700), lists again, and commits it only when it is the owner's only folder for that daemon (else it removes
its own and tries again after a random pause): of two ranks making one at once, at most one commits. A folder
made and never committed (its maker died) is removed after _PENDING_STALE_S. Where several committed folders
exist, every rank takes the one whose name sorts first. The daemon key is a short hash of the daemon's socket
path (resolved), so regions are tied to their daemon: lease ids restart at 1 in each daemon, so a lease
listing of one daemon must never judge the regions of another daemon of the same uid. The token file carries
the key too, and a prune removes only tokens that carry its own.

In the folder, ``<name>.lock`` (0600) serialises the owner's ranks: under an exclusive flock a rank attaches
to the token in ``<name>.token`` (0644, replaced whole by a rename) or, when there is none or its lease is gone
(a stale file from an earlier run), acquires, shares and writes a new one. Ranks of another uid never lock:
they read the token until it names a live lease, up to the timeout, so they may start before the owner's.

Trust: a folder that is not the owner's, or that others can write, is passed over (see above); a token file
that is not the owner's, or that others can write, is refused: a planted token could hand a rank another uid's
memory to write its data into. Other uids cannot
open the lock file, so they cannot hold the owner's ranks up.

Bound and clean-up: a region's files outlive its lease, so each new region first prunes the owner's stale ones
(prune_regions: no live lease of the owner's uid behind the token), then refuses with LimitReached when the
owner would have more than max_regions (``$PINBROKER_REGION_MAX``, default 256) regions with files on that
daemon (the bound is read only then: a join never depends on it). The token
file names the lease id beside the token, so one lease listing tells which are live, without mapping any; a
region is judged only under its own lock, taken without waiting (a region a rank is making is left alone), and
the listing is read after the locks are taken, so a token written before it is judged against it. Every writer
of a region's files (making, remove_region, the prune) holds its lock, and the prune checks that its lock is
still the file at the path before it reads the token and before it unlinks: files made anew after something
else removed the old ones (an older version's remove_region, a hand's rm) are never taken for the old ones.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import random
import re
import secrets
import stat
import time
from typing import Iterable, List, Optional, Set, Tuple

from ._client import Client, connect, socket_path
from ._lease import Lease
from .errors import BrokerError, InvalidArgument, LimitReached, PermissionDenied, Stale, Timeout, UnknownLease

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# Regions with files per owner uid, unless $PINBROKER_REGION_MAX or max_regions= says otherwise: far above the
# regions one job makes (one per model or cache tier), low enough that a leak shows before /dev/shm fills.
REGION_MAX_DEFAULT = 256
# A folder the owner made and never committed: its maker died between mkdir and commit (a listing's time).
_PENDING_STALE_S = 10.0
# The commit file in a rendezvous folder: only the owner can make it there.
_READY = ".ready"
# The random part of a folder's name: 64 bits, so no other uid can make the name before the owner does.
_SUFFIX = re.compile(r"^[0-9a-f]{16}$")
# Locks a prune holds at once: its fds stay well under a default RLIMIT_NOFILE (1024) whatever the folder holds.
_PRUNE_BATCH = 128


def _region_max(max_regions: Optional[int]) -> int:
    if max_regions is not None:
        v, where = max_regions, "max_regions"
    else:
        env = os.environ.get("PINBROKER_REGION_MAX")
        if not env:
            return REGION_MAX_DEFAULT
        where = "$PINBROKER_REGION_MAX"
        try:
            v = int(env)
        except ValueError:
            raise InvalidArgument(errno.EINVAL, f"{where} is {env!r}: write a whole number of regions, at "
                                  "least 1") from None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidArgument(errno.EINVAL, f"{where} is {v!r}: write a whole number of regions, at least 1")
    return v


def _base() -> str:
    return os.environ.get("PINBROKER_REGION_DIR") or "/dev/shm"


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise InvalidArgument(errno.EINVAL, f"region name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -")


def _daemon_key(client: Optional[Client]) -> str:
    """The daemon's key: a short hash of its socket path, resolved (the client's, else connect()'s default).
    Lease ids restart at 1 in each daemon, so regions are kept apart by daemon; the status reply carries no
    identity of the daemon that outlives a restart, and the socket path is what every rank of a job names."""
    path = client.path if client is not None else socket_path()
    return hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _prefix(owner: int, key: str) -> str:
    return f"pinbroker-regions-{owner}-{key}-"


def _is_trusted(st: os.stat_result, owner: int, want_dir: bool) -> bool:
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    return kind_ok and st.st_uid == owner and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted(st: os.stat_result, path: str, owner: int, want_dir: bool) -> None:
    if not _is_trusted(st, owner, want_dir):
        raise PermissionDenied(errno.EPERM, f"{path} is not a {'folder' if want_dir else 'plain file'} of uid "
                               f"{owner} that only it can write (owner {st.st_uid}, mode "
                               f"{stat.S_IMODE(st.st_mode):o}): not trusted; remove it, or set "
                               "$PINBROKER_REGION_DIR to another folder")


def _committed(path: str, owner: int) -> bool:
    """Whether the folder at path holds the owner's commit file, read through the folder itself (no links)."""
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not _is_trusted(os.fstat(dfd), owner, True):
            return False
        try:
            st = os.stat(_READY, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return False
        return _is_trusted(st, owner, False)
    finally:
        os.close(dfd)


def _owner_dirs(owner: int, key: str) -> List[Tuple[str, float, bool]]:
    """The owner's folders for the daemon of key in the base folder, sorted by name: (path, mtime, committed).
    Whatever else carries the prefix (another uid's, a link, a file, a folder others can write) is passed over."""
    base, prefix = _base(), _prefix(owner, key)
    try:
        entries = os.listdir(base)
    except FileNotFoundError:
        return []
    found = []
    for e in entries:
        if not e.startswith(prefix) or not _SUFFIX.match(e[len(prefix) :]):
            continue
        path = os.path.join(base, e)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if _is_trusted(st, owner, True):
            found.append((path, st.st_mtime, _committed(path, owner)))
    return sorted(found)


def _find_dir(owner: int, key: str) -> Optional[str]:
    """The owner's committed folder for the daemon of key (the first by name), or None."""
    committed = [p for p, _, ready in _owner_dirs(owner, key) if ready]
    return committed[0] if committed else None


def _wait_or_timeout(deadline: float, what: str) -> None:
    if time.monotonic() >= deadline:
        raise Timeout(errno.ETIMEDOUT, what)
    time.sleep(0.02)


def _make_dir(owner: int, key: str) -> Optional[str]:
    """One try at making and committing a folder; None when another of the owner's folders showed up."""
    path = os.path.join(_base(), _prefix(owner, key) + secrets.token_hex(8))
    try:
        os.mkdir(path, 0o700)  # private until committed: nobody reads a folder that may yet go
    except FileExistsError:
        return None
    if [p for p, _, _ in _owner_dirs(owner, key) if p != path]:
        os.rmdir(path)  # another rank made one too: both may step back, so pause at random before the next try
        time.sleep(random.uniform(0.001, 0.02))
        return None
    try:
        os.chmod(path, 0o755)  # whatever the umask: other uids named in uids read in it
        fd = os.open(os.path.join(path, _READY), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                     os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        return None  # taken for abandoned and removed before the commit
    os.fchmod(fd, 0o644)
    os.close(fd)
    return path


def _owner_dir(owner: int, key: str, deadline: float) -> str:
    """The owner's rendezvous folder for the daemon of key: found, or made by the owner and waited for by others."""
    while True:
        dirs = _owner_dirs(owner, key)
        committed = [p for p, _, ready in dirs if ready]
        if committed:
            return committed[0]
        if owner != os.geteuid():
            _wait_or_timeout(deadline, f"uid {owner} has no region folder in {_base()} in time (start the "
                             "owner's rank first, or give it a longer timeout)")
            continue
        pending = False
        for path, mtime, _ in dirs:
            if time.time() - mtime > _PENDING_STALE_S:
                try:
                    os.rmdir(path)  # made and never committed: its maker died
                except OSError:
                    pass
            else:
                pending = True
        if pending:
            _wait_or_timeout(deadline, f"another rank of uid {owner} did not finish its region folder in "
                             f"{_base()} in time")
            continue
        made = _make_dir(owner, key)
        if made is not None:
            return made


def region_path(name: str, owner_uid: Optional[int] = None, *, client: Optional[Client] = None) -> str:
    """The token file of region ``name`` owned by ``owner_uid`` (default: this process's uid) on the daemon of
    ``client`` (default: the socket connect() would use). The owner's folder is made when this uid is the owner
    and has none; for another owner with no folder yet, FileNotFoundError."""
    _check_name(name)
    uid = os.geteuid() if owner_uid is None else int(owner_uid)
    key = _daemon_key(client)
    d = _owner_dir(uid, key, time.monotonic() + 5) if uid == os.geteuid() else _find_dir(uid, key)
    if d is None:
        raise FileNotFoundError(errno.ENOENT, f"uid {uid} has no region folder for this daemon in {_base()}")
    return os.path.join(d, f"{name}.token")


def _read_token_file(path: str, owner: int) -> Tuple[str, int, Optional[int], Optional[str]]:
    """The token, size, lease id and daemon key in the token file; ("", 0, None, None) when there is none. A
    file of an earlier version has no daemon key (None), and the oldest no lease id either (None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return "", 0, None, None
    try:
        _trusted(os.fstat(fd), path, owner, False)
        words = os.read(fd, 256).decode("ascii", "replace").split()
    finally:
        os.close(fd)
    if len(words) in (2, 3) and all(w.isdigit() for w in words[1:]):
        return words[0], int(words[1]), int(words[2]) if len(words) == 3 else None, None
    if len(words) == 4 and all(w.isdigit() for w in words[1:3]):
        return words[0], int(words[1]), int(words[2]), words[3]
    return "", 0, None, None


def _read_token(path: str, owner: int) -> Tuple[str, int]:
    """The token and size in the token file; ("", 0) when there is none."""
    token, nbytes, _, _ = _read_token_file(path, owner)
    return token, nbytes


def _attach_live(c: Client, name: str, token: str, nbytes: int, label: str, cuda: bool = True) -> Optional[Lease]:
    """The region's lease, attached; None when its lease is gone. InvalidArgument when it is too small."""
    try:
        lease = c.attach(token, label=label, cuda=cuda)
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


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def _lock_is_current(fd: int, path: str) -> bool:
    """Whether the locked fd is still the file at path: a prune or remove_region may have unlinked it while this
    rank waited, and a lock on a removed file would let a rank that opened the new one in at the same time."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _lock_wait() -> None:
    """One pause of a rank waiting on a region's lock (a function of its own so a test can see the wait)."""
    time.sleep(0.01)


def _lock(path: str, name: str, deadline: float, timeout: float) -> int:
    """An fd of the region's lock file, exclusively locked, that is the file at path now."""
    while True:
        fd = _open_lock(path)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise Timeout(errno.ETIMEDOUT, f"region {name!r}: another rank held its lock for "
                                      f"{timeout:g} s") from None
                    _lock_wait()
            if _lock_is_current(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed while this rank waited: lock the file there now


def _publish(path: str, token: str, nbytes: int, lease_id: int, key: str) -> None:
    """Replace the token file whole: a reader sees the old token or the new one, never half of one."""
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: other uids named in uids read it
        os.write(fd, f"{token} {nbytes} {lease_id} {key}\n".encode("ascii"))
    finally:
        os.close(fd)
    os.rename(tmp, path)


def _region_names(d: str) -> List[str]:
    """The regions with a file in d (a token, a lock, or both), sorted."""
    names = set()
    for entry in os.listdir(d):
        for suffix in (".token", ".lock"):
            if entry.endswith(suffix) and _NAME.match(entry[: -len(suffix)]):
                names.add(entry[: -len(suffix)])
    return sorted(names)


def _live_lease_ids(c: Client, owner: int) -> Set[int]:
    """The ids of the owner's leases the daemon counts now (an admin sees every uid's rows: keep the owner's)."""
    return {row["id"] for row in c.leases() if row["uid"] == owner}


def _prune_batch(c: Client, d: str, owner: int, key: str, names: List[str]) -> List[str]:
    """Remove the files of the regions in names that are stale; returns those removed."""
    held = []
    removed = []
    try:
        for n in names:
            path = os.path.join(d, f"{n}.lock")
            try:
                fd = _open_lock(path)
            except OSError:
                continue  # not a file this uid can lock (a planted link): left for the owner to look at
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)  # a rank is making or joining it right now: not stale
                continue
            if not _lock_is_current(fd, path):
                os.close(fd)
                continue
            held.append((n, fd))
        if not held:
            return removed
        # Read after every lock is held: no token of these can change now, so one the listing lacks is dead.
        live = _live_lease_ids(c, owner)
        for n, fd in held:
            token_path = os.path.join(d, f"{n}.token")
            lock_path = os.path.join(d, f"{n}.lock")
            # Something that takes no lock (an older version's remove_region, a hand's rm) may have removed
            # the files while the listing was read, and a rank made the region anew: its files are not ours.
            if not _lock_is_current(fd, lock_path):
                continue
            try:
                token, _, lease_id, token_key = _read_token_file(token_path, owner)
            except PermissionDenied:
                continue  # not the owner's file: never removed behind its back
            if token and (lease_id is None or token_key != key or lease_id in live):
                continue  # live, or a file that is not provably this daemon's (an earlier version's): kept
            if not _lock_is_current(fd, lock_path):
                continue  # the same check again, as close to the unlink as it can be
            for p in (token_path, lock_path):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            removed.append(n)
    finally:
        for _, fd in held:
            os.close(fd)  # drops the flock; a rank that waited on it finds the file gone and opens a new one
    return removed


def _prune(c: Client, d: str, owner: int, key: str, skip: Optional[str] = None) -> List[str]:
    names = [n for n in _region_names(d) if n != skip]
    removed: List[str] = []
    for i in range(0, len(names), _PRUNE_BATCH):
        removed += _prune_batch(c, d, owner, key, names[i : i + _PRUNE_BATCH])
    return removed


def prune_regions(*, client: Optional[Client] = None) -> List[str]:
    """Remove the files of this uid's stale regions on the daemon of ``client`` (no live lease behind the token,
    or no token at all: a region whose making failed); returns their names, sorted. Only that daemon's regions
    are judged: another daemon's have another folder, and a token file that does not name this daemon (one of
    an earlier version) is kept, as is a region a rank is making or joining right now (``remove_region``
    removes a kept file)."""
    owner = os.geteuid()
    c = client or connect()
    key = _daemon_key(c)
    d = _find_dir(owner, key)
    if d is None:
        return []
    return _prune(c, d, owner, key)


def shared_region(name: str, nbytes: int, *, client: Optional[Client] = None, uids: Iterable[int] = (),
                  owner_uid: Optional[int] = None, label: Optional[str] = None, timeout: float = 60.0,
                  wait: bool = True, max_regions: Optional[int] = None,
                  slice: Optional[Tuple[int, int]] = None) -> Tuple[Lease, bool]:
    """The shared region ``name`` of at least ``nbytes``: (lease, created).

    The first rank of the owner's uid to call acquires the lease (from the warm pool, registered with CUDA
    where CUDA is) and shares it with ``uids``; every later rank, of this uid or of one of ``uids`` naming the
    owner as ``owner_uid``, attaches to it. ``created`` says which this call did. The lease is counted once, to
    the owner's uid, and lives until the last rank releases it (or exits). A region that exists with fewer
    bytes raises InvalidArgument. ``wait`` waits for memory (up to the daemon's acquire timeout) instead of
    failing at once when the budget is short; ``timeout`` bounds the wait for the owner's rank and the lock.

    Making a region first removes the files of the owner's stale regions (:func:`prune_regions`), then raises
    LimitReached when the owner already has ``max_regions`` regions with files (default
    ``$PINBROKER_REGION_MAX``, else 256) regions with files on this daemon. Joining a live region is never
    refused for the bound, nor for a bad bound: it is read only when a region is to be made.

    Regions belong to the daemon of ``client``: ranks meet only when they reach the daemon by the same
    socket path (resolved), and a region of the same name on another daemon is another region.

    ``slice=(offset, length)`` registers with CUDA only that part of the region in this process (the rank's own
    slice, the one it copies from; ``offset`` a multiple of the lease's page size), instead of the whole region:
    N ranks of one region then pin it in the driver once in all, and each is ready in about 1/N of the time.
    The region is still mapped whole, and charged once. On a host without CUDA the lease stays locked, as
    without ``slice``; a slice outside the region raises InvalidArgument (the lease is released here).
    """
    if slice is not None:
        if (not isinstance(slice, tuple) or len(slice) != 2 or
                not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in slice) or slice[1] == 0):
            raise InvalidArgument(errno.EINVAL, f"region {name!r}: slice must be (offset, length) with length > 0, "
                                  f"not {slice!r}")
        if slice[0] + slice[1] > nbytes:
            raise InvalidArgument(errno.ERANGE, f"region {name!r}: slice {slice!r} ends past its {nbytes} bytes")
    lease, created = _shared_region(name, nbytes, client, uids, owner_uid, label, timeout, wait, max_regions,
                                    slice is None)
    if slice is not None:
        _register_slice(lease, name, slice)
    return lease, created


def _register_slice(lease: Lease, name: str, part: Tuple[int, int]) -> None:
    """Register the rank's slice, after the lock is let go (registering takes time the other ranks need not wait)."""
    try:
        lease.register_slice(*part)
    except BrokerError as e:
        if e.errno == errno.ENODEV:
            return  # no usable driver here: locked, as a whole region is without CUDA
        lease.release()
        raise InvalidArgument(e.errno, f"region {name!r}: {e}") from None


def _shared_region(name: str, nbytes: int, client: Optional[Client], uids: Iterable[int], owner_uid: Optional[int],
                   label: Optional[str], timeout: float, wait: bool, max_regions: Optional[int],
                   cuda: bool) -> Tuple[Lease, bool]:
    if nbytes <= 0:
        raise InvalidArgument(errno.EINVAL, f"region {name!r}: nbytes must be positive, not {nbytes}")
    _check_name(name)
    owner = os.geteuid() if owner_uid is None else int(owner_uid)
    deadline = time.monotonic() + timeout
    c = client or connect()
    key = _daemon_key(c)
    d = _owner_dir(owner, key, deadline)
    token_path = os.path.join(d, f"{name}.token")
    tag = label or f"region:{name}"
    if owner != os.geteuid():
        # Another uid's region: wait for a token that names a live lease (the owner's rank may come later).
        while True:
            token, _ = _read_token(token_path, owner)
            lease = _attach_live(c, name, token, nbytes, tag, cuda) if token else None
            if lease is not None:
                return lease, False
            if time.monotonic() >= deadline:
                raise Timeout(errno.ETIMEDOUT, f"region {name!r} of uid {owner}: no live lease in {timeout:g} s "
                              "(its owner's rank makes it, and must name this uid in uids=)")
            time.sleep(0.05)
    lock_path = os.path.join(d, f"{name}.lock")
    fd = _lock(lock_path, name, deadline, timeout)
    try:
        token, _ = _read_token(token_path, owner)
        lease = _attach_live(c, name, token, nbytes, tag, cuda) if token else None
        if lease is not None:
            return lease, False
        # Read only now: a join never depends on the bound (nor on a bad $PINBROKER_REGION_MAX).
        most = _region_max(max_regions)
        _prune(c, d, owner, key, skip=name)
        others = len([n for n in _region_names(d) if n != name])
        if others >= most:
            raise LimitReached(errno.EUSERS, f"region {name!r}: uid {owner} already has {others} regions with files "
                               f"in {d} (at most {most}: max_regions= or $PINBROKER_REGION_MAX); release some "
                               "and remove_region() them, or raise the bound")
        lease = c.acquire(nbytes, label=tag, wait=wait, cuda=cuda)
        try:
            _publish(token_path, lease.share(uids), lease.nbytes, lease.id, key)
        except BaseException:
            lease.release()
            raise
        return lease, True
    finally:
        # A region refused or not made (the bound, no memory) leaves no lock file without a token behind.
        if not os.path.exists(token_path):
            try:
                os.unlink(lock_path)
            except FileNotFoundError:
                pass
        os.close(fd)  # drops the flock


def remove_region(name: str, *, client: Optional[Client] = None, timeout: float = 60.0) -> bool:
    """Remove this uid's files of region ``name`` on the daemon of ``client`` (default: the socket connect()
    would use; nothing is sent to it). Ranks that attached keep their mapping. True if removed.

    It holds the region's lock while it removes, as making, joining and pruning do: a prune that judged the
    region stale must not then remove the files of a region made anew by the same name; Timeout when a rank
    holds the lock for ``timeout`` seconds."""
    _check_name(name)
    d = _find_dir(os.geteuid(), _daemon_key(client))
    if d is None:
        return False  # no folder, so no files: none is made for it
    path = os.path.join(d, f"{name}.token")
    lock_path = path[: -len(".token")] + ".lock"
    if not os.path.lexists(path) and not os.path.lexists(lock_path):
        return False  # nothing to remove: no lock file is made for it
    fd = _lock(lock_path, name, time.monotonic() + timeout, timeout)
    try:
        for p in (path, lock_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)  # drops the flock; a rank that waited on it finds the file gone and opens a new one
    return True
