#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Why can H2D copies from pinbroker memory be slower than from torch's pinned tensor? (issue 25, part 3)

The pinned DataLoader's yielded 38.5 MB batches copied at 48.8 GB/s against 54.7 GB/s from torch's pinned tensor
on an H200 (0.893x), 0.977x on an H100. This probe measures H2D GB/s (CUDA events; per source the median of
--rounds x --reps copies, the sources interleaved round by round) of 38.5 MB and 256 MiB from:

  1. torch.empty(n, pin_memory=True), stock torch (cudaHostAlloc; the allocator is not installed here);
  2. a plain lease, pinbroker.Client().acquire(n), viewed with Lease.tensor();
  3. one lease of n + 2 MiB + 4 KiB, viewed at offsets 0, 4 KiB, 64 KiB and 2 MiB + 4 KiB;
  4. a batch yielded by pinbroker.torch.DataLoader (8 fork workers, 256 images of 3x224x224 uint8: 38.5 MB only),
     (a) while its workers are producing the next batches (a batch is taken and dropped before each copy) and
     (b) once they are idle (the prefetch queue full, nothing taken), each phase with source 1 interleaved so
     that memory-bandwidth contention from the workers shows in both or only in one;
  5. ordinary pageable memory (the floor).

Facts printed with them: per source the address modulo 4 KiB / 64 KiB / 2 MiB, is_pinned(), the lease's kind,
hugetlb, page size and chunks, /proc/self/smaps of the mapping (KernelPageSize, AnonHugePages, ShmemPmdMapped,
FilePmdMapped, Locked, VmFlags; whole mappings), the NUMA nodes of its pages (move_pages on up to 64 pages of the
range) against the GPU's (/sys/bus/pci/devices/<gpu>/numa_node, local_cpulist, `nvidia-smi topo -m`), this
process's CPU and affinity, the THP settings, how physically contiguous each range is (/proc/self/pagemap, as
root) and its cuMemHostGetFlags. Writes h2d_probe.json and h2d_probe.md to --out ($OUT).

Needs a CUDA torch, libpinbroker and a pinbrokerd on $PINBROKER_SOCKET (python/bench/run-torch-bench.sh starts
one). Exit 0 (a probe reports), 1 when a source failed, 77 without CUDA or daemon. ``--cpu-dry`` runs it on a
CPU torch with host-to-host copies (a smoke test of everything but CUDA). About 30 s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's pinbroker package

SKIP = 77
KIB, MIB = 1 << 10, 1 << 20
IMAGE = (3, 224, 224)
BATCH = 256
BATCH_BYTES = BATCH * 3 * 224 * 224  # 38,535,168
OFFSETS = [("+0", 0), ("+4 KiB", 4 * KIB), ("+64 KiB", 64 * KIB), ("+2 MiB+4 KiB", 2 * MIB + 4 * KIB)]
SMAPS_KEYS = ("Rss", "KernelPageSize", "MMUPageSize", "AnonHugePages", "ShmemPmdMapped", "FilePmdMapped", "Locked")
SYS_MOVE_PAGES = {"x86_64": 279, "aarch64": 239}


# ---------------------------------------------------------------- facts (pure parsers take text: tested on CPU)


def parse_smaps(text: str) -> List[Dict[str, Any]]:
    """/proc/PID/smaps as a list of mappings: start, end, path, the kB fields, and VmFlags."""
    out: List[Dict[str, Any]] = []
    cur: Optional[Dict[str, Any]] = None
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and ":" not in head[0]:
            try:
                a, b = (int(x, 16) for x in head[0].split("-"))
            except ValueError:
                continue
            cur = {"start": a, "end": b, "path": head[5] if len(head) > 5 else "", "kb": {}, "flags": ""}
            out.append(cur)
        elif cur is not None and line.startswith("VmFlags:"):
            cur["flags"] = line.split(":", 1)[1].strip()
        elif cur is not None and ":" in line:
            k, v = line.split(":", 1)
            parts = v.split()
            if parts and parts[0].isdigit():
                cur["kb"][k] = int(parts[0])
    return out


def smaps_for(maps: List[Dict[str, Any]], addr: int, nbytes: int) -> Dict[str, Any]:
    """What the mappings that overlap [addr, addr + nbytes) say, summed (kB fields) or collected."""
    hit = [m for m in maps if m["start"] < addr + nbytes and m["end"] > addr]
    d: Dict[str, Any] = {"mappings": len(hit), "mapped_bytes": sum(m["end"] - m["start"] for m in hit),
                         "paths": sorted({m["path"] for m in hit})[:4],
                         "vmflags": sorted({m["flags"] for m in hit})[:4]}
    for k in SMAPS_KEYS:
        vals = [m["kb"].get(k) for m in hit if k in m["kb"]]
        if k in ("KernelPageSize", "MMUPageSize"):
            d[k + "_kB"] = sorted(set(vals))
        else:
            d[k + "_kB"] = sum(vals) if vals else None
    return d


def pci_sysfs_id(bus_id: str) -> str:
    """nvidia-smi's "00000000:18:00.0" (or torch's) as sysfs names it: "0000:18:00.0"."""
    b = bus_id.strip().lower()
    dom, rest = b.split(":", 1) if b.count(":") == 2 else ("0000", b)
    return f"{dom[-4:].rjust(4, '0')}:{rest}"


def page_nodes(addr: int, nbytes: int, samples: int = 64) -> Dict[str, Any]:
    """The NUMA node of up to `samples` pages spread over the range (move_pages with no target: a query)."""
    nr = SYS_MOVE_PAGES.get(platform.machine())
    if nr is None:
        return {"error": f"move_pages number unknown on {platform.machine()}"}
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = addr // page, (addr + nbytes - 1) // page
    n = min(samples, last - first + 1)
    pages = sorted({(first + (last - first) * i // max(1, n - 1)) * page for i in range(n)})
    arr = (ctypes.c_void_p * len(pages))(*pages)
    status = (ctypes.c_int * len(pages))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(nr), ctypes.c_int(0), ctypes.c_ulong(len(pages)), arr, None, status, ctypes.c_int(0))
    if r != 0:
        return {"error": os.strerror(ctypes.get_errno())}
    nodes: Dict[str, int] = {}
    for s in status:
        key = str(s) if s >= 0 else f"-{os.strerror(-s)}"
        nodes[key] = nodes.get(key, 0) + 1
    return {"sampled": len(pages), "nodes": nodes}


def phys_runs(addr: int, nbytes: int, pagemap: str = "/proc/self/pagemap") -> Dict[str, Any]:
    """How physically contiguous the range is, from pagemap's frame numbers (visible to CAP_SYS_ADMIN only):
    the number of runs of consecutive frames, the longest and the mean run. The GPU maps host memory in
    larger pages where it is contiguous, so scattered 4 KiB frames can copy slower than cudaHostAlloc's."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = addr // page, (addr + nbytes - 1) // page
    try:
        with open(pagemap, "rb") as f:
            f.seek(first * 8)
            raw = f.read((last - first + 1) * 8)
    except OSError as e:
        return {"error": e.strerror}
    pfns = [int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)]
    present = [e & ((1 << 55) - 1) if e >> 63 else None for e in pfns]
    if not any(present):
        return {"error": "no frame numbers (not present, or pagemap hides them without CAP_SYS_ADMIN)"}
    runs, longest, cur, prev = 0, 0, 0, None
    for pfn in present:
        if pfn is not None and prev is not None and pfn == prev + 1:
            cur += 1
        else:
            runs += 1
            cur = 1
        longest = max(longest, cur)
        prev = pfn
    n = len(present)
    return {"pages": n, "not_present": sum(1 for x in present if x is None), "runs": runs,
            "longest_kB": longest * page // 1024, "mean_run_kB": round(n * page / runs / 1024, 1)}


def host_flags(addr: int) -> Any:
    """cuMemHostGetFlags of a host address (CU_MEMHOSTALLOC_PORTABLE 1, DEVICEMAP 2, WRITECOMBINED 4), through
    the driver in the context torch made current; a string when it is not pinned memory or cannot be asked."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        flags = ctypes.c_uint(0)
        r = cuda.cuMemHostGetFlags(ctypes.byref(flags), ctypes.c_void_p(addr))
    except (OSError, AttributeError) as e:
        return f"unavailable: {e}"
    return int(flags.value) if r == 0 else f"CUresult {r}"


def read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def run_cmd(cmd: List[str], timeout: float = 10.0) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (p.stdout or p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({' '.join(cmd)}: {e})"


def host_facts(torch: Any, dry: bool) -> Dict[str, Any]:
    f: Dict[str, Any] = {
        "thp_enabled": read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_shmem_enabled": read("/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
        "thp_defrag": read("/sys/kernel/mm/transparent_hugepage/defrag"),
        "numa_nodes": read("/sys/devices/system/node/online"),
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    stat = read("/proc/self/stat")
    if stat:
        cpu = int(stat.rsplit(")", 1)[1].split()[36])  # field 39, "processor": the CPU last run on
        f["cpu"] = cpu
        for d in os.listdir("/sys/devices/system/node") if os.path.isdir("/sys/devices/system/node") else []:
            if d.startswith("node") and os.path.exists(f"/sys/devices/system/node/{d}/cpu{cpu}"):
                f["cpu_node"] = int(d[4:])
    if dry:
        return f
    bus = None
    props = torch.cuda.get_device_properties(0)
    if getattr(props, "pci_bus_id", None) is not None:
        dom, devno = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        bus = f"{dom:04x}:{props.pci_bus_id:02x}:{devno:02x}.0"
    smi = run_cmd(["nvidia-smi", "--query-gpu=pci.bus_id,pcie.link.gen.current,pcie.link.width.current,"
                   "pcie.link.gen.max,clocks.mem,clocks.sm", "--format=csv,noheader"])
    f["nvidia_smi_gpu"] = smi
    if bus is None and smi and not smi.startswith("("):
        bus = pci_sysfs_id(smi.splitlines()[0].split(",")[0])
    f["gpu_pci"] = bus
    if bus:
        f["gpu_numa_node"] = read(f"/sys/bus/pci/devices/{bus}/numa_node")
        f["gpu_local_cpulist"] = read(f"/sys/bus/pci/devices/{bus}/local_cpulist")
        f["gpu_link"] = {k: read(f"/sys/bus/pci/devices/{bus}/{k}") for k in
                         ("current_link_speed", "current_link_width", "max_link_speed", "max_payload_size")}
    f["nvidia_smi_topo"] = run_cmd(["nvidia-smi", "topo", "-m"])
    return f


# ---------------------------------------------------------------- copies


class Copier:
    """Times src -> dst copies: CUDA events on the current stream, or (--cpu-dry) perf_counter on the host."""

    def __init__(self, torch: Any, dry: bool, warmup: int) -> None:
        self.torch = torch
        self.dry = dry
        self.warmup = warmup

    def gbps(self, src: Any, dst: Any, reps: int, between: Optional[Callable[[], None]] = None) -> List[float]:
        torch = self.torch
        n = src.numel() * src.element_size()
        d = dst[:src.numel()]
        out = []
        for i in range(self.warmup + reps):
            if between is not None:
                between()
            if self.dry:
                t0 = time.perf_counter()
                d.copy_(src)
                dt = time.perf_counter() - t0
            else:
                stream = torch.cuda.current_stream()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
                d.copy_(src, non_blocking=True)
                b.record(stream)
                b.synchronize()
                dt = a.elapsed_time(b) / 1000.0
            if i >= self.warmup:
                out.append(n / dt / 1e9)
        return out


def describe(t: Any, maps: List[Dict[str, Any]], lease: Any = None) -> Dict[str, Any]:
    addr, n = t.data_ptr(), t.numel() * t.element_size()
    d: Dict[str, Any] = {"addr": hex(addr), "mod_4k": addr % (4 * KIB), "mod_64k": addr % (64 * KIB),
                         "mod_2m": addr % (2 * MIB), "is_pinned": bool(t.is_pinned()),
                         "smaps": smaps_for(maps, addr, n),
                         "page_nodes": page_nodes(addr, n), "phys": phys_runs(addr, n),
                         "host_flags": host_flags(addr) if t.is_pinned() else None}
    if lease is not None:
        d["lease"] = {k: getattr(lease, k, None) for k in ("id", "nbytes", "hugetlb", "page_size", "chunks",
                                                             "cuda_registered")}
        d["lease"]["kind"] = str(getattr(lease, "kind", "?"))
    return d


def measure_set(copier: Copier, srcs: List[Tuple[str, Any]], dst: Any, rounds: int, reps: int,
                between: Optional[Callable[[], None]] = None) -> Dict[str, List[float]]:
    """Every source's samples, the sources interleaved round by round."""
    samples: Dict[str, List[float]] = {name: [] for name, _ in srcs}
    for _ in range(rounds):
        for name, src in srcs:
            samples[name] += copier.gbps(src, dst, reps, between)
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    ap.add_argument("--sizes", default=f"{BATCH_BYTES},{256 * MIB}", help="bytes per copy, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10, help="copies per source per round (x rounds = samples)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed copies before each source's reps")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--idle-wait-s", type=float, default=2.0, help="max wait for the loader's workers to go idle")
    ap.add_argument("--cpu-dry", action="store_true", help="CPU torch, host-to-host copies (smoke test)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    dry = args.cpu_dry

    try:
        import torch
        import torch.utils.data
    except ImportError as e:
        print(f"SKIP: no torch for {sys.executable}: {e}")
        return SKIP
    if not dry and not torch.cuda.is_available():
        print(f"SKIP: no CUDA device (torch {torch.__version__})")
        return SKIP
    import pinbroker
    import pinbroker.torch as pbt

    try:
        client = pinbroker.connect()
    except OSError as e:
        print(f"SKIP: no pinbrokerd on $PINBROKER_SOCKET ({os.environ.get('PINBROKER_SOCKET')}): {e}")
        return SKIP
    if not dry:
        torch.cuda.init()
    dev = torch.device("cpu" if dry else "cuda")
    copier = Copier(torch, dry, args.warmup)
    facts = host_facts(torch, dry)
    errors: List[str] = []
    result: Dict[str, Any] = {"torch": torch.__version__,
                              "device": "cpu (dry)" if dry else torch.cuda.get_device_name(0),
                              "libpinbroker": pinbroker.library_path(), "facts": facts, "sizes": {}, "loader": {}}
    try:
        result["daemon"] = {k: v for k, v in client.status().items() if isinstance(v, (int, str, bool))}
    except Exception as e:
        errors.append(f"daemon status: {e}")
    print(f"torch {torch.__version__} on {result['device']}, GPU NUMA node {facts.get('gpu_numa_node')}, "
          f"this process on CPU {facts.get('cpu')} (node {facts.get('cpu_node')})", flush=True)

    # -- sources 1, 2, 3, 5 at each size
    for n in (int(s) for s in args.sizes.split(",") if s.strip()):
        row: Dict[str, Any] = {}
        leases: List[Any] = []
        try:
            stock = torch.empty(n, dtype=torch.uint8, pin_memory=not dry)
            stock.fill_(1)
            plain = client.acquire(n, label="h2d-probe")
            leases.append(plain)
            if not dry and (str(plain.kind) != "pinned" or not plain.cuda_registered):
                errors.append(f"{n} B: the lease is {plain.kind}, cuda_registered {plain.cuda_registered}: "
                              "its copies are not pinned-memory copies")
            plain_t = plain.tensor(shape=n)
            plain_t.fill_(2)
            big = client.acquire(n + OFFSETS[-1][1], label="h2d-probe")
            leases.append(big)
            page = torch.empty(n, dtype=torch.uint8)
            page.fill_(3)
            srcs: List[Tuple[str, Any]] = [("1 torch pinned", stock), ("2 lease", plain_t)]
            for name, off in OFFSETS:
                t = big.tensor(shape=n, offset=off)
                t.fill_(4)
                srcs.append((f"3 lease {name}", t))
            srcs.append(("5 pageable", page))
            dst = torch.empty(n, dtype=torch.uint8, device=dev)
            maps = parse_smaps(read("/proc/self/smaps") or "")
            lease_of = {"2 lease": plain, **{name: big for name, _ in srcs if name.startswith("3 ")}}
            row["facts"] = {name: describe(t, maps, lease_of.get(name)) for name, t in srcs}
            row["samples"] = measure_set(copier, srcs, dst, args.rounds, args.reps)
            ok = bool(torch.equal(dst[:n].cpu() if not dry else dst[:n], srcs[-1][1]))
            row["last_copy_exact"] = ok
            if not ok:
                errors.append(f"{n} B: the last copy differs from its source")
            del srcs, t, plain_t, stock, page, dst
        except Exception as e:
            errors.append(f"{n} B: {type(e).__name__}: {e}")
        for lease in leases:
            lease.release()
        result["sizes"][str(n)] = row
        print(f"{n} B done at {time.perf_counter() - t_start:.1f} s", flush=True)

    # -- source 4: a batch yielded by the pinned DataLoader, with its workers busy, then idle
    try:
        result["loader"] = loader_phase(torch, pbt, copier, dev, args)
    except Exception as e:
        errors.append(f"DataLoader: {type(e).__name__}: {e}")
    client.close()
    result["errors"] = errors
    result["wall_s"] = round(time.perf_counter() - t_start, 1)

    md = markdown(result, args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "h2d_probe.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(args.out, "h2d_probe.md"), "w") as f:
        f.write(md)
    print()
    print(md)
    return 1 if errors else 0


def loader_phase(torch: Any, pbt: Any, copier: Copier, dev: Any, args: argparse.Namespace) -> Dict[str, Any]:
    base = torch.randint(0, 256, (64,) + IMAGE, dtype=torch.uint8)

    class Images(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return BATCH * 1000  # never exhausted here

        def __getitem__(self, i: int) -> Any:
            return base[i % 64]

    out: Dict[str, Any] = {}
    loader = pbt.DataLoader(Images(), batch_size=BATCH, num_workers=args.workers, multiprocessing_context="fork")
    it = iter(loader)
    try:
        b0 = next(it)
        stock = torch.empty(b0.shape, dtype=torch.uint8, pin_memory=not copier.dry)
        stock.copy_(b0)
        dst = torch.empty(b0.numel(), dtype=torch.uint8, device=dev)
        maps = parse_smaps(read("/proc/self/smaps") or "")
        ring = None
        try:
            ring, slot = pbt.slot_of(b0)
            out["slot"] = slot
        except Exception as e:
            out["slot_of"] = f"{type(e).__name__}: {e}"
        lease = getattr(ring, "lease", None) if ring is not None else None
        out["facts"] = {"4 DataLoader batch": describe(b0.view(-1), maps, lease),
                        "1 torch pinned (loader phase)": describe(stock.view(-1), maps)}
        if ring is not None:
            out["ring"] = {"slot_bytes": getattr(ring, "slot_bytes", None), "n_slots": getattr(ring, "n_slots", None),
                           "slot_offset": b0.data_ptr() - int(getattr(ring, "addr", 0) or 0)}
        out["stats_start"] = dict(loader.stats)
        taken = [0]

        def take() -> None:  # keep the workers collating: each copy runs while they write the next batches
            nb = next(it)
            taken[0] += 1
            del nb

        srcs = [("4a DataLoader batch, workers busy", b0.view(-1)), ("1 torch pinned, workers busy", stock.view(-1))]
        out["busy"] = measure_set(copier, srcs, dst, args.rounds, args.reps, take)
        out["batches_taken"] = taken[0]
        # Idle: nothing taken, so the workers stop once the prefetch queue is full; wait until the ring's
        # slots in use stop changing (or --idle-wait-s).
        deadline = time.monotonic() + args.idle_wait_s
        last = -1
        while time.monotonic() < deadline:
            cur = ring.in_use() if ring is not None else 0
            if cur == last:
                break
            last = cur
            time.sleep(0.3)
        out["idle_slots_in_use"] = last
        srcs = [("4b DataLoader batch, workers idle", b0.view(-1)), ("1 torch pinned, workers idle", stock.view(-1))]
        out["idle"] = measure_set(copier, srcs, dst, args.rounds, args.reps)
        out["stats_end"] = dict(loader.stats)
        del b0, stock, dst
    finally:
        it = None
        if hasattr(loader, "close"):
            loader.close()
    return out


def _med(xs: Optional[List[float]]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def markdown(r: Dict[str, Any], args: argparse.Namespace) -> str:
    f = r["facts"]
    lines = [f"## H2D from pinbroker memory against torch's pinned tensor: torch {r['torch']} on {r['device']} "
             f"({time.strftime('%Y-%m-%d', time.gmtime())})", "",
             f"GB/s, CUDA events, median of {args.rounds} rounds x {args.reps} copies, sources interleaved; ratio to "
             "source 1 (torch pinned) of the same table.", ""]
    sizes = list(r["sizes"])
    hdr = "| source | " + " | ".join(f"{int(s) / 1e6:.1f} MB GB/s | ratio" for s in sizes) + " |"
    lines += [hdr, "|---|" + "---:|---:|" * len(sizes)]
    names: List[str] = []
    for s in sizes:
        for n in r["sizes"][s].get("samples", {}):
            if n not in names:
                names.append(n)
    for n in names:
        cells = []
        for s in sizes:
            smp = r["sizes"][s].get("samples", {})
            v, ref = _med(smp.get(n)), _med(smp.get("1 torch pinned"))
            cells.append(f"{v:.2f} | {v / ref:.3f}x" if v and ref else "— | —")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    ld = r.get("loader") or {}
    if ld.get("busy") or ld.get("idle"):
        lines += ["", f"DataLoader ({args.workers} fork workers, {BATCH_BYTES / 1e6:.1f} MB batches; busy: "
                  f"{ld.get('batches_taken', 0)} batches taken and dropped between copies):", "",
                  "| phase | DataLoader batch GB/s | torch pinned GB/s | ratio |", "|---|---:|---:|---:|"]
        for phase in ("busy", "idle"):
            smp = ld.get(phase) or {}
            vals = [_med(v) for v in smp.values()]
            if len(vals) == 2 and all(vals):
                lines.append(f"| workers {phase} | {vals[0]:.2f} | {vals[1]:.2f} | {vals[0] / vals[1]:.3f}x |")
    lines += ["", "| source | addr mod 4K / 64K / 2M | pinned | KernelPageSize kB | AnonHugePages kB | "
              "ShmemPmdMapped kB | Locked kB | mapped MB | page NUMA nodes | physical runs (mean, longest kB) | "
              "host flags | lease |", "|---|---|---|---|---:|---:|---:|---:|---|---|---|---|"]
    facts_rows: List[Tuple[str, Dict[str, Any]]] = []
    if sizes:
        facts_rows += list((r["sizes"][sizes[0]].get("facts") or {}).items())
    facts_rows += list((ld.get("facts") or {}).items())
    for name, d in facts_rows:
        sm = d.get("smaps", {})
        ls = d.get("lease")
        lease = f"{ls['kind']}, hugetlb {ls['hugetlb']}, page {ls['page_size']}, {ls['chunks']} chunks" if ls else ""
        pn = d.get("page_nodes", {})
        nodes = ", ".join(f"{k}: {v}" for k, v in (pn.get("nodes") or {}).items()) or pn.get("error", "")
        ph = d.get("phys") or {}
        phys = f"{ph['runs']} ({ph['mean_run_kB']}, {ph['longest_kB']})" if "runs" in ph else ph.get("error", "")
        lines.append(f"| {name} | {d['mod_4k']} / {d['mod_64k']} / {d['mod_2m']} | {d['is_pinned']} | "
                     f"{sm.get('KernelPageSize_kB')} | {sm.get('AnonHugePages_kB')} | {sm.get('ShmemPmdMapped_kB')} | "
                     f"{sm.get('Locked_kB')} | {sm.get('mapped_bytes', 0) / 1e6:.1f} | {nodes} | {phys} | "
                     f"{d.get('host_flags')} | {lease} |")
    lines += ["", f"GPU {f.get('gpu_pci')}: NUMA node {f.get('gpu_numa_node')}, "
              f"local CPUs {f.get('gpu_local_cpulist')}, "
              f"link {f.get('gpu_link')}; this process on CPU {f.get('cpu')} (node {f.get('cpu_node')}), "
              f"{len(f.get('affinity', []))} CPUs allowed; NUMA nodes online {f.get('numa_nodes')}; "
              f"THP {f.get('thp_enabled')}, "
              f"shmem THP {f.get('thp_shmem_enabled')}; ring {ld.get('ring')}."]
    for e in r.get("errors", []):
        lines.append(f"ERROR {e}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
