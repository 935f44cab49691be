#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Where a 1 GiB D2H into memory torch already holds (``held.copy_(cuda)``) spends its time, one process: the
same copy several ways, each the median of REPS (default 5) GB/s. Run it bare and under ``pinctl run --no-torch``
(and with PINBROKER_STAGING_THREADS / PINBROKER_STAGING_STREAM_STORES set) to compare the interposer's staging
with the driver's; bench/results/h100-2026-12-07-held-copy-diag.txt has such runs.

  A  a pinned tensor's copy_ (the ceiling)             E  cuMemcpyDtoH (ctypes) into held, after fill_ and idle
  B  held.copy_ right after held.fill_ (as bench_staging_torch.py's row)      F  a numpy-allocated tensor's copy_
  C  held.copy_ again, no fill_ between               G  cuMemcpyDtoH into numpy memory
  D  held.copy_ after fill_ and 0.3 s idle            H  B with torch's intra-op threads at 1

usage: held_copy_probe.py [PINCTL]     (PINCTL: print its staging status at the end)
"""
import ctypes
import os
import statistics
import sys
import time

import numpy as np
import torch

GIB = 1 << 30
REPS = int(os.environ.get("REPS", "5"))
dev = torch.device("cuda")
y = torch.arange(GIB, dtype=torch.int64, device=dev).to(torch.uint8)
torch.cuda.synchronize()
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
ref = y.cpu()


def timed(fn, pre=None):
    rates = []
    for _ in range(REPS):
        if pre:
            pre()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        rates.append(GIB / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates), min(rates), max(rates)


def row(name, r):
    print(f"{name:58s} {r[0]:6.2f} GB/s  (min {r[1]:.2f} max {r[2]:.2f})", flush=True)


pin = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
row("A pinned p.copy_(y)", timed(lambda: pin.copy_(y)))
held = torch.ones(GIB, dtype=torch.uint8)
row("B held.copy_(y) after fill_(0) [bench]", timed(lambda: held.copy_(y), lambda: held.fill_(0)))
assert torch.equal(held, ref), "B differs"
row("C held.copy_(y), no fill_", timed(lambda: held.copy_(y)))
row("D held.copy_(y) after fill_(0) + 0.3 s idle", timed(lambda: held.copy_(y), lambda: (held.fill_(0), time.sleep(0.3))))
hp = held.data_ptr()
row("E cuMemcpyDtoH into held (ctypes) after fill_+idle",
    timed(lambda: cuda.cuMemcpyDtoH_v2(hp, y.data_ptr(), GIB), lambda: (held.fill_(0), time.sleep(0.3))))
assert torch.equal(held, ref), "E differs"
a = np.ones(GIB, dtype=np.uint8)
ta = torch.from_numpy(a)
row("F numpy-allocated dst .copy_(y) after a.fill(0)", timed(lambda: ta.copy_(y), lambda: a.fill(0)))
assert torch.equal(ta, ref), "F differs"
ap = a.ctypes.data
row("G cuMemcpyDtoH into numpy dst", timed(lambda: cuda.cuMemcpyDtoH_v2(ap, y.data_ptr(), GIB)))
print("alignment: held %% 4096 = %d, numpy %% 4096 = %d" % (hp % 4096, ap % 4096))
torch.set_num_threads(1)
row("H torch threads 1: held.copy_(y) after fill_(0)", timed(lambda: held.copy_(y), lambda: held.fill_(0)))
with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
    print("THP:", f.read().strip())
for line in open(f"/proc/{os.getpid()}/smaps_rollup"):
    if "AnonHuge" in line or line.startswith("Rss"):
        print(line.strip())
if len(sys.argv) > 1:
    os.system(sys.argv[1] + " status 2>&1 | tail -3")
