# SPDX-License-Identifier: MIT
"""``python3 -m pinbroker``: the daemon's status, and checks of what this Python needs to use pinbroker.

    python3 -m pinbroker status [--json]     the daemon's status (--json: the document pinctl status --json prints)
    python3 -m pinbroker doctor [--json]     library, daemon, permission, CUDA driver, torch's host allocator
    python3 -m pinbroker version

Exit status as pinctl's: 0 ok (doctor: nothing to do), 1 an error (doctor: something to fix), 2 a usage error,
3 no daemon answers at the socket.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from . import _lib, _torch_ext
from ._client import connect, cuda_available, socket_path
from .errors import BrokerError, LibraryNotFound, NotConnected, PermissionDenied

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3

#: The schema of ``doctor --json``'s object.
DOCTOR_SCHEMA_VERSION = 1


def _size(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def _duration(ms: int) -> str:
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _no_daemon_advice(path: str) -> str:
    return (f"start it: systemctl start pinbrokerd.socket (or by hand: pinbrokerd --socket {path}); "
            "point elsewhere with --socket or $PINBROKER_SOCKET")


def _safe(text: Any) -> str:
    """Text from the daemon or its clients, made safe for a terminal (no control characters)."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in str(text))


# ---------------------------------------------------------------- status


def _print_status(st: Dict[str, Any]) -> None:
    print(f"pinbrokerd {_safe(st['version']) or '(unknown version)'}, up {_duration(st['uptime_ms'])}")
    print(f"state:        {_safe(st['pressure_state'])} (monitor: {_safe(st['monitor_mode'])})")
    print(f"budget:       {_size(st['budget_bytes'])} (uid quota {_size(st['uid_quota_bytes'])})")
    print(f"leased:       {_size(st['leased_bytes'])}, free {_size(st['free_bytes'])}, overdue "
          f"{_size(st['overdue_bytes'])}, cached idle {_size(st['cached_idle_bytes'])}")
    if st["orphaned_bytes"]:
        print(f"of leased:    {_size(st['orphaned_bytes'])} orphaned: lent before a restart, still mapped")
    print(f"unbrokered:   {_size(st['unbrokered_bytes'])} pinned outside the budget ({st['unbrokered_source']})")
    print(f"pool:         {_size(st['pool_bytes'])} resident, {_size(st['pool_idle_bytes'])} idle, on "
          f"{_safe(st['page_kind'])} pages")
    print(f"waiting:      {st['waiting_acquires']} acquire{'' if st['waiting_acquires'] == 1 else 's'}")
    me = os.getpid()
    rows = [c for c in st["clients"] if not (c["pid"] == me and c["leases"] == 0)]  # our own connection
    print()
    print(f"{'PID':<8} {'USER':<10} {'LEASES':>6} {'BYTES':>10}  {'NAME':<16} LABELS")
    for c in rows:
        print(f"{c['pid']:<8} {_safe(c['user']):<10} {c['leases']:>6} {_size(c['bytes']):>10}  "
              f"{_safe(c['name']):<16} {_safe(','.join(c['labels']))}")
    if st["jobs"]:
        print()
        print(f"{'JOB':<48} {'LEASED':>10} {'QUOTA':>10}")
        for j in st["jobs"]:
            print(f"{_safe(j['job']):<48} {_size(j['bytes']):>10} {_size(j['quota_bytes']):>10}")


def cmd_status(args: argparse.Namespace) -> int:
    path = socket_path(args.socket)
    try:
        with connect(path) as c:
            st = c.status(leases=args.json)
    except LibraryNotFound as e:
        print(f"pinbroker: {e.strerror}", file=sys.stderr)
        return EXIT_ERROR
    except PermissionDenied as e:
        print(f"pinbroker: {e.strerror}", file=sys.stderr)
        return EXIT_ERROR
    except NotConnected as e:
        print(f"pinbroker: no daemon answers at {path}: {os.strerror(e.errno or 0)}\n{_no_daemon_advice(path)}",
              file=sys.stderr)
        return EXIT_NO_DAEMON
    except BrokerError as e:
        print(f"pinbroker: status: {e.strerror}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        json.dump(st, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        _print_status(st)
    return EXIT_OK


# ---------------------------------------------------------------- doctor


class _Doctor:
    """The findings, in order: each a check's name, ok/warn/fail/skip, what was found and the fix."""

    def __init__(self) -> None:
        self.findings: List[Dict[str, str]] = []
        self.no_daemon = False

    def add(self, check: str, status: str, message: str, fix: str = "") -> None:
        self.findings.append({"check": check, "status": status, "message": message, "fix": fix})

    def count(self, status: str) -> int:
        return sum(f["status"] == status for f in self.findings)


def _mapped_library() -> str:
    """The file the dynamic linker mapped for libpinbroker (the loaded name may be a bare soname)."""
    name = _lib.path() or ""
    if os.sep in name:
        return os.path.realpath(name)
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libpinbroker.so"):
                    return parts[5].strip()
    except OSError:
        pass
    return name


def _check_library(d: _Doctor) -> bool:
    try:
        _lib.load()
    except LibraryNotFound as e:
        d.add("library", "fail", e.strerror,
              f"apt install {_lib.DEBIAN_PACKAGE}, or set {_lib.LIBRARY_ENV}=/path/to/{_lib.SONAME}")
        return False
    version = _lib.version()
    d.add("library", "ok", f"libpinbroker {version or '(no pb_version: an old one)'} at {_mapped_library()}")
    return True


def _check_daemon(d: _Doctor, path: str) -> None:
    try:
        with connect(path) as c:
            st = c.status()
    except PermissionDenied as e:
        d.add("daemon", "skip", f"a socket is at {path}, but this user may not connect to ask it (see permission)")
        d.add("permission", "fail", e.strerror,
              "add the user to the daemon's socket-group (pinbroker): usermod -a -G pinbroker USER, then log in again")
        return
    except NotConnected as e:
        d.no_daemon = True
        d.add("daemon", "fail", f"no daemon answers at {path}: {os.strerror(e.errno or 0)}", _no_daemon_advice(path))
        d.add("permission", "skip", "no daemon to connect to")
        return
    except BrokerError as e:
        d.add("daemon", "fail", f"{path}: {e.strerror}", "use a libpinbroker of the daemon's version")
        d.add("permission", "skip", "the daemon could not be asked")
        return
    d.add("daemon", "ok", f"pinbrokerd {_safe(st['version'])} answers at {path} (up {_duration(st['uptime_ms'])}, "
          f"budget {_size(st['budget_bytes'])}, {st['pressure_state']})")
    d.add("permission", "ok", f"uid {os.geteuid()} may use {path}")


def _gpu_present() -> bool:
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidia0")


def _check_cuda(d: _Doctor) -> None:
    ok, reason = cuda_available()
    if ok:
        d.add("cuda", "ok", "the CUDA driver loads: leases are registered with CUDA (pinned)")
    elif _gpu_present():
        d.add("cuda", "warn", f"an NVIDIA GPU is here, but the CUDA driver does not load: {reason}",
              "install the NVIDIA driver's libcuda.so.1 for this system; until then leases are locked, not pinned")
    else:
        d.add("cuda", "skip", f"no NVIDIA GPU here ({reason}): leases are locked memory, not CUDA-registered")


def _check_torch(d: _Doctor) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        d.add("torch-allocator", "skip", "torch is not installed for this Python")
        return
    from . import torch_alloc

    try:
        import torch
    except Exception as e:  # a broken torch install: say so, not crash
        d.add("torch-allocator", "warn", f"import torch failed: {e}", "repair this Python's torch")
        return
    ver = str(getattr(torch, "__version__", "?"))
    if _torch_ext.version_tuple(ver) < torch_alloc.MIN_TORCH:
        d.add("torch-allocator", "skip", f"torch {ver} predates at::setHostAllocator (torch >= "
              f"{torch_alloc.MIN_TORCH[0]}.{torch_alloc.MIN_TORCH[1]}): pinbroker.torch.install() is not available")
        return
    cuda = getattr(torch.version, "cuda", None)
    if cuda is None:
        d.add("torch-allocator", "skip", f"torch {ver} is built without CUDA: no host allocator to install")
        return
    want = _torch_ext.want(ver, cuda, _torch_ext.sha256_file(torch_alloc._SOURCE))
    jit_dir = os.path.join(_torch_ext.jit_root(cuda), want["module"])
    folders = _torch_ext.search_folders(_lib.path(), os.path.dirname(os.path.abspath(__file__)), jit_dir)
    found, rejected = _torch_ext.find(folders, want)
    if found is not None:
        so, origin, meta = found
        d.add("torch-allocator", "ok", f"a prebuilt host allocator for torch {ver} (CUDA {cuda}): {so} ({origin}"
              f"{', built by the JIT' if meta.get('built_by') == 'jit' else ''})")
        return
    d.add("torch-allocator", "warn",
          f"no prebuilt host allocator for torch {ver}, CUDA {cuda}, {_torch_ext.python_abi()}: "
          "pinbroker.torch.install() would compile one at first use"
          + (f" (passed over: {'; '.join(rejected[:3])})" if rejected else ""),
          torch_alloc._how_to_prebuild())


def cmd_doctor(args: argparse.Namespace) -> int:
    path = socket_path(args.socket)
    d = _Doctor()
    if _check_library(d):
        _check_daemon(d, path)
        _check_cuda(d)
    else:
        for name in ("daemon", "permission", "cuda"):
            d.add(name, "skip", "libpinbroker is not loaded")
    _check_torch(d)
    warns, fails = d.count("warn"), d.count("fail")
    if args.json:
        json.dump({"schema_version": DOCTOR_SCHEMA_VERSION, "socket": path, "library": _lib.path(),
                   "library_version": _lib.version() if _lib.path() else None, "warnings": warns,
                   "failures": fails, "checks": d.findings}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for f in d.findings:
            print(f"{f['status']:<5} {f['check']:<15} {f['message']}")
            if f["fix"]:
                print(f"{'':<5} {'':<15} fix: {f['fix']}")
        print(f"\n{warns} warning{'' if warns == 1 else 's'}, {fails} failure{'' if fails == 1 else 's'}")
    if d.no_daemon:
        return EXIT_NO_DAEMON
    return EXIT_ERROR if warns or fails else EXIT_OK


def cmd_version(args: argparse.Namespace) -> int:
    from . import __version__

    try:
        _lib.load()
        lib = f"libpinbroker {_lib.version() or '?'} ({_mapped_library()})"
    except LibraryNotFound:
        lib = "libpinbroker not found"
    print(f"pinbroker {__version__} (Python package); {lib}")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on exit status 2 (as pinctl's) and a pointer to the help."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python3 -m pinbroker", description="pinbroker from Python: the daemon's status and checks.",
                epilog="Exit status: 0 ok, 1 error (doctor: something to fix), 2 usage, 3 no daemon answers.")
    p.add_argument("--socket", metavar="PATH",
                   help="the daemon's socket (default: $PINBROKER_SOCKET, else /run/pinbroker/pinbroker.sock)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    s = sub.add_parser("status", help="the daemon's status (--json: as pinctl status --json)")
    s.add_argument("--json", action="store_true", help="the JSON document of pinctl status --json")
    s.set_defaults(func=cmd_status)
    s = sub.add_parser("doctor", help="check the library, the daemon, permission, CUDA and torch's allocator")
    s.add_argument("--json", action="store_true", help="{schema_version, checks: [{check, status, message, fix}]}")
    s.set_defaults(func=cmd_doctor)
    s = sub.add_parser("version", help="the package's and the library's versions")
    s.set_defaults(func=cmd_version)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.error("give a COMMAND: status, doctor or version")
    try:
        rc = int(args.func(args))
        sys.stdout.flush()
        return rc
    except BrokenPipeError:  # the reader went away (| head): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
