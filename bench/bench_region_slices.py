#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Ranks of one shared region registering their own slice against each registering the whole region (GPU host).

N rank processes start together (a barrier after each has loaded libpinbroker and the CUDA driver) and each calls
``pinbroker.shared_region(NAME, SIZE, ...)``: in the ``whole`` rounds without ``slice=`` (every rank registers the
whole region with CUDA), in the ``slice`` rounds with ``slice=(rank * SIZE / N, SIZE / N)``. Ready: the time from the
barrier until the last rank returned. Rounds alternate whole, slice, slice, whole, ...; the region is released
(every rank lets go) between rounds, and one untimed round first warms the daemon's pool, so both sides take warm
memory. Checks: the daemon charges the region once (its leased bytes while the ranks hold it), each slice rank's
lease says its slice and is pinned, each whole rank's lease is registered whole.

usage: bench_region_slices.py [--ranks 8] [--size 64G] [--rounds 2]     (PINBROKER_SOCKET names the daemon)
Prints a table with the ratio slice/whole; exits 1 when a check failed, 77 without a usable CUDA driver.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

GIB = 1 << 30


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(float(s[:-1]) * units[s[-1]]) if s and s[-1] in units else int(s)


def rank_main(rank: int, n: int, size: int, name: str, sliced: bool, barrier: Any, go: Any, out: Any) -> None:
    import pinbroker

    res: Dict[str, Any] = {"rank": rank}
    try:
        c = pinbroker.connect()
        barrier.wait()
        t0 = time.perf_counter()
        part = (rank * (size // n), size // n) if sliced else None
        lease, created = pinbroker.shared_region(name, size, client=c, slice=part, timeout=600)
        res.update(ready_s=time.perf_counter() - t0, created=created, kind=str(lease.kind),
                   registered=lease.cuda_registered, slice=lease.cuda_slice, nbytes=lease.nbytes)
        out.put(res)
        go.wait()  # hold until the parent has read the daemon's status
        lease.release()
        c.close()
    except Exception as e:  # reported, never hidden: the parent fails the run
        res["error"] = f"{type(e).__name__}: {e}"
        out.put(res)


def leased_bytes() -> int:
    import pinbroker

    c = pinbroker.connect()
    try:
        return int(c.status()["leased_bytes"])
    finally:
        c.close()


def run_round(n: int, size: int, name: str, sliced: bool, checks: List[str]) -> float:
    ctx = mp.get_context("spawn")
    barrier, go, out = ctx.Barrier(n), ctx.Event(), ctx.Queue()
    before = leased_bytes()
    procs = [ctx.Process(target=rank_main, args=(r, n, size, name, sliced, barrier, go, out)) for r in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=900) for _ in range(n)]
    held = leased_bytes() - before
    go.set()
    for p in procs:
        p.join(120)
    side = "slice" if sliced else "whole"
    for r in results:
        if "error" in r:
            checks.append(f"{side} rank {r['rank']}: {r['error']}")
        elif sliced and r["slice"] != (r["rank"] * (size // n), size // n):
            checks.append(f"slice rank {r['rank']}: registered slice {r['slice']}, not its own")
        elif not sliced and (r["slice"] is not None or not r["registered"]):
            checks.append(f"whole rank {r['rank']}: not registered whole ({r['slice']}, {r['registered']})")
    if sum(1 for r in results if r.get("created")) != 1:
        checks.append(f"{side}: {sum(1 for r in results if r.get('created'))} ranks made the region, not 1")
    if not size <= held < size + GIB:
        checks.append(f"{side}: the daemon lent {held} bytes for the region while it was held, not {size} once")
    if any("error" in r for r in results):
        return float("nan")
    return max(r["ready_s"] for r in results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--size", default="64G")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of rounds (whole+slice), alternated")
    a = ap.parse_args()
    size = parse_size(a.size)
    import pinbroker

    c = pinbroker.connect()
    probe = c.acquire(1 << 21)
    pinned = probe.kind == pinbroker.Kind.PINNED
    probe.release()
    c.close()
    if not pinned:
        print("SKIP bench_region_slices: leases are not registered with CUDA here (no usable driver or GPU)")
        return 77
    checks: List[str] = []
    name = f"slices-{os.getpid()}"
    run_round(a.ranks, size, name, True, [])  # warm the pool: untimed
    times: Dict[str, List[float]] = {"whole": [], "slice": []}
    order = []
    for i in range(a.rounds):
        order += ["whole", "slice"] if i % 2 == 0 else ["slice", "whole"]
    for side in order:
        t = run_round(a.ranks, size, name, side == "slice", checks)
        times[side].append(t)
        print(f"  {side:5s} round: all {a.ranks} ranks ready in {t:.3f} s", flush=True)
    w, s = statistics.median(times["whole"]), statistics.median(times["slice"])
    print(f"\n{a.ranks} ranks, one {size / GIB:g} GiB region, slices of {size / a.ranks / GIB:g} GiB, "
          f"{a.rounds} rounds each side (median)\n")
    print("| ranks register | all ready, s | ratio to whole | target |")
    print("|---|---:|---:|---|")
    print(f"| the whole region each | {w:.3f} | 1.00× | |")
    print(f"| their own slice | {s:.3f} | {s / w:.2f}× | ≤ 0.25× |")
    for c_ in checks:
        print(f"FAIL {c_}")
    print(f"\nchecks: {'all passed' if not checks else f'{len(checks)} failed'}")
    return 1 if checks else 0


if __name__ == "__main__":
    sys.exit(main())
