# SPDX-License-Identifier: MIT
"""Shared leases: Lease.share() and Client.attach() over pb_lease_share / pb_attach (issue 10, item 1)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import pinbroker
from pinbroker import _lib
from conftest import NOBODY, env_for_uid, need_root

MiB = 1 << 20


def _has_share() -> bool:
    try:
        return _lib.optional("pb_lease_share") is not None and _lib.optional("pb_attach") is not None
    except pinbroker.LibraryNotFound:
        return False


needs_share = pytest.mark.skipif(
    not _has_share(),
    reason=f"the libpinbroker under test ({os.environ.get('PINBROKER_LIBRARY') or 'from the build tree'}) has no "
    "pb_lease_share/pb_attach yet (shared leases, issue 10 item 1): these tests run once it does",
)



def test_share_without_library_support_says_so(client):
    if _has_share():
        pytest.skip("this libpinbroker has pb_lease_share: the NotImplementedError path does not apply")
    lease = client.acquire(MiB)
    with pytest.raises(NotImplementedError, match="pb_lease_share"):
        lease.share()
    with pytest.raises(NotImplementedError, match="pb_attach"):
        client.attach("0" * 32)
    lease.release()


def test_fallback_lease_cannot_be_shared(client):
    fb = pinbroker.acquire_or_fallback(4096, path="/nonexistent/pinbroker.sock")
    assert fb.kind == "fallback"
    with pytest.raises(pinbroker.InvalidArgument, match="cannot be shared"):
        fb.share()
    fb.release()


class Attacher:
    """A child interpreter that attaches a token and then follows line commands on stdin."""

    SCRIPT = textwrap.dedent("""
        import sys, threading, pinbroker
        sock, token = sys.argv[1], sys.argv[2]
        c = pinbroker.connect(sock)
        revoked = threading.Event()
        c.on_revoke(lambda lease, ms: (print("REVOKED", lease.id, flush=True), lease.release()))
        try:
            lease = c.attach(token)
        except pinbroker.BrokerError as e:
            print("REFUSED", type(e).__name__, e.errno, e, flush=True)
            sys.exit(0)
        print("ATTACHED", lease.id, lease.nbytes, lease.kind, lease.attached, flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "read":
                print("DATA", bytes(lease.memoryview()[:int(cmd[1])]).hex(), flush=True)
            elif cmd[0] == "write":
                lease.memoryview()[:len(bytes.fromhex(cmd[1]))] = bytes.fromhex(cmd[1])
                print("WROTE", flush=True)
            elif cmd[0] == "release":
                print("RELEASED", lease.release(), flush=True)
            elif cmd[0] == "exit":
                break
    """)

    def __init__(self, socket: str, token: str, user: int = None) -> None:
        env = env_for_uid({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, user)
        kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
        self.p = subprocess.Popen([sys.executable, "-c", self.SCRIPT, socket, token], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)

    def line(self, timeout: float = 10) -> str:
        out = []
        t = threading.Thread(target=lambda: out.append(self.p.stdout.readline()))
        t.start()
        t.join(timeout)
        assert out and out[0], f"attacher said nothing; stderr: {self.p.stderr.read() if self.p.poll() is not None else '(running)'}"
        return out[0].strip()

    def send(self, cmd: str) -> str:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.line()

    def close(self) -> int:
        if self.p.poll() is None:
            try:
                self.p.stdin.write("exit\n")
                self.p.stdin.flush()
            except BrokenPipeError:
                pass
        try:
            return self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()


@needs_share
def test_same_uid_attach_sees_the_same_memory_counted_once(daemon, client):
    lease = client.acquire(2 * MiB, label="shared")
    lease.memoryview()[:4] = b"\x01\x02\x03\x04"
    token = lease.share()
    assert isinstance(token, str) and len(token) == _lib.PB_SHARE_TOKEN_LEN - 1
    a = Attacher(daemon.socket, token)
    try:
        first = a.line()
        assert first.startswith("ATTACHED"), first
        _, lid, nbytes, kind, attached = first.split()
        assert int(lid) == lease.id and int(nbytes) == lease.nbytes and attached == "True"
        assert a.send("read 4") == "DATA 01020304"
        assert a.send("write cafe") == "WROTE"
        assert bytes(lease.memoryview()[:2]) == b"\xca\xfe"
        assert daemon.leased() == lease.nbytes  # one ledger entry, two mappers
        row = [r for r in client.leases() if r["id"] == lease.id][0]
        assert row["shared"] and row["attachers"] == 1 and row["attacher_pids"] == [a.p.pid], row
        me = [c for c in client.status()["clients"] if c["pid"] == a.p.pid]
        assert me and me[0]["attached"] == 1, me
        # The holder lets go first: the attacher keeps the lease alive.
        assert lease.release() is True
        time.sleep(0.2)
        assert daemon.leased() == lease.nbytes
        row = [r for r in daemon.status()["leases"] if r["id"] == lease.id][0]
        assert row["holder_detached"] and row["attachers"] == 1, row
        assert a.send("read 2") == "DATA cafe"
        assert a.send("release").startswith("RELEASED")
        assert daemon.wait_leased(0) == 0
    finally:
        a.close()


@needs_share
def test_attacher_exit_without_release_is_cleaned_up(daemon, client):
    lease = client.acquire(MiB)
    token = lease.share()
    a = Attacher(daemon.socket, token)
    assert a.line().startswith("ATTACHED")
    a.p.send_signal(signal.SIGKILL)  # crashes with the lease attached
    a.p.wait()
    a.close()
    time.sleep(0.2)
    assert daemon.leased() == lease.nbytes  # the holder still has it
    lease.memoryview()[0] = 1
    lease.release()
    assert daemon.wait_leased(0) == 0


@needs_share
def test_forged_and_stale_tokens_are_refused(daemon, client):
    with pytest.raises(pinbroker.UnknownLease) as ei:
        client.attach("0123456789abcdef0123456789abcdef")
    assert ei.value.errno == errno.ENOENT and isinstance(ei.value, LookupError)
    assert ei.value.strerror
    lease = client.acquire(MiB)
    token = lease.share()
    assert lease.share() == token  # one token for the lease's life
    lease.release()
    assert daemon.wait_leased(0) == 0
    with pytest.raises(pinbroker.UnknownLease):
        client.attach(token)
    with pytest.raises(pinbroker.BrokerError):
        client.attach("")


@needs_share
def test_other_uid_needs_a_grant(daemon, client):
    need_root()
    lease = client.acquire(MiB)
    lease.memoryview()[:2] = b"hi"
    a = Attacher(daemon.socket, lease.share(), user=NOBODY)
    try:
        out = a.line()
        assert out.startswith(f"REFUSED PermissionDenied {errno.EACCES}"), out
    finally:
        a.close()
    b = Attacher(daemon.socket, lease.share(uids=[NOBODY]), user=NOBODY)
    try:
        assert b.line().startswith("ATTACHED")
        assert b.send("read 2") == "DATA " + b"hi".hex()
    finally:
        b.close()
    lease.release()
    assert daemon.wait_leased(0) == 0


@needs_share
def test_revoke_reaches_every_attacher(daemon, client):
    done = threading.Event()
    client.on_revoke(lambda l, ms: (l.release(), done.set()))
    lease = client.acquire(MiB)
    a = Attacher(daemon.socket, lease.share())
    try:
        assert a.line().startswith("ATTACHED")
        with daemon.connect() as admin:
            admin.revoke(lease.id, deadline_ms=5000)
        assert done.wait(5)
        assert a.line() == f"REVOKED {lease.id}"
        assert daemon.wait_leased(0) == 0
    finally:
        a.close()


@needs_share
def test_attach_in_the_same_process_over_a_second_client(daemon, client):
    np = pytest.importorskip("numpy")
    lease = client.acquire(MiB)
    with daemon.connect() as other:
        mine = other.attach(lease.share(), label="worker")
        assert mine.attached and mine.id == lease.id
        lease.numpy(np.uint32)[:3] = [7, 8, 9]
        assert mine.numpy(np.uint32, 3).tolist() == [7, 8, 9]
        mine.release()
    assert daemon.leased() == lease.nbytes
    lease.release()
    assert daemon.wait_leased(0) == 0
