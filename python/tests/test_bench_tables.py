# SPDX-License-Identifier: MIT
"""The GPU-host benchmark scripts' CPU-testable parts (issue 25): torch_alloc_bench.py's parent (sides in
subprocesses, medians, ratios, targets, the table and JSON) driven by --fake sides, and h2d_probe.py's parsers
and table, h2d_after_cpu.py's trip order, windows and table. No torch, no GPU, no daemon."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(HERE), "bench")


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


tab = _load("torch_alloc_bench")
probe = _load("h2d_probe")


def _run_fake(tmp_path: Any, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(BENCH, "torch_alloc_bench.py"), "--fake", "--out",
                           str(tmp_path), *extra], capture_output=True, text=True, timeout=60)


def _rows(tmp_path: Any) -> Dict[str, Dict[str, Any]]:
    with open(tmp_path / "torch_alloc_bench.json") as f:
        return {r["key"]: r for r in json.load(f)["table"]}


def test_targets_are_issue_25s() -> None:
    # Issue 25: alloc+free <= 2x, pin-then-H2D <= 1.05x, DataLoader >= 1.0x, first use <= 1 s, bytes 1.0000x.
    want = {"a_64KiB": ("lower", 2.0), "a_1MiB": ("lower", 2.0), "a_16MiB": ("lower", 2.0), "b": ("lower", 1.05),
            "c_16": ("higher", 1.0), "c_64": ("higher", 1.0), "c_256": ("higher", 1.0), "d": ("abs", 1.0),
            "e": ("exact", 1.0), "e_daemon": ("exact", 1.0),
            "cpin_16": ("info", None), "cpin_64": ("info", None), "cpin_256": ("info", None)}
    assert {r["key"]: (r["kind"], r["target"]) for r in tab.ROWS} == want
    assert tab.BATCH_SHAPE == (256, 3, 224, 224) and 256 * 3 * 224 * 224 == 38_535_168
    assert len(tab.EXACT_SIZES) == 20 and min(tab.EXACT_SIZES) == 1_000_001 and max(tab.EXACT_SIZES) <= 37_000_001
    assert all(n & (n - 1) and n % 4096 for n in tab.EXACT_SIZES), "sizes must be neither powers of two nor pages"


def test_fake_run_medians_ratios_and_table(tmp_path: Any) -> None:
    r = _run_fake(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _rows(tmp_path)
    # fake_side: a_64KiB is (2 + round) stock and 1.5x that for pinbroker; rounds 1 and 2 alternate.
    a = rows["a_64KiB"]
    assert a["stock_rounds"] == [3.0, 4.0] and a["stock"] == pytest.approx(3.5)
    assert a["pinbroker"] == pytest.approx(5.25) and a["ratio"] == pytest.approx(1.5) and a["met"] is True
    assert rows["b"]["ratio"] == pytest.approx(1.1) and rows["b"]["met"] is False  # over 1.05x
    for bs in (16, 64, 256):
        assert rows[f"c_{bs}"]["ratio"] == pytest.approx(1.25) and rows[f"c_{bs}"]["met"] is True
    # Row d is the worst round (a first use), not the median: 0.5 s and 0.7 s give 0.7 s, within 1 s.
    assert rows["d"]["pinbroker"] == pytest.approx(0.7) and rows["d"]["met"] is True
    assert rows["e"]["pinbroker"] == 1.0 and rows["e"]["stock"] == 1.5 and rows["e"]["met"] is True
    assert rows["e"]["ratio"] is None and rows["e_daemon"]["met"] is True
    md = (tmp_path / "torch_alloc_bench.md").read_text()
    assert "| row | stock | pinbroker | ratio | paired | target | met |" in md
    assert rows["b"]["paired"] == pytest.approx(1.1) and rows["d"]["paired"] is None
    assert md.count("\n| a. ") == 3 and md.count("\n| c. ") == 6
    # The pin thread's time is reported, lower is better, never judged: fake pinbroker 0.9x stock every round.
    pin = rows["cpin_256"]
    assert pin["ratio"] == pytest.approx(0.9) and pin["paired"] == pytest.approx(0.9) and pin["met"] is None
    assert pin["rounds_met"] == [2, 2]
    line_pin = next(ln for ln in md.splitlines() if ln.startswith("| c. its pin thread's pin_memory() of one 38.5"))
    assert "reported (lower is better)" in line_pin and line_pin.endswith("| — |")
    line_b = next(ln for ln in md.splitlines() if ln.startswith("| b. "))
    assert line_b.count("1.100x") == 2 and "**no**" in line_b and "1.05x" in line_b
    assert md in r.stdout  # the table is printed last
    for side in ("stock", "pinbroker"):
        for rnd in (1, 2):
            assert (tmp_path / f"torch_alloc_bench.{side}.{rnd}.log").exists()
    assert "cache_hits 9" in md  # the allocator's cache counters are shown
    # ABBA: the second round runs pinbroker first, so neither side always gains from a host that speeds up.
    with open(tmp_path / "torch_alloc_bench.json") as f:
        order = [(x["round"], x["side"]) for x in json.load(f)["rounds"]]
    assert order == [(1, "stock"), (1, "pinbroker"), (2, "pinbroker"), (2, "stock")]


def test_fake_rows_filter(tmp_path: Any) -> None:
    # --rows c: the sides run row c (and d, which installs the allocator); the table holds those rows only.
    r = _run_fake(tmp_path, "--rows", "c")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _rows(tmp_path)
    assert sorted(rows) == sorted(["c_16", "c_64", "c_256", "cpin_16", "cpin_64", "cpin_256", "d"])
    assert rows["c_256"]["met"] is True and rows["d"]["met"] is True
    bad = _run_fake(tmp_path, "--rows", "cx")
    assert bad.returncode == 2 and "--rows 'cx'" in bad.stderr


def test_fake_side_crash_exits_1(tmp_path: Any) -> None:
    r = _run_fake(tmp_path, "--fake-fail", "crash")
    assert r.returncode == 1, r.stdout + r.stderr
    md = (tmp_path / "torch_alloc_bench.md").read_text()
    assert "ERROR pinbroker round 1: exit 1" in md and "fake crash" in md
    assert _rows(tmp_path)["a_64KiB"]["met"] is None  # no pinbroker numbers: not judged


def test_fake_row_error_exits_1(tmp_path: Any) -> None:
    r = _run_fake(tmp_path, "--fake-fail", "rowerror")
    assert r.returncode == 1
    assert "ERROR pinbroker round 2: row c: RuntimeError: fake" in (tmp_path / "torch_alloc_bench.md").read_text()


def test_fake_no_cuda_exits_77(tmp_path: Any) -> None:
    r = _run_fake(tmp_path, "--fake-fail", "nocuda")
    assert r.returncode == 77 and "SKIP" in r.stdout


def test_evaluate_edges() -> None:
    def res(vals: Dict[str, float]) -> Dict[str, Any]:
        return {"values": vals}

    stock = [res({"a_64KiB": 2.0, "b": 2.0, "c_16": 100.0, "d": 0.1, "e": 1.4})]
    pb = [res({"a_64KiB": 4.0, "b": 2.2, "c_16": 100.0, "d": 1.01, "e": 1.00004})]
    rows = {r["key"]: r for r in tab.evaluate({"stock": stock, "pinbroker": pb})}
    assert rows["a_64KiB"]["met"] is True  # exactly 2x is within "<= 2x"
    assert rows["b"]["met"] is False  # 1.1x
    assert rows["c_16"]["met"] is True  # exactly 1.0x is ">= 1.0x"
    assert rows["d"]["met"] is False  # 1.01 s
    assert rows["e"]["met"] is True  # 1.0000 to four decimals
    assert rows["a_1MiB"]["met"] is None and rows["a_1MiB"]["ratio"] is None  # missing: not judged
    assert tab.combine([1.0, None, 3.0], "median") == 2.0 and tab.combine([], "max") is None


SMAPS = """\
7f0000000000-7f0000400000 rw-s 00000000 00:01 1234                       /memfd:pinbroker (deleted)
Size:               4096 kB
KernelPageSize:        4 kB
MMUPageSize:           4 kB
Rss:                4096 kB
AnonHugePages:         0 kB
ShmemPmdMapped:     2048 kB
FilePmdMapped:         0 kB
Locked:             4096 kB
VmFlags: rd wr sh mr mw me ms lo dc
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
Size:               2048 kB
KernelPageSize:        4 kB
MMUPageSize:           4 kB
Rss:                2048 kB
AnonHugePages:      2048 kB
ShmemPmdMapped:        0 kB
Locked:                0 kB
VmFlags: rd wr mr mw me ac hg
7f0000800000-7f0000a00000 r--p 00000000 00:00 0                          [heap]
KernelPageSize:        4 kB
Rss:                   4 kB
"""


def test_smaps_parse_and_range() -> None:
    maps = probe.parse_smaps(SMAPS)
    assert [(m["start"], m["end"]) for m in maps] == [(0x7f0000000000, 0x7f0000400000),
                                                       (0x7f0000400000, 0x7f0000600000),
                                                       (0x7f0000800000, 0x7f0000a00000)]
    assert maps[0]["path"] == "/memfd:pinbroker (deleted)" and maps[0]["flags"].endswith("lo dc")
    # A range across the first two mappings, not the third.
    d = probe.smaps_for(maps, 0x7f0000300000, 0x200000)
    assert d["mappings"] == 2 and d["mapped_bytes"] == 6 << 20
    assert d["ShmemPmdMapped_kB"] == 2048 and d["AnonHugePages_kB"] == 2048 and d["Locked_kB"] == 4096
    assert d["KernelPageSize_kB"] == [4] and d["FilePmdMapped_kB"] == 0
    assert probe.smaps_for(maps, 0x7f0000600000, 0x1000)["mappings"] == 0


def test_smaps_of_this_process_and_page_nodes() -> None:
    buf = bytearray(1 << 20)
    import ctypes

    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    with open("/proc/self/smaps") as f:
        d = probe.smaps_for(probe.parse_smaps(f.read()), addr, len(buf))
    assert d["mappings"] >= 1 and d["Rss_kB"] is not None
    nodes = probe.page_nodes(addr, len(buf), samples=8)
    if "error" in nodes:
        pytest.skip(f"move_pages: {nodes['error']}")
    assert nodes["sampled"] == 8 and sum(nodes["nodes"].values()) == 8


def test_pci_sysfs_id() -> None:
    assert probe.pci_sysfs_id("00000000:18:00.0") == "0000:18:00.0"
    assert probe.pci_sysfs_id("0000:9A:00.0\n") == "0000:9a:00.0"
    assert probe.pci_sysfs_id("18:00.0") == "0000:18:00.0"


def test_probe_markdown() -> None:
    mb = str(probe.BATCH_BYTES)
    fact = {"mod_4k": 0, "mod_64k": 0, "mod_2m": 4096, "is_pinned": True, "smaps": {"KernelPageSize_kB": [4]},
            "page_nodes": {"nodes": {"0": 64}}, "lease": {"kind": "pinned", "hugetlb": False, "page_size": 4096,
                                                         "chunks": 19}}
    r: Dict[str, Any] = {
        "torch": "x", "device": "y", "facts": {"gpu_numa_node": "1"}, "errors": ["boom"],
        "sizes": {mb: {"samples": {"1 torch pinned": [50.0, 54.0, 52.0], "2 lease": [49.4, 49.4, 49.4]},
                       "facts": {"2 lease": fact}}},
        "loader": {"busy": {"4a": [40.0], "1": [50.0]}, "idle": {"4b": [52.0], "1": [52.0]}, "batches_taken": 30},
    }
    args = argparse.Namespace(rounds=3, reps=10, workers=8)
    md = probe.markdown(r, args)
    lines: List[str] = md.splitlines()
    assert "| 2 lease | 49.40 | 0.950x |" in lines
    assert "| workers busy | 40.00 | 50.00 | 0.800x |" in lines and "| workers idle | 52.00 | 52.00 | 1.000x |" in lines
    assert any(ln.startswith("| 2 lease | 0 / 0 / 4096 | True | [4] |") and "19 chunks" in ln for ln in lines)
    assert "NUMA node 1" in md and "ERROR boom" in md


def test_phys_runs_from_a_pagemap(tmp_path: Any) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    present = 1 << 63
    # Pages 0-5 of the range: frames 100, 101, 102, 7, 8 and one not present.
    entries = [present | 100, present | 101, present | 102, present | 7, present | 8, 0]
    pm = tmp_path / "pagemap"
    pm.write_bytes(b"".join(e.to_bytes(8, "little") for e in entries))
    d = probe.phys_runs(0, 6 * page, str(pm))
    assert d["pages"] == 6 and d["not_present"] == 1 and d["runs"] == 3
    assert d["longest_kB"] == 3 * page // 1024
    pm.write_bytes(bytes(8 * 6))
    assert "error" in probe.phys_runs(0, 6 * page, str(pm))


def test_targets_are_judged_on_the_rounds_own_ratios() -> None:
    """A host that drifts over a run: the sides' medians say 0.95x, each round's pair says 0.95-1.05x, median 1.033x.
    The target is judged on the paired figure; under two complete pairs, on the ratio of the medians."""
    def side(vals: Dict[int, float]) -> List[Dict[str, Any]]:
        return [{"round": k, "values": {"c_16": v}} for k, v in vals.items()]

    res = {"stock": side({1: 100.0, 2: 200.0, 3: 300.0}), "pinbroker": side({1: 105.0, 2: 190.0, 3: 310.0})}
    assert tab.paired_ratio(res, "c_16") == pytest.approx(310 / 300)
    row = next(r for r in tab.evaluate(res) if r["key"] == "c_16")
    assert row["ratio"] == pytest.approx(0.95) and row["met"] is True
    assert row["rounds_met"] == [2, 3]  # round 2 (0.95x) is under the target
    md = tab.markdown([row], "h", [])
    assert "| 0.950x | 1.033x (2/3 rounds) |" in md
    # A crashed round pairs with nothing: rounds 1 and 3 only.
    res["pinbroker"] = side({1: 105.0, 3: 310.0})
    assert tab.paired_ratio(res, "c_16") == pytest.approx((1.05 + 310 / 300) / 2)
    res["pinbroker"] = side({2: 190.0})
    row = next(r for r in tab.evaluate(res) if r["key"] == "c_16")
    assert tab.paired_ratio(res, "c_16") is None and row["met"] is False  # one pair: the medians, 0.95x


after = _load("h2d_after_cpu")


def test_after_cpu_rotation_puts_each_source_first_and_last() -> None:
    names = [after.REF, "lease", "torch"]
    orders = [after.rotation(names, k) for k in range(6)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert {o[0] for o in orders} == set(names) and {o[-1] for o in orders} == set(names)
    assert orders[0] == names and orders[1] == [after.REF, "torch", "lease"]  # rotated by one, reversed
    # Every phase of the probe copies two sources, the reference and one other: each goes first in half the trips.
    pair = [after.rotation([after.REF, "lease"], k) for k in range(8)]
    assert [o[0] for o in pair] == [after.REF, "lease", "lease", after.REF] * 2
    assert all(sorted(o) == sorted([after.REF, "lease"]) for o in pair)


def test_after_cpu_windows_and_table() -> None:
    ref = after.REF
    # A slow first copy, then a shortfall that fades: 0.8x at once, 0.9x in the first 50 ms, 1.0x after.
    trips = [{"t": 0.0, ref: 50.0, "lease": 40.0}, {"t": 0.01, ref: 50.0, "lease": 45.0},
             {"t": 0.02, ref: 40.0, "lease": 36.0}, {"t": 0.1, ref: 50.0, "lease": 50.0},
             {"t": 5.0, ref: 50.0, "lease": 51.0}]
    rows = after.windows(trips, [ref, "lease"])
    got = {r["window"]: (r["n"], round(r["lease"], 3)) for r in rows}
    assert got == {"first copy": (1, 0.8), "0-0.05 s": (3, 0.9), "0.05-0.2 s": (1, 1.0), "3.2 s on": (1, 1.02)}
    assert ref not in rows[0] and after.windows([], [ref, "lease"]) == []
    # A 2 s series (the probe's default): its last window is labelled 0.8-2 s, not 0.8-3.2 s.
    two_s = trips[:4] + [{"t": 1.5, ref: 50.0, "lease": 50.0}]
    short = [r["window"] for r in after.windows(two_s, [ref, "lease"], until=2.0)]
    assert short == ["first copy", "0-0.05 s", "0.05-0.2 s", "0.8-2 s"]
    md = after.markdown([{"action": "none", "sources": ["lease"], "rows": rows}])
    lines = md.splitlines()
    assert lines[0] == "| action | source | first copy | 0-0.05 s | 0.05-0.2 s | 3.2 s on |"
    assert lines[2] == "| none | lease | 0.800 | 0.900 | 1.000 | 1.020 |"
