#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""GPU checks of pinbroker.torch.install() (torch's host allocator backed by pinbrokerd), and what pinned memory
it takes against stock torch.

Checks, with the allocator installed:
- torch.empty(n, pin_memory=True), Tensor.pin_memory() and a DataLoader(pin_memory=True, num_workers=2) batch
  are pinned and were allocated through it;
- data survive a non_blocking H2D copy and a non_blocking D2H copy back into a pinned tensor;
- a block freed while its copy may still run is given back only after the copy's event completed;
- each lease the daemon lists (Client.status, as ``pinctl leases``) is the request rounded to the daemon's page;
- after del + empty_cache the daemon's leased bytes are back at their baseline.
Then, for 129.5e6 bytes, 2.08 GiB and 4.1 GiB, the pinned memory one tensor takes: stock torch (a subprocess
without the allocator; torch.cuda.host_memory_stats()) against the daemon's leased bytes with it. A table
with the ratio to the request is printed last.

Needs a CUDA torch >= 2.8, libpinbroker (PINBROKER_LIBRARY or the checkout's build), and a pinbrokerd on
$PINBROKER_SOCKET whose budget, uid quota and max-no-revoke-per-uid hold 4.1 GiB (and 2 GiB more for the other
checks), e.g. ``pinbrokerd --socket /tmp/pb.sock --budget 16G --max-no-revoke-per-uid 100% --hugetlb no``.
The first run builds the extension (20-40 s on the H200 host; TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions).
Exits 0 when every check passed, 1 when one failed, 77 without CUDA or without a daemon. ``--out DIR``
writes torch_alloc_check.json there.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
sys.path.insert(0, PYDIR)  # this checkout's python/ (the pinbroker package)

try:
    import torch
    import torch.utils.data
except ImportError as _e:
    print(f"SKIP: no torch for {sys.executable}: {_e}")
    sys.exit(77)

GIB = 1 << 30
SIZES = [("129.5e6 B", 129_500_000), ("2.08 GiB", int(2.08 * GIB)), ("4.1 GiB", int(4.1 * GIB))]
SKIP = 77

# Run in a subprocess: stock torch (no pinbroker), one pinned tensor of argv[1] bytes, what torch took.
STOCK = r"""
import json, sys, time, torch
n = int(sys.argv[1])
torch.cuda.init()
t0 = time.perf_counter()
x = torch.empty(n, dtype=torch.uint8, pin_memory=True)
dt = time.perf_counter() - t0
st = dict(torch.cuda.host_memory_stats())
reserved = None
for key in ("reserved_bytes.current", "segment_bytes.current", "allocated_bytes.current"):
    if key in st:
        reserved = int(st[key]); break
print(json.dumps({"pinned": bool(x.is_pinned()), "reserved": reserved, "alloc_s": dt, "key": key,
                  "stats": {k: v for k, v in st.items() if isinstance(v, (int, float))}}))
"""


class Checks:
    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []
        self.failed = 0

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.rows.append({"check": name, "ok": bool(ok), "detail": detail})
        if not ok:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'}: {name}: {detail}", flush=True)
        return bool(ok)


def round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class Daemon:
    """Figures from the daemon the allocator uses, over a separate Client."""

    def __init__(self, client: Any, label: str) -> None:
        self.client = client
        self.label = label

    def leased(self) -> int:
        return int(self.client.status()["leased_bytes"])

    def page(self) -> int:
        return int(self.client.status()["page_size_bytes"]) or 4096

    def ours(self) -> List[Dict[str, Any]]:
        return [row for row in self.client.leases() if row.get("label") == self.label]

    def wait_leased(self, want: int, timeout_s: float = 10.0) -> int:
        deadline = time.monotonic() + timeout_s
        got = self.leased()
        while got != want and time.monotonic() < deadline:
            time.sleep(0.02)
            got = self.leased()
        return got


def stock_pinned(n: int) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PINBROKER_TORCH"}
    r = subprocess.run([sys.executable, "-c", STOCK, str(n)], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]}
    return json.loads(r.stdout.strip().splitlines()[-1])


class Pairs(torch.utils.data.Dataset):
    """Item i is a float tensor of 4096 copies of i: checkable after pinning."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        return torch.full((4096,), float(i))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write torch_alloc_check.json here")
    ap.add_argument("--no-large", action="store_true", help="skip the 2.08 GiB and 4.1 GiB measurements")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print(f"SKIP: no CUDA device (torch {torch.__version__}, torch.version.cuda {torch.version.cuda})")
        return SKIP
    import pinbroker
    import pinbroker.torch_alloc as ta

    try:
        client = pinbroker.connect()
    except OSError as e:
        print(f"SKIP: no pinbrokerd on $PINBROKER_SOCKET ({os.environ.get('PINBROKER_SOCKET')}): {e}")
        return SKIP

    checks = Checks()
    label = f"torch-check:{os.getpid()}"
    # Pinned by stock torch before install: its copies' events must reach torch's allocator afterwards.
    pre = torch.full((1 << 20,), 7, dtype=torch.uint8, pin_memory=True)
    t0 = time.perf_counter()
    try:
        alloc = ta.install(label=label, verbose=bool(os.environ.get("PB_VERBOSE_BUILD")))
    except RuntimeError as e:
        checks.add("install", False, str(e))
        return 1
    checks.add("install", alloc.installed, f"{alloc!r} in {time.perf_counter() - t0:.1f} s (includes build/load)")
    checks.add("install is idempotent", ta.install() is alloc, "a second install() returned the same allocator")
    d = Daemon(client, label)
    page = d.page()
    torch.cuda.init()
    baseline = d.leased()
    print(f"daemon: page {page} B, leased at start {baseline} B, lib {ta._lib.path()}")

    # -- torch.empty(pin_memory=True)
    n = 10_000_001
    s0 = alloc.stats()
    x = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    s1 = alloc.stats()
    rows = d.ours()
    checks.add("empty(pin_memory=True) is pinned", x.is_pinned(), f"is_pinned() {x.is_pinned()}")
    checks.add("empty(pin_memory=True) went through the broker", s1["allocations"] == s0["allocations"] + 1
               and s1["fallbacks"] == s0["fallbacks"], f"allocations {s0['allocations']} -> {s1['allocations']}, "
               f"fallbacks {s1['fallbacks']} ({s1['last_fallback']})")
    sizes = sorted(int(r["bytes"]) for r in rows)
    checks.add("the lease is the request, page-rounded", sizes == [round_up(n, page)],
               f"daemon lists {sizes} for {n} B (page {page})")
    checks.add("the lease is never revoked", all(r.get("no_revoke", True) for r in rows),
               f"no_revoke {[r.get('no_revoke') for r in rows]}")
    hs = dict(torch.cuda.host_memory_stats())
    checks.add("torch.cuda.host_memory_stats() reads it",
               any(k.startswith(("allocated_bytes", "active_bytes")) and v in (n, round_up(n, page))
                   for k, v in hs.items()),
               f"{ {k: v for k, v in hs.items() if 'bytes' in k} }")

    # -- H2D and D2H non_blocking, data intact
    x.copy_(torch.arange(n, dtype=torch.int64).remainder_(251).to(torch.uint8))
    want = x.clone()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev.copy_(x, non_blocking=True)
    back = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    back.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    checks.add("non_blocking H2D then D2H keeps the data", torch.equal(back, want) and torch.equal(dev.cpu(), want),
               f"{n} bytes")
    s2 = alloc.stats()
    checks.add("non_blocking copies recorded events", s2["events_recorded"] >= s1["events_recorded"] + 2,
               f"events_recorded {s1['events_recorded']} -> {s2['events_recorded']}")

    # -- memory of torch's own allocator, after install: record_event is passed on to it
    pre_dev = torch.empty_like(pre, device="cuda")
    s0 = alloc.stats()
    pre_dev.copy_(pre, non_blocking=True)
    pre_back = torch.empty(pre.numel(), dtype=torch.uint8, pin_memory=True)
    pre_back.copy_(pre_dev, non_blocking=True)
    torch.cuda.synchronize()
    s1 = alloc.stats()
    checks.add("a tensor pinned before install still copies (its event goes to torch's allocator)",
               torch.equal(pre_back, pre) and s1["events_recorded"] == s0["events_recorded"] + 1,
               f"events recorded here {s0['events_recorded']} -> {s1['events_recorded']} (one: pre_back's)")
    del pre, pre_dev, pre_back

    # -- Tensor.pin_memory()
    src = torch.arange(1 << 20, dtype=torch.float32)
    s0 = alloc.stats()
    pm = src.pin_memory()
    s1 = alloc.stats()
    checks.add("Tensor.pin_memory() is pinned and went through the broker", pm.is_pinned() and torch.equal(pm, src)
               and s1["allocations"] == s0["allocations"] + 1, f"is_pinned {pm.is_pinned()}, allocations "
               f"{s0['allocations']} -> {s1['allocations']}")

    # -- a block freed while its copy runs waits for the copy's event
    big_n = 512 << 20
    big = torch.ones(big_n, dtype=torch.uint8, pin_memory=True)
    gdst = torch.empty(big_n, dtype=torch.uint8, device="cuda")
    # Queue work ahead of the copy on the same stream so it cannot be done when del returns.
    spin = torch.empty(4096, 4096, device="cuda")
    for _ in range(20):
        spin = spin @ spin
    gdst.copy_(big, non_blocking=True)
    leased_before = d.leased()
    del big
    s_after_del = alloc.stats()
    held = d.leased()
    torch.cuda.synchronize()
    alloc.empty_cache()
    s_done = alloc.stats()
    checks.add("a freed block waits for its copy", s_after_del["blocks_waiting"] >= 1 and held == leased_before,
               f"right after del: blocks_waiting {s_after_del['blocks_waiting']}, events_pending "
               f"{s_after_del['events_pending']}, leased {held} (was {leased_before})")
    checks.add("and goes back once it completed", s_done["blocks_waiting"] == 0
               and d.wait_leased(leased_before - round_up(big_n, page)) == leased_before - round_up(big_n, page),
               f"blocks_waiting {s_done['blocks_waiting']}, released {s_done['released']}")
    checks.add("the copy saw the data", int(gdst.sum(dtype=torch.int64).item()) == big_n, "sum of ones")
    del gdst, spin

    # -- DataLoader(pin_memory=True, num_workers=2): the pin thread allocates through it
    s0 = alloc.stats()
    loader = torch.utils.data.DataLoader(Pairs(), batch_size=8, num_workers=2, pin_memory=True)
    batches = list(loader)
    s1 = alloc.stats()
    ok_vals = all(torch.equal(b[:, 0], torch.arange(8 * i, 8 * i + 8, dtype=torch.float32))
                  for i, b in enumerate(batches))
    checks.add("DataLoader(pin_memory=True, num_workers=2) batches are pinned, through the broker",
               all(b.is_pinned() for b in batches) and ok_vals
               and s1["allocations"] >= s0["allocations"] + len(batches),
               f"{len(batches)} batches, allocations {s0['allocations']} -> {s1['allocations']}, values ok {ok_vals}")
    del batches, loader

    # -- CUDA graph capture: torch 2.11 calls the host allocator's begin/end_allocate_to_pool at every capture
    try:
        xg = torch.ones(1 << 16, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            yg = xg * 2  # warm-up outside the capture, as torch's docs ask
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = xg * 2
        xg.fill_(3)
        g.replay()
        torch.cuda.synchronize()
        ok = int(yg.sum().item()) == 6 * (1 << 16)
        checks.add("CUDA graph capture and replay work with the allocator installed", ok,
                   f"sum {int(yg.sum().item())}, want {6 * (1 << 16)}")
        del g, xg, yg
    except Exception as e:
        checks.add("CUDA graph capture and replay work with the allocator installed", False,
                   f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    # -- a fallback is counted: pinned memory torch's own allocator takes during a graph capture is reported to
    #    the daemon as unbrokered (no interposer in this process to count it)
    try:
        s0 = alloc.stats()
        side = torch.cuda.Stream()
        g2 = torch.cuda.CUDAGraph()
        xg = torch.ones(1 << 16, device="cuda")
        with torch.cuda.graph(g2, stream=side):
            yg = xg + 1
            hp = torch.empty(4 << 20, dtype=torch.uint8, pin_memory=True)
        s1 = alloc.stats()
        unbrokered = int(client.status().get("unbrokered_bytes", 0))
        checks.add("a fallback's pinned bytes are reported as unbrokered",
                   s1["fallbacks"] > s0["fallbacks"] and s1["unbrokered_reported_bytes"] >= (4 << 20)
                   and unbrokered >= (4 << 20),
                   f"fallbacks {s0['fallbacks']} -> {s1['fallbacks']} ({s1['last_fallback']}), reported "
                   f"{s1['unbrokered_reported_bytes']} B, daemon's unbrokered {unbrokered} B")
        del g2, xg, yg, hp
    except Exception as e:
        checks.add("a fallback's pinned bytes are reported as unbrokered", False,
                   f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    # -- the cache of freed blocks: the same size again is the same block, without a new lease
    s0 = alloc.stats()
    t1 = torch.empty(3_000_001, dtype=torch.uint8, pin_memory=True)
    p1 = t1.data_ptr()
    del t1
    t2 = torch.empty(3_000_001, dtype=torch.uint8, pin_memory=True)
    s1 = alloc.stats()
    checks.add("a freed block is reused for the same size", t2.data_ptr() == p1
               and s1["cache_hits"] >= s0["cache_hits"] + 1, f"same address {t2.data_ptr() == p1}, cache_hits "
               f"{s0['cache_hits']} -> {s1['cache_hits']}, cap {s1['cache_cap_bytes']} B")
    t3 = torch.empty(3_000_001 + page, dtype=torch.uint8, pin_memory=True)
    s2 = alloc.stats()
    checks.add("a different page-rounded size is a new lease (slack 0)", t3.data_ptr() != p1
               and s2["cache_misses"] >= s1["cache_misses"] + 1, f"cache_misses {s1['cache_misses']} -> "
               f"{s2['cache_misses']}")
    del t2, t3

    # -- everything back after del + empty_cache
    del x, back, dev, pm, want, src
    gc.collect()
    torch.cuda.synchronize()
    alloc.empty_cache()
    end = d.wait_leased(baseline)
    st = alloc.stats()
    checks.add("all given back after del + empty_cache", end == baseline and st["live_blocks"] == 0
               and st["blocks_waiting"] == 0, f"leased {end} (baseline {baseline}), live_blocks {st['live_blocks']}, "
               f"blocks_waiting {st['blocks_waiting']}, release_errors {st['release_errors']}")

    # -- pinned memory taken per tensor: stock torch against the broker
    table = []
    for name, size in SIZES:
        if args.no_large and size > GIB:
            continue
        stock = stock_pinned(size)
        base = d.leased()
        t0 = time.perf_counter()
        t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        alloc_s = time.perf_counter() - t0
        taken = d.leased() - base
        st = alloc.stats()
        pinned = t.is_pinned()
        del t
        alloc.empty_cache()
        back_to = d.wait_leased(base)
        row = {"size": name, "request": size, "stock_bytes": stock.get("reserved"),
               "stock_s": stock.get("alloc_s"), "stock_pinned": stock.get("pinned"), "stock_error": stock.get("error"),
               "broker_bytes": taken, "broker_s": alloc_s, "broker_pinned": pinned, "fallbacks": st["fallbacks"]}
        table.append(row)
        checks.add(f"{name}: the broker takes the request page-rounded", taken == round_up(size, page) and pinned,
                   f"took {taken} B for {size} B, is_pinned {pinned}, fallbacks {st['fallbacks']} "
                   f"({st['last_fallback']})")
        checks.add(f"{name}: given back", back_to == base, f"leased {back_to} (before {base})")

    # -- uninstall: new pinned memory is torch's again; install() puts this one back
    s0 = alloc.stats()
    was = alloc.uninstall()
    t = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    s1 = alloc.stats()
    checks.add("uninstall() gives new allocations back to torch", was and not alloc.installed and t.is_pinned()
               and s1["allocations"] == s0["allocations"], f"uninstall {was}, allocations {s0['allocations']} -> "
               f"{s1['allocations']}, is_pinned {t.is_pinned()}")
    del t
    again = ta.install()
    t = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    s2 = alloc.stats()
    checks.add("install() after uninstall() takes over again", again is alloc and alloc.installed
               and s2["allocations"] == s1["allocations"] + 1,
               f"allocations {s1['allocations']} -> {s2['allocations']}")
    del t
    alloc.empty_cache()
    if hasattr(torch.cuda, "reset_peak_host_memory_stats"):
        peak = alloc.stats()["peak_leased_bytes"]
        torch.cuda.reset_peak_host_memory_stats()
        st = alloc.stats()
        checks.add("torch.cuda.reset_peak_host_memory_stats() resets this allocator's peaks",
                   st["peak_leased_bytes"] == st["leased_bytes"], f"peak {peak} -> {st['peak_leased_bytes']}")

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "torch_alloc_check.json"), "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "page": page,
                       "checks": checks.rows, "table": table, "stats": alloc.stats()}, f, indent=1, default=str)

    print()
    print(f"## pinned bytes per tensor, torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print()
    print("| request | stock torch | ratio | alloc s | pinbroker | ratio | alloc s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in table:
        sb: Optional[int] = r["stock_bytes"]
        stock_cell = f"{sb / GIB:.3f} GiB" if sb else f"? ({r['stock_error'] or 'no host_memory_stats key'})"
        stock_ratio = f"{sb / r['request']:.3f}" if sb else "?"
        stock_s = f"{r['stock_s']:.3f}" if r["stock_s"] is not None else "?"
        print(f"| {r['size']} ({r['request']} B) | {stock_cell} | {stock_ratio} | {stock_s} | "
              f"{r['broker_bytes'] / GIB:.3f} GiB | {r['broker_bytes'] / r['request']:.4f} | {r['broker_s']:.3f} |")
    print()
    print(f"{len(checks.rows) - checks.failed}/{len(checks.rows)} checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
