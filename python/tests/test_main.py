# SPDX-License-Identifier: MIT
"""``python3 -m pinbroker`` (status, doctor, exit codes), Client.status() against ``pinctl status --json``, and the
messages of a refused socket and a missing library."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Set, Tuple

import pytest

import pinbroker
from pinbroker import _lib
from conftest import env_for_uid, need_root, run_python

MiB = 1 << 20
#: A uid of no user (tests/security and the C suites use the same ones).
OTHER_UID = 61001


def run_main(*args: str, env: Any = None, user: Any = None) -> subprocess.CompletedProcess:
    """python3 -m pinbroker ARGS in a fresh interpreter with this checkout's package (as uid ``user`` if given)."""
    code = "import sys, runpy; sys.argv = ['pinbroker'] + sys.argv[1:]; runpy.run_module('pinbroker', run_name='__main__')"
    e = env_for_uid(os.environ, user)
    if env:
        e.update(env)
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=e, timeout=120,
                          **kw)


def shape(doc: Any, path: str = "") -> Set[Tuple[str, bool]]:
    """Every key path of a JSON document with whether its value is null; list items share one path ("[]")."""
    out: Set[Tuple[str, bool]] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add((f"{path}.{k}", v is None))
            out |= shape(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for v in doc:
            out |= shape(v, path + "[]")
    return out


def types(doc: Any, path: str = "") -> Set[Tuple[str, str]]:
    """Every key path with the JSON type of its value (ints and floats are both numbers)."""
    def kind(v: Any) -> str:
        if isinstance(v, bool):
            return "bool"
        if isinstance(v, (int, float)):
            return "number"
        return type(v).__name__

    out: Set[Tuple[str, str]] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            if v is not None:
                out.add((f"{path}.{k}", kind(v)))
            out |= types(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for v in doc:
            out |= types(v, path + "[]")
    return out


def test_status_has_pinctls_keys_and_nulls(daemon):
    """Client.status(leases=True), `python3 -m pinbroker status --json` and `pinctl status --json`, against one
    daemon holding a lease, a shared lease and an unbrokered report: the same key paths, the same nulls, the same
    types (the values may change between the calls)."""
    with daemon.connect() as c:
        held = c.acquire(4 * MiB, label="img-ring")
        shared = c.acquire(2 * MiB, label="kv")
        shared.share()
        c.report_unbrokered(3 * MiB)
        mine = c.status(leases=True)
        ours = json.loads(run_main("--socket", daemon.socket, "status", "--json").stdout)
        theirs = json.loads(daemon.pinctl("status", "--json").stdout)
        held.release()
        shared.release()
    for doc in (mine, ours, theirs):
        # What the comparison must cover: rows in every list that has any.
        assert doc["clients"] and doc["leases"] and doc["unbrokered_uids"] and doc["signals"] and doc["nodes"]
    assert set(mine) == set(theirs), (set(mine) ^ set(theirs))
    assert shape(mine) == shape(theirs), sorted(shape(mine) ^ shape(theirs))
    assert types(mine) == types(theirs), sorted(types(mine) ^ types(theirs))
    assert shape(ours) == shape(theirs), sorted(shape(ours) ^ shape(theirs))
    # The issue-22 figures are there, with values.
    assert mine["unbrokered_bytes"] == 3 * MiB and mine["unbrokered_reported_bytes"] == 3 * MiB
    assert mine["unbrokered_cap_bytes"] > 0 and mine["orphaned_bytes"] == 0
    assert mine["unbrokered_uids"][0]["reported_bytes"] == 3 * MiB
    assert mine["schema_version"] == theirs["schema_version"] and mine["version"] == theirs["version"]
    assert mine["budget_bytes"] == theirs["budget_bytes"] and mine["free_bytes"] == mine["budget_bytes"] - mine["leased_bytes"]
    row = [r for r in mine["clients"] if r["pid"] == os.getpid() and r["leases"]][0]
    assert "img-ring" in row["labels"] and "kv" in row["labels"]
    # Without leases=True, the same less "leases".
    with daemon.connect() as c:
        assert set(c.status()) == set(theirs) - {"leases"}


def test_status_jobs_rows_as_pinctl_writes_them():
    """A job row has rule and source only with a quota, quota_bytes null without: built from C rows directly,
    since a job row needs the daemon to see a cgroup (check_itest_quota covers that)."""
    if not _lib.has_status_jobs():
        pytest.skip("this libpinbroker has no per-job quotas")
    from pinbroker import _status

    s = _lib.StatusUnbrokered()
    jobs = (_lib.Job * 2)()
    jobs[0].job, jobs[0].bytes, jobs[0].has_quota, jobs[0].quota_bytes = b"/a", 5, 1, 10
    jobs[0].rule, jobs[0].source = b"/a", b"set"
    jobs[1].job, jobs[1].bytes = b"/b", 7
    s.n_jobs, s.jobs = 2, jobs
    s.server_version, s.pressure_state, s.monitor_mode, s.page_kind = b"x", b"normal", b"poll", b"4k"
    d = _status._status_dict(ctypes_status(s), False)
    assert d["jobs"] == [{"job": "/a", "bytes": 5, "leases": 0, "quota_bytes": 10, "rule": "/a", "source": "set"},
                         {"job": "/b", "bytes": 7, "leases": 0, "quota_bytes": None}]


def ctypes_status(ext: Any) -> Any:
    import ctypes

    return ctypes.cast(ctypes.pointer(ext), ctypes.POINTER(_lib.Status)).contents


def test_main_status_table(daemon):
    with daemon.connect() as c, c.acquire(MiB, label="tbl"):
        r = run_main("--socket", daemon.socket, "status")
    assert r.returncode == 0, r.stderr
    assert "budget:" in r.stdout and "256 MiB" in r.stdout and "tbl" in r.stdout, r.stdout


def test_main_exit_codes(tmp_path, daemon):
    none = str(tmp_path / "none.sock")
    r = run_main("--socket", none, "status")
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert f"no daemon answers at {none}" in r.stderr and "systemctl start pinbrokerd.socket" in r.stderr
    assert f"pinbrokerd --socket {none}" in r.stderr
    r = run_main("--socket", none, "doctor", "--json")
    assert r.returncode == 3, (r.returncode, r.stderr)
    checks = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["daemon"]["status"] == "fail" and "systemctl start" in checks["daemon"]["fix"]
    for args in ([], ["bogus"], ["status", "--bogus"], ["--socket"]):
        r = run_main(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "--help" in r.stderr or "usage" in r.stderr, r.stderr
    r = run_main("--socket", daemon.socket, "version")
    assert r.returncode == 0 and pinbroker.__version__ in r.stdout, r.stdout


def test_main_doctor(daemon):
    r = run_main("--socket", daemon.socket, "doctor", "--json")
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["socket"] == daemon.socket
    checks = {c["check"]: c for c in doc["checks"]}
    assert list(checks) == ["library", "daemon", "permission", "cuda", "torch-allocator"], list(checks)
    assert checks["library"]["status"] == "ok"
    lib = os.path.realpath(pinbroker.library_path())
    assert lib in checks["library"]["message"] and doc["library_version"] in checks["library"]["message"]
    assert checks["daemon"]["status"] == "ok" and daemon.socket in checks["daemon"]["message"]
    assert checks["permission"]["status"] == "ok"
    ok, reason = pinbroker.cuda_available()
    assert (checks["cuda"]["status"] == "ok") == ok
    if not ok:
        assert reason in checks["cuda"]["message"]
    assert checks["torch-allocator"]["status"] in ("ok", "warn", "skip")
    # 0 exactly when its advice is nothing to do.
    advice = [c for c in doc["checks"] if c["status"] in ("warn", "fail")]
    assert r.returncode == (1 if advice else 0), (r.returncode, advice)
    assert doc["warnings"] + doc["failures"] == len(advice)
    human = run_main("--socket", daemon.socket, "doctor")
    assert human.returncode == r.returncode and "ok    daemon" in human.stdout, human.stdout


def test_permission_denied_says_permission(daemon):
    """EACCES on connect (a socket this uid may not write) is PermissionDenied naming the socket and the group,
    never 'no broker'; `python3 -m pinbroker` exits 1 with it, and doctor fails the permission check."""
    need_root()
    os.chown(daemon.socket, 0, 0)
    os.chmod(daemon.socket, 0o660)  # owner root, group root: uid 61001 is neither
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        try:
            pinbroker.connect({daemon.socket!r})
        except pinbroker.PermissionDenied as e:
            print("ERR", e.errno, e.strerror)
    """), user=OTHER_UID)
    assert r.returncode == 0, r.stderr
    assert f"ERR {errno.EACCES} permission denied on {daemon.socket}: add your user to the pinbroker group " \
           "(or the daemon's socket-group)" in r.stdout, r.stdout
    assert "no broker" not in r.stdout and "mode 0660, group root" in r.stdout, r.stdout
    r = run_main("--socket", daemon.socket, "status", user=OTHER_UID)
    assert r.returncode == 1 and "permission denied on" in r.stderr and "no broker" not in r.stderr, r.stderr
    r = run_main("--socket", daemon.socket, "doctor", "--json", user=OTHER_UID)
    checks = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert r.returncode == 1 and checks["permission"]["status"] == "fail", r.stdout
    assert "permission denied on" in checks["permission"]["message"]


def test_permission_denied_names_the_folder(daemon):
    need_root()
    os.chmod(daemon.dir, 0o700)
    try:
        r = run_python(textwrap.dedent(f"""
            import pinbroker
            try:
                pinbroker.connect({daemon.socket!r})
            except pinbroker.PermissionDenied as e:
                print("ERR", e.errno, e.strerror)
        """), user=OTHER_UID)
    finally:
        os.chmod(daemon.dir, 0o755)
    assert f"ERR {errno.EACCES} permission denied on {daemon.socket}" in r.stdout, (r.stdout, r.stderr)
    assert f"the folder {daemon.dir} (mode 0700" in r.stdout, r.stdout


def test_library_not_found_names_the_package(tmp_path):
    missing = str(tmp_path / "libpinbroker.so.1")
    r = run_python(textwrap.dedent("""
        import pinbroker
        try:
            pinbroker.connect()
        except pinbroker.LibraryNotFound as e:
            print("ERR", e.errno, e.strerror)
    """), env={"PINBROKER_LIBRARY": missing})
    pkg = _lib.DEBIAN_PACKAGE
    assert f"install {pkg} (Debian/Ubuntu: apt install {pkg})" in r.stdout, r.stdout
    assert "PINBROKER_LIBRARY" in r.stdout and missing in r.stdout, r.stdout
    r = run_main("status", env={"PINBROKER_LIBRARY": missing})
    assert r.returncode == 1 and f"apt install {pkg}" in r.stderr, r.stderr
    r = run_main("doctor", "--json", env={"PINBROKER_LIBRARY": missing})
    checks = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert r.returncode == 1 and checks["library"]["status"] == "fail" and pkg in checks["library"]["fix"]
    assert [checks[n]["status"] for n in ("daemon", "permission", "cuda")] == ["skip"] * 3
