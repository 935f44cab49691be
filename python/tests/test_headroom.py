# SPDX-License-Identifier: MIT
"""Client.headroom against the real daemon: the answer names its binding bound, an acquire of exactly
``available`` is granted and one of a page more is refused by that bound (check_itest_headroom covers every
bound in C; these are the ones a Python serving rank meets first)."""
import json

import pytest

import pinbroker

MiB = 1 << 20


def _bound(h: pinbroker.Headroom, kind: str) -> pinbroker.Bound:
    return next(b for b in h.bounds if b.kind == kind)


def test_budget_binds_and_the_headroom_is_exact(start_daemon) -> None:
    d = start_daemon("--budget", "64M", "--prewarm", "0")
    with d.connect() as other, d.connect() as c:
        held = other.acquire(10 * MiB, cuda=False, cache=False)
        h = c.headroom()
        assert h.binding.kind == "budget"
        assert h.available == 54 * MiB
        assert (h.binding.limit, h.binding.used, h.binding.left) == (64 * MiB, 10 * MiB, 54 * MiB)
        assert h.binding.reason and h.state == "normal"
        with pytest.raises(pinbroker.BudgetExhausted, match="budget"):
            c.acquire(h.available + h.page_bytes, cuda=False, cache=False)
        c.acquire(h.available, cuda=False, cache=False).release()
        held.release()


def test_uid_quota_binds(start_daemon) -> None:
    d = start_daemon("--budget", "64M", "--uid-quota", "16M", "--prewarm", "0")
    with d.connect() as c:
        held = c.acquire(5 * MiB, cuda=False, cache=False)
        h = c.headroom()
        assert h.binding.kind == "uid_quota" and h.available == 11 * MiB
        assert _bound(h, "budget").left == 59 * MiB
        with pytest.raises(pinbroker.QuotaExceeded):
            c.acquire(h.available + h.page_bytes, cuda=False, cache=False)
        c.acquire(h.available, cuda=False, cache=False).release()
        held.release()


def test_no_revoke_asks_the_never_revoked_cap_too(start_daemon) -> None:
    d = start_daemon("--budget", "64M", "--max-no-revoke-per-uid", "8M", "--prewarm", "0")
    with d.connect() as c:
        assert c.headroom().binding.kind == "budget"
        h = c.headroom(no_revoke=True)
        assert h.binding.kind == "no_revoke" and h.available == 8 * MiB
        # Count caps bound no bytes until reached: left is None there, and the table says so.
        assert _bound(h, "connection_leases").left is None


def test_pinctl_headroom_json_matches(start_daemon) -> None:
    d = start_daemon("--budget", "64M", "--prewarm", "0")
    out = json.loads(d.pinctl("headroom", "--json").stdout)
    with d.connect() as c:
        h = c.headroom()
    assert out["available_bytes"] == h.available == 64 * MiB
    assert out["binding"] == h.binding.kind == "budget"
    assert [b["bound"] for b in out["bounds"]] == [b.kind for b in h.bounds]
