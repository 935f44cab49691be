# SPDX-License-Identifier: MIT
"""Lease.cuda_piece_bytes: a lease above the driver's per-call cap is registered in pieces (issues 26, 27).

On the stand-in libcuda.so.1 of the C tests (tests/preload/stub_cuda.c), which refuses one registration of
STUB_CUDA_REGISTER_CAP bytes or more as r580 drivers refuse one of 512 GiB, with the library's piece size made
small by PINBROKER_CUDA_REGISTER_PIECE.
"""

from __future__ import annotations

import glob
import os
import textwrap

import pytest

from conftest import REPO, run_python

MiB = 1 << 20


def _stub_dir() -> str:
    # The stand-in of the build under test (a sanitized build's would need its runtime preloaded), else the newest.
    lib = os.environ.get("PINBROKER_LIBRARY")
    if lib:
        own = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib))), "tests", "preload", "stub")
        if os.path.exists(os.path.join(own, "libcuda.so.1")):
            return own
    found = sorted(glob.glob(os.path.join(REPO, "build*", "tests", "preload", "stub", "libcuda.so.1")),
                   key=os.path.getmtime, reverse=True)
    if not found:
        pytest.skip("no stand-in libcuda.so.1 in a build tree (cmake --build build --target stub_cuda)")
    return os.path.dirname(found[0])


def test_a_small_lease_is_registered_in_one_piece(client):
    with client.acquire(MiB) as lease:
        assert lease.cuda_piece_bytes == 0


def test_a_lease_above_the_piece_size_reports_its_pieces(daemon):
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        c = pinbroker.connect({daemon.socket!r})
        big = c.acquire(20 << 20)
        small = c.acquire(4 << 20)
        print("BIG", big.kind.value, big.cuda_registered, big.cuda_piece_bytes)
        print("SMALL", small.kind.value, small.cuda_registered, small.cuda_piece_bytes)
    """), env={
        "LD_LIBRARY_PATH": _stub_dir(),
        "PINBROKER_CUDA_REGISTER_PIECE": "4M",
        "STUB_CUDA_REGISTER_CAP": "6M",
        "PINBROKER_NO_CUDA": "0",
    })
    assert r.returncode == 0, r.stderr
    # One call of 20 MiB would be refused (cap 6 MiB): pinned in pieces of 4 MiB.
    assert f"BIG pinned True {4 * MiB}" in r.stdout, r.stdout
    assert "SMALL pinned True 0" in r.stdout, r.stdout
    assert daemon.wait_leased(0) == 0


def test_ranks_of_a_region_register_their_own_slices(daemon, tmp_path):
    """Four ranks (four connections) of one region, each with slice=: each registers only its quarter, the
    region is lent once, and a slice past the region's end is refused before anything is acquired."""
    d = tmp_path / "regions"
    d.mkdir(mode=0o700)
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        q = 4 << 20
        leases = []
        for rank in range(4):
            c = pinbroker.connect({daemon.socket!r})
            lease, created = pinbroker.shared_region("kv", 4 * q, client=c, slice=(rank * q, q))
            leases.append(lease)
            print("RANK", rank, int(created), lease.kind.value, lease.cuda_slice == (rank * q, q))
        c = pinbroker.connect({daemon.socket!r})
        print("LEASED", c.status()["leased_bytes"])
        try:
            pinbroker.shared_region("kv", 4 * q, client=c, slice=(3 * q, 2 * q))
        except pinbroker.InvalidArgument as e:
            print("PAST-END", e.errno)
    """), env={
        "LD_LIBRARY_PATH": _stub_dir(),
        "PINBROKER_NO_CUDA": "0",
        "PINBROKER_REGION_DIR": str(d),
    })
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("RANK")] == [
        "RANK 0 1 pinned True", "RANK 1 0 pinned True", "RANK 2 0 pinned True", "RANK 3 0 pinned True"], r.stdout
    assert f"LEASED {16 * MiB}" in lines, r.stdout  # lent once, not four times
    assert "PAST-END 34" in lines, r.stdout  # ERANGE
    assert daemon.wait_leased(0) == 0


def test_a_region_slice_without_a_driver_leaves_the_lease_locked(daemon, tmp_path):
    d = tmp_path / "regions"
    d.mkdir(mode=0o700)
    r = run_python(textwrap.dedent(f"""
        import pinbroker
        c = pinbroker.connect({daemon.socket!r})
        lease, created = pinbroker.shared_region("kv", 8 << 20, client=c, slice=(0, 4 << 20))
        print("LEASE", int(created), lease.kind.value, lease.cuda_slice)
    """), env={"PINBROKER_NO_CUDA": "1", "PINBROKER_REGION_DIR": str(d)})
    assert r.returncode == 0, r.stderr
    assert "LEASE 1 locked None" in r.stdout, r.stdout


def test_a_second_concurrent_slice_registration_raises_busy(daemon):
    """Two threads register slices of one lease: the first is held in the driver (the stand-in's gate); the
    second neither waits for it (the mapping's lock is not held across the driver call) nor registers too: it
    raises BrokerError EBUSY at once, and only the first slice is registered."""
    r = run_python(textwrap.dedent(f"""
        import ctypes, threading
        import pinbroker
        c = pinbroker.connect({daemon.socket!r})
        lease = c.acquire(16 << 20, cuda=False, cache=False)
        stub = ctypes.CDLL("libcuda.so.1")
        stub.stub_cuda_register_gate(1)
        out = {{}}

        def call(name, offset):
            out[name + "-slice"] = lease.cuda_slice
            try:
                lease.register_slice(offset, 1 << 20)
                out[name] = "ok"
            except pinbroker.BrokerError as e:
                out[name] = f"{{type(e).__name__}} {{e.errno}} {{'another thread' in str(e)}}"

        first = threading.Thread(target=call, args=("first", 0))
        first.start()
        print("WAITING", stub.stub_cuda_register_gate_wait(1, 10000))
        second = threading.Thread(target=call, args=("second", 8 << 20))
        second.start()
        second.join(10)
        print("SECOND-DONE", not second.is_alive())
        stub.stub_cuda_register_gate(0)
        first.join()
        second.join()
        print("FIRST", out["first"], lease.cuda_slice, lease.kind.value)
        print("SECOND", out["second"], out["second-slice"])
        lease.release()
    """), env={
        "LD_LIBRARY_PATH": _stub_dir(),
        "PINBROKER_NO_CUDA": "0",
    })
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "WAITING 1" in lines, r.stdout
    assert "SECOND-DONE True" in lines, r.stdout
    assert f"FIRST ok (0, {MiB}) pinned" in lines, r.stdout
    assert "SECOND BrokerError 16 True None" in lines, r.stdout  # EBUSY, while nothing was registered yet
    assert daemon.wait_leased(0) == 0
