# SPDX-License-Identifier: MIT
"""Fixtures: the real pinbrokerd on a temp socket, started per test, and paths from $PINBROKERD / $PINCTL."""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYDIR)
FIXTURES = os.path.join(REPO, "tests", "fixtures", "proc")

# The package under test is this checkout's, not an installed copy.
sys.path.insert(0, PYDIR)

import pinbroker  # noqa: E402


def _from_env_or_build(var: str, rel: str) -> str:
    p = os.environ.get(var)
    if p:
        return p
    found = sorted(glob.glob(os.path.join(REPO, "build*", rel)), key=os.path.getmtime, reverse=True)
    if not found:
        pytest.exit(f"set {var}, or build the tree (cmake --build build): no build*/{rel}", returncode=2)
    return found[0]


PINBROKERD = _from_env_or_build("PINBROKERD", "daemon/pinbrokerd")
PINCTL = _from_env_or_build("PINCTL", "client/pinctl")

# Deterministic tests: no host pressure signal may refuse an acquire on a busy CI machine, and a
# missed revoke deadline must not SIGTERM the test runner.
QUIET = [
    "--tight-mem-available-pct", "0", "--critical-mem-available-pct", "0",
    "--tight-psi-some-avg10", "0", "--critical-psi-full-avg10", "0",
    "--tight-swapout-pages-per-s", "0", "--critical-swapout-pages-per-s", "0",
    "--tight-swap-free-pct", "0", "--revoke-enforce", "none",
]
if os.geteuid() != 0:
    # Root is an admin; anyone else running the tests is made one through its group, for the
    # revoke tests (admin requests).
    import grp

    QUIET += ["--admin-group", grp.getgrgid(os.getegid()).gr_name]


class Daemon:
    """One pinbrokerd process and its socket; stop() kills it by pid and shows its log on failure."""

    def __init__(self, args: List[str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="pbpy.")
        os.chmod(self.dir, 0o755)  # other uids (the cross-uid tests) reach the socket
        self.socket = os.path.join(self.dir, "pb.sock")
        self.log_path = os.path.join(self.dir, "pinbrokerd.log")
        self.argv = [PINBROKERD, "--socket", self.socket, "--config", "/dev/null", "--budget", "256M",
                     "--prewarm", "16M", "--hugetlb", "no", "--lock-memory", "no", "--log-level", "debug"] + QUIET + args
        self.start()

    def start(self) -> None:
        """Start (or, after stop(), start again) on the same socket with the same arguments."""
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "JOURNAL_STREAM")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        # 30 s, or ITEST_START_TIMEOUT_S (as the C suites): a loaded machine can take seconds to start it.
        wait_s = int(os.environ.get("ITEST_START_TIMEOUT_S", "0") or 0) or 30
        deadline = time.monotonic() + wait_s
        while True:
            try:
                pinbroker.connect(self.socket).close()
                return
            except pinbroker.NotConnected:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"pinbrokerd exited ({self.proc.returncode}) during start-up:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pinbrokerd did not answer within {wait_s} s:\n{self.log()}")
            time.sleep(0.01)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def connect(self) -> "pinbroker.Client":
        return pinbroker.connect(self.socket)

    def status(self, leases: bool = True) -> Dict:
        with self.connect() as c:
            return c.status(leases=leases)

    def leased(self) -> int:
        return int(self.status(leases=False)["leased_bytes"])

    def wait_leased(self, want: int, timeout: float = 5.0) -> int:
        """Poll until leased_bytes == want (releases are asynchronous); return the last value seen."""
        deadline = time.monotonic() + timeout
        got = self.leased()
        while got != want and time.monotonic() < deadline:
            time.sleep(0.02)
            got = self.leased()
        return got

    def pinctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([PINCTL, "--socket", self.socket, *args], capture_output=True, text=True,
                              check=check, timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start_daemon() -> Iterator[Callable[..., Daemon]]:
    """start_daemon(*extra_args) -> Daemon; every daemon started is stopped at the end of the test."""
    started: List[Daemon] = []

    def start(*args: str) -> Daemon:
        d = Daemon(list(args))
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def daemon(start_daemon: Callable[..., Daemon]) -> Daemon:
    return start_daemon()


@pytest.fixture
def client(daemon: Daemon) -> Iterator["pinbroker.Client"]:
    c = daemon.connect()
    yield c
    c.close()


_stage_dir: Optional[str] = None


def _stage() -> str:
    """This checkout's package and the libpinbroker it loaded, copied into one temp folder any uid can read.

    Another uid cannot import from a checkout under a 0700 folder (a clone in /root): a process run as one imports
    the copy. Made once per session, removed at exit.
    """
    global _stage_dir
    if _stage_dir is None:
        # Where a library may be mapped executable: a hardened host mounts /tmp noexec.
        top = next((t for t in ("/tmp", "/var/tmp", "/dev/shm")
                    if os.path.isdir(t) and not os.statvfs(t).f_flag & os.ST_NOEXEC), "/tmp")
        d = tempfile.mkdtemp(prefix="pbpy-stage.", dir=top)
        atexit.register(shutil.rmtree, d, True)
        shutil.copytree(os.path.join(PYDIR, "pinbroker"), os.path.join(d, "pinbroker"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        pinbroker._lib.load()
        lib = pinbroker._lib.path()
        if lib and os.path.isabs(lib):
            shutil.copy(os.path.realpath(lib), os.path.join(d, os.path.basename(lib)))
        # Explicit modes: root's umask may be 077.
        for top, dirs, files in os.walk(d):
            os.chmod(top, 0o755)
            for f in files:
                os.chmod(os.path.join(top, f), 0o644)
        _stage_dir = d
    return _stage_dir


def env_for_uid(env: Dict[str, str], user: Optional[int]) -> Dict[str, str]:
    """env with PYTHONPATH (and $PINBROKER_LIBRARY) naming this checkout's package for a process run as user:
    the checkout itself for this uid, the staged copy (_stage) for another."""
    e = dict(env)
    # No empty entry: that would put the current folder on the path.
    rest = [e["PYTHONPATH"]] if e.get("PYTHONPATH") else []
    if user is None or user == os.geteuid():
        e["PYTHONPATH"] = os.pathsep.join([PYDIR, *rest])
        return e
    d = _stage()
    e["PYTHONPATH"] = os.pathsep.join([d, *rest])
    lib = pinbroker._lib.path()
    if lib and os.path.isabs(lib):
        e["PINBROKER_LIBRARY"] = os.path.join(d, os.path.basename(lib))
    return e


def run_python(code: str, env: Optional[Dict[str, str]] = None, user: Optional[int] = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter that imports this checkout's package (as uid ``user`` if given)."""
    e = env_for_uid(os.environ, user)
    if env:
        e.update(env)
    kw = {}
    if user is not None:
        kw = {"user": user, "group": user, "extra_groups": []}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=timeout,
                          **kw)


NOBODY = 65534


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (switches to uid 65534 to act as another user)")
