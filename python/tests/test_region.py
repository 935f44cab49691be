# SPDX-License-Identifier: MIT
"""Named shared regions (pinbroker.shared_region): one lease every rank maps, counted once (issue 26, item 2)."""

from __future__ import annotations

import errno
import os
import re
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
    assert pinbroker.remove_region("again", client=client) and not pinbroker.remove_region("again", client=client)


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
    path = pinbroker.region_path("planted", client=client)
    with open(path, "w") as f:
        f.write("0" * 32 + " 1048576\n")
    os.chmod(path, 0o666)
    with pytest.raises(pinbroker.PermissionDenied, match="not trusted"):
        pinbroker.shared_region("planted", MiB, client=client)
    os.unlink(path)
    # A folder of the owner's that others can write is passed over, with whatever was put in it: the region
    # is made in a new folder.
    os.chmod(os.path.dirname(path), 0o777)
    with open(path, "w") as f:
        f.write("0" * 32 + " 1048576\n")
    lease, created = pinbroker.shared_region("planted", MiB, client=client)
    assert created
    assert os.path.dirname(pinbroker.region_path("planted", client=client)) != os.path.dirname(path)
    lease.release()
    daemon.wait_leased(0)


def _plant(region_dir, name, planter):
    """A folder at name in region_dir, as uid planter makes one: with a commit file and a token in it."""
    d = os.path.join(region_dir, name)
    os.mkdir(d, 0o755)
    for f, text in ((".ready", ""), ("kv.token", "0" * 32 + " 1048576 1 x\n"), ("kv.lock", "")):
        with open(os.path.join(d, f), "w") as fh:
            fh.write(text)
        os.chown(os.path.join(d, f), planter, planter)
    os.chown(d, planter, planter)
    return d


def test_folders_another_uid_planted_neither_block_nor_hijack_a_region(daemon, client, region_dir):
    # Issue 38 finding 8: a uid that made pinbroker-regions-<uid>-<key> for every uid kept every region from
    # being made, root's included. Each uid here plants for the other: the earlier version's fixed name, names
    # of the new form (whose random part they would have to guess), and a link to a folder of the planter's.
    need_root()
    os.chmod(region_dir, 0o1777)  # as /dev/shm: every uid makes its folders in it
    key = pinbroker._region._daemon_key(client)
    for owner, planter in ((0, NOBODY), (NOBODY, 0)):
        prefix = f"pinbroker-regions-{owner}-{key}"
        for suffix in ("", "-0000000000000000", "-ffffffffffffffff"):
            _plant(region_dir, prefix + suffix, planter)
        target = _plant(region_dir, f"elsewhere-{owner}", planter)
        os.symlink(target, os.path.join(region_dir, prefix + "-1111111111111111"))
        os.lchown(os.path.join(region_dir, prefix + "-1111111111111111"), planter, planter)
    lease, created = pinbroker.shared_region("kv", MiB, client=client, uids=[NOBODY])
    assert created
    assert not os.path.dirname(pinbroker.region_path("kv", client=client)).endswith(
        ("-0000000000000000", "-ffffffffffffffff", "-1111111111111111", key))
    lease.memoryview()[:1] = b"\x07"
    # The other uid's rank reaches root's region, not the planted token.
    joiner = _rank(daemon, "kv", MiB, 1, user=NOBODY, owner=0)
    # And its own region is made, whatever root planted for it.
    maker = _rank(daemon, "mine", MiB, 0, user=NOBODY)
    try:
        first = joiner.stdout.readline().split()
        assert first[:2] == ["READY", "0"] and int(first[2]) == lease.id, (first, joiner.stderr.read())
        joiner.stdin.write("\n")
        joiner.stdin.flush()
        assert joiner.stdout.readline().split() == ["DATA", "0702000000000000"]
        made = maker.stdout.readline().split()
        assert made[:2] == ["READY", "1"], (made, maker.stderr.read())
    finally:
        _finish([joiner, maker])
    lease.release()
    daemon.wait_leased(0)


def test_ranks_of_one_owner_making_its_folder_at_once_agree_on_one(region_dir):
    # Forked makers released together by closing one pipe, round after round: every one must end in the same
    # folder, and no other folder of the owner's may be left (checked: dropping the second listing fails this).
    for rnd in range(20):
        key = f"{rnd:012x}"
        go_r, go_w = os.pipe()
        outs = []
        for _ in range(8):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(go_w)
                os.read(go_r, 1)
                try:
                    path = pinbroker._region._owner_dir(os.geteuid(), key, time.monotonic() + 10)
                    os.write(w, path.encode())
                finally:
                    os._exit(0)
            os.close(w)
            outs.append((pid, r))
        os.close(go_r)
        os.close(go_w)
        paths = []
        for pid, r in outs:
            paths.append(os.read(r, 4096).decode())
            os.close(r)
            os.waitpid(pid, 0)
        assert len(set(paths)) == 1 and paths[0], paths
        folders = [e for e in os.listdir(region_dir) if e.startswith(f"pinbroker-regions-{os.geteuid()}-{key}-")]
        assert folders == [os.path.basename(paths[0])], (folders, paths)


def test_a_stale_region_of_another_size_is_made_anew_and_its_lock_is_the_owners_alone(daemon, client, region_dir):
    small, created = pinbroker.shared_region("grow", MiB, client=client)
    assert created
    small.release()
    # The file names a dead 1 MiB lease: a bigger region is made, not refused for its size.
    big, created = pinbroker.shared_region("grow", 4 * MiB, client=client)
    assert created and big.nbytes >= 4 * MiB
    big.release()
    lock = pinbroker.region_path("grow", client=client)[: -len(".token")] + ".lock"
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


def _files(name, client):
    token = pinbroker.region_path(name, client=client)
    return [p for p in (token, token[: -len(".token")] + ".lock") if os.path.exists(p)]


def test_stale_regions_files_are_pruned_on_demand_and_when_a_region_is_made(daemon, client, region_dir):
    gone, _ = pinbroker.shared_region("gone", MiB, client=client)
    live, _ = pinbroker.shared_region("live", 2 * MiB, client=client)
    # The token file names the lease beside the token: one listing tells which are live; and the daemon
    # whose listing that is (its key, also in the folder's name).
    with open(pinbroker.region_path("live", client=client)) as f:
        words = f.read().split()
    key = pinbroker._region._daemon_key(client)
    assert len(words) == 4 and words[1:] == [str(live.nbytes), str(live.id), key], words
    folder = os.path.basename(os.path.dirname(pinbroker.region_path("live", client=client)))
    assert re.match(rf"^pinbroker-regions-{os.geteuid()}-{key}-[0-9a-f]{{16}}$", folder), folder
    gone.release()
    daemon.wait_leased(live.nbytes)
    # A region whose making failed (no memory) leaves a lock file and no token: stale too.
    lock_only = pinbroker.region_path("failed", client=client)[: -len(".token")] + ".lock"
    open(lock_only, "w").close()
    assert pinbroker.prune_regions(client=client) == ["failed", "gone"]
    assert _files("gone", client) == [] and _files("failed", client) == []
    assert len(_files("live", client)) == 2
    # The live region's files still lead a later rank to it.
    other = daemon.connect()
    joined, created = pinbroker.shared_region("live", 2 * MiB, client=other)
    assert not created and joined.id == live.id
    joined.release()
    other.close()
    assert pinbroker.prune_regions(client=client) == []
    # Once every rank left, making another region removes its files.
    live.release()
    daemon.wait_leased(0)
    fresh, created = pinbroker.shared_region("fresh", MiB, client=client)
    assert created and _files("live", client) == [] and len(_files("fresh", client)) == 2
    fresh.release()
    daemon.wait_leased(0)


def test_a_region_whose_creator_left_is_live_while_a_rank_maps_it(daemon, client, region_dir):
    lease, _ = pinbroker.shared_region("held", MiB, client=client)
    other = daemon.connect()
    attached, created = pinbroker.shared_region("held", MiB, client=other)
    assert not created
    lease.release()  # the creator leaves; the attached rank keeps the lease alive
    deadline = time.monotonic() + 5  # releases are asynchronous: until the daemon shows the holder gone
    while not [r for r in client.leases() if r["id"] == attached.id and r["holder_detached"]]:
        assert time.monotonic() < deadline, client.leases()
        time.sleep(0.02)
    assert daemon.leased() == attached.nbytes
    assert pinbroker.prune_regions(client=client) == []
    third = daemon.connect()
    again, created = pinbroker.shared_region("held", MiB, client=third)
    assert not created and again.id == attached.id
    again.release()
    attached.release()
    third.close()
    other.close()
    daemon.wait_leased(0)
    assert pinbroker.prune_regions(client=client) == ["held"]


def test_a_region_being_made_and_an_older_token_file_are_left_alone(daemon, client, region_dir):
    import fcntl

    pinbroker.shared_region("seed", MiB, client=client)[0].release()  # makes the folder
    daemon.wait_leased(0)
    # A rank holds the lock of "busy" (it is making the region): not stale whatever its files say.
    lock = pinbroker.region_path("busy", client=client)[: -len(".token")] + ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # A token file of the version before lease ids: its lease cannot be told without mapping it, so it stays.
    with open(pinbroker.region_path("older", client=client), "w") as f:
        f.write("0" * 32 + " 1048576\n")
    try:
        assert pinbroker.prune_regions(client=client) == ["seed"]
        assert os.path.exists(lock) and os.path.exists(pinbroker.region_path("older", client=client))
    finally:
        os.close(fd)
    assert pinbroker.prune_regions(client=client) == ["busy"]
    assert pinbroker.remove_region("older", client=client)


def test_a_rank_waiting_on_a_lock_that_is_removed_locks_the_new_file(daemon, client, region_dir, monkeypatch):
    import fcntl
    import threading

    R = pinbroker._region
    pinbroker.shared_region("seed", MiB, client=client)[0].release()
    lock = pinbroker.region_path("moved", client=client)[: -len(".token")] + ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    # The rank tells when it is inside _lock's wait loop (it opened the old file and found it locked), and
    # counts the lock files it opens: the test then knows the re-open path ran, not a lucky late start.
    waiting = threading.Event()
    opened = []
    real_wait, real_open = R._lock_wait, R._open_lock
    monkeypatch.setattr(R, "_lock_wait", lambda: (waiting.set(), real_wait()))
    monkeypatch.setattr(R, "_open_lock", lambda path: opened.append(path) or real_open(path))
    other = daemon.connect()
    got = []
    t = threading.Thread(target=lambda: got.append(pinbroker.shared_region("moved", MiB, client=other, timeout=10)))
    t.start()
    assert waiting.wait(10), "the rank never waited on the lock"
    # A prune (or remove_region) removes the file under the lock, then lets go: the waiting rank must not
    # go on holding a removed file, which a rank opening the path anew would lock too.
    os.unlink(lock)
    os.close(fd)
    t.join(10)
    assert got and got[0][1]
    assert os.path.exists(lock)  # it locked the file at the path, made anew
    assert opened.count(lock) >= 2, opened  # the old file, then the new one
    got[0][0].release()
    other.close()


def test_the_number_of_regions_is_bounded(daemon, client, region_dir, monkeypatch):
    a, _ = pinbroker.shared_region("a", MiB, client=client, max_regions=2)
    b, _ = pinbroker.shared_region("b", MiB, client=client, max_regions=2)
    with pytest.raises(pinbroker.LimitReached, match=r"already has 2 regions .*at most 2") as e:
        pinbroker.shared_region("c", MiB, client=client, max_regions=2)
    assert e.value.errno == errno.EUSERS
    assert _files("c", client) == []  # refused before any lease or token
    # Joining a live region is never refused for the bound.
    other = daemon.connect()
    joined, created = pinbroker.shared_region("a", MiB, client=other, max_regions=2)
    assert not created
    joined.release()
    other.close()
    # The environment sets the bound when the argument does not.
    monkeypatch.setenv("PINBROKER_REGION_MAX", "2")
    with pytest.raises(pinbroker.LimitReached):
        pinbroker.shared_region("c", MiB, client=client)
    # A region whose ranks all left makes room: it is pruned when the next one is made.
    a.release()
    daemon.wait_leased(b.nbytes)
    c, created = pinbroker.shared_region("c", MiB, client=client)
    assert created and _files("a", client) == []
    for bad in ("0", "-1", "many"):
        monkeypatch.setenv("PINBROKER_REGION_MAX", bad)
        with pytest.raises(pinbroker.InvalidArgument, match="PINBROKER_REGION_MAX"):
            pinbroker.shared_region("d", MiB, client=client)
        assert _files("d", client) == []
        # Not even a bad bound refuses a join: it is read only when a region is to be made.
        other = daemon.connect()
        joined, created = pinbroker.shared_region("c", MiB, client=other)
        assert not created and joined.id == c.id
        joined.release()
        other.close()
    other = daemon.connect()
    joined, created = pinbroker.shared_region("c", MiB, client=other, max_regions=0)
    assert not created and joined.id == c.id
    joined.release()
    other.close()
    monkeypatch.delenv("PINBROKER_REGION_MAX")
    with pytest.raises(pinbroker.InvalidArgument, match="max_regions"):
        pinbroker.shared_region("d", MiB, client=client, max_regions=0)
    c.release()
    b.release()
    daemon.wait_leased(0)


def test_the_default_bound_is_256():
    assert pinbroker._region.REGION_MAX_DEFAULT == 256


def test_regions_belong_to_their_daemon(start_daemon, region_dir):
    # Two daemons of one uid: lease ids restart at 1 in each, so one daemon's listing must never judge the
    # other's regions (a region made through A once pruned a live region of B's, whose next rank then made
    # a second lease instead of joining).
    a, b = start_daemon(), start_daemon()
    ca, cb, cb2 = a.connect(), b.connect(), b.connect()
    on_b, created = pinbroker.shared_region("kv", MiB, client=cb)
    assert created
    on_a, created = pinbroker.shared_region("other", MiB, client=ca)
    assert created
    assert len(_files("kv", cb)) == 2
    assert pinbroker.prune_regions(client=ca) == []
    assert len(_files("kv", cb)) == 2
    joined, created = pinbroker.shared_region("kv", MiB, client=cb2)
    assert not created and joined.id == on_b.id
    joined.release()
    # The same name on the other daemon is another region, with its own files.
    assert pinbroker.region_path("kv", client=ca) != pinbroker.region_path("kv", client=cb)
    kv_a, created = pinbroker.shared_region("kv", MiB, client=ca)
    assert created and len(_files("kv", ca)) == 2 and len(_files("kv", cb)) == 2
    # remove_region removes the named daemon's files only.
    kv_a.release()
    assert pinbroker.remove_region("kv", client=ca)
    assert _files("kv", ca) == [] and len(_files("kv", cb)) == 2
    on_a.release()
    on_b.release()
    for c in (ca, cb, cb2):
        c.close()


def test_a_prune_keeps_token_files_not_provably_its_daemons(daemon, client, region_dir):
    pinbroker.shared_region("seed", MiB, client=client)[0].release()
    daemon.wait_leased(0)
    # Stale-looking tokens (no lease 999 here) that name another daemon's key, or none (an earlier version):
    # the listing of this daemon says nothing of them, so they are kept.
    with open(pinbroker.region_path("elsewhere", client=client), "w") as f:
        f.write("0" * 32 + " 1048576 999 " + "f" * 12 + "\n")
    with open(pinbroker.region_path("threeword", client=client), "w") as f:
        f.write("0" * 32 + " 1048576 999\n")
    assert pinbroker.prune_regions(client=client) == ["seed"]
    assert os.path.exists(pinbroker.region_path("elsewhere", client=client))
    assert os.path.exists(pinbroker.region_path("threeword", client=client))
    assert pinbroker.remove_region("elsewhere", client=client) and pinbroker.remove_region("threeword", client=client)


def test_remove_region_waits_for_the_regions_lock(daemon, client, region_dir):
    import fcntl

    lease, _ = pinbroker.shared_region("held", MiB, client=client)
    lock = pinbroker.region_path("held", client=client)[: -len(".token")] + ".lock"
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a rank is joining it, or a prune is judging it
    try:
        with pytest.raises(pinbroker.Timeout, match="held"):
            pinbroker.remove_region("held", client=client, timeout=0.2)
        assert len(_files("held", client)) == 2
    finally:
        os.close(fd)
    assert pinbroker.remove_region("held", client=client) and _files("held", client) == []
    lease.release()


def test_a_prune_never_removes_files_made_anew_while_it_read_the_listing(daemon, client, region_dir, monkeypatch):
    import threading

    R = pinbroker._region
    old, _ = pinbroker.shared_region("x", MiB, client=client)
    old.release()
    daemon.wait_leased(0)  # "x" is stale now
    other = daemon.connect()
    made = []
    real = R._live_lease_ids

    def listing_then_interleave(c, owner):
        live = real(c, owner)  # the prune read its listing, holding x's old lock
        # Something that takes no lock (an older version's remove_region, a hand's rm) removes x's files,
        # and another rank makes x anew: a new lock file, a new token, a live lease the listing lacks.
        for p in _files("x", client):
            os.unlink(p)
        t = threading.Thread(target=lambda: made.append(pinbroker.shared_region("x", MiB, client=other, timeout=10)))
        t.start()
        t.join(10)
        return live

    monkeypatch.setattr(R, "_live_lease_ids", listing_then_interleave)
    assert pinbroker.prune_regions(client=client) == []
    monkeypatch.setattr(R, "_live_lease_ids", real)
    lease, created = made[0]
    assert created and len(_files("x", client)) == 2
    third = daemon.connect()
    joined, created = pinbroker.shared_region("x", MiB, client=third)
    assert not created and joined.id == lease.id
    joined.release()
    lease.release()
    third.close()
    other.close()
