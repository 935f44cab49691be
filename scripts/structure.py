#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The house's shape, checked from the built objects and the sources.

Fails (exit 1) on:
  - an import loop: A -> B when A's object needs a global symbol B's object defines (nm, from
    BUILD/compile_commands.json); a cycle of such edges among the files of one folder tree (daemon/,
    client/, common/), found as a strongly connected component of more than one file. A name the C
    library exports (dlopen, dlsym: the interposer defines its own) is the C library's, not a sibling's;
  - an include against the direction of the house (INCLUDE_RULES): the core includes no shell header,
    the interposer and pinctl only the library's public face or the one internal header named for them;
  - a C source or header over --max-lines lines under daemon/, client/, common/ or tests/ (the fuzzers
    are in tests/fuzz/).
Warns, without failing, on the files listed in TESTS_OVER_LIMIT_PENDING and the includes listed in
DIRECTION_PENDING: work under way elsewhere, both lists to be emptied.
--self-test runs every rule over the fixture trees in tests/fixtures/structure/ and fails unless each
catches its violation and the clean tree passes.
Exit status: 0 clean, 1 a finding, 2 bad usage or nothing built to read.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

# The folder trees whose objects draw the call graph and whose sources follow INCLUDE_RULES.
FOLDERS = ("daemon", "client", "common")
# The folder trees whose C files must stay under the line limit.
LIMIT_FOLDERS = FOLDERS + ("tests",)
C_SUFFIXES = (".c", ".h", ".cu")

# Who may include whom, first matching folder wins. Besides what is listed, every file may include the headers
# of its own folder, system headers (<...>) and headers that are no file of these trees (the generated
# pinbroker.pb-c.h). An entry ending in "/" is a folder and all below it, any other a single header.
INCLUDE_RULES = (
    # The decision core: no I/O, so nothing of the shell that does it.
    ("daemon/core/", ("daemon/core/", "common/")),
    # The shell: its subsystems and the core.
    ("daemon/", ("daemon/", "common/")),
    ("client/lib/", ("client/lib/", "common/")),
    # The interposer links the library's objects but calls only its public face and the internal one made for it.
    ("client/preload/", ("client/lib/pinbroker.h", "client/lib/pinbroker-internal.h", "common/")),
    # pinctl: the public face, and the interposer's fallback words that `pinctl run --fallback` checks.
    ("client/pinctl/", ("client/lib/pinbroker.h", "client/preload/preload-policy.h", "common/")),
    ("client/metrics-http/", ("client/lib/pinbroker.h", "common/")),
    # A file directly in client/ belongs to no product: it may include nothing of the tree.
    ("client/", ()),
    ("common/", ()),
)

# Sources allowed over the line limit for a while, as warnings (empty: every file is within it). A file put here
# must be being shortened; the check warns once it no longer needs the entry.
TESTS_OVER_LIMIT_PENDING = ()

# Includes against INCLUDE_RULES allowed for a while, as warnings, (includer, included): empty, as it should stay.
DIRECTION_PENDING = ()

SELF_TEST_DIR = os.path.join("tests", "fixtures", "structure")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   help="the source tree (default: this script's tree)")
    p.add_argument("--build", help="a configured and built CMake build folder (required unless --self-test)")
    p.add_argument("--max-lines", type=int, default=1000, help="longest source file allowed (default 1000)")
    p.add_argument("--graph", action="store_true", help="also print every file's edges")
    p.add_argument("--self-test", action="store_true",
                   help=f"check that every rule catches its fixture in {SELF_TEST_DIR}/ (needs cc and nm)")
    args = p.parse_args()
    if not args.self_test and not args.build:
        p.error("--build is required (or --self-test)")
    return args


# ------------------------------------------------------------------ import loops (built objects)

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


def import_loops(objs, show_graph=False):
    """(findings, edge count) of the symbol graph among objs ({source: object})."""
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
    if show_graph:
        for src in sorted(graph):
            for dst in sorted(graph[src]):
                print(f"{src} -> {dst} ({why[(src, dst)]})")
    findings = []
    for comp in strongly_connected(graph):
        members = set(comp)
        edges = [f"{a} -> {b} ({why[(a, b)]})" for a in comp for b in sorted(graph[a]) if b in members]
        findings.append(f"import loop among {', '.join(comp)}:\n  " + "\n  ".join(edges))
    return findings, sum(len(v) for v in graph.values())


# ------------------------------------------------------------------ include direction (sources)

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def tree_files(root, folders, suffixes):
    """Every file under root's folders with one of the suffixes, relative to root, '/'-separated, sorted."""
    found = []
    for folder in folders:
        for dirpath, dirs, files in os.walk(os.path.join(root, folder)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(suffixes):
                    found.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return found


def resolve(includer, name, headers):
    """The tree headers a quoted include can name: the includer's folder first, as the compiler looks, else
    every header whose path ends in the name (the include paths). Empty: no file of the tree (generated)."""
    here = os.path.normpath(os.path.join(os.path.dirname(includer), name)).replace(os.sep, "/")
    if here in headers:
        return [here]
    return [h for h in sorted(headers) if h == name or h.endswith("/" + name)]


def rule_for(path):
    for folder, allowed in INCLUDE_RULES:
        if path.startswith(folder):
            return folder, allowed
    return None, ()


def may_include(includer, header):
    folder, allowed = rule_for(includer)
    if folder is None:
        return True
    if os.path.dirname(header) == os.path.dirname(includer):
        return True
    return any(header.startswith(a) if a.endswith("/") else header == a for a in allowed)


def include_findings(root):
    """[(includer, header, why)]: each quoted include against INCLUDE_RULES."""
    files = tree_files(root, FOLDERS, C_SUFFIXES)
    headers = {f for f in files if f.endswith(".h")}
    found = []
    for path in files:
        with open(os.path.join(root, path), errors="replace") as f:
            text = f.read()
        for name in INCLUDE_RE.findall(text):
            cands = resolve(path, name, headers)
            if cands and not any(may_include(path, c) for c in cands):
                folder, allowed = rule_for(path)
                what = ", ".join(allowed) if allowed else "nothing"
                found.append((path, cands[0], f"a file under {folder} may include only its own folder's headers, "
                              f"{what} and system headers"))
    return found


# ------------------------------------------------------------------ line limit

def long_files(root, limit):
    found = []
    for path in tree_files(root, LIMIT_FOLDERS, C_SUFFIXES):
        with open(os.path.join(root, path), errors="replace") as f:
            n = sum(1 for _ in f)
        if n > limit:
            found.append((path, n))
    return found


# ------------------------------------------------------------------ the check

def check(root, objs, max_lines, pending_long=TESTS_OVER_LIMIT_PENDING, pending_includes=DIRECTION_PENDING,
          show_graph=False, out=print):
    """Every rule over root: (findings, warnings), each a list of lines, printed through out as found."""
    findings, warnings = [], []
    loops, nedges = import_loops(objs, show_graph) if objs else ([], 0)
    findings += loops
    for includer, header, why in include_findings(root):
        if (includer, header) in pending_includes:
            warnings.append(f"{includer} includes {header} (DIRECTION_PENDING: to be removed): {why}")
        else:
            findings.append(f"{includer} includes {header}: {why}")
    long = long_files(root, max_lines)
    for path, n in long:
        msg = f"{path} has {n} lines, over {max_lines}"
        if path in pending_long:
            warnings.append(f"{msg} (TESTS_OVER_LIMIT_PENDING: being shortened)")
        else:
            findings.append(f"{msg}: split it by concern")
    for path in pending_long:
        if path not in {p for p, _ in long}:
            warnings.append(f"{path} is listed in TESTS_OVER_LIMIT_PENDING but is not over {max_lines} lines "
                            "(or is gone): take it off the list")
    for line in findings:
        out(f"structure: {line}")
    for line in warnings:
        out(f"structure: warning: {line}")
    out(f"structure: {len(objs)} objects read, {nedges} edges, {len(findings)} finding(s), "
        f"{len(warnings)} warning(s)")
    return findings, warnings


# ------------------------------------------------------------------ self-test

def build_fixture_objects(root, tmp):
    """Compile the fixture tree's .c files under FOLDERS with cc -c: {source: object}."""
    objs = {}
    dirs = sorted({os.path.dirname(h) for h in tree_files(root, FOLDERS, (".h",))})
    incs = [f"-I{os.path.join(root, d)}" for d in dirs]
    for src in tree_files(root, FOLDERS, (".c",)):
        obj = os.path.join(tmp, src.replace("/", "_") + ".o")
        subprocess.run(["cc", "-c", "-w", *incs, "-o", obj, os.path.join(root, src)], check=True)
        objs[src] = obj
    return objs


# Each fixture tree and what the checker must say of it: (tree, max lines, the finding every line of which
# must name these words, or None for a clean tree, and the pending lists the case runs with).
SELF_TESTS = (
    ("clean", 40, None, (), ()),
    ("import-loop", 40, ("import loop", "daemon/loop-a.c", "daemon/loop-b.c"), (), ()),
    ("core-includes-shell", 40, ("daemon/core/broker.c includes daemon/pool/pool.h",), (), ()),
    ("preload-includes-lib-int", 40, ("client/preload/preload.c includes client/lib/lib-int.h",), (), ()),
    ("pinctl-includes-lib-int", 40, ("client/pinctl/pinctl.c includes client/lib/lib-int.h",), (), ()),
    ("flat-client", 40, ("client/stray.c includes client/lib/pinbroker.h",), (), ()),
    ("long-test", 40, ("tests/unit/check_long.c has 41 lines, over 40",), (), ()),
    # The same long file listed as pending: a warning, no finding.
    ("long-test", 40, None, ("tests/unit/check_long.c",), ()),
    # The core's include listed as pending: a warning, no finding.
    ("core-includes-shell", 40, None, (), (("daemon/core/broker.c", "daemon/pool/pool.h"),)),
)


def self_test(repo):
    failed = 0
    for tree, max_lines, expect, pending_long, pending_inc in SELF_TESTS:
        root = os.path.join(repo, SELF_TEST_DIR, tree)
        if not os.path.isdir(root):
            print(f"structure self-test: {root} is missing")
            failed += 1
            continue
        tmp = tempfile.mkdtemp(prefix="structure-")
        lines = []
        try:
            objs = build_fixture_objects(root, tmp)
            findings, warnings = check(root, objs, max_lines, pending_long, pending_inc, out=lines.append)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if expect is None:
            ok = not findings and (bool(warnings) == bool(pending_long or pending_inc))
        else:
            ok = len(findings) == 1 and all(word in findings[0] for word in expect)
        label = f"{tree}" + (" (pending)" if pending_long or pending_inc else "")
        print(f"structure self-test: {'ok' if ok else 'FAIL'}: {label}")
        if not ok:
            failed += 1
            print("  expected " + ("no finding" if expect is None else "one finding naming " + ", ".join(expect)))
            print("  got:\n    " + "\n    ".join(lines))
    print(f"structure self-test: {len(SELF_TESTS) - failed} of {len(SELF_TESTS)} cases as expected")
    return 1 if failed else 0


def main():
    args = parse_args()
    if args.self_test:
        return self_test(args.root)
    objs = objects_by_source(args.root, args.build)
    if not objs:
        print(f"structure: no built objects of {', '.join(FOLDERS)} under {args.build}: build first",
              file=sys.stderr)
        return 2
    findings, _ = check(args.root, objs, args.max_lines, show_graph=args.graph)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
