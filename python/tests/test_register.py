# SPDX-License-Identifier: MIT
"""Budgeted registration and unbrokered reports: Client.register / report_unbrokered over pb_register,
pb_unregister and pb_report_unbrokered (issue 14, item 3), against the real daemon."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

import pinbroker

PAGE = mmap.PAGESIZE
MiB = 1 << 20


def _buffer(n: int):
    buf = (ctypes.c_char * n)()
    return buf, ctypes.addressof(buf)


def test_register_charges_every_touched_page_and_unregister_returns_it(client):
    buf, addr = _buffer(4 * PAGE)
    base = addr - addr % PAGE + PAGE  # a page boundary inside buf
    with client.register(base + 10, PAGE, label="own", cuda=False) as reg:
        assert reg.charged_bytes == 2 * PAGE
        assert reg.shared_memory is False  # private memory: charged per registration
        st = client.status(leases=True)
        assert st["registered_bytes"] == 2 * PAGE
        assert st["no_revoke_bytes"] == 2 * PAGE
        assert st["leased_bytes"] == 2 * PAGE
        row = [r for r in st["leases"] if r["id"] == reg.id][0]
        assert row["registration"] is True and row["no_revoke"] is True and row["label"] == "own"
    st = client.status()
    assert st["registered_bytes"] == 0 and st["leased_bytes"] == 0
    reg.unregister()  # idempotent
    del buf


def test_register_over_budget_raises_the_broker_error(client):
    # Charge-only: the daemon never touches the range, so an address is all the test needs.
    with pytest.raises(pinbroker.TooLarge):
        client.register(0x7F0000000000, 512 * MiB, cuda=False)
    with pytest.raises(pinbroker.InvalidArgument):
        client.register(0, PAGE, cuda=False)
    with pytest.raises(pinbroker.InvalidArgument):
        client.register(0x7F0000000000, 0, cuda=False)
    assert client.status()["leased_bytes"] == 0


def test_unbrokered_reports_replace_each_other(client):
    client.report_unbrokered(3 * MiB)
    assert client.status()["unbrokered_bytes"] == 3 * MiB
    client.report_unbrokered(MiB)
    st = client.status()
    assert st["unbrokered_bytes"] == MiB
    assert st["leased_bytes"] == 0
    assert any(c.get("unbrokered_bytes") == MiB for c in st["clients"])
    client.report_unbrokered(0)
    assert client.status()["unbrokered_bytes"] == 0


def test_close_gives_registrations_back_and_they_stay_readable(daemon):
    c = pinbroker.connect(daemon.socket)
    reg = c.register(0x7F0000000000, 3 * PAGE, cuda=False)
    rid, charged = reg.id, reg.charged_bytes
    c2 = pinbroker.connect(daemon.socket)
    assert c2.status()["registered_bytes"] == 3 * PAGE
    c.close()
    # Given back at close, on the connection's last answer: not held until this process exits.
    assert c2.status()["registered_bytes"] == 0
    assert c2.status()["leased_bytes"] == 0
    # Facts stay readable, and unregister after close does nothing.
    assert (reg.id, reg.charged_bytes) == (rid, charged)
    reg.unregister()
    with c2.register(0x7F0000000000, PAGE, cuda=False):
        pass
    c2.close()


def test_lease_rows_of_several_leases_read_back_whole(client):
    """Every row of a multi-row listing decodes (the row struct's size must match the library's, row after row)."""
    leases = [client.acquire(4096 * (i + 1), label=f"row-{i}") for i in range(4)]
    try:
        rows = {r["id"]: r for r in client.leases()}
        for i, lease in enumerate(leases):
            r = rows[lease.id]
            assert r["label"] == f"row-{i}"
            assert r["bytes"] == 4096 * (i + 1)
            assert r["pid"] == os.getpid()
            assert r.get("misplaced", False) is False
    finally:
        for lease in leases:
            lease.release()


def test_shared_memory_registered_twice_is_charged_once(daemon):
    # Two connections (two ranks' worth) register one MAP_SHARED memfd region: one charge, two registrants.
    fd = os.memfd_create("kv-offload")
    os.ftruncate(fd, 4 * MiB)
    m = mmap.mmap(fd, 4 * MiB, flags=mmap.MAP_SHARED)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    a, b = daemon.connect(), daemon.connect()
    try:
        ra = a.register(addr, 4 * MiB, label="rank0", cuda=False)
        rb = b.register(addr, 4 * MiB, label="rank1", cuda=False)
        assert ra.shared_memory and rb.shared_memory
        st = a.status(leases=True)
        assert st["registered_bytes"] == 4 * MiB and st["leased_bytes"] == 4 * MiB
        rows = {r["id"]: r for r in st["leases"]}
        assert rows[ra.id]["registrants"] == 2 and rows[rb.id]["registrants"] == 2
        assert rows[ra.id]["charged_bytes"] == 4 * MiB and rows[rb.id]["charged_bytes"] == 0
        assert sorted(rows[ra.id]["registrant_pids"]) == [os.getpid(), os.getpid()]
        ra.unregister()
        st = a.status(leases=True)
        assert st["registered_bytes"] == 4 * MiB
        assert [r["charged_bytes"] for r in st["leases"] if r["id"] == rb.id] == [4 * MiB]
        rb.unregister()
        assert a.status()["registered_bytes"] == 0
    finally:
        a.close()
        b.close()
        os.close(fd)
