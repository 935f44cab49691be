#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The house's shape, checked from the built objects (issue 24).

Reads BUILD/compile_commands.json for the objects compiled from the given source folders, asks nm
which global symbols each object defines and which it needs, and draws an edge A -> B when A needs
a symbol B defines. It then fails on:
  - an import loop: a cycle of such edges among the files of one folder tree (daemon/, client/,
    common/), found as a strongly connected component of more than one file;
  - a source file (.c or .h) over --max-lines lines under those folders;
  - a file of the daemon's core (daemon/core/) that includes a header of the daemon's shell (the rest of
    daemon/): the core decides and the shell acts, so the includes run one way only.

The fuzz harness's libc stand-ins live in fuzz/, outside these folders, so they draw no edges; and a
name the C library exports (dlopen, dlsym: the interposer defines its own) is the C library's, not a
sibling's, so it draws none either.
Exit status: 0 clean, 1 a finding, 2 bad usage or nothing built to read.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

FOLDERS = ("daemon", "client", "common")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   help="the source tree (default: this script's tree)")
    p.add_argument("--build", required=True, help="a configured and built CMake build folder")
    p.add_argument("--max-lines", type=int, default=1000, help="longest source file allowed (default 1000)")
    p.add_argument("--graph", action="store_true", help="also print every file's edges")
    return p.parse_args()


def nm_symbols(obj):
    """(defined, needed): the object's global symbols it defines and the ones it leaves undefined."""
    out = subprocess.run(["nm", "-P", "-g", obj], check=True, capture_output=True, text=True).stdout
    defined, needed = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        (needed if kind in ("U", "w", "v") else defined).add(name)
    return defined, needed


def libc_names():
    """The names the C library and its loader export: needing one is a libc call, not an import."""
    names = set()
    out = subprocess.run(["ldd", sys.executable], capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split()
        lib = fields[2] if len(fields) > 2 and fields[1] == "=>" else (fields[0] if fields else "")
        if os.path.basename(lib).startswith(("libc.so", "libdl.so", "ld-linux", "libpthread.so", "libm.so")):
            dyn = subprocess.run(["nm", "-D", "-P", "--defined-only", lib], capture_output=True, text=True).stdout
            names.update(line.split()[0].split("@")[0] for line in dyn.splitlines() if line.strip())
    return names


def objects_by_source(root, build):
    """{source path relative to root: one object compiled from it} for sources under FOLDERS."""
    db = os.path.join(build, "compile_commands.json")
    if not os.path.exists(db):
        print(f"structure: {db} is missing: configure with CMake (the project's CMakeLists sets "
              "CMAKE_EXPORT_COMPILE_COMMANDS; an older tree needs -DCMAKE_EXPORT_COMPILE_COMMANDS=ON) "
              "and build first", file=sys.stderr)
        sys.exit(2)
    found = {}
    with open(db) as f:
        for entry in json.load(f):
            src = os.path.relpath(os.path.realpath(entry["file"]), os.path.realpath(root))
            if src.split(os.sep)[0] not in FOLDERS:
                continue
            out = entry.get("output")
            if out is None:  # CMake before 3.20 writes no "output": take the command's -o
                words = shlex.split(entry.get("command", ""))
                out = words[words.index("-o") + 1] if "-o" in words[:-1] else None
            if out is None:
                continue
            obj = out if os.path.isabs(out) else os.path.join(entry["directory"], out)
            if os.path.exists(obj):
                found.setdefault(src, obj)
    return found


def strongly_connected(graph):
    """Tarjan's algorithm, iteratively: the components of more than one node, sorted."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return sorted(comps)


def long_files(root, limit):
    found = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if not name.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, errors="replace") as f:
                    n = sum(1 for _ in f)
                if n > limit:
                    found.append((os.path.relpath(path, root), n))
    return sorted(found)


def core_includes_shell(root):
    """(core file, header) for each #include "header" in daemon/core/ that names a shell header of daemon/."""
    core = os.path.join(root, "daemon", "core")
    shell = set()
    for dirpath, _, files in os.walk(os.path.join(root, "daemon")):
        if os.path.realpath(dirpath).startswith(os.path.realpath(core)):
            continue
        shell.update(name for name in files if name.endswith(".h"))
    found = []
    for name in sorted(os.listdir(core)):
        if not name.endswith((".c", ".h")):
            continue
        with open(os.path.join(core, name), errors="replace") as f:
            for line in f:
                words = line.split('"')
                if line.lstrip().startswith("#include") and len(words) > 2:
                    header = os.path.basename(words[1])
                    if header in shell and not os.path.exists(os.path.join(core, header)):
                        found.append((f"daemon/core/{name}", words[1]))
    return found


def main():
    args = parse_args()
    objs = objects_by_source(args.root, args.build)
    if not objs:
        print(f"structure: no built objects of {', '.join(FOLDERS)} under {args.build}: build first",
              file=sys.stderr)
        return 2
    defs, needs = {}, {}
    for src, obj in objs.items():
        defs[src], needs[src] = nm_symbols(obj)
    owners, libc = {}, libc_names()
    for src, syms in defs.items():
        for s in syms - libc:
            owners.setdefault(s, set()).add(src)
    graph = {src: set() for src in objs}
    why = {}
    for src, syms in needs.items():
        tree = src.split(os.sep)[0]
        for s in sorted(syms):
            for owner in owners.get(s, ()):
                if owner != src and owner.split(os.sep)[0] == tree:
                    graph[src].add(owner)
                    why.setdefault((src, owner), s)
    if args.graph:
        for src in sorted(graph):
            for dst in sorted(graph[src]):
                print(f"{src} -> {dst} ({why[(src, dst)]})")
    bad = 0
    for comp in strongly_connected(graph):
        bad += 1
        members = set(comp)
        edges = [f"{a} -> {b} ({why[(a, b)]})" for a in comp for b in sorted(graph[a]) if b in members]
        print(f"structure: import loop among {', '.join(comp)}:\n  " + "\n  ".join(edges))
    for path, header in core_includes_shell(args.root):
        bad += 1
        print(f"structure: {path} includes the shell's {header}: the core takes plain values (a view, settings) "
              "and returns a plan or a verdict; move what it needs into daemon/core/")
    for path, n in long_files(args.root, args.max_lines):
        bad += 1
        print(f"structure: {path} has {n} lines, over {args.max_lines}: split it by concern")
    print(f"structure: {len(objs)} files read, {sum(len(v) for v in graph.values())} edges, "
          f"{bad} finding(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
