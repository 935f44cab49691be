# SPDX-License-Identifier: MIT
"""Revoke callbacks: called on the library's receiver thread, exceptions contained, the default policy."""

from __future__ import annotations

import gc
import textwrap
import threading
import time

import pytest

from conftest import run_python

MiB = 1 << 20


def _wait(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pred()


def test_callback_runs_on_the_receiver_thread_and_releases(daemon, client):
    seen = []
    done = threading.Event()

    @client.on_revoke
    def cb(lease, deadline_ms):
        seen.append((lease, deadline_ms, threading.get_ident()))
        lease.release()
        done.set()

    lease = client.acquire(4 * MiB, label="revoke-me")
    other = client.acquire(MiB, label="keep")
    with daemon.connect() as admin:  # root is an admin
        assert admin.revoke(lease.id, deadline_ms=3000) == [lease.id]
    assert done.wait(5), "revoke callback not called"
    got, deadline_ms, tid = seen[0]
    assert got is lease  # the same Python object the caller holds
    assert 0 < deadline_ms <= 3000
    assert tid != threading.get_ident()
    assert lease.released
    assert daemon.wait_leased(other.nbytes) == other.nbytes
    assert [r["id"] for r in client.leases()] == [other.id]
    other.release()


def test_pinctl_revoke_reaches_the_callback(daemon, client):
    done = threading.Event()
    client.on_revoke(lambda lease, ms: (lease.release(), done.set()))
    lease = client.acquire(MiB)
    daemon.pinctl("revoke", str(lease.id))
    assert done.wait(5)
    assert daemon.wait_leased(0) == 0
    st = daemon.status(leases=False)
    assert any(str(lease.id) in e["text"] for e in st["revocations"]), st["revocations"]


def test_callback_may_release_from_another_thread_later(daemon, client):
    np = pytest.importorskip("numpy")
    pending = []
    client.on_revoke(lambda lease, ms: pending.append(lease))
    lease = client.acquire(MiB)
    view = lease.numpy(np.uint8)
    view[:] = 4
    with daemon.connect() as admin:
        admin.revoke(lease.id, deadline_ms=5000)
    assert _wait(lambda: pending)
    assert daemon.leased() == lease.nbytes
    # The consumer finishes with its view, then lets go: the memory goes back only then.
    assert int(view.sum()) == 4 * lease.nbytes
    assert pending[0].release() is False
    del view
    gc.collect()
    assert daemon.wait_leased(0) == 0


def test_exception_in_callback_is_reported_not_fatal(daemon, client, capfd):
    calls = []

    def bad(lease, deadline_ms):
        calls.append(lease.id)
        raise RuntimeError("boom in callback")

    client.on_revoke(bad)
    lease = client.acquire(MiB)
    with daemon.connect() as admin:
        admin.revoke(lease.id)
    assert _wait(lambda: calls)
    # The binding releases a lease whose callback raised, so the daemon gets it back in time.
    assert daemon.wait_leased(0) == 0
    assert lease.released
    err = capfd.readouterr().err
    assert "boom in callback" in err and "revoke callback" in err and str(lease.id) in err
    # The connection and its receiver thread carry on.
    again = client.acquire(MiB)
    assert again.id
    again.release()


def test_default_releases_idle_leases(daemon, client):
    lease = client.acquire(MiB)
    busy = client.acquire(MiB)
    lease.set_idle(True)
    with pytest.warns(RuntimeWarning, match="no revoke callback"):
        with daemon.connect() as admin:
            admin.revoke(all=True, deadline_ms=5000)
        assert _wait(lambda: lease.released)
        # The busy one stays (the daemon's revoke-enforce is its business), with one warning.
        assert _wait(lambda: daemon.leased() == busy.nbytes)
        time.sleep(0.2)  # let the warning of the busy lease arrive inside pytest.warns
    assert not busy.released
    busy.release()
    assert daemon.wait_leased(0) == 0


def test_callback_in_a_subprocess_exits_cleanly(daemon):
    # The receiver thread calls into Python while the main thread waits; then the process exits
    # with the callback still installed.
    r = run_python(textwrap.dedent(f"""
        import threading, pinbroker
        c = pinbroker.connect({daemon.socket!r})
        ev = threading.Event()
        c.on_revoke(lambda lease, ms: (lease.release(), ev.set()))
        lease = c.acquire(1 << 20)
        admin = pinbroker.connect({daemon.socket!r})
        admin.revoke(lease.id)
        assert ev.wait(5)
        again = c.acquire(1 << 20)
        print("OK", again.id)
    """))
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout and r.stderr == ""
    assert daemon.wait_leased(0) == 0


def test_close_inside_callback_is_refused_not_deadlocked(daemon, client, capfd):
    errors = []

    def cb(lease, ms):
        try:
            client.close()
        except RuntimeError as e:
            errors.append(str(e))
        lease.release()

    client.on_revoke(cb)
    lease = client.acquire(MiB)
    with daemon.connect() as admin:
        admin.revoke(lease.id)
    assert _wait(lambda: errors)
    assert "revoke callback" in errors[0]
    assert daemon.wait_leased(0) == 0


def test_on_revoke_rejects_non_callables(client):
    with pytest.raises(TypeError):
        client.on_revoke(42)  # type: ignore[arg-type]


def test_threads_acquiring_while_revocations_arrive(daemon, client):
    np = pytest.importorskip("numpy")
    revoked = []
    got = []
    client.on_revoke(lambda lease, ms: (revoked.append(lease.id), lease.release()))
    stop = threading.Event()
    failures = []

    def worker(k):
        try:
            for i in range(100):
                lease = client.acquire_or_fallback((k + 1) * 65536, label=f"w{k}")
                a = lease.numpy(np.uint8)
                a[:] = k
                time.sleep(0.002)  # held long enough for revocations to catch some
                assert int(a[-1]) == k  # a view stays valid even when a revoke released the lease
                del a
                lease.release()
        except BaseException as e:  # reported below; a thread's exception would otherwise vanish
            failures.append(repr(e))

    def revoker():
        with daemon.connect() as admin:
            while not stop.is_set():
                got.extend(admin.revoke(all=True, deadline_ms=2000))
                time.sleep(0.005)

    r = threading.Thread(target=revoker)
    r.start()
    ws = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for w in ws:
        w.start()
    for w in ws:
        w.join(60)
    stop.set()
    r.join(10)
    assert not failures, failures
    assert revoked, f"no revocation arrived while the workers ran ({got})"
    gc.collect()
    assert daemon.wait_leased(0) == 0
