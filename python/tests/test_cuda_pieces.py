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
