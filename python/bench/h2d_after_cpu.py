#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What a CPU access to pinned memory does to the H2D copies that follow it (issue 25, item 3).

The pinned DataLoader's check once read its first batch at 0.88-0.93x torch's pinned tensor, and 1.00x 3 s
later. This probe finds out which CPU access does that, and for how long. Each phase does one thing to a source
(a plain lease, a torch pinned tensor, or the DataLoader's first yielded batch), then copies it to the GPU
(38.5 MB, CUDA events) over and over for --seconds, one copy of each source a trip in rotating order beside
torch's pinned tensor at rest (the reference). Per window of time since the action it prints the median of the
trips' ratios, source over reference, and the first copy after the action alone.

Actions: none; ``scratch.copy_(x)`` (torch's copy *from* x into ordinary memory, as the old check made torch's
copy of its batch); ``x.sum()`` (a CPU read); ``x.copy_(scratch)`` (a CPU write); ``x.fill_()`` on a thread of
its own; ``x.fill_()`` in a forked child. Writes h2d_after_cpu.json and h2d_after_cpu.md to --out ($OUT).

Needs a CUDA torch, libpinbroker and a pinbrokerd on $PINBROKER_SOCKET (python/bench/run-gpu.sh starts one and
runs this after the loader check). About 40 s. Exit 0 (a probe reports), 1 when a phase failed, 77 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's pinbroker package

SKIP = 77
SHAPE = (256, 3, 224, 224)  # 38,535,168 bytes: the check's batch
EDGES = [0.0, 0.05, 0.2, 0.8, 3.2, 1e9]  # the windows, seconds since the action
REF = "torch at rest"


def rotation(names: Sequence[str], k: int) -> List[str]:
    """Trip k's order: the names rotated by k, reversed on odd trips, so no source always follows another. Two
    names go ABBA: rotating two by one is reversing them, so rotated-and-reversed would put the reference first
    in every trip."""
    if len(names) == 2:
        return list(names) if k % 4 in (0, 3) else list(names[::-1])
    r = list(names[k % len(names):]) + list(names[:k % len(names)])
    return r[::-1] if k % 2 else r


def windows(trips: List[Dict[str, float]], names: Sequence[str], edges: Sequence[float] = EDGES,
            until: Optional[float] = None) -> List[Dict[str, Any]]:
    """Per window [a, b) of trip times: the trips in it and, per source but the reference, the median of the
    trips' ratios source/reference; the first row is the first trip alone (the first copy after the action).
    until: how long the series ran; a window's label ends there, not at an edge no trip reached."""
    if until is not None:
        edges = [e for e in edges if e < until] + [until]
    rows: List[Dict[str, Any]] = []
    if trips:
        rows.append({"window": "first copy", "n": 1,
                     **{nm: trips[0][nm] / trips[0][REF] for nm in names if nm != REF}})
    for a, b in zip(edges, edges[1:]):
        w = [t for t in trips if a <= t["t"] < b]
        if w:
            label = f"{a:g}-{b:g} s" if b < 1e9 else f"{a:g} s on"
            rows.append({"window": label, "n": len(w),
                         **{nm: statistics.median(t[nm] / t[REF] for t in w) for nm in names if nm != REF}})
    return rows


def markdown(phases: List[Dict[str, Any]]) -> str:
    cols = [r["window"] for r in phases[0]["rows"]] if phases else []
    out = ["| action | source | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for ph in phases:
        for src in ph["sources"]:
            cells = {r["window"]: r.get(src) for r in ph["rows"]}
            out.append(f"| {ph['action']} | {src} | "
                       + " | ".join("" if cells.get(c) is None else f"{cells[c]:.3f}" for c in cols) + " |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    ap.add_argument("--seconds", type=float, default=2.0, help="the time series after each action")
    ap.add_argument("--workers", type=int, default=8, help="the DataLoader phase's fork workers")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device visible to torch")
        return SKIP
    import gpu_loader_check as glc
    import pinbroker
    import pinbroker.torch as pbt

    torch.cuda.init()
    dev = torch.device("cuda")
    rand = torch.Generator().manual_seed(35)
    scratch = torch.randint(0, 256, SHAPE, dtype=torch.uint8, generator=rand)
    lease = pinbroker.connect().acquire(scratch.numel())
    srcs: Dict[str, Any] = {
        REF: torch.empty(SHAPE, dtype=torch.uint8).pin_memory(),
        "lease": lease.tensor(dtype=torch.uint8, shape=SHAPE),
        "torch": torch.empty(SHAPE, dtype=torch.uint8).pin_memory(),
    }
    for t in srcs.values():
        t.copy_(scratch)
    dst = torch.empty(SHAPE, dtype=torch.uint8, device=dev)
    for t in srcs.values():
        for _ in range(3):
            glc.copy_gbps(t, dst)
    time.sleep(1.0)

    def series(names: List[str]) -> List[Dict[str, float]]:
        # One untimed copy of the reference first: after the idle second between phases the first copy of any
        # source read ~7% slower (the link waking), and trip 0 copies the reference first.
        glc.copy_gbps(srcs[REF], dst)
        trips: List[Dict[str, float]] = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            trip = {"t": time.perf_counter() - t0}
            for nm in rotation(names, len(trips)):
                trip[nm] = glc.copy_gbps(srcs[nm], dst)
            trips.append(trip)
        return trips

    def forked_fill(t: Any) -> None:
        pid = os.fork()
        if pid == 0:  # the child writes through the mapping it inherited, as a loader worker does
            try:
                torch.set_num_threads(1)
                t.fill_(9)
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError(f"the forked child's write failed (wait status {status})")

    def on_thread(fn: Callable[[], Any]) -> None:
        th = threading.Thread(target=fn)
        th.start()
        th.join()

    actions: List[tuple] = [
        ("none", lambda t: None),
        ("scratch.copy_(x): copied from by the CPU", lambda t: scratch.copy_(t)),
        ("x.sum(): read by the CPU", lambda t: int(t.sum())),
        ("x.copy_(scratch): written by the CPU", lambda t: t.copy_(scratch)),
        ("x.fill_() on another thread", lambda t: on_thread(lambda: t.fill_(5))),
        ("x.fill_() in a forked child", forked_fill),
    ]
    phases: List[Dict[str, Any]] = []
    failed = 0

    def phase(action: str, names: List[str], sources: List[str]) -> None:
        trips = series(names)
        rows = windows(trips, names, until=args.seconds)
        phases.append({"action": action, "sources": sources, "rows": rows, "trips": trips})
        print(f"== {action}: {len(trips)} trips; " + "; ".join(
            f"{r['window']} " + " ".join(f"{s} {r[s]:.3f}x" for s in sources) for r in rows), flush=True)

    for action, fn in actions:
        for name in ("lease", "torch"):
            try:
                fn(srcs[name])
                phase(action, [REF, name], [name])
            except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
                failed += 1
                print(f"FAIL: {action} on {name}: {e}", flush=True)
            time.sleep(1.0)

    # The loader's first batch as yielded, then after the CPU copied from it (what the old check did).
    loader: Optional[Any] = pbt.DataLoader(glc.Images(256 * 64), batch_size=256, num_workers=args.workers,
                                           multiprocessing_context="fork")
    it = iter(loader)
    srcs["first batch"] = next(it)["image"]
    phase("none (just yielded)", [REF, "first batch"], ["first batch"])
    scratch.copy_(srcs["first batch"])
    phase("scratch.copy_(x): copied from by the CPU", [REF, "first batch"], ["first batch"])
    del srcs["first batch"], it
    loader.close()

    os.makedirs(args.out, exist_ok=True)
    md = markdown(phases)
    with open(os.path.join(args.out, "h2d_after_cpu.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "phases": phases}, f)
    with open(os.path.join(args.out, "h2d_after_cpu.md"), "w") as f:
        f.write(f"H2D of 38.5 MB after a CPU access, source / torch's pinned tensor at rest, median per window "
                f"({torch.cuda.get_device_name()}, torch {torch.__version__})\n\n" + md)
    print(md, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
