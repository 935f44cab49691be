#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch beside pinbroker: torch's own pinned allocation timed, and a broker lease wrapped as a tensor (ctypes on libpinbroker.so) checked for is_pinned() and non_blocking copy speed."""
import argparse
import ctypes
import statistics
import sys
import time


def parse_size(s):
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(float(s[:-1]) * mul[s[-1]]) if s[-1] in mul else int(s)


def label(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return f"{b}B"


def result(section, **kv):
    print("RESULT " + section + " " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)


class Broker:
    """The few libpinbroker calls this check needs."""

    def __init__(self, lib_path, socket):
        self.lib = ctypes.CDLL(lib_path)
        L = self.lib
        vp = ctypes.c_void_p
        L.pb_connect.argtypes = [ctypes.c_char_p, ctypes.POINTER(vp)]
        L.pb_connect.restype = ctypes.c_int
        L.pb_acquire.argtypes = [vp, ctypes.c_size_t, vp, ctypes.POINTER(vp)]
        L.pb_acquire.restype = ctypes.c_int
        L.pb_release.argtypes = [vp, vp]
        L.pb_release.restype = ctypes.c_int
        L.pb_disconnect.argtypes = [vp]
        L.pb_disconnect.restype = None
        L.pb_lease_data.argtypes = [vp]
        L.pb_lease_data.restype = vp
        L.pb_lease_size.argtypes = [vp]
        L.pb_lease_size.restype = ctypes.c_size_t
        L.pb_lease_kind.argtypes = [vp]
        L.pb_lease_kind.restype = ctypes.c_int
        L.pb_lease_id.argtypes = [vp]
        L.pb_lease_id.restype = ctypes.c_uint64
        L.pb_last_error.argtypes = []
        L.pb_last_error.restype = ctypes.c_char_p
        self.c = vp()
        r = L.pb_connect(socket.encode(), ctypes.byref(self.c))
        if r != 0:
            raise OSError(-r, "pb_connect: " + L.pb_last_error().decode())

    def acquire(self, size):
        lease = ctypes.c_void_p()
        r = self.lib.pb_acquire(self.c, size, None, ctypes.byref(lease))
        if r != 0:
            raise OSError(-r, "pb_acquire: " + self.lib.pb_last_error().decode())
        return lease

    def close(self):
        self.lib.pb_disconnect(self.c)


def time_copies(torch, dst, src, reps):
    """Median GB/s (events) and median host-side call time (us) of dst.copy_(src, non_blocking=True)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    gbs, call_us = [], []
    for _ in range(reps):
        e0.record()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        call_us.append((time.perf_counter() - t0) * 1e6)
        e1.record()
        e1.synchronize()
        gbs.append(src.numel() * src.element_size() / 1e9 / (e0.elapsed_time(e1) / 1e3))
    return statistics.median(gbs), statistics.median(call_us)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", required=True, help="path of libpinbroker.so")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--sizes", default="2M,64M,1G", help="sizes for torch.empty(pin_memory=True) timing")
    ap.add_argument("--bw-size", default="1G")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()

    import torch

    print(f"META torch={torch.__version__} (CUDA {torch.version.cuda})", flush=True)
    if not torch.cuda.is_available():
        print("SKIP: torch sees no GPU")
        return 77

    # --- torch's own pinned allocation, first call at each size, in a fresh process
    t0 = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    result("setup", method="torch-cuda-init", size="-", n=1, first_ms=f"{(time.perf_counter() - t0) * 1e3:.3f}",
           median_ms=f"{(time.perf_counter() - t0) * 1e3:.3f}")
    t0 = time.perf_counter()
    tiny = torch.empty(1, dtype=torch.uint8, pin_memory=True)
    result("setup", method="torch-pin-init", size="1B", n=1, first_ms=f"{(time.perf_counter() - t0) * 1e3:.3f}",
           median_ms=f"{(time.perf_counter() - t0) * 1e3:.3f}")
    keep = [tiny]
    for s in (parse_size(x) for x in a.sizes.split(",")):
        t0 = time.perf_counter()
        x = torch.empty(s, dtype=torch.uint8, pin_memory=True)
        ms = (time.perf_counter() - t0) * 1e3
        result("setup", method="torch.empty(pin_memory=True)", size=label(s), bytes=s, n=1, first_ms=f"{ms:.4f}",
               median_ms=f"{ms:.4f}")
        del x  # back to torch's host cache
        cached = []
        for _ in range(51):
            t0 = time.perf_counter()
            y = torch.empty(s, dtype=torch.uint8, pin_memory=True)
            cached.append((time.perf_counter() - t0) * 1e6)
            del y
        result("setup", method="torch-pinned-cached", size=label(s), bytes=s, n=len(cached), unit="us",
               first_ms=f"{cached[0]:.3f}", median_ms=f"{statistics.median(cached):.3f}")
    del keep

    # --- a broker lease as a tensor
    size = parse_size(a.bw_size)
    br = Broker(a.lib, a.socket)
    lease = br.acquire(size)
    ptr, lsize, kind = br.lib.pb_lease_data(lease), br.lib.pb_lease_size(lease), br.lib.pb_lease_kind(lease)
    buf = (ctypes.c_uint8 * lsize).from_address(ptr)
    t = torch.frombuffer(buf, dtype=torch.uint8)
    pinned = t.is_pinned()
    same = t.pin_memory().data_ptr() == t.data_ptr()
    dev = torch.empty(lsize, dtype=torch.uint8, device="cuda")
    ref = torch.randint(0, 256, (lsize,), dtype=torch.uint8, device="cuda")
    t.copy_(ref, non_blocking=True)
    torch.cuda.synchronize()
    dev.copy_(t, non_blocking=True)
    torch.cuda.synchronize()
    data_ok = bool(torch.equal(dev, ref))
    del ref
    h2d, h2d_call = time_copies(torch, dev, t, a.reps)
    d2h, _ = time_copies(torch, t, dev, a.reps)
    result("torch", source="broker-lease", size=label(lsize), lease_kind=kind, is_pinned=pinned,
           pin_memory_same_ptr=same, data_ok=data_ok, h2d_gbs=f"{h2d:.2f}", d2h_gbs=f"{d2h:.2f}",
           h2d_call_us=f"{h2d_call:.1f}", reps=a.reps)
    del t, buf
    r = br.lib.pb_release(br.c, lease)
    br.close()

    p = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    h2d, h2d_call = time_copies(torch, dev, p, a.reps)
    d2h, _ = time_copies(torch, p, dev, a.reps)
    result("torch", source="torch-pinned", size=label(size), lease_kind="-", is_pinned=p.is_pinned(),
           pin_memory_same_ptr=p.pin_memory().data_ptr() == p.data_ptr(), data_ok="-", h2d_gbs=f"{h2d:.2f}",
           d2h_gbs=f"{d2h:.2f}", h2d_call_us=f"{h2d_call:.1f}", reps=a.reps)
    del p
    q = torch.ones(size, dtype=torch.uint8)
    h2d, h2d_call = time_copies(torch, dev, q, a.reps)
    d2h, _ = time_copies(torch, q, dev, a.reps)
    result("torch", source="torch-pageable", size=label(size), lease_kind="-", is_pinned=q.is_pinned(),
           pin_memory_same_ptr=False, data_ok="-", h2d_gbs=f"{h2d:.2f}", d2h_gbs=f"{d2h:.2f}",
           h2d_call_us=f"{h2d_call:.1f}", reps=a.reps)
    return 0 if pinned and data_ok and r == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
