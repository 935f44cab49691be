#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Staged copies from torch on the GPU host (issue 39): stock torch against pinbroker's staging, in one run with
the sides alternated, and a table with ratios.

Two kinds of staging, two kinds of alternation:

- ``patched``: one process; pinbroker.torch's staging (install_staging(): Tensor.cuda/.to/.cpu/copy_ through the
  ring, no preload) installed and uninstalled between repetitions, so stock and staged alternate rep by rep;
- ``interposer``: ``pinctl run --no-torch`` (the interposer stages torch's cudaMemcpy* itself; torch's own host
  allocator) against the same program bare; one process per side, the sides alternated over rounds.

Workloads: ``tensor.cuda()`` of 1 GiB and ``.cpu()`` of 1 GiB (beside a pinned tensor's rate, the ceiling), 64 MiB
both ways, 64 KiB ``.cuda()`` (under the threshold: 1.00x expected), DataLoader(pin_memory=False, 8 workers) of
uint8 256x3x224x224 batches (38.5 MB) with ``.cuda()`` per batch (batches/s), and a 4 GiB weights file loaded to the
GPU two ways: ``torch.load(mmap=True)`` then ``.cuda()`` of each tensor, and a raw file mmap'ed, wrapped with
``torch.frombuffer`` and ``.cuda()``. Every staged result is checked against the stock one (bytes equal).

usage: bench_staging_torch.py --out DIR [--pinctl PATH] [--rounds N] [--quick]     the whole comparison
       bench_staging_torch.py --worker SIDE --json FILE [--weights DIR] [--quick]   one side (used by the above)
SIDE: stock, interposer (run under pinctl run by the caller), alternate (stock and patched in this process).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

GIB = 1 << 30
MIB = 1 << 20
N_WEIGHTS = 64  # 64 tensors of 64 MiB: 4 GiB


def sync() -> None:
    import torch

    torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


# ---------------------------------------------------------------- one side's workloads


class Side:
    """The workloads, each run with the staging state the caller sets (set_staged)."""

    def __init__(self, weights_dir: str, quick: bool) -> None:
        import torch

        self.torch = torch
        self.quick = quick
        self.weights_dir = weights_dir
        self.dev = torch.device("cuda", 0)
        torch.cuda.init()
        g = torch.Generator().manual_seed(39)
        # Random bytes, differing at every MiB (a random MiB repeated, each copy shifted): made at memory speed.
        block = torch.randint(0, 256, (MIB,), dtype=torch.uint8, generator=g)
        self.x1g = block.repeat(GIB // MIB)
        self.x1g.view(GIB // MIB, MIB).add_(torch.arange(GIB // MIB, dtype=torch.int64).to(torch.uint8).view(-1, 1))
        self.x64 = self.x1g[: 64 * MIB].clone()
        self.x64k = self.x1g[: 64 << 10].clone()
        self.ref1g = self.x1g.pin_memory().cuda()  # pinned: never staged; the judge of every H2D
        self.pinned1g = self.x1g.pin_memory()
        self.pinned64 = self.x64.pin_memory()
        self.checks: List[str] = []

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.checks.append(what)

    def rate_h2d(self, x: Any, reps: int, ref: Any) -> List[float]:
        rates = []
        for r in range(reps):
            box: List[Any] = []
            s = timed(lambda: box.append(x.cuda()))
            rates.append(x.numel() / s / 1e9)
            if r == 0:
                self.check(bool(self.torch.equal(box[0], ref)), f"H2D of {x.numel()} bytes differs from the pinned copy")
            del box
        return rates

    def rate_d2h(self, y: Any, reps: int, ref: Any) -> List[float]:
        rates = []
        for r in range(reps):
            box: List[Any] = []
            s = timed(lambda: box.append(y.cpu()))
            rates.append(y.numel() / s / 1e9)
            if r == 0:
                self.check(bool(self.torch.equal(box[0], ref)), f"D2H of {y.numel()} bytes differs from the source")
            del box
        return rates

    def rate_d2h_held(self, y: Any, held: Any, reps: int, ref: Any) -> List[float]:
        """D2H into a pageable tensor already touched (no page faults): the copy itself, as held.copy_(y)."""
        rates = []
        for r in range(reps):
            held.fill_(0)
            s = timed(lambda: held.copy_(y))
            rates.append(y.numel() / s / 1e9)
            if r == 0:
                self.check(bool(self.torch.equal(held, ref)), f"D2H into a held tensor of {y.numel()} bytes differs")
        return rates

    def first_touch(self, reps: int) -> List[float]:
        """What .cpu() pays before any copy: a fresh 1 GiB tensor's pages faulted in and written (torch.empty then
        fill_, on torch's own threads): the ceiling of a D2H into new memory."""
        rates = []
        for _ in range(reps):
            box: List[Any] = []
            s = timed(lambda: box.append(self.torch.empty(GIB, dtype=self.torch.uint8).fill_(1)))
            rates.append(GIB / s / 1e9)
            del box
        return rates

    def rate_pinned(self, h2d: bool, p: Any, y: Any, reps: int) -> List[float]:
        rates = []
        for _ in range(reps):
            if h2d:
                s = timed(lambda: y.copy_(p))
            else:
                s = timed(lambda: p.copy_(y))
            rates.append(p.numel() / s / 1e9)
        return rates

    def small_ops(self, reps: int) -> float:
        x = self.x64k
        for _ in range(50):
            x.cuda()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            x.cuda()
        sync()
        return reps / (time.perf_counter() - t0)

    def loader(self, batches: int) -> float:
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Images(Dataset):
            def __init__(self) -> None:
                self.pool = torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8)

            def __len__(self) -> int:
                return 1 << 20

            def __getitem__(self, i: int) -> Any:
                return self.pool[i % 64]

        data = Images()
        dl = DataLoader(data, batch_size=256, num_workers=8, pin_memory=False, prefetch_factor=2)
        it = iter(dl)
        first = next(it).cuda()
        self.check(tuple(first.shape) == (256, 3, 224, 224), "a DataLoader batch has the wrong shape")
        for _ in range(3):  # workers warm
            next(it).cuda()
        sync()
        t0 = time.perf_counter()
        for _ in range(batches):
            b = next(it).cuda()
        sync()
        rate = batches / (time.perf_counter() - t0)
        # Batch k holds samples 256k .. 256k+255, so image j is pool[j % 64].
        self.check(bool(torch.equal(b[69].cpu(), data.pool[69 % 64])), "a DataLoader batch on the GPU differs")
        del it, dl
        return rate

    def weights_torch_load(self) -> float:
        import torch

        path = os.path.join(self.weights_dir, "weights.pt")
        box: Dict[str, Any] = {}

        def load() -> None:
            sd = torch.load(path, mmap=True, weights_only=True)
            box.update({k: v.cuda() for k, v in sd.items()})

        s = timed(load)
        self.check(bool(torch.equal(box["w7"][:4096].cpu(), torch.full((4096,), 7, dtype=torch.float16))),
                   "torch.load weights differ")
        box.clear()
        return 4 * GIB / s / 1e9

    def weights_raw(self) -> float:
        import torch

        path = os.path.join(self.weights_dir, "weights.raw")
        box: List[Any] = []

        def load() -> None:
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            per = 64 * MIB // 2
            for i in range(N_WEIGHTS):
                t = torch.frombuffer(mm, dtype=torch.float16, count=per, offset=i * 64 * MIB)
                box.append(t.cuda())

        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # frombuffer of a read-only mmap warns once
            s = timed(load)
        self.check(bool(torch.equal(box[9][:4096].cpu(), torch.full((4096,), 9, dtype=torch.float16))),
                   "raw mmap weights differ")
        box.clear()
        return 4 * GIB / s / 1e9


def make_weights(d: str) -> None:
    """A 4 GiB state dict (64 float16 tensors of 64 MiB, tensor i filled with i) as torch.save and as raw bytes,
    read once so both sides find them in the page cache."""
    import torch

    os.makedirs(d, exist_ok=True)
    pt, raw = os.path.join(d, "weights.pt"), os.path.join(d, "weights.raw")
    if not os.path.exists(pt) or not os.path.exists(raw):
        sd = {f"w{i}": torch.full((32 * MIB,), i, dtype=torch.float16) for i in range(N_WEIGHTS)}
        torch.save(sd, pt)
        with open(raw, "wb") as f:
            for i in range(N_WEIGHTS):
                f.write(sd[f"w{i}"].numpy().tobytes())
        del sd
    for p in (pt, raw):
        with open(p, "rb") as f:
            while f.read(64 * MIB):
                pass


def set_patched(on: bool) -> None:
    from pinbroker import torch_staging

    if on:
        torch_staging.install(force=True)
    else:
        torch_staging.uninstall()


def run_side(side: str, weights_dir: str, quick: bool) -> Dict[str, Any]:
    """Measure every workload. side "alternate": stock and patched alternate rep by rep in this process; else one
    side (stock, or interposer when run under pinctl run)."""
    s = Side(weights_dir, quick)
    reps = 3 if quick else 5
    names = ["stock", "staged"] if side == "alternate" else [side]
    res: Dict[str, Dict[str, List[float]]] = {n: {} for n in names}

    def add(n: str, key: str, v: Any) -> None:
        res[n].setdefault(key, []).extend(v if isinstance(v, list) else [v])

    torch = s.torch
    y1g = s.ref1g
    y64 = s.x64.pin_memory().cuda()
    pin_out1g = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    dev_out1g = torch.empty(GIB, dtype=torch.uint8, device=s.dev)
    held1g = torch.ones(GIB, dtype=torch.uint8)  # pageable, every page touched
    # One process per side (interposer rounds): the caller alternates processes; here one pass each.
    passes = (2 if quick else 3) if side == "alternate" else 1
    for rnd in range(passes):
        order = names if rnd % 2 == 0 else names[::-1]
        for n in order:
            if side == "alternate":
                set_patched(n == "staged")
            add(n, "h2d_1g", s.rate_h2d(s.x1g, reps, s.ref1g))
            add(n, "d2h_1g", s.rate_d2h(y1g, reps, s.x1g))
            add(n, "d2h_1g_held", s.rate_d2h_held(y1g, held1g, reps, s.x1g))
            add(n, "first_touch_1g", s.first_touch(reps))
            add(n, "h2d_64m", s.rate_h2d(s.x64, reps * 3, y64))
            add(n, "d2h_64m", s.rate_d2h(y64, reps * 3, s.x64))
            add(n, "small_64k_ops", s.small_ops(500 if quick else 2000))
            add(n, "pinned_h2d_1g", s.rate_pinned(True, s.pinned1g, dev_out1g, reps))
            add(n, "pinned_d2h_1g", s.rate_pinned(False, pin_out1g, y1g, reps))
    if side == "alternate":
        set_patched(False)
    for rnd in range(2 if side == "alternate" else 1):
        order = names if rnd % 2 == 0 else names[::-1]
        for n in order:
            if side == "alternate":
                set_patched(n == "staged")
            add(n, "loader_batches_s", s.loader(10 if quick else 30))
            add(n, "weights_load_gbs", s.weights_torch_load())
            add(n, "weights_raw_gbs", s.weights_raw())
    if side == "alternate":
        from pinbroker import torch_staging

        res["staged"]["_stats"] = [torch_staging.stats()]  # type: ignore[list-item]
        set_patched(False)
    return {"side": side, "results": res, "checks_failed": s.checks, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__}


# ---------------------------------------------------------------- the driver: sides, rounds, table

ROWS = [
    ("h2d_1g", "tensor.cuda() 1 GiB, GB/s", "pinned_h2d_1g", "≥ 0.8× pinned"),
    ("d2h_1g_held", "held.copy_(cuda) 1 GiB into touched pageable memory, GB/s", "pinned_d2h_1g", "≥ 0.7× pinned"),
    ("d2h_1g", "tensor.cpu() 1 GiB (new memory: page faults), GB/s", "first_touch_1g",
     "≥ 2× stock; ceiling: first touch"),
    ("first_touch_1g", "first touch of 1 GiB new pageable memory (torch.empty + fill_), GB/s", None, "ceiling"),
    ("h2d_64m", "tensor.cuda() 64 MiB, GB/s", None, "≥ 2× stock"),
    ("d2h_64m", "tensor.cpu() 64 MiB, GB/s", None, "≥ 2× stock"),
    ("small_64k_ops", "tensor.cuda() 64 KiB, copies/s", None, "1.00× stock"),
    ("loader_batches_s", "DataLoader(pin_memory=False) + .cuda(), 38.5 MB batches/s", None, "≥ 1.5× stock"),
    ("weights_load_gbs", "4 GiB torch.load(mmap=True) + .cuda(), GB/s", None, "≥ 2× stock"),
    ("weights_raw_gbs", "4 GiB raw mmap + frombuffer + .cuda(), GB/s", None, "≥ 2× stock"),
]


def med(v: List[float]) -> float:
    return statistics.median(v) if v else float("nan")


def table(title: str, stock: Dict[str, List[float]], staged: Dict[str, List[float]]) -> List[str]:
    lines = [f"### {title}", "", "| what | stock | staged | staged/stock | ceiling (pinned, or first touch) | staged/ceiling | target |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for key, what, pinned_key, target in ROWS:
        a, b = med(stock.get(key, [])), med(staged.get(key, []))
        p = med(stock.get(pinned_key, []) + staged.get(pinned_key, [])) if pinned_key else None
        lines.append(f"| {what} | {a:.2f} | {b:.2f} | {b / a:.2f}× | {'' if p is None else f'{p:.2f}'} | "
                     f"{'' if p is None else f'{b / p:.2f}×'} | {target} |")
    return lines


def worker(args: argparse.Namespace) -> int:
    out = run_side(args.worker, args.weights, args.quick)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({"side": out["side"], "checks_failed": out["checks_failed"]}))
    return 1 if out["checks_failed"] else 0


def driver(args: argparse.Namespace) -> int:
    os.makedirs(args.out, exist_ok=True)
    # Not under --out: 8 GiB must not travel back with the results.
    weights = args.weights or tempfile.mkdtemp(prefix="pb-weights.")
    import torch  # noqa: F401  (the driver only writes the weights file)

    t0 = time.time()
    make_weights(weights)
    print(f"weights file ready in {time.time() - t0:.1f} s", flush=True)
    me = os.path.abspath(__file__)
    base = [sys.executable, me, "--weights", weights] + (["--quick"] if args.quick else [])
    failed: List[str] = []
    runs: Dict[str, List[Dict[str, Any]]] = {"alternate": [], "stock": [], "interposer": []}

    def one(side: str, tag: str, prefix: List[str]) -> None:
        js = os.path.join(args.out, f"torch-{tag}.json")
        log = os.path.join(args.out, f"torch-{tag}.log")
        t = time.time()
        with open(log, "w") as lf:
            try:
                rc = subprocess.call(prefix + base + ["--worker", side, "--json", js], stdout=lf,
                                     stderr=subprocess.STDOUT, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                rc = f"killed after {args.timeout} s"
        print(f"{tag}: exit {rc} in {time.time() - t:.0f} s ({log})", flush=True)
        if rc != 0 or not os.path.exists(js):
            failed.append(f"{tag} exit {rc}")
            return
        with open(js) as f:
            d = json.load(f)
        failed.extend(f"{tag}: {c}" for c in d["checks_failed"])
        runs[side].append(d)

    one("alternate", "patched-alternate", [])
    for r in range(args.rounds):
        sides = [("stock", []), ("interposer", [args.pinctl, "run", "--no-torch", "--label", "staging-bench", "--"])]
        for side, prefix in (sides if r % 2 == 0 else sides[::-1]):
            if side == "interposer" and not args.pinctl:
                continue
            one(side, f"{side}-{r}", prefix)

    def merged(side: str, name: str) -> Dict[str, List[float]]:
        m: Dict[str, List[float]] = {}
        for d in runs[side]:
            for k, v in d["results"].get(name, {}).items():
                if not k.startswith("_"):
                    m.setdefault(k, []).extend(v)
        return m

    lines = []
    dev = next((d["device"] for rs in runs.values() for d in rs), "?")
    lines.append(f"torch staging benchmark on {dev}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    lines.append("")
    if runs["alternate"]:
        lines += table("pinbroker.torch staging (Tensor methods patched), stock and staged alternated in one process",
                       merged("alternate", "stock"), merged("alternate", "staged"))
        lines.append("")
        st = runs["alternate"][0]["results"]["staged"].get("_stats")
        if st:
            lines.append(f"patched side's copies: {json.dumps(st[0].get('copies'))}")
            lines.append("")
    if runs["stock"] and runs["interposer"]:
        lines += table(f"pinctl run --no-torch (the interposer stages torch's copies) against bare, {args.rounds} "
                       "rounds, processes alternated", merged("stock", "stock"), merged("interposer", "interposer"))
        lines.append("")
    lines.append("checks: " + ("all staged results equal the stock ones" if not failed else "FAILED: " + "; ".join(failed)))
    with open(os.path.join(args.out, "torch-table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not args.keep_weights and not args.weights:
        shutil.rmtree(weights, ignore_errors=True)
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="results folder (driver)")
    ap.add_argument("--pinctl", help="pinctl, for the interposer side (without: that side is not run)")
    ap.add_argument("--rounds", type=int, default=2, help="stock/interposer process pairs (default 2)")
    ap.add_argument("--weights", help="folder of the 4 GiB weights files (default: a temp folder, removed after)")
    ap.add_argument("--keep-weights", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per worker process")
    ap.add_argument("--worker", choices=["stock", "interposer", "alternate"])
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        if not args.json or not args.weights:
            ap.error("--worker needs --json and --weights")
        return worker(args)
    if not args.out:
        ap.error("--out is required")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
