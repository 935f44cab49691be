# SPDX-License-Identifier: MIT
"""The LLM servers' shared-region pattern on a GPU host, three ways, ranks started together (issue 26).

N ranks (default 4) each make one region of S bytes (default 16 GiB) usable for H2D copies:
  stock       rank files one /dev/shm file, every rank maps it and cudaHostRegister()s all of it (vLLM's
              SharedOffloadRegion, SGLang's HiCache); no broker.
  interposed  the same program under the interposer (libpinbroker-preload.so, as `pinctl run` loads it):
              the broker must charge the region once (item 1), not once per rank.
  region      pinbroker.shared_region(): the first rank takes a shared lease from the warm pool, the others
              attach to it (item 2).
Each rank initialises CUDA first; the clock runs from "go" (sent to all ranks at once) to each rank's region
being mapped and registered. Prints a table (per-rank and total ready times, H2D from the region, the
broker's figures) and exits 1 when a broker figure is wrong (charged more than once, bytes left behind).

usage: shared_region.py --pinbrokerd D --pinctl P --preload L [--ranks 4] [--gib 16] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

RANK = r"""
import ctypes, mmap, os, sys, time
import torch
mode, name, nbytes, rank, shm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.cuda.init(); torch.empty(1, device="cuda")
if mode == "region":
    import pinbroker
    c = pinbroker.connect()
print("INIT", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
created = 0
if mode == "region":
    lease, created = pinbroker.shared_region(name, nbytes, client=c)
    buf = lease.memoryview()
else:
    fd = os.open(shm, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, nbytes)
    mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
    buf = mm
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
    if int(err) != 0:
        print("FAIL cudaHostRegister", int(err), flush=True)
        sys.exit(1)
t1 = time.perf_counter()
print("READY", t1 - t0, int(created), flush=True)
sys.stdin.readline()
gbps = 0.0
if rank == 0:
    n = min(nbytes, 1 << 30)
    src = torch.frombuffer(buf, dtype=torch.uint8, count=n)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = []
    for i in range(8):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src, non_blocking=True); b.record(); b.synchronize()
        if i >= 2:
            out.append(n / (a.elapsed_time(b) / 1e3) / 1e9)
    out.sort()
    gbps = out[len(out) // 2]
    del src
print("H2D", gbps, flush=True)
sys.stdin.readline()
"""


def status(pinctl: str, sock: str) -> dict:
    r = subprocess.run([pinctl, "--socket", sock, "status", "--json"], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def run_ranks(mode: str, n: int, nbytes: int, env: dict, shm: str, wrap: list) -> dict:
    procs = [subprocess.Popen(wrap + [sys.executable, "-c", RANK, mode, "kv", str(nbytes), str(r), shm], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(n)]

    def expect(p, word):
        line = p.stdout.readline().split()
        if not line or line[0] != word:
            p.kill()
            raise RuntimeError(f"{mode}: rank said {line} for {word}; stderr: {p.stderr.read()[-3000:]}")
        return line

    for p in procs:
        expect(p, "INIT")
    t_go = time.perf_counter()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    ready = []
    for p in procs:
        line = expect(p, "READY")
        ready.append((float(line[1]), int(line[2]), time.perf_counter() - t_go))
    out = {"per_rank_s": [r[0] for r in ready], "created": sum(r[1] for r in ready),
           "all_ready_s": max(r[2] for r in ready)}
    return out | {"procs": procs, "expect": expect}


def finish(res: dict) -> float:
    procs, expect = res.pop("procs"), res.pop("expect")
    for p in procs:
        p.stdin.write("h2d\n")
        p.stdin.flush()
    gbps = float(expect(procs[0], "H2D")[1])
    for p in procs[1:]:
        expect(p, "H2D")
    for p in procs:
        p.stdin.write("exit\n")
        p.stdin.flush()
    for p in procs:
        p.wait(120)
    return gbps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pinbrokerd", required=True)
    ap.add_argument("--pinctl", required=True)
    ap.add_argument("--preload", required=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--gib", type=float, default=16)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    nbytes = int(a.gib * (1 << 30))
    tmp = tempfile.mkdtemp(prefix="pb-region.")
    sock = os.path.join(tmp, "pb.sock")
    shm = f"/dev/shm/pb-region-check-{os.getpid()}"
    gib = 1 << 30
    budget = int(nbytes * 1.5) // gib + 2
    log = open(os.path.join(a.out, "shared_region.pinbrokerd.log"), "w")
    d = subprocess.Popen([a.pinbrokerd, "--socket", sock, "--config", "/dev/null", "--budget", f"{budget}G",
                          "--prewarm", f"{int(a.gib) + 1}G", "--hugetlb", "no", "--max-no-revoke-per-uid", "100%",
                          "--tight-mem-available-pct", "3", "--critical-mem-available-pct", "1"],
                         stdout=log, stderr=subprocess.STDOUT)
    failures, rows = [], {}
    try:
        t0 = time.perf_counter()
        st = {}
        while time.perf_counter() - t0 < 120:
            st = status(a.pinctl, sock)
            if st and st.get("pool_idle_bytes", 0) >= nbytes:
                break
            time.sleep(0.2)
        warm_s = time.perf_counter() - t0
        base = dict(os.environ, PINBROKER_SOCKET=sock)
        for mode in ("stock", "interposed", "region"):
            env, wrap = dict(base), []
            if mode == "interposed":
                # As a user runs it: pinctl run finds the interposer through $PINBROKER_PRELOAD_LIB.
                env["PINBROKER_PRELOAD_LIB"] = a.preload
                wrap = [a.pinctl, "--socket", sock, "run", "--no-torch", "--label", "region", "--"]
            if os.path.exists(shm):
                os.unlink(shm)
            res = run_ranks(mode, a.ranks, nbytes, env, shm, wrap)
            st = status(a.pinctl, sock)
            res["leased"] = st.get("leased_bytes", 0)
            res["registered"] = st.get("registered_bytes", 0)
            res["gbps"] = finish(res)
            after = status(a.pinctl, sock)
            res["after"] = after.get("leased_bytes", 0) + after.get("registered_bytes", 0)
            rows[mode] = res
            if mode == "interposed" and res["registered"] != nbytes:
                failures.append(f"interposed: {a.ranks} ranks registering one {a.gib:g} GiB region charged "
                                f"{res['registered'] / gib:.2f} GiB registered, not {a.gib:g} GiB once")
            if mode == "region" and (res["leased"] != nbytes or res["created"] != 1):
                failures.append(f"region: leased {res['leased'] / gib:.2f} GiB (want {a.gib:g}), "
                                f"{res['created']} ranks created it (want 1)")
            if res["after"]:
                failures.append(f"{mode}: {res['after']} bytes still charged after every rank exited")
            if os.path.exists(shm):
                os.unlink(shm)
    finally:
        d.terminate()
        d.wait(30)
        if os.path.exists(shm):
            os.unlink(shm)
    print(f"\n## {a.ranks} ranks x one {a.gib:g} GiB shared region: stock, under the interposer, and "
          f"pinbroker.shared_region() (pool warm in {warm_s:.1f} s before the clock)\n")
    print("| pattern | per-rank ready s (median, max) | all ranks ready s | ratio to stock | H2D GB/s (rank 0, 1 GiB) "
          "| broker: leased / registered GiB |")
    print("|---|---:|---:|---:|---:|---|")
    for mode, r in rows.items():
        pr = r["per_rank_s"]
        print(f"| {mode} | {statistics.median(pr):.2f}, {max(pr):.2f} | {r['all_ready_s']:.2f} | "
              f"{r['all_ready_s'] / rows['stock']['all_ready_s']:.3f}x | {r['gbps']:.1f} | "
              f"{r['leased'] / gib:.2f} / {r['registered'] / gib:.2f} |")
    with open(os.path.join(a.out, "shared_region.json"), "w") as f:
        json.dump({"rows": rows, "warm_s": warm_s, "failures": failures}, f, indent=1)
    for msg in failures:
        print("FAIL:", msg)
    print("PASS: the broker's figures" if not failures else "")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
