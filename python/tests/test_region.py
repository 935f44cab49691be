# SPDX-License-Identifier: MIT
"""Named shared regions (pinbroker.shared_region): one lease every rank maps, counted once (issue 26, item 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import pinbroker
from pinbroker import _lib
from conftest import NOBODY, env_for_uid, need_root

MiB = 1 << 20

pytestmark = pytest.mark.skipif(
    _lib.optional("pb_lease_share") is None, reason="the libpinbroker under test has no shared leases (pb_lease_share)"
)

# A rank: takes the region, writes its rank number at offset rank, waits for "go" on stdin, then prints
# the first `n` bytes and whether it created the region.
RANK = textwrap.dedent("""
    import os, sys, pinbroker
    sock, name, nbytes, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    owner = int(sys.argv[5]) if len(sys.argv) > 5 else None
    c = pinbroker.connect(sock)
    try:
        lease, created = pinbroker.shared_region(name, nbytes, client=c, owner_uid=owner, timeout=10)
    except pinbroker.BrokerError as e:
        print("REFUSED", type(e).__name__, e, flush=True)
        sys.exit(0)
    lease.memoryview()[rank] = rank + 1
    print("READY", int(created), lease.id, lease.nbytes, flush=True)
    sys.stdin.readline()
    print("DATA", bytes(lease.memoryview()[:8]).hex(), flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def region_dir(monkeypatch):
    # Under /tmp, not pytest's tmp_path (0700 above it): another uid's rank must reach the file.
    d = tempfile.mkdtemp(prefix="pb-regions.")
    os.chmod(d, 0o755)
    monkeypatch.setenv("PINBROKER_REGION_DIR", d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _rank(daemon, name, nbytes, rank, user=None, owner=None):
    env = env_for_uid({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, user)
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    args = [sys.executable, "-c", RANK, daemon.socket, name, str(nbytes), str(rank)]
    if owner is not None:
        args.append(str(owner))
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kw)


def _finish(procs):
    for p in procs:
        if p.poll() is None:
            try:
                p.stdin.write("\n\n")
                p.stdin.flush()
            except BrokenPipeError:
                pass
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_ranks_started_together_share_one_lease_counted_once(daemon, client, region_dir):
    nbytes = 8 * MiB
    procs = [_rank(daemon, "kv", nbytes, r) for r in range(4)]
    try:
        ready = [p.stdout.readline().split() for p in procs]
        assert all(r and r[0] == "READY" for r in ready), (ready, [p.stderr.read() for p in procs if p.poll() is not None])
        assert sorted(int(r[1]) for r in ready) == [0, 0, 0, 1], ready  # exactly one rank created it
        assert len({r[2] for r in ready}) == 1  # one lease id for all four
        assert daemon.leased() == int(ready[0][3])  # counted once, not four times
        rows = [row for row in client.leases() if row["id"] == int(ready[0][2])]
        assert rows and rows[0]["shared"] and rows[0]["attachers"] == 3, rows
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        # Every rank wrote its byte into the same memory.
        assert [p.stdout.readline().split() for p in procs][0] == ["DATA", "0102030400000000"]
    finally:
        _finish(procs)
    assert daemon.leased() == 0  # the last rank out let the lease go


def test_a_region_whose_ranks_all_left_is_made_again(daemon, client, region_dir):
    lease, created = pinbroker.shared_region("again", MiB, client=client)
    assert created
    first = lease.id
    with pytest.raises(pinbroker.InvalidArgument, match="already maps it"):
        pinbroker.shared_region("again", MiB, client=client)
    other = daemon.connect()
    again, created2 = pinbroker.shared_region("again", MiB, client=other)
    assert not created2 and again.id == first
    again.release()
    lease.release()
    other.close()
    assert daemon.leased() == 0
    # The file still names the old token: a stale token makes a new lease, not an error.
    fresh, created3 = pinbroker.shared_region("again", MiB, client=client)
    assert created3 and fresh.id != first
    fresh.release()
    assert pinbroker.remove_region("again") and not pinbroker.remove_region("again")


def test_a_region_smaller_than_asked_is_refused(daemon, client, region_dir):
    lease, _ = pinbroker.shared_region("small", MiB, client=client)
    other = daemon.connect()
    with pytest.raises(pinbroker.InvalidArgument, match="fewer than"):
        pinbroker.shared_region("small", 64 * MiB, client=other)
    other.close()
    lease.release()
    assert daemon.leased() == 0  # the attach made for the size check was let go


def test_bad_names_and_sizes_are_refused(region_dir):
    for bad in ("", "a/b", "..", "x" * 65, "sp ace"):
        with pytest.raises(pinbroker.InvalidArgument, match="region name"):
            pinbroker.region_path(bad)
    with pytest.raises(pinbroker.InvalidArgument, match="positive"):
        pinbroker.shared_region("ok", 0)


def test_a_token_file_or_folder_others_can_write_is_not_trusted(daemon, client, region_dir):
    path = pinbroker.region_path("planted")
    os.mkdir(os.path.dirname(path), 0o755)
    with open(path, "w") as f:
        f.write("0" * 32 + " 1048576\n")
    os.chmod(path, 0o666)
    with pytest.raises(pinbroker.PermissionDenied, match="not trusted"):
        pinbroker.shared_region("planted", MiB, client=client)
    os.unlink(path)
    os.chmod(os.path.dirname(path), 0o777)
    with pytest.raises(pinbroker.PermissionDenied, match="not trusted"):
        pinbroker.shared_region("planted", MiB, client=client)
    assert daemon.leased() == 0


def test_a_stale_region_of_another_size_is_made_anew_and_its_lock_is_the_owners_alone(daemon, client, region_dir):
    small, created = pinbroker.shared_region("grow", MiB, client=client)
    assert created
    small.release()
    # The file names a dead 1 MiB lease: a bigger region is made, not refused for its size.
    big, created = pinbroker.shared_region("grow", 4 * MiB, client=client)
    assert created and big.nbytes >= 4 * MiB
    big.release()
    lock = pinbroker.region_path("grow")[: -len(".token")] + ".lock"
    assert os.stat(lock).st_mode & 0o777 == 0o600  # no other uid can open it, so none can hold its flock


def test_another_uid_attaches_when_named_and_only_then(daemon, client, region_dir):
    need_root()
    lease, created = pinbroker.shared_region("cross", MiB, client=client, uids=[NOBODY])
    assert created
    lease.memoryview()[:1] = b"\x09"
    other = _rank(daemon, "cross", MiB, 1, user=NOBODY, owner=0)
    try:
        first = other.stdout.readline().split()
        assert first[:2] == ["READY", "0"] and int(first[2]) == lease.id, (first, other.stderr.read())
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().split() == ["DATA", "0902000000000000"]
    finally:
        _finish([other])
    lease.release()
    # Not named: the other uid's rank is refused by the daemon, whatever the file says.
    lease2, _ = pinbroker.shared_region("private", MiB, client=client)
    other = _rank(daemon, "private", MiB, 1, user=NOBODY, owner=0)
    try:
        line = other.stdout.readline().split()
        assert line[:2] == ["REFUSED", "PermissionDenied"], (line, other.stderr.read())
    finally:
        _finish([other])
    lease2.release()
    assert daemon.leased() == 0


def test_another_uids_rank_may_start_before_the_owners(daemon, client, region_dir):
    need_root()
    other = _rank(daemon, "early", MiB, 1, user=NOBODY, owner=0)
    try:
        time.sleep(0.5)  # the rank waits: no folder, then no token yet
        assert other.poll() is None, other.stderr.read()
        lease, created = pinbroker.shared_region("early", MiB, client=client, uids=[NOBODY])
        assert created
        first = other.stdout.readline().split()
        assert first[:2] == ["READY", "0"] and int(first[2]) == lease.id, (first, other.stderr.read())
    finally:
        _finish([other])
    lease.release()
