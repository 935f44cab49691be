#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Batches/s of pinbroker.torch.DataLoader against torch's DataLoader(pin_memory=True) and (pin_memory=False).

Same dataset, same workers (8, fork, prefetch 2, persistent), uint8 3x224x224 images held in memory (a worker's
__getitem__ is a view of one of them, so the loader's own costs dominate): 16 images (2.4 MB), 64 (9.6 MB),
256 (38.5 MB) a batch, and a mixed batch (64 images, their labels and a dict of metadata). Every batch's tensors
are copied to the GPU (non_blocking) as a training loop would, and the stream is synchronised at the end of each
timed run. Per configuration: a warm-up, then the median of --repeats runs of at least --seconds each.

Needs a CUDA torch (with --no-copy, a CPU host also runs it), libpinbroker and a pinbrokerd on $PINBROKER_SOCKET
(python/bench/run-gpu.sh starts one). Writes bench_loader.json and bench_loader.md to --out and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

SHAPE = (3, 224, 224)
IMAGE_BYTES = 3 * 224 * 224


class Images(torch.utils.data.Dataset):
    """K decoded images in memory; sample i is image i % K (a view: the collate's stack makes the copy)."""

    def __init__(self, n: int, mixed: bool, k: int = 64) -> None:
        g = torch.Generator().manual_seed(99)
        self.base = torch.randint(0, 256, (k,) + SHAPE, generator=g, dtype=torch.uint8)
        self.n, self.k, self.mixed = n, k, mixed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        img = self.base[i % self.k]
        if not self.mixed:
            return img
        return img, i, {"id": i, "scale": 1.0 + (i % 7) / 10, "crop": torch.tensor([i % 224, 0, 224, 224]),
                        "name": f"img{i}"}


def to_device(obj: Any, dev: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dev, non_blocking=True)
    if isinstance(obj, dict):
        return {k: to_device(v, dev) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_device(v, dev) for v in obj]
    return obj


def batch_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(batch_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(batch_bytes(v) for v in obj)
    return 0


def run(make: Callable[[], Any], args: argparse.Namespace, dev: Any) -> Dict[str, Any]:
    loader = make()
    it = iter(loader)
    nbytes = 0
    t_start = time.perf_counter()
    for _ in range(args.warmup):
        b = next(it)
        nbytes = batch_bytes(b)
        if dev is not None:
            to_device(b, dev)
        del b
    if dev is not None:
        torch.cuda.synchronize()
    warm_s = time.perf_counter() - t_start
    rates = []
    for _ in range(args.repeats):
        n = 0
        t0 = time.perf_counter()
        while True:
            b = next(it)
            if dev is not None:
                to_device(b, dev)
            del b
            n += 1
            if n >= args.min_batches and time.perf_counter() - t0 >= args.seconds:
                break
        if dev is not None:
            torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - t0))
    stats = getattr(loader, "stats", None)
    del it
    if hasattr(loader, "close"):
        loader.close()
    del loader
    gc.collect()
    return {"batches_per_s": statistics.median(rates), "runs": rates, "batch_bytes": nbytes, "warmup_s": warm_s,
            "stats": stats}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--sizes", default="16,64,256,mixed64", help="images per batch; mixedN is the mixed batch")
    ap.add_argument("--warmup", type=int, default=20, help="batches before timing")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="at least this long per timed run")
    ap.add_argument("--min-batches", type=int, default=30)
    ap.add_argument("--no-copy", action="store_true", help="do not copy batches to the GPU")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    import pinbroker
    import pinbroker.torch as pbt

    dev = None
    if not args.no_copy:
        if not torch.cuda.is_available():
            print("SKIP: no CUDA device (use --no-copy to time the loaders alone)")
            return 77
        dev = torch.device("cuda")
        torch.cuda.init()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name() if dev is not None else 'no GPU'}, libpinbroker {pinbroker.library_path()}, "
          f"{args.workers} workers, prefetch {args.prefetch}, H2D copy {'on' if dev is not None else 'off'}",
          flush=True)

    results: List[Dict[str, Any]] = []
    for spec in args.sizes.split(","):
        mixed = spec.startswith("mixed")
        bs = int(spec[5:] if mixed else spec)
        n = bs * 100000  # no timed run reaches the end of the epoch
        ds = Images(n, mixed)
        common = dict(batch_size=bs, num_workers=args.workers, prefetch_factor=args.prefetch,
                      persistent_workers=True, multiprocessing_context="fork")
        row: Dict[str, Any] = {"batch": f"{'mixed ' if mixed else ''}{bs} images"}
        for name, make in (
            ("pin_memory=False", lambda: torch.utils.data.DataLoader(ds, pin_memory=False, **common)),
            ("pin_memory=True", lambda: torch.utils.data.DataLoader(ds, pin_memory=torch.cuda.is_available(), **common)),
            ("pinbroker", lambda: pbt.DataLoader(ds, **common)),
        ):
            r = run(make, args, dev)
            row[name] = r
            extra = f" {r['stats']['ring_batches']} ring / {r['stats']['torch_path_batches']} torch-path" if r["stats"] else ""
            print(f"  {row['batch']:>18} {name:>17}: {r['batches_per_s']:8.1f} batches/s "
                  f"({r['batches_per_s'] * r['batch_bytes'] / 1e9:6.2f} GB/s) runs "
                  f"{', '.join(f'{x:.1f}' for x in r['runs'])}{extra}", flush=True)
        results.append(row)

    lines = [
        f"Batches/s, {args.workers} workers, prefetch {args.prefetch}, fork, persistent workers, "
        f"{'H2D copy of every batch' if dev is not None else 'no H2D copy'}; median of {args.repeats} runs "
        f">= {args.seconds:g} s each.",
        "",
        "| batch | MB | pin_memory=False | pin_memory=True | pinbroker | vs pin_memory=True | vs pin_memory=False |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results:
        f, t, p = (row[k]["batches_per_s"] for k in ("pin_memory=False", "pin_memory=True", "pinbroker"))
        mb = row["pinbroker"]["batch_bytes"] / 1e6
        lines.append(f"| {row['batch']} | {mb:.1f} | {f:.0f} | {t:.0f} | {p:.0f} | {p / t:.1f}x | {p / f:.1f}x |")
    table = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_loader.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    with open(os.path.join(args.out, "bench_loader.md"), "w") as fh:
        fh.write(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
