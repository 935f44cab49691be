#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every pinctl command alike, driven by pinctl's own command table (`pinctl help --commands`), so a new command
is checked without a new test.

usage: run-pinctl-commands.py PINCTL PINBROKERD      exit 0 pass, 1 fail

For each command (against a real daemon holding a lease under a quota rule, and against a socket nobody serves):
  every one       --help exits 0 and says its usage; `pinctl --help` lists it (watch being top's other name).
  json            --json answers one JSON object (schema_version 1); with no daemon, one object on stdout whose
                  error (or, for a command whose exit status is a finding, whose exit_status) says exit 3, the
                  exit status 3; a usage error with --json, and with --format json, is {"error": {"code":
                  "usage", "message", "exit_status": 2}} on stdout, exit 2, the words on stderr too.
  not json        --json is an unknown option: exit 2, nothing on stdout.
  table           its fields are those its usage error for an unknown one lists; -o FIRST,LAST --format csv
                  prints a header of those names and rows of two cells; --no-headers the same rows without
                  it; -o FIRST --no-headers one value a row; --no-headers alone prints rows; -o with --json is
                  a usage error (JSON too). Each exits as --json does (0, or doctor's finding).
"""
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PINCTL, PINBROKERD = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, file=sys.stdout if cond else sys.stderr)
    if not cond:
        failures.append(what)
    return cond


def run(*args, sock):
    r = subprocess.run([PINCTL, "--socket", sock, *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def one_json(text):
    """stdout as exactly one JSON object, or None."""
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


# Reserve 2 shares of 1M under the name "cmds" and hold them until killed: argv[1] the library, argv[2] the socket.
RESERVER = r'''
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
c = ctypes.c_void_p()
rid = ctypes.c_uint64()
lib.pb_reserve.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                           ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64)]
if lib.pb_connect(sys.argv[2].encode(), ctypes.byref(c)) < 0 or lib.pb_reserve(c, b"cmds", 2, 1 << 20, 0, 0,
                                                                              ctypes.byref(rid)) < 0:
    sys.exit(1)
print("reservation", rid.value, flush=True)
time.sleep(600)
'''


def preload_env(lib):
    """The environment a Python loading lib needs: libasan preloaded, leak checks off, when lib is a sanitizer
    build's (an uninstrumented interpreter cannot load it otherwise)."""
    env = dict(os.environ)
    ldd = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    asan = [ln.split("=>")[1].split()[0] for ln in ldd.splitlines() if "libasan" in ln and "=>" in ln]
    if asan:
        env["LD_PRELOAD"] = asan[0]
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    return env


def commands():
    r = subprocess.run([PINCTL, "help", "--commands"], capture_output=True, text=True)
    check(r.returncode == 0, f"pinctl help --commands exits 0 ({r.returncode}: {r.stderr.strip()})")
    out = []
    for line in r.stdout.splitlines():
        name, takes, args = (line.split("\t") + ["", ""])[:3]
        takes = set() if takes == "-" else set(takes.split(","))
        args = ["budget" if a == "KEY" else a for a in args.split()]
        out.append((name, takes, args))
    return out


def check_listed(cmds):
    usage = subprocess.run([PINCTL, "--help"], capture_output=True, text=True).stdout
    listed, on = set(), False
    for line in usage.splitlines():
        if line.startswith("Commands:"):
            on = True
        elif on and line and not line.startswith(" "):
            break
        elif on and line.startswith("  ") and line[2:3].isalpha():
            listed.add(line.split()[0])
    names = {n for n, _, _ in cmds}
    check(len(names) >= 10 and listed <= names, f"pinctl help --commands has every command of pinctl --help "
          f"({sorted(listed - names)} missing)")
    check(names - listed <= {"watch"}, f"pinctl --help lists every command ({sorted(names - listed)} missing)")


def check_command(name, takes, args, sock, nosock):
    rc, out, err = run(name, "--help", sock=sock)
    check(rc == 0 and out.startswith("Usage: pinctl"), f"{name} --help: exit 0 and its usage ({rc})")
    if "json" not in takes:
        rc, out, err = run(name, *args, "--json", sock=sock)
        check(rc == 2 and out == "" and "--json" in err,
              f"{name} takes no --json: exit 2, nothing on stdout ({rc}, {out[:80]!r}, {err.strip()[:80]!r})")
        return
    rc_ok, out, err = run(name, *args, "--json", sock=sock)
    doc = one_json(out)
    check(doc is not None and doc.get("schema_version") == 1 and rc_ok != 2,
          f"{name} --json: one JSON object with schema_version 1 (exit {rc_ok}; {out[:80]!r} {err.strip()[:120]!r})")
    if doc is not None and rc_ok != 0:
        # A command whose exit status is a finding says so in its object.
        check(doc.get("exit_status") == rc_ok, f"{name} --json: exit {rc_ok} is its object's exit_status")

    rc, out, err = run(name, *args, "--json", sock=nosock)
    doc = one_json(out)
    e = (doc or {}).get("error") or {}
    check(rc == 3 and doc is not None and (
        (e.get("code") == "no_daemon" and e.get("exit_status") == 3 and nosock in e.get("message", ""))
        or (not e and doc.get("exit_status") == 3)),
        f"{name} --json without a daemon: exit 3 and one JSON object saying so ({rc}, {out[:160]!r})")
    for form in (["--json"], ["--format", "json"], ["--format=json"]):
        rc, out, err = run(name, *args, *form, "--no-such-option", sock=sock)
        e = ((one_json(out) or {}).get("error")) or {}
        check(rc == 2 and e.get("code") == "usage" and e.get("exit_status") == 2 and "--no-such-option" in
              e.get("message", "") and "--no-such-option" in err,
              f"{name} {' '.join(form)} with a bad option: exit 2, a JSON usage error on stdout, the words on "
              f"stderr ({rc}, {out[:120]!r})")
    if "table" in takes:
        check_table(name, args, sock, rc_ok)


def check_table(name, args, sock, rc_ok):
    rc, out, err = run(name, *args, "-o", "no_such_field", sock=sock)
    fields = err.split("the fields: ")[1].split(";")[0].split(",") if "the fields: " in err else []
    if not check(rc == 2 and len(fields) >= 2, f"{name} -o no_such_field: exit 2, naming the fields ({rc}, "
                 f"{err.strip()[:160]!r})"):
        return
    two = f"{fields[0]},{fields[-1]}"
    rc, out, err = run(name, *args, "-o", two, "--format", "csv", sock=sock)
    rows = list(csv.reader(io.StringIO(out)))
    check(rc == rc_ok and rows and rows[0] == [fields[0], fields[-1]] and len(rows) >= 2 and
          all(len(r) == 2 for r in rows), f"{name} -o {two} --format csv: a header and rows of two cells "
          f"(exit {rc}; {out[:160]!r} {err.strip()[:120]!r})")
    rc, out2, err = run(name, *args, "-o", two, "--format", "csv", "--no-headers", sock=sock)
    # The first field names the row (id, key, name, check...); the others may move between two calls (metrics).
    check(rc == rc_ok and [r[0] for r in csv.reader(io.StringIO(out2))] == [r[0] for r in rows[1:]],
          f"{name} -o {two} --format csv --no-headers: the same rows without the header ({out2[:120]!r})")
    rc, out3, err = run(name, *args, "-o", fields[0], "--no-headers", sock=sock)
    lines = out3.splitlines()
    check(rc == rc_ok and len(lines) == len(rows) - 1 and all(ln.strip() and " " not in ln.strip() or
                                                              fields[0] in ("message", "fix", "value", "labels")
                                                              for ln in lines),
          f"{name} -o {fields[0]} --no-headers: one value a row, {len(rows) - 1} rows ({out3[:120]!r})")
    rc, out4, err = run(name, *args, "--no-headers", sock=sock)
    check(rc == rc_ok and out4.strip() != "", f"{name} --no-headers: exit {rc_ok} with rows ({rc}, {err.strip()[:120]!r})")
    rc, out5, err = run(name, *args, "--json", "-o", fields[0], sock=sock)
    e = ((one_json(out5) or {}).get("error")) or {}
    check(rc == 2 and e.get("code") == "usage", f"{name} --json -o: a usage error, as JSON ({rc}, {out5[:100]!r})")


def main():
    for f in (PINCTL, PINBROKERD):
        if not os.access(f, os.X_OK):
            print(f"FAIL: no {f}: build first", file=sys.stderr)
            return 1
    cmds = commands()
    check_listed(cmds)
    tmp = tempfile.mkdtemp(prefix="pinctl-commands.")
    sock, nosock = os.path.join(tmp, "pb.sock"), os.path.join(tmp, "nobody-serves.sock")
    log = open(os.path.join(tmp, "daemon.log"), "w")
    d = subprocess.Popen([PINBROKERD, "--socket", sock, "--budget", "64M", "--prewarm", "4M", "--lock-memory", "no",
                          "--job-quota", "/:32M"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    holder = reserver = None
    try:
        for _ in range(150):
            if run("status", sock=sock)[0] == 0:
                break
            time.sleep(0.1)
        holder = subprocess.Popen([PINCTL, "--socket", sock, "acquire", "4M", "--hold", "600", "--label", "cmds"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = holder.stdout.readline()
        check(line.startswith("lease "), f"a lease is held for the tables' rows ({line.strip()!r})")
        # A reservation held for pinctl reservations' rows: libpinbroker beside pinctl, through ctypes.
        lib = os.path.join(os.path.dirname(os.path.abspath(PINCTL)), "libpinbroker.so.1")
        reserver = subprocess.Popen([sys.executable, "-c", RESERVER, lib, sock], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, env=preload_env(lib))
        line = reserver.stdout.readline()
        check(line.startswith("reservation "), f"a reservation is held for its table's rows ({line.strip()!r})")
        for name, takes, args in cmds:
            check_command(name, takes, args, sock, nosock)
    finally:
        if reserver:
            reserver.terminate()
            reserver.wait()
        if holder:
            holder.terminate()
            holder.wait()
        d.terminate()
        d.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(cmds)} commands checked: " + " ".join(f"{n}({','.join(sorted(t)) or '-'})" for n, t, _ in cmds))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
