# SPDX-License-Identifier: MIT
"""Reservations for a group of ranks: Client.reserve, Reservation.acquire/release, Client.reservations and
Client.revoke(reservation=) against the real daemon. Figures expected come from the shares and sizes asked."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import pinbroker

MiB = 1 << 20


def test_reserve_join_take_release(start_daemon):
    d = start_daemon("--budget", "16M", "--prewarm", "0")
    a = pinbroker.connect(d.socket)
    b = pinbroker.connect(d.socket)
    try:
        ra = a.reserve("kv", 4, 2 * MiB)
        rb = b.reserve("kv", 4, 2 * MiB)
        assert ra.id == rb.id
        listing = a.reservations()
        assert listing["reserved_bytes"] == 8 * MiB
        assert [r["name"] for r in listing["reservations"]] == ["kv"]
        assert a.status()["leased_bytes"] == 8 * MiB
        lease = rb.acquire(cuda=False)
        assert lease.nbytes == 2 * MiB
        assert a.reservations()["reserved_bytes"] == 6 * MiB
        assert a.status()["leased_bytes"] == 8 * MiB  # moved, not added
        with pytest.raises(pinbroker.InvalidArgument):
            ra.acquire(2 * MiB + 4096, cuda=False)
        with pytest.raises(pinbroker.InvalidArgument, match="exists with 4 shares"):
            b.reserve("kv", 3, 2 * MiB)
        ra.release()
        assert a.reservations()["reservations"] == []
        assert a.status()["leased_bytes"] == 2 * MiB  # the share taken is an ordinary lease
        rb.release()  # gone already: not an error
        lease.release()
    finally:
        a.close()
        b.close()


def test_refused_whole_with_the_reason(start_daemon):
    d = start_daemon("--budget", "16M", "--prewarm", "0")
    with pinbroker.connect(d.socket) as c:
        other = c.acquire(1 * MiB, cuda=False, cache=False)
        with pytest.raises(pinbroker.BudgetExhausted):
            c.reserve("kv", 8, 2 * MiB)
        assert c.status()["leased_bytes"] == 1 * MiB
        assert c.reservations()["reserved_bytes"] == 0
        with c.reserve("kv", 7, 2 * MiB) as r:
            assert c.status()["leased_bytes"] == 15 * MiB
            assert r.shares == 7
        assert c.status()["leased_bytes"] == 1 * MiB
        other.release()


def test_revoke_by_reservation(start_daemon):
    d = start_daemon("--budget", "16M", "--prewarm", "0")
    with pinbroker.connect(d.socket) as c, pinbroker.connect(d.socket) as admin:
        r = c.reserve("kv", 2, 1 * MiB)
        lease = r.acquire(cuda=False)
        assert admin.revoke(reservation=r.id, deadline_ms=100) == [lease.id]
        assert admin.reservations()["reservations"] == []


def _rank(path, q, go):
    with pinbroker.connect(path) as c:
        go.wait(30)
        try:
            r = c.reserve("grp", 8, 2 * MiB)
        except pinbroker.BrokerError as e:
            q.put(("refused", type(e).__name__))
            return
        lease = r.acquire(cuda=False)
        q.put(("granted", lease.nbytes))
        go.wait(30)


@pytest.mark.parametrize("budget,want", [("16M", "granted"), ("15M", "refused")])
def test_eight_ranks_all_or_nothing(start_daemon, budget, want):
    d = start_daemon("--budget", budget, "--prewarm", "0")
    ctx = mp.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    ranks = [ctx.Process(target=_rank, args=(d.socket, q, go)) for _ in range(8)]
    for p in ranks:
        p.start()
    go.set()
    got = [q.get(timeout=30) for _ in ranks]
    assert {g[0] for g in got} == {want}, got
    for p in ranks:
        p.join(30)
