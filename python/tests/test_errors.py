# SPDX-License-Identifier: MIT
"""Each error class, with its errno and the daemon's (or the library's) message."""

from __future__ import annotations

import errno
import os
import socket
import textwrap
import time

import pytest

import pinbroker
from conftest import FIXTURES, NOBODY, need_root, run_python

MiB = 1 << 20


def test_hierarchy():
    for cls in (pinbroker.BudgetExhausted, pinbroker.QuotaExceeded, pinbroker.MemoryPressure, pinbroker.TooLarge,
                pinbroker.Timeout, pinbroker.NotConnected, pinbroker.PermissionDenied, pinbroker.LimitReached,
                pinbroker.InvalidArgument, pinbroker.ProtocolError, pinbroker.LibraryNotFound):
        assert issubclass(cls, pinbroker.BrokerError) and issubclass(cls, OSError)
    assert issubclass(pinbroker.Timeout, TimeoutError)
    assert issubclass(pinbroker.NotConnected, ConnectionError)
    assert issubclass(pinbroker.PermissionDenied, PermissionError)
    assert issubclass(pinbroker.InvalidArgument, ValueError)


def test_too_large(client):
    with pytest.raises(pinbroker.TooLarge) as ei:
        client.acquire(1 << 40)
    assert ei.value.errno == errno.EFBIG
    assert "1 TiB" in ei.value.strerror and "budget" in ei.value.strerror


def test_budget_exhausted_and_timeout(client):
    hold = client.acquire(200 * MiB)
    with pytest.raises(pinbroker.BudgetExhausted) as ei:
        client.acquire(100 * MiB)
    assert ei.value.errno == errno.ENOSPC
    assert "budget exhausted" in str(ei.value) and "100 MiB asked" in str(ei.value)
    t0 = time.monotonic()
    with pytest.raises(pinbroker.Timeout) as ei:
        client.acquire(100 * MiB, timeout=0.3)
    assert ei.value.errno == errno.ETIMEDOUT and isinstance(ei.value, TimeoutError)
    assert 0.25 < time.monotonic() - t0 < 5
    assert "timeout" in str(ei.value)
    hold.release()


def test_wait_succeeds_once_memory_comes_back(daemon, client):
    import threading

    hold = client.acquire(200 * MiB)
    threading.Timer(0.3, hold.release).start()
    got = client.acquire(100 * MiB, wait=True, timeout=10)
    assert got.nbytes >= 100 * MiB
    got.release()


def test_quota_exceeded(start_daemon):
    d = start_daemon("--uid-quota", "32M")
    with d.connect() as c:
        a = c.acquire(20 * MiB)
        with pytest.raises(pinbroker.QuotaExceeded) as ei:
            c.acquire(20 * MiB)
        assert ei.value.errno == errno.EDQUOT
        assert "quota" in str(ei.value)
        a.release()


def test_limit_reached(start_daemon):
    d = start_daemon("--max-leases-per-client", "2")
    with d.connect() as c:
        held = [c.acquire(MiB), c.acquire(MiB)]
        with pytest.raises(pinbroker.LimitReached) as ei:
            c.acquire(MiB)
        assert ei.value.errno == errno.EUSERS
        assert str(ei.value).strip() != f"[Errno {errno.EUSERS}]"
        for lease in held:
            lease.release()


def test_invalid_size(client):
    with pytest.raises(pinbroker.InvalidArgument) as ei:
        client.acquire(0)
    assert ei.value.errno == errno.EINVAL and ei.value.strerror
    with pytest.raises(pinbroker.InvalidArgument):
        client.acquire(-1)
    with pytest.raises(TypeError):
        client.acquire(1.5)  # type: ignore[arg-type]
    # Size 0 is refused, not papered over with fallback memory.
    with pytest.raises(pinbroker.InvalidArgument) as ei:
        client.acquire_or_fallback(0)
    assert ei.value.errno == errno.EINVAL and "size 0" in ei.value.strerror


@pytest.mark.parametrize("scenario, err, critical", [("swapping", errno.EBUSY, False),
                                                      ("near-oom", errno.EAGAIN, True)])
def test_memory_pressure(start_daemon, scenario, err, critical):
    # The daemon reads a captured /proc of a host under pressure (tests/fixtures/proc); the fixture
    # turns thresholds off, so they are set back to the defaults here.
    root = os.path.join(FIXTURES, scenario)
    d = start_daemon("--proc-root", root, "--poll-interval-ms", "50",
                     "--tight-mem-available-pct", "10", "--critical-mem-available-pct", "5",
                     "--tight-psi-some-avg10", "10", "--critical-psi-full-avg10", "5",
                     "--tight-swap-free-pct", "20")
    want = "critical" if critical else "tight"
    deadline = time.monotonic() + 10
    while d.status(leases=False)["pressure_state"] != want and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.status(leases=False)["pressure_state"] == want
    with d.connect() as c:
        with pytest.raises(pinbroker.MemoryPressure) as ei:
            c.acquire(MiB)
        assert ei.value.errno == err and ei.value.critical is critical
        assert str(ei.value).strip() != f"[Errno {err}]"
        fb = c.acquire_or_fallback(MiB)
        assert fb.kind == "fallback" and "broker refused" in fb.fallback_reason
        fb.release()


def test_not_connected_no_socket(tmp_path):
    path = str(tmp_path / "none.sock")
    with pytest.raises(pinbroker.NotConnected) as ei:
        pinbroker.connect(path)
    assert ei.value.errno == errno.ENOENT and path in str(ei.value)


def test_not_connected_refused(tmp_path):
    path = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    s.close()  # the file stays, nobody listens
    with pytest.raises(pinbroker.NotConnected) as ei:
        pinbroker.connect(path)
    assert ei.value.errno == errno.ECONNREFUSED and path in str(ei.value)


def test_not_connected_after_daemon_stops(daemon):
    c = daemon.connect()
    daemon.stop()
    with pytest.raises(pinbroker.BrokerError) as ei:
        c.acquire(MiB)
    assert ei.value.errno in (errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN, errno.ECONNREFUSED,
                              errno.ENOENT), ei.value
    assert isinstance(ei.value, pinbroker.NotConnected)
    # and the fallback path still hands out memory
    fb = c.acquire_or_fallback(MiB)
    assert fb.kind == "fallback"
    fb.release()
    c.close()


def test_permission_denied_for_admin_requests(daemon):
    need_root()
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        c = pinbroker.connect({daemon.socket!r})
        try:
            c.revoke(all=True)
        except pinbroker.PermissionDenied as e:
            print("ERR", e.errno, e)
    """), user=NOBODY)
    assert r.returncode == 0, r.stderr
    assert f"ERR {errno.EACCES}" in r.stdout or f"ERR {errno.EPERM}" in r.stdout, r.stdout


def test_permission_denied_on_the_socket(daemon):
    need_root()
    os.chmod(daemon.dir, 0o700)
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        try:
            pinbroker.connect({daemon.socket!r})
        except pinbroker.PermissionDenied as e:
            print("ERR", e.errno, e)
    """), user=NOBODY)
    os.chmod(daemon.dir, 0o755)
    assert r.returncode == 0, r.stderr
    assert f"ERR {errno.EACCES}" in r.stdout and daemon.socket in r.stdout, r.stdout
