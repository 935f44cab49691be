# SPDX-License-Identifier: MIT
"""Staged copies from Python (issue 39): Client.copy_to_device / copy_from_device / configure_staging /
staging_stats, their ctypes declarations against client/lib/pinbroker.h, their argument errors, and
pinbroker.torch's staged tensor copies: which copies it stages and which it leaves to torch, install and
uninstall. Copies that move bytes need a GPU: tests/gpu/run-staging.sh runs them (bench_staging_torch.py checks
every byte it copies)."""

from __future__ import annotations

import array
import ctypes
import dataclasses
import errno
import os
import re

import pytest

import pinbroker
from pinbroker import _lib, _staging
from conftest import REPO

HEADER = os.path.join(REPO, "client", "lib", "pinbroker.h")

# C type (as written in pinbroker.h) -> the ctypes type that declares it.
C_TYPES = {
    "int": ctypes.c_int,
    "unsigned": ctypes.c_uint,
    "size_t": ctypes.c_size_t,
    "uint64_t": ctypes.c_uint64,
    "uint32_t": ctypes.c_uint32,
    "pb_client *": ctypes.c_void_p,
    "void *": ctypes.c_void_p,
    "const void *": ctypes.c_void_p,
}


def _header() -> str:
    with open(HEADER) as f:
        text = f.read()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _prototype(name: str):
    m = re.search(r"\b(int|void)\s+" + name + r"\s*\(([^)]*)\)\s*;", _header())
    assert m, f"{name} not declared in {HEADER}"
    args = []
    for a in m.group(2).split(","):
        a = a.strip()
        t = re.sub(r"\s*\b\w+$", "", a).strip()  # drop the parameter's name
        t = re.sub(r"\s*\*", " *", t)
        args.append(t)
    return m.group(1), args


def _struct_fields(name: str):
    m = re.search(r"struct " + name + r"\s*\{(.*?)\};", _header(), re.S)
    assert m, f"struct {name} not in {HEADER}"
    fields = []
    for decl in m.group(1).split(";"):
        decl = decl.strip()
        if not decl:
            continue
        t, names = re.match(r"(\w+)\s+(.*)", decl).groups()
        fields += [(n.strip(), t) for n in names.split(",")]
    return fields


@pytest.mark.parametrize("name", ["pb_copy_to_device", "pb_copy_from_device", "pb_staging_configure",
                                  "pb_staging_stats"])
def test_declarations_match_the_header(name):
    ret, args = _prototype(name)
    res, argtypes = _lib._OPTIONAL[name]
    assert res is {"int": ctypes.c_int}[ret]
    assert len(args) == len(argtypes), (args, argtypes)
    for c, py in zip(args, argtypes):
        if c.startswith("const struct") or c.startswith("struct"):
            struct = c.split()[-2] if c.endswith("*") else c.split()[-1]
            want = {"pb_staging_opts": _lib.StagingOpts, "pb_staging_stats": _lib.StagingStats}[struct]
            assert py is ctypes.POINTER(want), (name, c, py)
        else:
            assert py is C_TYPES[c], (name, c, py)


@pytest.mark.parametrize("struct,cls", [("pb_staging_opts", _lib.StagingOpts), ("pb_staging_stats", _lib.StagingStats)])
def test_structs_match_the_header(struct, cls):
    got = [(n, t) for n, t in cls._fields_]
    want = _struct_fields(struct)
    assert [n for n, _ in got] == [n for n, _ in want]
    for (n, t), (_, c) in zip(got, want):
        assert t is C_TYPES[c], (struct, n, c, t)


def test_staging_ring_flag_matches_the_header():
    m = re.search(r"#define PB_ACQUIRE_STAGING_RING \(1u << (\d+)\)", _header())
    assert m and _lib.PB_ACQUIRE_STAGING_RING == 1 << int(m.group(1))


def test_stats_dataclass_has_every_counter():
    fields = [f.name for f in dataclasses.fields(pinbroker.StagingStats)]
    assert fields == [n for n, _ in _lib.StagingStats._fields_]
    c = _lib.StagingStats(*range(1, 11))
    s = pinbroker.StagingStats.from_c(c)
    assert s.h2d_bytes == 1 and s.busy_ns == 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.h2d_bytes = 5  # type: ignore[misc]


def test_client_has_the_staging_calls():
    for name in ("copy_to_device", "copy_from_device", "configure_staging", "staging_stats"):
        assert callable(getattr(pinbroker.Client, name))


# ---------------------------------------------------------------- sizes, streams, buffers (no daemon)


@pytest.mark.parametrize("text,want", [("64M", 64 << 20), ("1G", 1 << 30), ("512K", 512 << 10), ("4096", 4096),
                                       ("8MiB", 8 << 20), (" 2m ", 2 << 20), (0, 0), (12345, 12345)])
def test_sizes(text, want):
    assert _staging.parse_size(text, "ring") == want


@pytest.mark.parametrize("bad,exc", [("lots", pinbroker.InvalidArgument), ("-1M", pinbroker.InvalidArgument),
                                     (-5, pinbroker.InvalidArgument), (1.5, TypeError), (True, TypeError),
                                     (None, TypeError)])
def test_bad_sizes_name_the_setting(bad, exc):
    with pytest.raises(exc, match="slot"):
        _staging.parse_size(bad, "slot")


def test_env_threshold(monkeypatch):
    monkeypatch.delenv("PINBROKER_STAGING_THRESHOLD", raising=False)
    assert _staging.env_threshold() == 1 << 20
    monkeypatch.setenv("PINBROKER_STAGING_THRESHOLD", "4M")
    assert _staging.env_threshold() == 4 << 20
    monkeypatch.setenv("PINBROKER_STAGING_THRESHOLD", "junk")
    assert _staging.env_threshold() == 1 << 20  # the library warns and takes the default too


class _TorchLikeStream:
    cuda_stream = 0x5555


class _CupyLikeStream:
    ptr = 0x7777


def test_stream_arguments():
    assert _staging.stream_handle(None) is None
    assert _staging.stream_handle(0) is None  # the legacy default stream: C's NULL
    assert _staging.stream_handle(2) == 2  # CU_STREAM_PER_THREAD passes as it is
    assert _staging.stream_handle(_TorchLikeStream()) == 0x5555
    assert _staging.stream_handle(_CupyLikeStream()) == 0x7777
    for bad in ("s", 1.0, True, object()):
        with pytest.raises(TypeError, match="stream"):
            _staging.stream_handle(bad)
    with pytest.raises(pinbroker.InvalidArgument):
        _staging.stream_handle(-1)


def test_device_pointer_arguments():
    assert _staging.check_device_pointer(0x7F0000000000) == 0x7F0000000000
    for bad in (0, -4096, 1 << 64):
        with pytest.raises(pinbroker.InvalidArgument, match="dptr"):
            _staging.check_device_pointer(bad)
    for bad in ("0x1000", 1.0, None, True):
        with pytest.raises(TypeError, match="dptr"):
            _staging.check_device_pointer(bad)

    class Cai:
        __cuda_array_interface__ = {"data": (0x2000, False), "shape": (16,), "typestr": "<f4", "version": 3}

    assert _staging.check_device_pointer(Cai()) == 0x2000
    np = pytest.importorskip("numpy", reason="numpy is not installed: the __cuda_array_interface__ size check "
                                              "is not tested (apt-get install python3-numpy)")
    assert np is not None
    assert _staging.device_capacity(Cai()) == 64


def test_host_buffers():
    b = bytearray(b"abcdef")
    with _staging.HostBuffer(b, writable=True, what="dst") as h:
        assert h.nbytes == 6
        assert ctypes.string_at(h.address, 6) == b"abcdef"
        with pytest.raises(BufferError):
            b.extend(b"x")  # held: it cannot move under C
    b.extend(b"x")  # released
    a = array.array("i", [1, 2, 3])
    with _staging.HostBuffer(a, writable=False, what="src") as h:
        assert h.nbytes == 12
    with pytest.raises(TypeError, match="read-only"):
        _staging.HostBuffer(b"abc", writable=True, what="dst")
    with pytest.raises(TypeError, match="buffer protocol"):
        _staging.HostBuffer("text", writable=False, what="src")
    with pytest.raises(TypeError, match="not contiguous"):
        _staging.HostBuffer(memoryview(bytearray(16))[::2], writable=False, what="src")
    with _staging.HostBuffer(b"", writable=False, what="src") as h:
        assert h.nbytes == 0


def test_numpy_buffers():
    np = pytest.importorskip("numpy", reason="numpy is not installed (apt-get install python3-numpy)")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with _staging.HostBuffer(x, writable=False, what="src") as h:
        assert h.nbytes == 48 and h.address == x.ctypes.data
    with _staging.HostBuffer(np.asfortranarray(x), writable=True, what="dst") as h:
        assert h.nbytes == 48  # Fortran order is one range of bytes too
    with pytest.raises(TypeError, match="not contiguous"):
        _staging.HostBuffer(x[:, ::2], writable=False, what="src")
    ro = x.copy()
    ro.setflags(write=False)
    with pytest.raises(TypeError, match="read-only"):
        _staging.HostBuffer(ro, writable=True, what="dst")


# ---------------------------------------------------------------- the Client calls (a real daemon)


def test_argument_errors_come_before_any_copy(client):
    with pytest.raises(TypeError, match="dptr"):
        client.copy_to_device("0x1000", b"abc")
    with pytest.raises(pinbroker.InvalidArgument, match="dptr"):
        client.copy_to_device(0, b"abc")
    with pytest.raises(TypeError, match="stream"):
        client.copy_to_device(0x1000, b"abc", stream="default")
    with pytest.raises(TypeError, match="buffer protocol"):
        client.copy_to_device(0x1000, "abc")
    with pytest.raises(TypeError, match="read-only"):
        client.copy_from_device(b"abc", 0x1000)
    with pytest.raises(TypeError, match="not contiguous"):
        client.copy_from_device(memoryview(bytearray(8))[::2], 0x1000)

    class Small:
        __cuda_array_interface__ = {"data": (0x2000, False), "shape": (2,), "typestr": "|u1", "version": 3}

    pytest.importorskip("numpy", reason="numpy is not installed (apt-get install python3-numpy)")
    with pytest.raises(pinbroker.InvalidArgument, match="only 2"):
        client.copy_to_device(Small(), b"abcd")
    with pytest.raises(TypeError, match="threads"):
        client.configure_staging(threads=2.0)
    with pytest.raises(pinbroker.InvalidArgument, match="ring"):
        client.configure_staging(ring="-64M")
    with pytest.raises(TypeError, match="slot"):
        client.configure_staging(slot=8.5)


def _need_staging():
    if not _lib.has_staging():
        pytest.skip(f"SKIP: the libpinbroker loaded ({_lib.path()}) has no pb_copy_to_device: the staging "
                    "engine (client/lib/lib-staging.c) is not in this build")


def test_closed_client_refuses(daemon):
    _need_staging()
    c = daemon.connect()
    c.close()
    for call in (lambda: c.configure_staging(threshold="2M"), c.staging_stats,
                 lambda: c.copy_to_device(0x1000, b"abc")):
        with pytest.raises(pinbroker.NotConnected):
            call()


def test_configure_and_stats(client):
    _need_staging()
    s = client.staging_stats()
    assert isinstance(s, pinbroker.StagingStats)
    assert s.ring_bytes == 0 and s.h2d_copies == 0 and s.ring_leases == 0
    client.configure_staging(ring="32M", slot="4M", threads=2, threshold="2M")
    assert client.staging_threshold == 2 << 20
    with pytest.raises(pinbroker.InvalidArgument) as e:
        client.configure_staging(ring="8M", slot="8M")  # ring/slot must be >= 2
    assert e.value.errno == errno.EINVAL and str(e.value)
    with pytest.raises(pinbroker.InvalidArgument):
        client.configure_staging(threads=1000)


def test_copy_without_cuda_says_so(client):
    _need_staging()
    from pinbroker._client import cuda_available

    ok, why = cuda_available()
    if ok:
        pytest.skip("SKIP: CUDA is usable here: tests/gpu/run-staging.sh checks real copies")
    with pytest.raises(pinbroker.BrokerError) as e:
        client.copy_to_device(0x10000, bytes(4 << 20))
    assert e.value.errno == errno.ENODEV, (e.value.errno, str(e.value))
    with pytest.raises(pinbroker.BrokerError) as e:
        client.copy_from_device(bytearray(4 << 20), 0x10000)
    assert e.value.errno == errno.ENODEV
    assert client.staging_stats().ring_bytes == 0  # no ring taken for a copy that could not run


def test_library_without_staging_says_what_to_do(client, monkeypatch):
    monkeypatch.setattr(_lib, "optional", lambda name: None)
    with pytest.raises(NotImplementedError, match="newer libpinbroker"):
        client.staging_stats()
    with pytest.raises(NotImplementedError, match="pb_copy_to_device"):
        client.copy_to_device(0x1000, b"abc")


SHIM = r"""
#include <stdint.h>
#include <string.h>
#include "pinbroker.h"
uint64_t seen[8];
int pb_copy_to_device(pb_client *c, uint64_t dptr, const void *src, size_t bytes, void *stream)
{ seen[0] = (uintptr_t)c; seen[1] = dptr; seen[2] = (uintptr_t)src; seen[3] = bytes; seen[4] = (uintptr_t)stream;
  memcpy(&seen[5], src, bytes < 8 ? bytes : 8); return 0; }
int pb_copy_from_device(pb_client *c, void *dst, uint64_t dptr, size_t bytes, void *stream)
{ seen[0] = (uintptr_t)c; seen[1] = dptr; seen[2] = (uintptr_t)dst; seen[3] = bytes; seen[4] = (uintptr_t)stream;
  memset(dst, 0x42, bytes); return 0; }
int pb_staging_configure(pb_client *c, const struct pb_staging_opts *o)
{ (void)c; seen[5] = o->ring_bytes; seen[6] = o->slot_bytes; seen[7] = (uint64_t)o->threads << 32 | o->threshold_bytes;
  return 0; }
int pb_staging_stats(pb_client *c, struct pb_staging_stats *s)
{ (void)c; memset(s, 0, sizeof *s); s->d2h_copies = 3; s->busy_ns = 10; s->ring_bytes = 1 << 26; return 0; }
"""

CALLS = r"""
import ctypes, pinbroker
from pinbroker import _lib
c = pinbroker.connect(SOCK)
seen = (ctypes.c_uint64 * 8).in_dll(_lib.load(), "seen")
buf = bytearray(b"ABCDEFGH" * 512)

class Stream:
    cuda_stream = 0x77

c.copy_to_device(0xDEAD000, buf, stream=Stream())
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
assert (seen[1], seen[2], seen[3], seen[4]) == (0xDEAD000, addr, 4096, 0x77), list(seen)
assert bytes(seen[5].to_bytes(8, "little")) == b"ABCDEFGH"
out = bytearray(16)
c.copy_from_device(out, 0xBEEF000)
assert (seen[1], seen[3], seen[4]) == (0xBEEF000, 16, 0) and out == b"B" * 16, list(seen)
c.configure_staging(ring="32M", slot="4M", threads=3, threshold="2M")
assert (seen[5], seen[6], seen[7]) == (32 << 20, 4 << 20, 3 << 32 | 2 << 20), list(seen)
s = c.staging_stats()
assert (s.d2h_copies, s.busy_ns, s.ring_bytes, s.h2d_bytes) == (3, 10, 1 << 26, 0), s
c.close()
print("ok")
"""


def test_arguments_reach_the_library_in_order(daemon, tmp_path):
    # A stand-in for the staging calls, in front of the real library: what each Python call passes, in which place.
    import shutil
    import subprocess

    from conftest import run_python

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("SKIP: no C compiler (cc) to build the stand-in library")
    real = _lib.path()
    src = tmp_path / "shim.c"
    src.write_text(SHIM)
    shim = tmp_path / "libshim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-I", os.path.join(REPO, "client", "lib"), "-o", str(shim), str(src),
                    "-Wl,--no-as-needed", real, "-Wl,-rpath," + os.path.dirname(os.path.realpath(real))], check=True)
    r = run_python(f"SOCK = {daemon.socket!r}\n" + CALLS, env={"PINBROKER_LIBRARY": str(shim)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
