# SPDX-License-Identifier: MIT
"""The status room: the daemon's status and lease rows as dicts, and the admin calls (revoke, set).

Each function takes the C client handle that Client passes in while it counts the call in flight
(Client._enter/_leave), so this room needs nothing of the client room and is not imported back by it.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional

from . import _lib
from ._lease import _PRIO_BY_C, Priority, _dec, _raise


def query(ptr: int, leases: bool) -> Dict[str, Any]:
    """pb_status_query as a dict (Client.status)."""
    lib = _lib.load()
    st = ctypes.POINTER(_lib.Status)()
    r = lib.pb_status_query(ptr, _lib.PB_STATUS_LEASES if leases else 0, ctypes.byref(st))
    if r < 0:
        _raise(r, "querying the daemon's status")
    try:
        return _status_dict(st.contents, leases)
    finally:
        lib.pb_status_free(st)


def lease_pages(ptr: int) -> List[Dict[str, Any]]:
    """Every lease row pb_leases_page shows this caller, page by page (Client.leases)."""
    lib = _lib.load()
    out: List[Dict[str, Any]] = []
    cursor = 0
    while True:
        rows = ctypes.c_void_p()
        n = ctypes.c_size_t()
        nxt = ctypes.c_uint64()
        r = lib.pb_leases_page(ptr, cursor, 0, ctypes.byref(rows), ctypes.byref(n), ctypes.byref(nxt))
        if r < 0:
            _raise(r, "listing leases")
        try:
            out += _lease_rows(rows.value, n.value)
        finally:
            lib.pb_lease_info_free(rows, n.value)
        cursor = nxt.value
        if cursor == 0:
            return out


def admin_revoke(ptr: int, lease_id: Optional[int], uid: Optional[int], all: bool, deadline_ms: int) -> List[int]:
    """pb_admin_revoke for exactly one of lease_id, uid or all (Client.revoke checked that); the ids revoked."""
    what = _lib.PB_REVOKE_LEASE if lease_id is not None else _lib.PB_REVOKE_UID if uid is not None else _lib.PB_REVOKE_ALL
    lib = _lib.load()
    ids = ctypes.POINTER(ctypes.c_uint64)()
    n = ctypes.c_size_t()
    r = lib.pb_admin_revoke(ptr, what, lease_id or 0, uid or 0, deadline_ms, ctypes.byref(ids), ctypes.byref(n))
    if r < 0:
        _raise(r, "revoking")
    try:
        return [int(ids[i]) for i in range(n.value)]
    finally:
        if ids:
            _libc_free(ids)


def admin_set(ptr: int, key: str, value: str) -> None:
    """pb_admin_set (Client.set)."""
    r = _lib.load().pb_admin_set(ptr, key.encode(), str(value).encode())
    if r < 0:
        _raise(r, f"setting {key}")


def _libc_free(p: Any) -> None:
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    libc.free(ctypes.cast(p, ctypes.c_void_p))


def _lease_rows(ptr: Optional[int], n: int) -> List[Dict[str, Any]]:
    if not ptr or n == 0:
        return []
    rows = ctypes.cast(ptr, ctypes.POINTER(_lib.row_types()[1]))
    return [_lease_info(rows[i]) for i in range(n)]


def _lease_info(li: Any) -> Dict[str, Any]:
    """One pb_lease_info row; with a library that has shared leases, also shared, holder_detached,
    attachers and attacher_pids."""
    d = {
        "id": int(li.id),
        "pid": int(li.pid),
        "uid": int(li.uid),
        "bytes": int(li.bytes),
        "label": _dec(li.label) or "",
        "age_ms": int(li.age_ms),
        "priority": _PRIO_BY_C.get(li.priority, Priority.NORMAL).value,
        "state": _dec(li.state) or "",
        "idle_ms": int(li.idle_ms),
        "deadline_left_ms": int(li.deadline_left_ms),
    }
    if hasattr(li, "attachers"):
        d["shared"] = bool(li.shared)
        d["holder_detached"] = bool(li.holder_detached)
        d["attachers"] = int(li.attachers)
        d["attacher_pids"] = [int(li.attacher_pids[i]) for i in range(min(li.n_attacher_pids, _lib.PB_LEASE_INFO_PIDS))]
    if hasattr(li, "registration"):
        d["registration"] = bool(li.registration)
        d["no_revoke"] = bool(li.no_revoke)
    if hasattr(li, "numa_node"):
        d["numa_node"] = int(li.numa_node) if li.numa_node >= 0 else None
        d["misplaced"] = bool(li.misplaced)
    if hasattr(li, "job"):
        d["job"] = _dec(li.job) or None
    if hasattr(li, "registrants"):
        # Registrations of one shared file are charged once: charged_bytes is this row's part.
        d["charged_bytes"] = int(li.charged_bytes)
        d["registrants"] = int(li.registrants)
        d["registrant_pids"] = [
            int(li.registrant_pids[i]) for i in range(min(li.n_registrant_pids, _lib.PB_LEASE_INFO_PIDS))
        ]
    return d


_STATUS_LISTS = ("clients", "leases", "signals", "transitions", "revocations")


def _status_dict(s: _lib.Status, with_leases: bool) -> Dict[str, Any]:
    """struct pb_status as a dict: every summary field by its C name, and the row arrays as lists."""
    d: Dict[str, Any] = {}
    for name, _typ in _lib.Status._fields_:
        if name.startswith("n_") or name in _STATUS_LISTS:
            continue
        v = getattr(s, name)
        d[name] = _dec(v) if isinstance(v, bytes) or v is None and name.endswith(("version", "state", "mode")) else v
    d["hugetlb"] = bool(s.hugetlb)
    if _lib.has_registration():
        ext = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusRegistration)).contents
        for name in ("registered_bytes", "no_revoke_bytes", "unbrokered_bytes"):
            d[name] = int(getattr(ext, name))
    cgroups = None
    if _lib.has_numa():
        pages = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusPages)).contents
        d["page_kind"] = _dec(pages.page_kind) or "unknown"
        for name in ("thp_bytes", "thp_failures", "hugetlb_bytes", "huge_pages_free_bytes"):
            d[name] = int(getattr(pages, name))
        d["nodes"] = [
            {"node": n.node, "idle_bytes": n.idle_bytes, "lent_bytes": n.lent_bytes,
             "misplaced_bytes": n.misplaced_bytes, "gpus": n.gpus, "mem_free_bytes": n.mem_free_bytes}
            for n in (pages.nodes[i] for i in range(pages.n_nodes))
        ]
    if _lib.has_status_jobs():
        ext = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusJobs)).contents
        d["jobs"] = [
            {"job": _dec(j.job), "bytes": j.bytes, "leases": j.leases,
             "quota_bytes": j.quota_bytes if j.has_quota else None, "rule": _dec(j.rule) or None,
             "source": _dec(j.source) or None}
            for j in (ext.jobs[i] for i in range(ext.n_jobs))
        ]
        cgroups = ext.client_cgroups
    d["clients"] = []
    if s.clients and s.n_clients:
        rows = ctypes.cast(s.clients, ctypes.POINTER(_lib.row_types()[0]))
        for i in range(s.n_clients):
            c = rows[i]
            row = {"pid": c.pid, "uid": c.uid, "leases": c.leases, "bytes": c.bytes, "labels": _dec(c.labels) or "",
                   "name": _dec(c.name) or ""}
            if hasattr(c, "attached"):
                row["attached"] = int(c.attached)
            if hasattr(c, "unbrokered_bytes"):
                row["unbrokered_bytes"] = int(c.unbrokered_bytes)
            if cgroups:
                row["cgroup"] = _dec(cgroups[i]) or None
            d["clients"].append(row)
    d["signals"] = [
        {"name": _dec(g.name), "value": g.value, "tight": g.tight, "critical": g.critical, "unit": _dec(g.unit),
         "available": bool(g.available)}
        for g in (s.signals[i] for i in range(s.n_signals))
    ]
    for key in ("transitions", "revocations"):
        arr, n = getattr(s, key), getattr(s, "n_" + key)
        d[key] = [{"age_ms": arr[i].age_ms, "text": _dec(arr[i].text)} for i in range(n)]
    if with_leases:
        d["leases"] = _lease_rows(s.leases, s.n_leases)
    return d
