# SPDX-License-Identifier: MIT
"""pinbroker.torch's staged tensor copies (issue 39) without a GPU: which copies go through the ring and which
stay torch's own (pinbroker.torch_staging.reason), that the patched Tensor methods keep torch's results and
errors for every copy they leave to torch, and install / uninstall. The copies themselves need a GPU:
tests/gpu/run-staging.sh runs bench/bench_staging_torch.py, which checks every byte it copies."""

from __future__ import annotations

import inspect
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pinbroker.torch staging is not tested "
                                            "(apt-get install python3-torch)")

import pinbroker.torch as pbt  # noqa: E402
from pinbroker import torch_staging as ts  # noqa: E402

MIB = 1 << 20
CUDA = torch.device("cuda", 0)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("PINBROKER_STAGING_THRESHOLD", raising=False)
    monkeypatch.setattr(ts, "_thr", MIB)
    ts._counts.clear()
    yield
    ts.uninstall()
    ts._counts.clear()


def big(n=MIB, dtype=torch.uint8, **kw):
    return torch.zeros(n, dtype=dtype, **kw)


def test_a_big_pageable_contiguous_tensor_is_staged():
    assert ts.reason(big(), CUDA) is None
    assert ts.reason(big(MIB // 4, torch.float32), CUDA) is None  # bytes count, not elements
    assert ts.reason(big().view(1024, 1024), CUDA, memory_format=torch.contiguous_format) is None
    assert ts.reason(big().view(1024, 1024), CUDA, dtype=torch.uint8) is None  # the same dtype is no conversion


@pytest.mark.parametrize("make,kw,why", [
    (lambda: big(MIB - 1), {}, "under the threshold"),
    (lambda: big(), {"non_blocking": True}, "non_blocking"),
    (lambda: big(), {"dtype": torch.float16}, "a dtype conversion"),
    (lambda: big().view(1024, 1024).t(), {}, "not contiguous"),
    (lambda: big().view(1024, 1024)[:, :512], {}, "not contiguous"),
    (lambda: big(MIB, torch.float32).view(64, 64, 16, 16), {"memory_format": torch.channels_last},
     "a memory format other than preserve/contiguous"),
    (lambda: big(MIB // 4, torch.float32, requires_grad=True), {}, "autograd records the copy"),
    (lambda: torch.zeros(1024, 1024, dtype=torch.uint8, names=("a", "b")), {}, "named dimensions"),
    (lambda: torch.zeros(MIB // 8, dtype=torch.complex64).conj(), {}, "a conjugate or negative view"),
    (lambda: big().to_sparse(), {}, "not a strided tensor"),
])
def test_what_stays_torchs_own(make, kw, why):
    assert ts.reason(make(), CUDA, **kw) == why


def test_subclasses_stay_torchs_own_but_parameters_are_staged_without_grad():
    class Sub(torch.Tensor):
        pass

    assert ts.reason(big().as_subclass(Sub), CUDA) == "a tensor subclass"
    p = torch.nn.Parameter(big(MIB // 4, torch.float32))
    assert ts.reason(p, CUDA) == "autograd records the copy"
    with torch.no_grad():  # Module.cuda() copies its parameters so: the result is a plain tensor either way
        assert ts.reason(p, CUDA) is None


def test_not_between_cpu_and_cuda():
    assert ts.reason(big(), torch.device("cpu")) == "not between CPU and CUDA"
    assert ts.reason(torch.empty(MIB, device="meta"), CUDA) == "not between CPU and CUDA"


def test_copy_into_a_cuda_tensor():
    # No CUDA tensor exists here: a meta tensor stands for the destination's shape and dtype only.
    dst = torch.empty(MIB, dtype=torch.uint8, device="meta")
    why = ts.reason(big(), CUDA, dst=dst)
    if ts._increment_version(torch) is None:
        assert why == "this torch cannot bump copy_'s version counter"
    else:
        assert why is None
    assert ts.reason(big(), CUDA, dst=torch.empty(1, MIB, dtype=torch.uint8, device="meta")) == \
        "a broadcast (the shapes differ)"
    assert ts.reason(big(), CUDA, dst=torch.empty(MIB, dtype=torch.int8, device="meta")) == "a dtype conversion"
    assert ts.reason(big(), CUDA, dst=dst, non_blocking=True) == "non_blocking"
    with torch.inference_mode():
        inf = torch.empty(MIB, dtype=torch.uint8, device="meta")
    if ts._increment_version(torch) is not None:
        assert ts.reason(big(), CUDA, dst=inf) == "an inference tensor outside inference mode"
        with torch.inference_mode():
            assert ts.reason(big(), CUDA, dst=inf) is None


def test_threshold_comes_from_install_and_the_environment(monkeypatch, tmp_path):
    ts.install(client=str(tmp_path / "none.sock"), threshold="4M", force=True)
    assert ts._thr == 4 * MIB
    assert ts.reason(big(2 * MIB), CUDA) == "under the threshold"
    ts.uninstall()
    monkeypatch.setenv("PINBROKER_STAGING_THRESHOLD", "64K")
    ts.install(client=str(tmp_path / "none.sock"), force=True)
    assert ts._thr == 64 << 10
    assert ts.reason(big(64 << 10), CUDA) is None


def test_install_patches_and_uninstall_restores(tmp_path):
    own = {n: getattr(torch.Tensor, n) for n in ("cuda", "to", "cpu", "copy_")}
    before = set(torch.Tensor.__dict__)
    s = ts.install(client=str(tmp_path / "none.sock"), force=True)
    assert s.mode == "patched" and ts.installed() == "patched"
    for n in own:
        assert getattr(torch.Tensor, n) is not own[n]
    assert ts.install(client=str(tmp_path / "none.sock"), force=True).mode == "patched"  # idempotent
    assert ts.uninstall() is True
    for n in own:
        assert getattr(torch.Tensor, n) is own[n]
        assert (n in torch.Tensor.__dict__) == (n in before)  # nothing left behind on the class
    assert ts.uninstall() is False and ts.installed() == "off"


def test_under_the_interposer_nothing_is_patched(monkeypatch, tmp_path):
    own = torch.Tensor.cuda
    monkeypatch.setattr(ts, "_interposer_loaded", lambda: True)
    assert ts.install(client=str(tmp_path / "none.sock")).mode == "interposer"
    assert torch.Tensor.cuda is own
    assert ts.install(client=str(tmp_path / "none.sock"), force=True).mode == "patched"


def test_interposer_detection():
    assert ts._interposer_loaded() is False  # this test process has no libpinbroker-preload.so


def test_staging_off_in_the_environment_patches_nothing(monkeypatch, tmp_path):
    own = torch.Tensor.cuda
    monkeypatch.setenv("PINBROKER_STAGING", "0")
    assert ts.install(client=str(tmp_path / "none.sock")).mode == "off"
    assert torch.Tensor.cuda is own and ts.installed() == "off"
    assert ts.install(client=str(tmp_path / "none.sock"), force=True).mode == "patched"


def test_patched_methods_keep_torchs_results_on_the_cpu(tmp_path):
    x = torch.arange(MIB // 4, dtype=torch.float32)
    want = {"f64": x.to(torch.float64), "cpu": x.cpu(), "to_cpu": x.to("cpu"), "copy": torch.empty_like(x).copy_(x)}
    ts.install(client=str(tmp_path / "none.sock"), force=True)
    y = x.to(torch.float64)
    assert y.dtype == torch.float64 and torch.equal(y, want["f64"])
    assert x.cpu() is x and x.to("cpu") is x  # torch returns self when nothing changes; so do we
    z = torch.empty_like(x)
    assert z.copy_(x) is z and torch.equal(z, want["copy"])
    assert torch.equal(x.to(x), x)
    assert x.to(torch.zeros(1, dtype=torch.int32)).dtype == torch.int32
    with pytest.raises(TypeError):
        x.to(1, 2, 3, 4, 5)  # torch's own error for torch's own arguments


def _error_of(fn):
    try:
        fn()
    except Exception as e:  # torch's exception, type and text
        return type(e), str(e)
    return None


@pytest.mark.parametrize("call", [
    lambda t: t.cuda(),
    lambda t: t.cuda(0),
    lambda t: t.cuda(device="cuda:0", non_blocking=False),
    lambda t: t.to("cuda"),
    lambda t: t.to("cuda:0", torch.uint8),
    lambda t: t.to(device=CUDA, copy=True),
    lambda t: t.cuda(0, True),
    lambda t: t.cuda(bogus=1),
])
def test_without_cuda_the_patched_methods_raise_what_torch_raises(call, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("SKIP: CUDA is usable here; this checks the error paths of a torch without CUDA")
    t = big()
    want = _error_of(lambda: call(t))
    assert want is not None
    ts.install(client=str(tmp_path / "none.sock"), force=True)
    assert _error_of(lambda: call(t)) == want


def test_without_a_daemon_copies_stay_torchs_own_and_say_why(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("SKIP: CUDA is usable here; this checks the path of a torch without CUDA")
    sock = str(tmp_path / "none.sock")
    t = big()
    want = _error_of(lambda: t.cuda(0))
    ts.install(client=sock, force=True)
    got = _error_of(lambda: t.cuda(0))  # staged by reason(), but no daemon: torch's own .cuda, which raises here
    assert got == want and got is not None
    st = ts.stats()
    assert st["mode"] == "patched"
    assert any(k.startswith("no staging client") for k in st["copies"]), st
    assert "none.sock" in st["no_client"] or "libpinbroker" in st["no_client"], st


def test_small_copies_take_torchs_call_at_once(tmp_path, monkeypatch):
    ts.install(client=str(tmp_path / "none.sock"), force=True)
    monkeypatch.setattr(ts, "reason", lambda *a, **k: pytest.fail("a small copy was looked at"))
    small = torch.zeros(1000)
    assert torch.equal(small.to(torch.float64), torch.zeros(1000, dtype=torch.float64))
    assert torch.empty(1000).copy_(small).sum() == 0
    if not torch.cuda.is_available():
        with pytest.raises(AssertionError):
            small.cuda()
    assert ts._counts == {}


def test_torch_install_takes_staging_and_uninstall_restores_it(tmp_path):
    sig = inspect.signature(pbt.install)
    assert sig.parameters["staging"].default is True
    own = torch.Tensor.cuda
    pbt.install_staging(client=str(tmp_path / "none.sock"), force=True)
    assert torch.Tensor.cuda is not own
    assert pbt.uninstall() is True  # the module-level uninstall puts the staging patch back too
    assert torch.Tensor.cuda is own


def test_helpers_without_install_fall_back(tmp_path):
    x = torch.arange(16, dtype=torch.float32)
    assert pbt.to_host(x) is x  # already on the CPU: torch's .cpu() returns self
    y = torch.empty_like(x)
    assert pbt.copy_(y, x) is y and torch.equal(x, y)
    assert torch.Tensor.cuda is ts._orig("cuda")


def test_stats_shape(tmp_path):
    ts.install(client=str(tmp_path / "none.sock"), force=True)
    st = pbt.staging_stats()
    assert st["mode"] == "patched" and isinstance(st["copies"], dict)


def test_a_failed_connection_is_tried_again_after_a_while(monkeypatch, tmp_path):
    import pinbroker
    import pinbroker._client as pc
    from pinbroker import _lib

    calls = []

    def refuse(path):
        calls.append(path)
        raise pinbroker.NotConnected(111, f"no broker at {path}")

    monkeypatch.setattr(pc, "connect", refuse)
    monkeypatch.setattr(_lib, "has_staging", lambda: True)
    sock = str(tmp_path / "later.sock")
    ts.install(client=sock, force=True)
    assert ts._get_client() is None and ts._get_client() is None
    assert calls == [sock]  # not again at once: every copy would pay a connect
    assert "later.sock" in ts.stats()["no_client"]
    monkeypatch.setattr(ts, "RETRY_S", 0.0)
    assert ts._get_client() is None
    assert calls == [sock, sock]


def _need_gpu_and_engine():
    from pinbroker import _lib

    if not torch.cuda.is_available():
        pytest.skip("SKIP: needs a GPU (torch sees no CUDA device); tests/gpu/run-staging.sh runs these copies")
    if not _lib.has_staging():
        pytest.skip(f"SKIP: the libpinbroker loaded ({_lib.path()}) has no pb_copy_to_device")


def test_staged_tensor_copies_on_a_gpu(daemon):
    _need_gpu_and_engine()
    ts.install(client=daemon.socket, force=True)
    x = torch.randint(0, 256, (4 * MIB + 3,), dtype=torch.uint8)
    y = x.cuda()
    assert y.is_cuda and torch.equal(y, x.pin_memory().cuda())
    z = y.cpu()
    assert not z.is_pinned() and torch.equal(z, x)
    w = torch.zeros_like(y)
    assert w.copy_(x) is w and torch.equal(w, y)
    copies = ts.stats()["copies"]
    assert copies.get("staged h2d", 0) == 2 and copies.get("staged d2h", 0) == 1, copies
    assert ts.stats()["client"]["h2d_copies"] >= 2


def test_client_copies_on_a_gpu(daemon):
    _need_gpu_and_engine()
    np = pytest.importorskip("numpy", reason="numpy is not installed (apt-get install python3-numpy)")
    src = np.random.default_rng(39).integers(0, 256, 8 * MIB + 5, dtype=np.uint8)
    dev = torch.empty(src.nbytes, dtype=torch.uint8, device="cuda")
    with daemon.connect() as c:
        c.copy_to_device(dev, src, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        assert torch.equal(dev.cpu(), torch.from_numpy(src))
        back = np.zeros_like(src)
        c.copy_from_device(back, dev.data_ptr())
        assert (back == src).all()
        st = c.staging_stats()
        assert st.h2d_copies == 1 and st.d2h_copies == 1 and 0 < st.ring_bytes <= 64 * MIB


class _FakeCudaTensor:
    """What _staged reads of a CUDA tensor, over CPU memory: its device, address and size."""

    def __init__(self, t):
        self.t, self.device = t, torch.device("cuda", 0)

    def data_ptr(self):
        return self.t.data_ptr()

    def nelement(self):
        return self.t.nelement()

    def element_size(self):
        return self.t.element_size()


def _fake_cuda(monkeypatch, client):
    import contextlib

    syncs = []

    class Stream:
        cuda_stream = 0x99

        def synchronize(self):
            syncs.append(True)

    class Driver:
        def enter(self, dptr):
            return None

        def leave(self, prev):
            pass

    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: Stream())
    return (client, Driver()), syncs


def test_a_staged_copy_calls_the_library_on_the_current_stream_then_syncs(monkeypatch):
    import ctypes

    calls = []

    class Client:
        def _copy_raw(self, to_device, dptr, host, n, stream):
            calls.append((to_device, dptr, host, n, stream))
            ctypes.memmove(dptr, host, n) if to_device else ctypes.memmove(host, dptr, n)

    ready, syncs = _fake_cuda(monkeypatch, Client())
    src = torch.arange(MIB, dtype=torch.int32)
    dev = _FakeCudaTensor(torch.zeros(MIB, dtype=torch.int32))
    assert ts._staged(torch, ready, src, dev) is True
    assert calls == [(True, dev.data_ptr(), src.data_ptr(), 4 * MIB, 0x99)] and syncs == [True]
    assert torch.equal(dev.t, src)
    back = torch.zeros(MIB, dtype=torch.int32)
    assert ts._staged(torch, ready, dev, back) is True
    assert calls[1] == (False, dev.data_ptr(), back.data_ptr(), 4 * MIB, 0x99) and len(syncs) == 2
    assert torch.equal(back, src)
    assert ts._counts == {"staged h2d": 1, "staged d2h": 1}


def test_a_closed_client_falls_back_and_a_driver_error_raises(monkeypatch):
    import errno

    import pinbroker

    class Closed:
        def _copy_raw(self, *a):
            raise pinbroker.NotConnected(errno.ENOTCONN, "closed")

    class Failing:
        def _copy_raw(self, *a):
            raise pinbroker.BrokerError(errno.EIO, "cuMemcpyHtoDAsync_v2: CUDA_ERROR_ILLEGAL_ADDRESS")

    src = torch.zeros(MIB, dtype=torch.uint8)
    dev = _FakeCudaTensor(torch.zeros(MIB, dtype=torch.uint8))
    ready, syncs = _fake_cuda(monkeypatch, Closed())
    assert ts._staged(torch, ready, src, dev) is False and syncs == []
    ready, syncs = _fake_cuda(monkeypatch, Failing())
    with pytest.raises(RuntimeError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        ts._staged(torch, ready, src, dev)
