#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The docs_commands test (labels docs, install): the shell blocks of README.md and docs/*.md that a reader
pastes on the first day, run as written on this machine, as docs_links checks the links.

A fenced shell block is run when the line just above its fence is the marker

    <!-- doctest: run -->

and left alone when it is `<!-- doctest: skip: WHY -->` (the reason is for the reader of the source) or
has no marker. The marked blocks of one file run in order in one bash, as one reader pastes them into
one terminal (a variable set in one block is there in the next), each under `set -eo pipefail`: any
command that fails fails the test, naming the file, the block's line and the command's output. Every
file's blocks run in a fresh HOME (a temp folder: `~/opt/pinbroker` is private to the run) from a copy of
the source tree made of links, whose `build` is the build tree under test, and with PINBROKER_SOCKET naming
a socket nobody listens on (a block that wants a daemon starts its own). Whatever a block leaves running
(`pinbrokerd ... &`) is stopped at the end of its file.

usage: check-doc-commands.py SOURCE_DIR BUILD_DIR [--list] [FILE...]
       FILE: Markdown files relative to SOURCE_DIR (default README.md and docs/*.md)
       --list: only print each shell block with its marker, run nothing
Exits 0 when every marked block ran, 1 when one failed or a marker is misplaced, 77 (skip) where the
blocks cannot run here (not root: they start the daemon with its default pool locked; no cc or pkg-config;
a sanitizer build, PINBROKER_SANITIZED=1: its library needs programs linked with -fsanitize).
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MARKER = re.compile(r"^<!--\s*doctest:\s*(run|skip)\b:?\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```+\s*(\w*)")
SHELLS = {"sh", "bash", "shell", "console"}
FILE_TIMEOUT_S = 150


def blocks(path):
    """(line, marker, lang, text) of each fenced block, marker being 'run', 'skip' or None; and marker errors."""
    out, errors = [], []
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
            errors.append("%s:%d: a doctest marker must be the line just above a ``` fence" % (path, i + 1))
        f = FENCE.match(lines[i])
        if f:
            start = i
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            prev = MARKER.match(lines[start - 1]) if start > 0 else None
            out.append((start + 1, prev.group(1) if prev else None, f.group(2), "\n".join(lines[start + 1:j])))
            i = j + 1
            continue
        i += 1
    return out, errors


def tree_of_links(src, build, dest):
    """dest: every top-level entry of src as a link, `build` the build tree under test."""
    os.makedirs(dest)
    for name in os.listdir(src):
        if name in ("build", ".git"):
            continue
        os.symlink(os.path.join(src, name), os.path.join(dest, name))
    os.symlink(build, os.path.join(dest, "build"))


def run_file(src, build, rel, runnable, tmp):
    """Runs one file's marked blocks in one bash; returns (ok, seconds)."""
    home = os.path.join(tmp, "home-" + rel.replace("/", "-"))
    tree = os.path.join(tmp, "tree-" + rel.replace("/", "-"))
    os.makedirs(home)
    tree_of_links(src, build, tree)
    script = ["set -eo pipefail", "trap 'echo \"doctest: exit $? from: $BASH_COMMAND\" >&2' ERR"]
    for line, _, _, text in runnable:
        script.append("echo '### %s:%d' >&2" % (rel, line))
        script.append(text)
    # No daemon of this host's is reached by accident: a block that wants one starts its own (and sets
    # PINBROKER_SOCKET, as install.md's does); the others fall back, as documented.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINBROKER_")}
    env.update(HOME=home, PWD=tree, PINBROKER_SOCKET=os.path.join(home, "no-daemon", "pinbroker.sock"))
    t0 = time.monotonic()
    p = subprocess.Popen(["bash", "-c", "\n".join(script) + "\n"], cwd=tree, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=FILE_TIMEOUT_S)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = "timeout after %d s" % FILE_TIMEOUT_S
    dt = time.monotonic() - t0
    # What the blocks left running (a daemon started with &): SIGTERM, then SIGKILL.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    text = out.decode("utf-8", "replace")
    if rc != 0:
        print(text[-6000:])
        print("FAIL: %s: its doctest blocks (lines %s) failed (%s) in %.1f s; the output is above, the failing "
              "block's line after the last ###" % (rel, ", ".join(str(b[0]) for b in runnable), rc, dt))
        return False, dt
    print("\n".join(text.rstrip("\n").split("\n")[-25:]))
    print("ok: %s: %d block(s) ran as written in %.1f s (lines %s)" %
          (rel, len(runnable), dt, ", ".join(str(b[0]) for b in runnable)))
    return True, dt


def main(argv):
    args = [a for a in argv[1:] if a != "--list"]
    listing = "--list" in argv
    if len(args) < 2:
        print(__doc__)
        return 2
    src, build = os.path.abspath(args[0]), os.path.abspath(args[1])
    files = args[2:] or ["README.md"] + sorted(os.path.relpath(p, src) for p in glob.glob(src + "/docs/*.md"))
    plan, errors, unmarked = [], [], 0
    for rel in files:
        found, errs = blocks(os.path.join(src, rel))
        errors += errs
        for line, marker, lang, text in found:
            if marker and lang not in SHELLS:
                errors.append("%s:%d: a doctest marker on a ```%s block: only shell blocks run" % (rel, line, lang))
            if lang in SHELLS and marker is None:
                unmarked += 1
            if listing and lang in SHELLS:
                print("%s:%d: %s" % (rel, line, marker or "unmarked"))
        runnable = [b for b in found if b[1] == "run"]
        if runnable:
            plan.append((rel, runnable))
    for e in errors:
        print("FAIL: " + e)
    if listing or errors:
        return 1 if errors else 0
    if os.environ.get("PINBROKER_SANITIZED") == "1":
        print("SKIP: a sanitizer build: the documented commands link and run programs without -fsanitize, which "
              "its libpinbroker needs (the plain build's run checks them)")
        return 77
    if os.geteuid() != 0:
        print("SKIP: the marked blocks start pinbrokerd with its default pool (256 MiB locked): run as root")
        return 77
    for tool in ("cc", "pkg-config", "cmake"):
        if not shutil.which(tool):
            print("SKIP: %s not found (apt-get install gcc pkg-config cmake; scripts/deps.sh installs them)" % tool)
            return 77
    if not plan:
        print("FAIL: no block is marked <!-- doctest: run --> in %s" % " ".join(files))
        return 1
    ok = True
    total = 0.0
    with tempfile.TemporaryDirectory(prefix="pb-doctest.") as tmp:
        os.chmod(tmp, 0o755)
        for rel, runnable in plan:
            good, dt = run_file(src, build, rel, runnable, tmp)
            ok = ok and good
            total += dt
    print("%s: %d file(s), %d marked block(s) in %.1f s; %d other shell block(s) are not run (no marker)" %
          ("ok" if ok else "FAIL", len(plan), sum(len(r) for _, r in plan), total, unmarked))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
