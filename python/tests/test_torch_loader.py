# SPDX-License-Identifier: MIT
"""pinbroker.torch.DataLoader against torch's own DataLoader: same batches in the same order, for every start
method, with persistent workers, several loaders, revocation, a dead daemon and a dead worker."""

from __future__ import annotations

import gc
import os
import signal
import statistics
import sys
import time
import warnings
from typing import Any, List

import pytest

torch = pytest.importorskip("torch", reason="pinbroker.torch needs torch (Debian: python3-torch)")
np = pytest.importorskip("numpy")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import loader_data as data  # noqa: E402
import pinbroker.torch as pbt  # noqa: E402
from pinbroker import _lib  # noqa: E402

HAVE_SHARES = _lib.optional("pb_lease_share") is not None and _lib.optional("pb_attach") is not None


@pytest.fixture
def broker(daemon, monkeypatch):
    """A daemon the loaders reach through $PINBROKER_SOCKET, with the module's connection made fresh."""
    monkeypatch.setenv("PINBROKER_SOCKET", daemon.socket)
    pbt._Broker._client = None
    yield daemon
    gc.collect()
    pbt._Broker._client = None


def assert_same(a: Any, b: Any, where: str = "batch") -> None:
    """Structure, types, dtypes, shapes and values all equal."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{where}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def reference(dataset: Any, **kw: Any) -> List[Any]:
    """What torch's own DataLoader yields (single process: the order and content do not depend on workers)."""
    kw = dict(kw)
    kw.pop("num_workers", None)
    kw.pop("multiprocessing_context", None)
    kw.pop("persistent_workers", None)
    kw.pop("worker_init_fn", None)
    return list(torch.utils.data.DataLoader(dataset, num_workers=0, **kw))


def compare_epoch(loader: Any, ref: List[Any], hold: bool = False) -> List[Any]:
    """Iterate loader, comparing batch by batch with ref as each arrives (and dropping it unless hold)."""
    kept = []
    n = 0
    for i, batch in enumerate(loader):
        assert i < len(ref), "more batches than torch's DataLoader"
        assert_same(ref[i], batch, f"batch {i}")
        if hold:
            kept.append(batch)
        n += 1
    assert n == len(ref), f"{n} batches, torch's DataLoader gave {len(ref)}"
    return kept


def ring_lease_id(daemon) -> int:
    rows = [l for l in daemon.status(leases=True)["leases"] if l["label"] == "dataloader"]
    assert len(rows) == 1, f"expected one ring lease, got {rows}"
    return int(rows[0]["id"])


# ------------------------------------------------------------------------------------------------ outputs


@pytest.mark.parametrize(
    "num_workers,method",
    [(0, None), (2, "fork"), (2, "spawn"), (2, "forkserver")],
    ids=["main-process", "fork", "spawn", "forkserver"],
)
def test_same_batches_as_torch(broker, num_workers, method):
    ds = data.Nested(n=46)
    kw = dict(batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
    ref = reference(ds, **kw)
    kw["generator"] = torch.Generator().manual_seed(7)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = pbt.DataLoader(ds, num_workers=num_workers, multiprocessing_context=method, **kw)
        compare_epoch(loader, ref)
    st = loader.stats
    if method in ("spawn", "forkserver") and not HAVE_SHARES:
        # No shared leases in this libpinbroker: torch's path, said once.
        msgs = [str(x.message) for x in w if "pinbroker" in str(x.message)]
        assert len(msgs) == 1 and "shared leases" in msgs[0], msgs
        assert st["ring_batches"] == 0
        return
    assert st["ring_batches"] == len(ref), st
    assert st["torch_path_batches"] == 0, st
    assert not [x for x in w if "pinbroker" in str(x.message)], [str(x.message) for x in w]


def test_custom_collate_fn_output_goes_through_the_ring(broker):
    ds = data.Images(n=30, shape=(3, 4, 4))
    ref = reference(ds, batch_size=4, collate_fn=data.collate_pairs)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=data.collate_pairs)
    compare_epoch(loader, ref)
    assert loader.stats["ring_batches"] == len(ref)


def test_drop_last_and_positional_arguments(broker):
    ds = data.Images(n=30, shape=(2, 3))
    ref = reference(ds, batch_size=4, drop_last=True)
    loader = pbt.DataLoader(ds, 4, False, num_workers=1, drop_last=True)
    assert len(loader) == len(ref)
    compare_epoch(loader, ref)


def test_collate_errors_are_torchs(broker):
    class Bad(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return object()

    with pytest.raises(TypeError) as plain:
        list(torch.utils.data.DataLoader(Bad(), batch_size=2))
    with pytest.raises(TypeError) as ours:
        list(pbt.DataLoader(Bad(), batch_size=2))
    assert str(ours.value) == str(plain.value)


def test_iterable_dataset_is_measured_then_ringed(broker):
    ds = data.Stream(n=40)
    ref = reference(ds, batch_size=5)
    loader = pbt.DataLoader(ds, batch_size=5, num_workers=0)
    with pytest.warns(RuntimeWarning, match="cannot size ring slots"):
        compare_epoch(loader, ref)
    assert loader.stats["ring_batches"] == 0
    compare_epoch(loader, ref)
    assert loader.stats["ring_batches"] == len(ref)


# --------------------------------------------------------------------------------------------- lifetimes


def test_held_batches_are_never_overwritten(broker):
    ds = data.Images(n=96, shape=(3, 16, 16))
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, slots=6)
    kept = []
    views = []
    for i, batch in enumerate(loader):
        if i < 3:
            kept.append((i, batch))  # the whole batch
        elif i < 5:
            views.append((i, batch[0][1]))  # only a view of one image: must keep the slot too
        for j, b in kept:
            assert_same(ref[j], b, f"kept batch {j} at step {i}")
        for j, v in views:
            assert torch.equal(ref[j][0][1], v), f"view of batch {j} overwritten at step {i}"
    st = loader.stats
    # Held slots were not reused: every held batch that came from the ring still holds its slot (under
    # load a worker may have found the ring full and sent one of the first batches on torch's path),
    # and everything else still arrived intact.
    held = sum(pbt.slot_of(b[0][1]) is not None for _, b in kept) + sum(pbt.slot_of(v) is not None for _, v in views)
    assert st["ring_batches"] + st["torch_path_batches"] == len(ref)
    assert held >= 1 and st["ring"]["in_use"] >= held, (held, st)
    del batch, b, v  # the loop variables hold the last kept batch and view
    kept.clear()
    views.clear()
    gc.collect()
    assert loader.stats["ring"]["in_use"] == 0


def test_slots_are_reused_once_dropped(broker):
    ds = data.Images(n=200, shape=(3, 8, 8))
    ref = reference(ds, batch_size=2)
    loader = pbt.DataLoader(ds, batch_size=2, num_workers=2)
    compare_epoch(loader, ref)
    st = loader.stats
    assert st["ring_batches"] == len(ref) > 10 * st["ring"]["slots"] // 2, st


def test_every_ring_batch_is_pinned_where_cuda_is(broker):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA in this torch/host: is_pinned() is checked by python/bench/gpu_loader_check.py")
    loader = pbt.DataLoader(data.Images(n=16), batch_size=4, num_workers=2)
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()


def test_persistent_workers_several_epochs_and_an_abandoned_one(broker):
    ds = data.Images(n=40, shape=(3, 8, 8))
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, shuffle=True,
                            generator=torch.Generator().manual_seed(3))
    # Persistent workers draw from the generator once, not each epoch: the reference must be persistent too.
    plain = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, shuffle=True,
                                        generator=torch.Generator().manual_seed(3))
    for epoch in range(4):
        if epoch == 1:
            # Abandoned mid-epoch, by both (a sampler left early draws less from the generator): workers had
            # slots in flight, which must come back for the next epoch.
            for i, (a, b) in enumerate(zip(plain, loader)):
                assert_same(a, b, f"epoch 1 batch {i}")
                if i == 2:
                    break
            del a, b
            continue
        compare_epoch(loader, list(plain))
    workers = loader._pb_inner._workers
    assert all(w.is_alive() for w in workers)
    assert loader.stats["torch_path_batches"] == 0, loader.stats


def test_several_loaders_at_once(broker):
    a_ds, b_ds = data.Images(n=40, shape=(4, 4)), data.Nested(n=40)
    a_ref, b_ref = reference(a_ds, batch_size=4), reference(b_ds, batch_size=4)
    a = pbt.DataLoader(a_ds, batch_size=4, num_workers=2)
    b = pbt.DataLoader(b_ds, batch_size=4, num_workers=1)
    c = pbt.DataLoader(a_ds, batch_size=4, num_workers=0)
    for i, (x, y, z) in enumerate(zip(a, b, c)):
        assert_same(a_ref[i], x)
        assert_same(b_ref[i], y)
        assert_same(a_ref[i], z)
    rows = [l for l in broker.status(leases=True)["leases"] if l["label"] == "dataloader"]
    assert len(rows) == 3
    assert a.stats["ring_batches"] == b.stats["ring_batches"] == c.stats["ring_batches"] == len(a_ref)


def test_close_gives_the_ring_back(broker):
    loader = pbt.DataLoader(data.Images(n=16), batch_size=4, num_workers=0)
    it = iter(loader)
    held = next(it)
    assert broker.leased() > 0
    del it
    loader.close()
    assert broker.leased() > 0, "a held batch must keep the ring"
    del held
    gc.collect()
    assert broker.wait_leased(0) == 0


# ------------------------------------------------------------------------------------------- torch's path


def test_no_daemon_behaves_like_torch_and_says_so_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PINBROKER_SOCKET", str(tmp_path / "nobody.sock"))
    pbt._Broker._client = None
    ds = data.Nested(n=20)
    ref = reference(ds, batch_size=4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = pbt.DataLoader(ds, batch_size=4, num_workers=2)
        compare_epoch(loader, ref)
        compare_epoch(loader, ref)
    msgs = [str(x.message) for x in w if "pinbroker" in str(x.message)]
    assert len(msgs) == 1 and "pin_memory=True" in msgs[0], msgs
    assert loader.stats["ring_batches"] == 0
    # torch's own pin_memory=True pins only with CUDA; the loader's iterator does the same.
    it = iter(loader)
    assert it._inner._pin_memory == torch.cuda.is_available()


def test_refused_ring_falls_back(start_daemon, monkeypatch):
    d = start_daemon("--budget", "2M", "--prewarm", "0")
    monkeypatch.setenv("PINBROKER_SOCKET", d.socket)
    pbt._Broker._client = None
    ds = data.Images(n=24, shape=(3, 64, 64))  # 12 KiB a sample, 48 KiB a batch, 64 slots: over the 2 MiB budget
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, slots=64)
    with pytest.warns(RuntimeWarning, match="no pinned ring"):
        compare_epoch(loader, ref)
    assert loader.stats["ring_batches"] == 0


def test_batch_too_big_takes_torchs_path_then_slots_grow(broker):
    ds = data.Growing(n=32)
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, headroom=1.0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        compare_epoch(loader, ref)
    msgs = [str(x.message) for x in w if "does not fit" in str(x.message)]
    assert len(msgs) == 1, [str(x.message) for x in w]
    st = loader.stats
    assert st["reasons"].get("too big") == 6 and st["ring_batches"] == 2, st
    compare_epoch(loader, ref)
    st2 = loader.stats
    assert st2["ring_batches"] == 2 + len(ref), st2
    assert st2["ring"]["slot_bytes"] >= 4 * 4096 * 4


# ------------------------------------------------------------------------------------- things going wrong


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_revoked_mid_epoch_continues_on_torchs_path(broker, method):
    if method == "spawn" and not HAVE_SHARES:
        pytest.skip("spawn workers map the ring through shared leases, which this libpinbroker lacks")
    ds = data.Images(n=120, shape=(3, 16, 16))
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=method)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        it = iter(loader)
        for i in range(5):
            assert_same(ref[i], next(it), f"batch {i}")
        held = next(it)  # a batch the program keeps across the revoke
        lease_id = ring_lease_id(broker)
        t0 = time.monotonic()
        with broker.connect() as admin:
            assert admin.revoke(lease_id, deadline_ms=3000) == [lease_id]
        for i in range(6, 14):
            assert_same(ref[i], next(it), f"batch {i}")
        assert broker.leased() > 0, "the ring went back under a held batch"
        assert_same(ref[5], held, "held batch")
        del held
        gc.collect()
        got = broker.wait_leased(0, timeout=3)
        elapsed = time.monotonic() - t0
        assert got == 0, "the ring was not given back after the last held batch was dropped"
        assert elapsed < 3.0, f"given back after {elapsed:.2f} s, past the 3 s deadline"
        for i in range(14, len(ref)):
            assert_same(ref[i], next(it), f"batch {i}")
        with pytest.raises(StopIteration):
            next(it)
    msgs = [str(x.message) for x in w if "pinbroker" in str(x.message)]
    assert len(msgs) == 1 and "revoked" in msgs[0], msgs
    st = loader.stats
    assert st["reasons"].get("revoked", 0) > 0 and st["ring_batches"] >= 6, st


def test_revoked_with_pinctl_between_epochs_then_a_new_ring(broker):
    ds = data.Images(n=24, shape=(8,))
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=1)
    compare_epoch(loader, ref)
    lease_id = ring_lease_id(broker)
    broker.pinctl("revoke", str(lease_id), "--deadline", "2000")
    assert broker.wait_leased(0, timeout=2) == 0, "an idle ring was not given back at once"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compare_epoch(loader, ref)
    assert ring_lease_id(broker) != lease_id


def test_daemon_killed_mid_epoch(broker, start_daemon, monkeypatch):
    ds = data.Images(n=160, shape=(3, 8, 8))
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        it = iter(loader)
        for i in range(3):
            assert_same(ref[i], next(it))
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait()
        for i in range(3, len(ref)):
            assert_same(ref[i], next(it), f"batch {i}")
            time.sleep(0.04)  # the epoch outlasts the 1 s liveness check
        with pytest.raises(StopIteration):
            next(it)
        del it
        # The next epoch finds no daemon: torch's path, no crash.
        compare_epoch(loader, ref)
    st = loader.stats
    assert st["reasons"].get("revoked", 0) > 0, st
    msgs = [str(x.message) for x in w if "pinbroker" in str(x.message)]
    assert any("went away" in m for m in msgs), msgs
    # A daemon again: the next iterator leases a ring from it.
    again = start_daemon()
    monkeypatch.setenv("PINBROKER_SOCKET", again.socket)
    before = loader.stats["ring_batches"]
    compare_epoch(loader, ref)
    assert loader.stats["ring_batches"] == before + len(ref), loader.stats


def worker_death(run, errors):
    """The error run() ends with, and torch's own SIGCHLD handler's too: it raises the same death again,
    asynchronously, wherever the main thread is when the signal lands (inside pytest.raises' exit, or the
    next statement, on a loaded machine). Caught here until 0.3 s pass without one (3 s at most)."""
    first = None
    deadline = time.monotonic() + 3.0
    try:
        try:
            run()
        except errors as e:
            first = e
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 0.3 and time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except errors as e:
                first = first or e
                quiet_since = time.monotonic()
    except errors as e:
        first = first or e
    return first


@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent-workers"])
def test_killed_worker_raises_like_torch_and_leaks_nothing(broker, persistent):
    ds = data.Killer(n=64, kill_at=20)
    # torch's own loader reports a killed worker as a RuntimeError ("DataLoader worker (pid N) is killed by
    # signal"), or, when the death interrupts fd passing, as the ConnectionResetError or EOFError underneath it.
    torch_errors = (RuntimeError, ConnectionError, EOFError)

    def stock():
        for _ in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent):
            pass

    plain_error = worker_death(stock, torch_errors)
    assert plain_error is not None, "torch's own loader did not report its killed worker"
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=persistent, timeout=30)
    t0 = time.monotonic()
    with pytest.raises(torch_errors) as ours:
        for batch in loader:
            del batch  # a batch kept would (rightly) keep its slot and the ring
    assert time.monotonic() - t0 < 20, "hung after a worker died"
    for e in (plain_error, ours.value):
        assert isinstance(e, (ConnectionError, EOFError)) or "DataLoader worker" in str(e), repr(e)
    # No slot stays taken by the dead worker, and the ring goes back with the loader.
    ok = data.Images(n=16, shape=(4,))
    ref = reference(ok, batch_size=4)
    loader2 = pbt.DataLoader(ok, batch_size=4, num_workers=2)
    compare_epoch(loader2, ref)
    del loader, loader2, ours, e  # the exception's traceback holds the iterator, which holds the loader
    gc.collect()
    # Generous: on a loaded 2-core CI box the dead worker's slots and the ring come back in seconds.
    assert broker.wait_leased(0, timeout=30.0) == 0, broker.status(leases=True)["leases"]



def test_forked_worker_without_the_mapping_takes_torchs_path(broker):
    """A range marked MADV_DONTFORK (as a driver may do to registered memory) is not inherited: the worker
    must notice rather than fault, and its batches take torch's path (or attach, with shared leases)."""
    import ctypes

    ds = data.Images(n=24, shape=(3, 8, 8))
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")
    ring = loader._ensure_ring()
    assert ring is not None
    libc = ctypes.CDLL(None, use_errno=True)
    madv_dontfork = 10
    assert libc.madvise(ctypes.c_void_p(ring.addr), ctypes.c_size_t(ring.nbytes), madv_dontfork) == 0, ctypes.get_errno()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        compare_epoch(loader, ref)
    st = loader.stats
    if HAVE_SHARES:
        assert st["ring_batches"] == len(ref), st
    else:
        assert st["reasons"].get("worker cannot map the ring") == len(ref), st
        assert any("cannot map the pinned ring" in str(x.message) for x in w)


def test_spawn_persistent_workers_keep_their_attachment_across_epochs(broker):
    if not HAVE_SHARES:
        pytest.skip("spawn workers map the ring through shared leases, which this libpinbroker lacks")
    ds = data.Images(n=24, shape=(3, 8, 8))
    ref = reference(ds, batch_size=4)
    loader = pbt.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True,
                            multiprocessing_context="spawn")
    for _ in range(3):
        compare_epoch(loader, ref)
    assert loader.stats["ring_batches"] == 3 * len(ref), loader.stats
    rows = [l for l in broker.status(leases=True)["leases"] if l["label"] == "dataloader"]
    assert len(rows) == 1, rows  # one ring, counted once, whoever maps it
    loader.close()  # stops the workers, which detach; the holder lets go: a shared lease ends with its last mapper
    assert broker.wait_leased(0) == 0, broker.status(leases=True)["leases"]


def test_gpu_check_alternates_its_copies_abba() -> None:
    """gpu_loader_check.py times the ring's and torch's copies one by one in ABBA order, so neither source always
    meets the busiest workers (timed in blocks, the ring's came first and read 0.958x on an H100)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "gpu_loader_check.py")
    spec = importlib.util.spec_from_file_location("_gpu_loader_check", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    order = mod.abba_order(6)
    assert order[:8] == [0, 1, 1, 0, 0, 1, 1, 0]
    assert order.count(0) == order.count(1) == 6
    firsts = [order[k] for k in range(0, len(order), 2)]  # who goes first in each pair
    assert firsts.count(0) == firsts.count(1) == 3

    # The judged loop: a fresh batch for each pair, one copy of each source a pair, in abba_order's order.
    copies = []
    mod.copy_gbps = lambda src, dst: copies.append(src) or (2.0 if src is ref else 1.0)
    ref, batches = torch.zeros(1), [torch.ones(1) for _ in range(4)]
    lp = mod.loop_gbps(iter({"image": b} for b in batches), ref, None, 4)
    assert (lp.ring, lp.ref, lp.pair_ratio()) == ([1.0] * 4, [2.0] * 4, 0.5) and lp.last is batches[-1]
    assert [0 if c is ref else 1 for c in copies] == [1, 0, 0, 1, 1, 0, 0, 1]
    assert [c for c in copies if c is not ref] == batches

    # Refilled: the reference is rewritten from the pageable source before each pair, as a pin thread does.
    copies.clear()
    ref.zero_()
    seen = []
    mod.copy_gbps = lambda src, dst: seen.append(float(ref[0])) or (2.0 if src is ref else 1.0)
    lp = mod.loop_gbps(iter({"image": b} for b in batches), ref, None, 2, refill=torch.full((1,), 7.0))
    assert seen == [7.0] * 4 and len(lp.ring) == 2
    # Each pair's refill, not one at the start: a copy that spoils the reference is undone before the next pair.
    seen.clear()

    def spoiling_copy(src: Any, dst: Any) -> float:
        seen.append(float(ref[0]))
        ref.fill_(-1.0)
        return 2.0 if src is ref else 1.0

    mod.copy_gbps = spoiling_copy
    mod.loop_gbps(iter({"image": b} for b in batches), ref, None, 2, refill=torch.full((1,), 7.0))
    assert seen == [7.0, -1.0, 7.0, -1.0]

    # The judged figure is the median of the pairs' ratios, not the ratio of the medians; its interval holds it.
    lp = mod.Loop()
    lp.ring, lp.ref = [1.0, 2.0, 3.0], [2.0, 4.0, 1.0]
    assert lp.pair_ratio() == 0.5 and statistics.median(lp.ring) / statistics.median(lp.ref) == 1.0
    lp.ring = [9.0, 20.0, 30.0, 40.0, 50.0]
    lp.ref = [10.0, 20.0, 31.0, 41.0, 50.0]
    lo, hi = lp.interval()
    assert lo <= lp.pair_ratio() <= hi <= 1.0 and lo >= 0.9
    # An interval of the median, not the samples' range nor a point: 210 ratios spread evenly over 0.90-1.10 give
    # a median of 1.0 known to about +-0.014 (95%), and a constant sample no width at all.
    lp.ring = [1.0 + 0.01 * ((i * 37) % 21 - 10) for i in range(210)]
    lp.ref = [1.0] * 210
    lo, hi = lp.interval()
    assert 0.97 < lo < 1.0 < hi < 1.03 and hi - lo > 0.005
    lp.ring = [0.99] * 210
    assert lp.interval() == (0.99, 0.99)
    # Judged on the trimmed mean too: 4 of 10 batches at half speed leave the median at 1.0x, not the mean of the
    # middle eight (0.8125x); one stretched copy in ten moves the total time, not the trimmed mean.
    lp.ring, lp.ref = [50.0] * 6 + [25.0] * 4, [50.0] * 10
    assert lp.pair_ratio() == 1.0 and lp.trimmed_ratio() == pytest.approx(6.5 / 8)
    assert lp.time_ratio() == pytest.approx(10 / 14)
    lp.ring = [50.0] * 9 + [5.0]
    assert lp.trimmed_ratio() == 1.0 and lp.time_ratio() == pytest.approx(10 / 19)
    # The interval resamples ABBA groups of two pairs: pairs that differ only across groups keep their group.
    lp.ring, lp.ref = [1.0, 1.0, 2.0, 2.0] * 10, [1.0] * 40
    lo, hi = lp.interval()
    assert 1.0 <= lo <= hi <= 2.0

    # The labels of the last batch come with it, for the check that it is intact after more batches.
    mod.copy_gbps = lambda src, dst: 1.0
    labelled = [{"image": b, "label": torch.tensor([i])} for i, b in enumerate(batches)]
    lp = mod.loop_gbps(iter(labelled), ref, None, 4)
    assert lp.last is batches[-1] and int(lp.labels[0]) == 3

    # What it prints of each source's memory: physical runs as root, else why not; the page size from smaps.
    t = torch.ones(3 << 20, dtype=torch.uint8)
    lay = mod.memory_layout(t)
    assert lay["KernelPageSize_kB"] and "physical" in lay
    line = mod.layout_line("ring", lay)
    assert line.startswith("ring: ") and ("physical runs" in line or "physical layout unknown" in line)
