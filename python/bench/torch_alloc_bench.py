#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Stock torch against pinbroker's torch host allocator (pinbroker.torch.install()), side by side in one run
(issue 25's targets).

Each side runs in a fresh subprocess of this script (``--side stock|pinbroker``: the allocator cannot be
uninstalled cleanly enough for a fair comparison), alternated stock, pinbroker, pinbroker, stock (``--rounds``);
each row is the median of its rounds (row d: the worst round, since it is a first use). Rows:

  a. ``torch.empty(n, dtype=uint8, pin_memory=True)`` then ``del``, µs per pair, at 64 KiB, 1 MiB and 16 MiB:
     200 pairs of warm-up, then pairs until 2,000 pairs and 0.25 s, or 1 s (target pinbroker <= 2x stock);
  b. ``batch.pin_memory().cuda(non_blocking=True)`` then synchronize, a 38.5 MB uint8 batch (256x3x224x224),
     ms per iteration, median (target <= 1.05x stock);
  c. ``torch.utils.data.DataLoader(ds, batch_size=B, num_workers=8, pin_memory=True)``, fork workers, every
     batch copied ``.cuda(non_blocking=True)``, batches/s over at least a fixed count and --loader-min-s (1.5 s)
     after 5 warm-up batches, at 16, 64 and 256 uint8 3x224x224 images (2.4, 9.6, 38.5 MB); the dataset indexes
     a preallocated tensor, so the pin thread is what is measured (target >= 1.0x stock);
  d. first use in a fresh process: ``pinbroker.torch.install()`` plus the first 1 MiB pinned tensor, s
     (CUDA's own start-up timed apart; target <= 1 s, no compiler);
  e. pinned bytes of 20 live tensors of non-power-of-two sizes (1,000,001 B to 37 MB) against the sum of the
     page-rounded requests: the allocator's leased_bytes, the daemon's lease rows of its label, and stock
     torch's reserved bytes (torch.cuda.host_memory_stats()) (target pinbroker exactly 1.0000).

Each side prints one JSON line; the parent prints a markdown table (| row | stock | pinbroker | ratio | paired |
target | met |: the ratio of the sides' medians, and the median of the rounds' own ratios, on which a target is
judged, with how many rounds met it) and writes torch_alloc_bench.json and torch_alloc_bench.md to --out ($OUT). Exit 0 (a benchmark
reports; it does not fail), 1 when a side crashed or a row raised, 77 without CUDA. The pinbroker side needs
libpinbroker and a pinbrokerd on $PINBROKER_SOCKET (python/bench/run-torch-bench.sh starts one).

``--fake`` runs the parent with sides that print made-up numbers (no torch): the CPU test of the tables.
``--cpu-dry`` runs the sides' code on a CPU torch without pinning or copies (a smoke test of the loops).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
SKIP = 77
KIB, MIB = 1 << 10, 1 << 20
IMAGE = (3, 224, 224)
IMAGE_BYTES = 3 * 224 * 224  # 150,528
BATCH_SHAPE = (256,) + IMAGE  # 38,535,168 bytes: the 38.5 MB batch
ALLOC_SIZES = [("64 KiB", 64 * KIB), ("1 MiB", MIB), ("16 MiB", 16 * MIB)]
LOADER_BATCHES = [16, 64, 256]
# 20 sizes from 1,000,001 B to 37,000,000 B, roughly geometric, none a power of two or a page multiple.
EXACT_SIZES = [int(1_000_001 * 37 ** (i / 19)) | 1 for i in range(19)] + [37_000_001]

# One entry per table row: key in the sides' JSON, what it is, unit, how it compares, target, how rounds combine.
#   kind "lower": pinbroker/stock <= target; "higher": >= target; "abs": the pinbroker value <= target;
#   "exact": the pinbroker value == target (to 4 decimals); "info": lower is better, reported, no target.
ROWS: List[Dict[str, Any]] = (
    [{"key": f"a_{n.replace(' ', '')}", "name": f"a. empty({n}, pin_memory=True) + del", "unit": "µs/pair",
      "kind": "lower", "target": 2.0, "fmt": "{:.2f}"} for n, _ in ALLOC_SIZES]
    + [{"key": "b", "name": "b. pin_memory().cuda(non_blocking) of 38.5 MB", "unit": "ms", "kind": "lower",
        "target": 1.05, "fmt": "{:.3f}"}]
    + [{"key": f"c_{b}", "name": f"c. DataLoader(pin_memory=True) {b * IMAGE_BYTES / 1e6:.1f} MB batches",
        "unit": "batches/s", "kind": "higher", "target": 1.0, "fmt": "{:.1f}"} for b in LOADER_BATCHES]
    + [{"key": f"cpin_{b}", "name": f"c. its pin thread's pin_memory() of one {b * IMAGE_BYTES / 1e6:.1f} MB batch",
        "unit": "ms", "kind": "info", "target": None, "fmt": "{:.3f}"} for b in LOADER_BATCHES]
    + [{"key": "d", "name": "d. first use: install() + first 1 MiB pinned", "unit": "s", "kind": "abs",
        "target": 1.0, "fmt": "{:.3f}", "combine": "max"},
       {"key": "e", "name": "e. pinned bytes / page-rounded request, 20 live tensors", "unit": "x", "kind": "exact",
        "target": 1.0, "fmt": "{:.4f}"},
       {"key": "e_daemon", "name": "e. the same, the daemon's lease rows", "unit": "x", "kind": "exact",
        "target": 1.0, "fmt": "{:.4f}", "pinbroker_only": True}]
)


# ---------------------------------------------------------------- the sides (one fresh process each)


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _scalars(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool)) or v is None}


class Side:
    """One side's measurements. Every row runs in its own try: a row that raises is reported, not fatal."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.torch = torch
        self.args = args
        self.dry = args.cpu_dry
        self.pin = not self.dry
        self.side = args.side
        self.values: Dict[str, Any] = {}
        self.detail: Dict[str, Any] = {}
        self.errors: Dict[str, str] = {}
        self.alloc: Any = None

    def row(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # reported in the table; the side goes on to the next row
            self.errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            print(f"row {name}: {self.errors[name]}", file=sys.stderr, flush=True)
        self.detail.setdefault("row_s", {})[name] = round(time.perf_counter() - t0, 3)

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    def empty_caches(self) -> None:
        """Give back every cached pinned block (torch's, and the allocator's when installed)."""
        gc.collect()
        self.sync()
        if self.alloc is not None:
            self.alloc.empty_cache()
        elif not self.dry and hasattr(self.torch._C, "_host_emptyCache"):
            self.torch._C._host_emptyCache()

    # -- d: first use (runs first: the process is fresh)
    def first_use(self) -> None:
        torch = self.torch
        t0 = time.perf_counter()
        if self.side == "pinbroker" and not self.dry:
            import pinbroker.torch

            self.alloc = pinbroker.torch.install()
        t1 = time.perf_counter()
        if not self.dry:
            torch.cuda.init()
            torch.zeros(1, device="cuda")
        t2 = time.perf_counter()
        x = torch.empty(MIB, dtype=torch.uint8, pin_memory=self.pin)
        t3 = time.perf_counter()
        self.detail["first_pinned"] = bool(x.is_pinned())
        del x
        self.detail.update(install_s=t1 - t0, cuda_init_s=t2 - t1, first_alloc_s=t3 - t2)
        self.values["d"] = (t1 - t0) + (t3 - t2)
        if self.alloc is not None:
            a = self.alloc
            # Added by the prebuilt-extension work (issue 25); read whichever this tree has.
            ext = getattr(a, "_ext", None)
            self.detail["extension_path"] = getattr(a, "extension_path", None) or getattr(ext, "__file__", None)
            for attr in ("build_kind", "extension_kind", "prebuilt"):
                if getattr(a, attr, None) is not None:
                    self.detail[attr] = getattr(a, attr)
            st = a.stats()
            self.detail["first_alloc_through_broker"] = st.get("allocations", 0) >= 1 and not st.get("fallbacks")

    # -- a: steady-state alloc + free
    def alloc_free(self) -> None:
        torch = self.torch
        for label, n in ALLOC_SIZES:
            # A bare call: the tensor is freed as the statement ends, as `x = torch.empty(...); del x` would.
            for _ in range(self.args.alloc_warmup):
                torch.empty(n, dtype=torch.uint8, pin_memory=self.pin)
            pairs = 0
            t0 = time.perf_counter()
            while True:
                for _ in range(100):
                    torch.empty(n, dtype=torch.uint8, pin_memory=self.pin)
                pairs += 100
                dt = time.perf_counter() - t0
                if (pairs >= self.args.alloc_pairs and dt >= self.args.alloc_min_s) or dt >= self.args.alloc_max_s:
                    break
            self.values[f"a_{label.replace(' ', '')}"] = dt / pairs * 1e6
            self.detail[f"a_{label.replace(' ', '')}_pairs"] = pairs

    # -- b: pin then H2D of a 38.5 MB batch
    def pin_h2d(self) -> None:
        torch = self.torch
        b = torch.randint(0, 256, BATCH_SHAPE, dtype=torch.uint8)
        times: List[float] = []
        t_end = None
        for i in range(self.args.pin_warmup + self.args.pin_iters):
            t0 = time.perf_counter()
            p = b.pin_memory() if self.pin else b.clone()
            g = p.cuda(non_blocking=True) if not self.dry else p.clone()
            self.sync()
            dt = time.perf_counter() - t0
            del p, g
            if i >= self.args.pin_warmup:
                times.append(dt)
                if t_end is None:
                    t_end = time.perf_counter() + self.args.pin_max_s
                elif time.perf_counter() > t_end:
                    break
        self.values["b"] = statistics.median(times) * 1e3
        self.detail["b_iters"] = len(times)
        self.detail["b_mean_ms"] = statistics.mean(times) * 1e3

    # -- c: DataLoader(pin_memory=True) batches/s
    def loader(self) -> None:
        torch = self.torch
        base = torch.randint(0, 256, (64,) + IMAGE, dtype=torch.uint8)

        class Images(torch.utils.data.Dataset):
            """Image i is the preallocated image i % 64 (a view: collate's stack is the only copy)."""

            def __init__(self, n: int) -> None:
                self.n = n

            def __len__(self) -> int:
                return self.n

            def __getitem__(self, i: int) -> Any:
                return base[i % 64]

        # The pin thread's own work, timed alike on both sides: the end-to-end batches/s mixes it with the
        # workers' collate and the host's noise (round to round 0.7-1.3x at 38.5 MB), while this is where the
        # allocator can cost anything (its alloc, and the copy into its memory). DataLoader's pin thread looks
        # pin_memory up in its module at each batch, so replacing the module's function reaches it.
        pm_mod = importlib.import_module("torch.utils.data._utils.pin_memory")
        real_pin = pm_mod.pin_memory
        pin_s: List[float] = []

        def timed_pin(data: Any, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            out = real_pin(data, *a, **kw)
            pin_s.append(time.perf_counter() - t)
            return out

        pm_mod.pin_memory = timed_pin
        try:
            for bs in LOADER_BATCHES:
                self.loader_size(bs, Images, pin_s)
        finally:
            pm_mod.pin_memory = real_pin

    def loader_size(self, bs: int, images: Any, pin_s: List[float]) -> None:
        torch = self.torch
        # The same bytes at every batch size: a short timing of small batches is mostly noise.
        # At least count batches and --loader-min-s: 60 batches of 38.5 MB were 0.5 s, and its runs spread
        # 0.94-1.20x; the dataset is long enough for 20x that many batches.
        count = max(self.args.loader_batches, self.args.loader_batches * 256 // bs)
        ds = images(bs * (self.args.loader_warmup + 20 * count + 2))
        dl = torch.utils.data.DataLoader(ds, batch_size=bs, num_workers=self.args.workers, pin_memory=self.pin,
                                         multiprocessing_context="fork" if self.args.workers else None)
        it = iter(dl)
        for _ in range(self.args.loader_warmup):
            x = next(it)
            if not self.dry:
                x.cuda(non_blocking=True)
            del x
        self.sync()
        del pin_s[:]
        t0 = time.perf_counter()
        pinned = done = 0
        while done < 20 * count and (done < count or time.perf_counter() - t0 < self.args.loader_min_s):
            x = next(it)
            pinned += bool(x.is_pinned())
            if not self.dry:
                x.cuda(non_blocking=True)
            del x
            done += 1
        self.sync()
        dt = time.perf_counter() - t0
        del it, dl
        gc.collect()
        self.values[f"c_{bs}"] = done / dt
        self.detail[f"c_{bs}_batches"] = done
        self.detail[f"c_{bs}_pinned"] = pinned
        if pin_s:  # without workers or pinning there is no pin thread
            self.values[f"cpin_{bs}"] = statistics.median(pin_s) * 1e3
            self.detail[f"cpin_{bs}_n"] = len(pin_s)

    # -- e: pinned bytes of live tensors against the page-rounded requests
    def exact_bytes(self) -> None:
        torch = self.torch
        page = os.sysconf("SC_PAGE_SIZE")
        self.empty_caches()
        client = None
        if self.alloc is not None:
            import pinbroker

            client = pinbroker.connect()
            try:
                page = int(client.status().get("page_size_bytes") or page)
            except Exception as e:
                self.detail["e_page_note"] = f"daemon page size unknown ({e}); using {page}"
        want = sum(_round_up(n, page) for n in EXACT_SIZES)
        self.detail.update(e_page=page, e_requested=sum(EXACT_SIZES), e_requested_rounded=want)

        def label_bytes() -> Optional[int]:
            if client is None:
                return None
            return sum(int(r["bytes"]) for r in client.leases() if r.get("label") == self.alloc.label)

        def host_reserved() -> Tuple[Optional[int], Optional[str]]:
            if self.dry:
                return None, None
            st = dict(torch.cuda.host_memory_stats())
            for key in ("reserved_bytes.current", "segment_bytes.current", "allocated_bytes.current"):
                if key in st:
                    return int(st[key]), key
            return None, None

        def settled_label_bytes() -> Optional[int]:
            # Blocks given back by empty_cache() leave the daemon's rows asynchronously: wait for a steady count.
            last, deadline = label_bytes(), time.monotonic() + 3.0
            while last is not None and time.monotonic() < deadline:
                time.sleep(0.1)
                cur = label_bytes()
                if cur == last:
                    break
                last = cur
            return last

        s0 = self.alloc.stats() if self.alloc is not None else {}
        d0 = settled_label_bytes()
        r0, _ = host_reserved()
        held = [torch.empty(n, dtype=torch.uint8, pin_memory=self.pin) for n in EXACT_SIZES]
        s1 = self.alloc.stats() if self.alloc is not None else {}
        d1 = label_bytes()
        r1, rkey = host_reserved()
        self.detail["e_all_pinned"] = all(t.is_pinned() for t in held)
        del held
        if self.alloc is not None:
            got = int(s1["leased_bytes"]) - int(s0["leased_bytes"])
            self.detail["e_leased_delta"] = got
            self.detail["e_fallbacks"] = int(s1.get("fallbacks", 0)) - int(s0.get("fallbacks", 0))
            self.values["e"] = got / want
            if d0 is not None and d1 is not None:
                self.detail["e_daemon_delta"] = d1 - d0
                self.values["e_daemon"] = (d1 - d0) / want
        elif r0 is not None and r1 is not None:
            self.detail.update(e_reserved_delta=r1 - r0, e_reserved_key=rkey)
            self.values["e"] = (r1 - r0) / want
        if client is not None:
            client.close()
        self.empty_caches()

    def run(self) -> Dict[str, Any]:
        torch = self.torch
        self.row("d", self.first_use)
        if self.side == "pinbroker" and self.alloc is None and not self.dry:
            # Without the allocator every other row would measure stock torch under the pinbroker name.
            return self.result()
        for name, fn in (("a", self.alloc_free), ("b", self.pin_h2d), ("c", self.loader), ("e", self.exact_bytes)):
            if name in self.args.rows:
                self.row(name, fn)
        if not self.dry:
            self.detail["host_memory_stats"] = _scalars(dict(torch.cuda.host_memory_stats()))
        return self.result()

    def result(self) -> Dict[str, Any]:
        torch = self.torch
        out: Dict[str, Any] = {"side": self.side, "round": self.args.round, "torch": torch.__version__,
                               "device": torch.cuda.get_device_name(0) if not self.dry else "cpu (dry)",
                               "values": self.values, "detail": self.detail, "errors": self.errors}
        if self.alloc is not None:
            st = self.alloc.stats()
            out["stats"] = _scalars(st)
            keys = [k for k in st if "cache" in k or "hit" in k or "miss" in k]
            print("allocator stats: " + ", ".join(f"{k} {st.get(k)}" for k in
                  ["allocations", "fallbacks", "released", "acquire_us_total", "release_us_total"] + keys),
                  file=sys.stderr, flush=True)
        return out


def fake_side(args: argparse.Namespace) -> Dict[str, Any]:
    """Made-up numbers, a function of the side and round only: the parent's CPU test checks its arithmetic."""
    if args.fake_fail == "crash" and args.side == "pinbroker":
        raise SystemExit("fake crash")
    if args.fake_fail == "nocuda":
        print("SKIP: no CUDA (fake)")
        raise SystemExit(SKIP)
    r = args.round
    pb = args.side == "pinbroker"
    v: Dict[str, Any] = {}
    for i, (n, _) in enumerate(ALLOC_SIZES):
        v[f"a_{n.replace(' ', '')}"] = (2.0 + r) * (1.5 if pb else 1.0) * (1 + i)  # ratio 1.5: met
    v["b"] = (2.0 + r) * (1.1 if pb else 1.0)  # ratio 1.1: not met
    for bs in LOADER_BATCHES:
        v[f"c_{bs}"] = 1000.0 / bs * (1 + r) * (1.25 if pb else 1.0)
        v[f"cpin_{bs}"] = bs / 100 * (1 + r) * (0.9 if pb else 1.0)
    v = {k: x for k, x in v.items() if k[0] in args.rows + "d"}
    v["d"] = (0.3 + 0.2 * r) if pb else 0.2  # pinbroker's worst round 0.7 (max over rounds): met
    v["e"] = 1.0 if pb else 1.5
    if pb:
        v["e_daemon"] = 1.0
    errors = {"c": "RuntimeError: fake"} if args.fake_fail == "rowerror" and pb else {}
    return {"side": args.side, "round": r, "torch": "fake", "device": "fake", "values": v,
            "detail": {"install_s": 0.1} if pb else {}, "errors": errors,
            "stats": {"allocations": 10, "cache_hits": 9} if pb else None}


def side_main(args: argparse.Namespace) -> int:
    if args.fake:
        res = fake_side(args)
    else:
        sys.path.insert(0, PYDIR)  # this checkout's pinbroker package
        try:
            import torch
            import torch.utils.data  # noqa: F401
        except ImportError as e:
            print(f"SKIP: no torch for {sys.executable}: {e}")
            return SKIP
        if not args.cpu_dry and not torch.cuda.is_available():
            print(f"SKIP: no CUDA device (torch {torch.__version__})")
            return SKIP
        res = Side(args).run()
    print(json.dumps(res, default=str), flush=True)
    return 0


# ---------------------------------------------------------------- the parent


def run_side(side: str, rnd: int, args: argparse.Namespace, passthrough: List[str],
             timeout_s: float) -> Tuple[int, Optional[Dict[str, Any]], str]:
    """Run one side in a fresh process; (exit status, its JSON line or None, the end of its output)."""
    env = dict(os.environ)
    env.pop("PINBROKER_TORCH", None)  # no side gets the allocator from sitecustomize; pinbroker installs it
    if side == "stock":
        env.pop("LD_PRELOAD", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--round", str(rnd)] + passthrough
    log = os.path.join(args.out, f"torch_alloc_bench.{side}.{rnd}.log")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
            f"\ntimed out after {timeout_s:.0f} s"
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\nexit {rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
    res = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                res = json.loads(line)
            except ValueError:
                pass
            break
    tail = "\n".join((out + "\n" + err).strip().splitlines()[-8:])
    return rc, res, tail


def combine(vals: List[float], how: str) -> Optional[float]:
    vals = [v for v in vals if isinstance(v, (int, float))]
    if not vals:
        return None
    return max(vals) if how == "max" else statistics.median(vals)


def round_ratios(results: Dict[str, List[Dict[str, Any]]], key: str) -> List[float]:
    """Pinbroker's value over stock's in each round where both sides have one, by round number (pooling runs
    means numbering their rounds apart first)."""
    by_round = {side: {r.get("round"): r["values"].get(key) for r in results[side]} for side in results}
    return [p / by_round["stock"][k] for k, p in sorted(by_round["pinbroker"].items())
            if isinstance(p, (int, float)) and isinstance(by_round["stock"].get(k), (int, float))
            and by_round["stock"][k]]


def paired_ratio(results: Dict[str, List[Dict[str, Any]]], key: str) -> Optional[float]:
    """The median of round_ratios; None under two. A round's two processes run one after the other, so a host
    that speeds up or slows down over a run moves both; the ratio of the two medians keeps such swings (row c's
    stock figures at 38.5 MB went 54-79 batches/s from round to round in one run), and crossed 1.0x both ways
    between runs of one host."""
    return _median_of_pairs(round_ratios(results, key))


def _median_of_pairs(ratios: List[float]) -> Optional[float]:
    return statistics.median(ratios) if len(ratios) >= 2 else None


def evaluate(results: Dict[str, List[Dict[str, Any]]], rows: str = "abcde") -> List[Dict[str, Any]]:
    """The table's rows from every side's rounds (those of the letters in rows, and d): values combined per row,
    the ratio of the medians, the paired ratio (paired_ratio), and the target met, judged on the paired ratio
    where there is one."""
    table = []
    for spec in ROWS:
        if spec["key"][0] not in rows + "d":
            continue
        how = spec.get("combine", "median")
        row: Dict[str, Any] = {"key": spec["key"], "name": spec["name"], "unit": spec["unit"], "kind": spec["kind"],
                               "target": spec["target"], "combine": how}
        for side in ("stock", "pinbroker"):
            vals = [r["values"].get(spec["key"]) for r in results[side]]
            row[side] = combine(vals, how)
            row[f"{side}_rounds"] = vals
        s, p = row["stock"], row["pinbroker"]
        kind, t = spec["kind"], spec["target"]
        # Row e compares each side with the request, not the sides with each other.
        both = isinstance(s, (int, float)) and isinstance(p, (int, float)) and s
        row["ratio"] = p / s if both and kind != "exact" else None
        ratios = round_ratios(results, spec["key"]) if kind in ("lower", "higher", "info") else []
        row["paired"] = _median_of_pairs(ratios)
        # How many rounds are on the target's side (an "info" row: pinbroker no slower): with 4-8 noisy rounds,
        # the median alone says little.
        bound = 1.0 if kind == "info" else t
        row["rounds_met"] = [sum(1 for x in ratios if (x >= bound if kind == "higher" else x <= bound)), len(ratios)]
        judged = row["paired"] if row["paired"] is not None else row["ratio"]
        if kind == "info":
            met = None
        elif kind == "lower":
            met = judged <= t if judged is not None else None
        elif kind == "higher":
            met = judged >= t if judged is not None else None
        elif kind == "abs":
            met = p <= t if p is not None else None
        else:
            met = round(p, 4) == round(t, 4) if p is not None else None
        row["met"] = met
        table.append(row)
    return table


def target_text(spec: Dict[str, Any]) -> str:
    t, kind = spec["target"], spec["kind"]
    if kind == "lower":
        return f"pinbroker <= {t:g}x stock"
    if kind == "higher":
        return f"pinbroker >= {t:g}x stock"
    if kind == "abs":
        return f"pinbroker <= {t:g} {spec['unit']}"
    if kind == "info":
        return "reported (lower is better)"
    return f"pinbroker = {t:.4f}"


def markdown(table: List[Dict[str, Any]], header: str, notes: List[str]) -> str:
    fmts = {s["key"]: s for s in ROWS}
    lines = [header, "", "| row | stock | pinbroker | ratio | paired | target | met |",
             "|---|---:|---:|---:|---:|---|---|"]
    for r in table:
        spec = fmts[r["key"]]

        def cell(v: Any) -> str:
            return (spec["fmt"].format(v) + f" {spec['unit']}") if isinstance(v, (int, float)) else "—"

        stock = "n/a" if spec.get("pinbroker_only") else cell(r["stock"])
        ratio, paired = (f"{r[k]:.3f}x" if r.get(k) is not None else "—" for k in ("ratio", "paired"))
        if r.get("paired") is not None:
            paired += " ({}/{} rounds)".format(*r["rounds_met"])
        met = "—" if r["kind"] == "info" else {True: "yes", False: "**no**", None: "?"}[r["met"]]
        lines.append(f"| {r['name']} | {stock} | {cell(r['pinbroker'])} | {ratio} | {paired} | {target_text(spec)} "
                     f"| {met} |")
    lines.append("")
    lines += notes
    return "\n".join(lines) + "\n"


def parent_main(args: argparse.Namespace) -> int:
    os.makedirs(args.out, exist_ok=True)
    passthrough: List[str] = []
    if args.fake:
        passthrough += ["--fake", "--fake-fail", args.fake_fail]
    if args.cpu_dry:
        passthrough.append("--cpu-dry")
    for name in ("workers", "loader_batches", "loader_warmup", "loader_min_s", "alloc_warmup", "alloc_pairs",
                 "alloc_min_s", "alloc_max_s", "pin_warmup", "pin_iters", "pin_max_s"):
        passthrough += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    passthrough += ["--rows", args.rows]
    results: Dict[str, List[Dict[str, Any]]] = {"stock": [], "pinbroker": []}
    crashed: List[str] = []
    dropped: List[str] = []
    rounds: List[Dict[str, Any]] = []
    t_all = time.perf_counter()
    for rnd in range(1, args.rounds + 1):
        # ABBA: a round's second process gains from a host that speeds up over the run (row c's stock figures at
        # 38.5 MB read 54-69 batches/s in rounds 1-4 of one run and 70-79 in rounds 5-8), so neither side is
        # always second.
        for side in ("stock", "pinbroker") if rnd % 2 else ("pinbroker", "stock"):
            t0 = time.perf_counter()
            left = args.total_s - (t0 - t_all)
            if left < 20:  # the whole run is bounded (the GPU host's call is): later rounds are dropped
                dropped.append(f"{side} round {rnd}: not run, --total-s {args.total_s:g} s spent")
                print(f"{side} round {rnd}: not run ({left:.0f} s left of --total-s)", flush=True)
                continue
            rc, res, tail = run_side(side, rnd, args, passthrough, min(args.side_timeout, left))
            took = time.perf_counter() - t0
            rounds.append({"side": side, "round": rnd, "exit": rc, "s": round(took, 2)})
            print(f"{side} round {rnd}: exit {rc} in {took:.1f} s", flush=True)
            if rc == SKIP:
                print(tail)
                print("SKIP: no CUDA for the sides")
                return SKIP
            if rc != 0 or res is None:
                crashed.append(f"{side} round {rnd}: exit {rc}: {tail}")
                print(tail, flush=True)
                continue
            for k, e in res.get("errors", {}).items():
                crashed.append(f"{side} round {rnd}: row {k}: {e}")
            if res.get("stats"):
                st = res["stats"]
                keys = ["allocations", "fallbacks", "released"] + sorted(k for k in st if "cache" in k or "hit" in k)
                print("  allocator stats: " + ", ".join(f"{k} {st.get(k)}" for k in keys), flush=True)
            results[side].append(res)
    table = evaluate(results, args.rows)
    any_res = (results["pinbroker"] or results["stock"] or [{}])[0]
    header = (f"## torch's pinned memory: stock against pinbroker.torch.install(), "
              f"torch {any_res.get('torch', '?')} on "
              f"{any_res.get('device', '?')} ({time.strftime('%Y-%m-%d', time.gmtime())}); "
              f"{len(results['stock'])}+{len(results['pinbroker'])} rounds, medians (row d: worst round)")
    notes = []
    pb = results["pinbroker"]
    if pb:
        det = pb[0].get("detail", {})
        notes.append("pinbroker first use per round: " + "; ".join(
            f"install {r['detail'].get('install_s', 0):.3f} s + "
            f"first alloc {r['detail'].get('first_alloc_s', 0):.3f} s "
            f"(CUDA init {r['detail'].get('cuda_init_s', 0):.3f} s apart)" for r in pb if r.get("detail")) +
            f"; extension {det.get('extension_path')} {det.get('build_kind', det.get('prebuilt', ''))}")
        st = pb[-1].get("stats") or {}
        if st:
            keys = ["allocations", "fallbacks", "released"] + sorted(k for k in st if "cache" in k or "hit" in k)
            notes.append("allocator stats (last round): " + ", ".join(f"{k} {st.get(k)}" for k in keys))
    notes += [f"NOTE {d}" for d in dropped]
    notes += [f"ERROR {c}" for c in crashed]
    md = markdown(table, header, notes)
    with open(os.path.join(args.out, "torch_alloc_bench.json"), "w") as f:
        json.dump({"table": table, "rounds": rounds, "sides": results, "errors": crashed, "dropped": dropped,
                   "wall_s": round(time.perf_counter() - t_all, 1)}, f, indent=1, default=str)
    with open(os.path.join(args.out, "torch_alloc_bench.md"), "w") as f:
        f.write(md)
    print()
    print(md)
    return 1 if crashed else 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--side", choices=["stock", "pinbroker"], help="run one side (the parent runs these)")
    ap.add_argument("--round", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2, help="stock+pinbroker pairs of sides (default 2)")
    ap.add_argument("--out", default=os.environ.get("OUT") or ".", help="results folder (default $OUT, else .)")
    ap.add_argument("--side-timeout", type=float, default=150.0, help="seconds one side may take (default 150)")
    ap.add_argument("--total-s", type=float, default=240.0, help="seconds all sides may take (default 240)")
    ap.add_argument("--rows", default="abcde", help="the rows to run, as letters (default abcde; d always runs: "
                    "it installs the allocator)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--loader-batches", type=int, default=60, help="timed batches at 38.5 MB (more when smaller)")
    ap.add_argument("--loader-warmup", type=int, default=5)
    ap.add_argument("--loader-min-s", type=float, default=1.5, help="row c times each batch size at least this long")
    ap.add_argument("--alloc-warmup", type=int, default=200)
    ap.add_argument("--alloc-pairs", type=int, default=2000)
    ap.add_argument("--alloc-min-s", type=float, default=0.25)
    ap.add_argument("--alloc-max-s", type=float, default=1.0)
    ap.add_argument("--pin-warmup", type=int, default=10)
    ap.add_argument("--pin-iters", type=int, default=100)
    ap.add_argument("--pin-max-s", type=float, default=1.5)
    ap.add_argument("--fake", action="store_true", help="sides print made-up numbers (tests the parent; no torch)")
    ap.add_argument("--fake-fail", choices=["none", "crash", "nocuda", "rowerror"], default="none",
                    help=argparse.SUPPRESS)
    ap.add_argument("--cpu-dry", action="store_true", help="run the sides on a CPU torch: no pinning, no copies")
    args = ap.parse_args(argv)
    if not args.rows or set(args.rows) - set("abcde"):
        ap.error(f"--rows {args.rows!r}: give letters of a-e, e.g. --rows c")
    if args.side:
        return side_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
