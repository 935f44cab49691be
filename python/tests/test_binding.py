# SPDX-License-Identifier: MIT
"""The binding against the real daemon: acquire/release, views, kinds, fallback, status, process life."""

from __future__ import annotations

import errno
import gc
import os
import textwrap
import time

import pytest

import pinbroker
from conftest import run_python

MiB = 1 << 20


def _expected_kind() -> str:
    ok, _ = pinbroker.cuda_available()
    return "pinned" if ok else "locked"


def test_acquire_release_accounts_exactly(daemon, client):
    lease = client.acquire(3 * MiB + 1, label="t-acquire")
    assert isinstance(lease.id, int) and lease.id > 0
    assert lease.nbytes >= 3 * MiB + 1 and lease.nbytes % lease.page_size == 0
    assert lease.requested_nbytes == 3 * MiB + 1
    assert lease.kind == _expected_kind() and isinstance(lease.kind, pinbroker.Kind)
    assert lease.fallback_reason is None
    assert lease.chunks >= 1
    assert daemon.leased() == lease.nbytes
    assert lease.release() is True
    assert lease.released
    assert daemon.wait_leased(0) == 0
    assert lease.release() is True  # idempotent
    with pytest.raises(ValueError, match="released"):
        lease.memoryview()


def test_memoryview_write_then_read(client):
    with client.acquire(MiB) as lease:
        mv = lease.memoryview()
        assert mv.format == "B" and mv.nbytes == lease.nbytes and not mv.readonly
        pattern = bytes(range(256)) * 16
        mv[: len(pattern)] = pattern
        mv[-4:] = b"tail"
        again = lease.memoryview()
        assert bytes(again[: len(pattern)]) == pattern
        assert bytes(again[-4:]) == b"tail"
        # The same bytes through the raw address: the view is the mapping, not a copy.
        import ctypes

        assert ctypes.string_at(lease.address, 4) == pattern[:4]


def test_numpy_view_shares_memory(client):
    np = pytest.importorskip("numpy")
    with client.acquire(MiB) as lease:
        a = lease.numpy(np.float32, (256, 256))
        assert a.shape == (256, 256) and a.dtype == np.float32
        a[:] = np.arange(256 * 256, dtype=np.float32).reshape(256, 256)
        b = lease.numpy("uint8")
        assert b.size == lease.nbytes
        assert bytes(lease.memoryview()[:8]) == np.array([0, 1], dtype=np.float32).tobytes()
        c = lease.numpy(np.int64, 4, offset=8)
        assert c.tobytes() == a.reshape(-1)[2:10].tobytes()
        with pytest.raises(ValueError, match="needs"):
            lease.numpy(np.float64, lease.nbytes)
        with pytest.raises(ValueError, match="outside"):
            lease.numpy(np.uint8, 1, offset=lease.nbytes + 1)
        del a, b, c


def test_torch_tensor_view_shares_memory(client):
    torch = pytest.importorskip("torch")
    with client.acquire(MiB) as lease:
        t = lease.tensor(torch.int32, (16, 16))
        assert t.shape == (16, 16) and t.dtype == torch.int32
        t.copy_(torch.arange(256, dtype=torch.int32).view(16, 16))
        import numpy as np

        assert lease.numpy(np.int32, 256).tolist() == list(range(256))
        u = lease.tensor()  # uint8, everything
        assert u.numel() == lease.nbytes and u.dtype == torch.uint8
        # CUDA registration is what makes is_pinned() true; without it (CPU torch, no driver) it is false.
        if lease.kind == "pinned" and torch.cuda.is_available():
            assert t.is_pinned()
        else:
            assert not t.is_pinned()
        del t, u


def test_views_keep_the_memory_until_dropped(daemon, client):
    np = pytest.importorskip("numpy")
    lease = client.acquire(2 * MiB)
    a = lease.numpy(np.uint8)
    a[:4] = [1, 2, 3, 4]
    assert lease.views == 1
    assert lease.release() is False  # deferred: a view is alive
    assert daemon.leased() == lease.nbytes
    assert a[:4].tolist() == [1, 2, 3, 4]  # still mapped, no crash
    a[-1] = 9
    with pytest.raises(ValueError, match="released"):
        lease.numpy()
    del a
    gc.collect()
    assert lease.views == 0
    assert daemon.wait_leased(0) == 0


def test_torch_view_keeps_the_memory_until_dropped(daemon, client):
    torch = pytest.importorskip("torch")
    lease = client.acquire(MiB)
    t = lease.tensor(torch.float32)
    t.fill_(2.5)
    assert lease.release() is False
    assert float(t.sum()) == 2.5 * t.numel()
    del t
    gc.collect()
    assert daemon.wait_leased(0) == 0


def test_unreleased_lease_is_released_when_collected(daemon, client):
    lease = client.acquire(MiB)
    assert daemon.leased() == lease.nbytes
    del lease
    gc.collect()
    assert daemon.wait_leased(0) == 0


def test_context_managers_release(daemon):
    with daemon.connect() as c:
        with c.acquire(MiB) as lease:
            assert daemon.leased() == lease.nbytes
        assert lease.released
        assert daemon.wait_leased(0) == 0
        held = [c.acquire(MiB) for _ in range(3)]
        assert daemon.leased() == sum(h.nbytes for h in held)
    assert c.closed
    # close() gave back what was still held, while this process lives on: nothing stays counted.
    assert daemon.wait_leased(0, timeout=2) == 0
    for _ in range(5):
        with daemon.connect() as c:
            held = [c.acquire(MiB) for _ in range(3)]
        assert daemon.wait_leased(0, timeout=2) == 0
    with pytest.raises(pinbroker.NotConnected, match="closed"):
        c.acquire(MiB)


def test_priority_and_label_in_status_and_leases(daemon, client):
    a = client.acquire(MiB, label="img-ring", priority="critical")
    b = client.acquire(MiB, label="scratch", priority=pinbroker.Priority.BEST_EFFORT)
    c = client.acquire(MiB)
    rows = {r["id"]: r for r in client.leases()}
    assert rows[a.id]["label"] == "img-ring" and rows[a.id]["priority"] == "critical"
    assert rows[b.id]["label"] == "scratch" and rows[b.id]["priority"] == "best-effort"
    assert rows[c.id]["label"] == "" and rows[c.id]["priority"] == "normal"
    assert rows[a.id]["pid"] == os.getpid() and rows[a.id]["state"] == "active"
    st = client.status(leases=True)
    assert st["leased_bytes"] == a.nbytes + b.nbytes + c.nbytes
    assert st["budget_bytes"] == 256 * MiB
    assert {r["id"] for r in st["leases"]} == {a.id, b.id, c.id}
    me = [r for r in st["clients"] if r["pid"] == os.getpid() and r["leases"] == 3]
    assert me and "img-ring" in me[0]["labels"] and "scratch" in me[0]["labels"]
    assert "leases" not in client.status()
    with pytest.raises(ValueError, match="priority"):
        client.acquire(MiB, priority="urgent")
    for lease in (a, b, c):
        lease.release()


def test_acquire_or_fallback_without_a_daemon(tmp_path):
    sock = str(tmp_path / "nobody-here.sock")
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        lease = pinbroker.acquire_or_fallback(5000, label="x", path={sock!r})
        assert lease.kind == "fallback" and lease.id is None, lease
        assert lease.nbytes >= 5000
        lease.memoryview()[:3] = b"abc"
        assert bytes(lease.memoryview()[:3]) == b"abc"
        print("REASON", lease.fallback_reason)
        lease.release()
    """))
    assert r.returncode == 0, r.stderr
    assert "REASON" in r.stdout and sock in r.stdout, r.stdout


def test_acquire_or_fallback_over_budget_says_why(start_daemon):
    d = start_daemon("--budget", "8M", "--prewarm", "4M")
    with d.connect() as c:
        lease = c.acquire_or_fallback(16 * MiB)
        assert lease.kind == pinbroker.Kind.FALLBACK
        assert lease.fallback_reason.startswith("broker refused"), lease.fallback_reason
        assert "budget" in lease.fallback_reason
        lease.memoryview()[-1] = 7
        assert lease.release() is True
        ok = c.acquire_or_fallback(MiB)
        assert ok.kind != "fallback" and ok.id
        ok.release()
    # A closed client falls back too, instead of raising.
    lease = c.acquire_or_fallback(MiB)
    assert lease.kind == "fallback" and lease.fallback_reason
    lease.release()


def test_module_acquire_or_fallback_uses_the_daemon(daemon):
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        lease = pinbroker.acquire_or_fallback(1 << 20, label="mod", path={daemon.socket!r})
        assert lease.kind != "fallback" and lease.id, lease
        print("ID", lease.id)
    """))
    assert r.returncode == 0, r.stderr
    assert daemon.wait_leased(0) == 0  # released at exit


def test_missing_library_is_explained_and_fallback_still_works(tmp_path):
    r = run_python(textwrap.dedent("""
        import pinbroker
        try:
            pinbroker.connect()
        except pinbroker.LibraryNotFound as e:
            print("ERR", e.errno, e)
        lease = pinbroker.acquire_or_fallback(4096)
        assert lease.kind == "fallback"
        lease.numpy()[:] = 3
        print("FALLBACK", lease.fallback_reason)
        lease.release()
    """), env={"PINBROKER_LIBRARY": str(tmp_path / "libnope.so")})
    assert r.returncode == 0, r.stderr
    assert f"ERR {errno.ELIBACC}" in r.stdout
    assert "PINBROKER_LIBRARY" in r.stdout and "libnope.so" in r.stdout
    assert "FALLBACK no libpinbroker" in r.stdout


def test_exit_without_release_gives_everything_back(daemon):
    # A view, a revoke callback and an unreleased lease at exit: the process exits 0, quietly, and the
    # daemon has nothing leased.
    r = run_python(textwrap.dedent(f"""
        import pinbroker, numpy
        c = pinbroker.connect({daemon.socket!r})
        c.on_revoke(lambda lease, ms: lease.release())
        keep = c.acquire(4 << 20, label="exit-test")
        view = keep.numpy(numpy.uint8)
        view[:] = 1
        other = pinbroker.connect({daemon.socket!r}).acquire(1 << 20)
        print("HELD", keep.id)
    """))
    assert r.returncode == 0, r.stderr
    assert "HELD" in r.stdout and r.stderr == ""
    assert daemon.wait_leased(0) == 0


def test_forked_child_leaves_the_parents_lease_alone(daemon):
    # The child exits normally (atexit and finalisers run): none may release or disconnect the
    # parent's lease, whose connection the child shares. The lease is mapped MADV_DONTFORK: the child
    # has nothing at its address (it would otherwise keep the memory past the lease's end).
    r = run_python(textwrap.dedent(f"""
        import ctypes, os, sys, pinbroker
        def mapped(addr):
            with open("/proc/self/maps") as f:
                for line in f:
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    if lo <= addr < hi:
                        return True
            return False
        c = pinbroker.connect({daemon.socket!r})
        lease = c.acquire(1 << 20)
        mv = lease.memoryview()
        mv[:2] = b"ok"
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        assert mapped(addr)
        pid = os.fork()
        if pid == 0:
            assert not mapped(addr), "a forked child inherited the lease's mapping"
            try:
                c.acquire(1 << 20)
                sys.exit(3)
            except pinbroker.NotConnected as e:
                assert "fork" in str(e), e
            lease.release()  # a no-op in the child: the parent holds the lease
            del mv, lease
            sys.exit(0)
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 0, st
        rows = c.leases()
        assert [r["id"] for r in rows] == [lease.id], rows
        assert bytes(mv[:2]) == b"ok"
        again = c.acquire(1 << 20)  # the connection still works
        print("PARENT OK")
    """))
    assert r.returncode == 0, r.stderr
    assert "PARENT OK" in r.stdout
    assert daemon.wait_leased(0) == 0


def test_daemon_restarted_clean_leaves_the_mapping_usable(daemon):
    # Without systemd's fd store a restarted daemon is a new instance that does not count the old lease.
    # The mapping stays usable here; a library with shared leases says so through Lease.stale.
    c = daemon.connect()
    lease = c.acquire(MiB)
    lease.memoryview()[:3] = b"abc"
    daemon.stop()
    daemon.start()
    assert bytes(lease.memoryview()[:3]) == b"abc"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            c.leases()  # the next call reconnects
            break
        except pinbroker.NotConnected:
            time.sleep(0.05)
    if pinbroker._lib.has_sharing():
        assert lease.stale
    lease.release()
    assert daemon.wait_leased(0) == 0
    again = c.acquire(MiB)  # the reconnected client works
    assert again.id and daemon.leased() == again.nbytes
    again.release()
    c.close()


def test_status_has_the_pool_pages_nodes_jobs_and_client_cgroups(daemon, client):
    """status() carries what pinctl status --json shows: page kind, NUMA nodes, jobs, each client's cgroup."""
    lease = client.acquire(2 * MiB, label="jobs")
    try:
        st = client.status()
        assert st["page_kind"] in ("4k", "thp", "hugetlb")
        assert st["thp_bytes"] + st["hugetlb_bytes"] <= st["pool_bytes"]
        assert isinstance(st["nodes"], list)
        assert sum(n["idle_bytes"] + n["lent_bytes"] for n in st["nodes"]) in (0, st["pool_bytes"])
        me = [r for r in st["clients"] if r["pid"] == os.getpid() and r["leases"] >= 1]
        assert me and "cgroup" in me[0]
        # The daemon charges a lease to its holder's cgroup, when it can read one: that job's row counts it.
        cg = me[0]["cgroup"]
        if cg:
            rows = [j for j in st["jobs"] if cg == j["job"] or cg.startswith(j["job"].rstrip("/") + "/")]
            assert rows and rows[0]["bytes"] >= lease.nbytes and rows[0]["leases"] >= 1, (cg, st["jobs"])
        else:
            assert st["jobs"] == [] or all(j["bytes"] == 0 or j["job"] for j in st["jobs"])
    finally:
        lease.release()
