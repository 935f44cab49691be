# SPDX-License-Identifier: MIT
"""The status room: the daemon's status and lease rows as dicts, and the admin calls (revoke, set).

Each function takes the C client handle that Client passes in while it counts the call in flight
(Client._enter/_leave), so this room needs nothing of the client room and is not imported back by it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import math
import pwd
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
        d = _status_dict(st.contents, leases)
        # After uptime_ms, as pinctl writes them; None from an older library or daemon (pinctl's null).
        ns, root = None, ctypes.c_char_p()
        fn = _lib.optional("pb_status_cgroup_namespace")
        if fn is not None:
            ns = _dec(fn(ctypes.cast(st, ctypes.c_void_p), ctypes.byref(root)))
        extra = {"cgroup_namespace": ns or None,
                 "cgroup_ns_root": (_dec(root.value) or None) if ns else None}
        books, warning = ctypes.c_char_p(), None
        fn = _lib.optional("pb_status_restart_warning")
        if fn is not None:
            warning = _dec(fn(ctypes.cast(st, ctypes.c_void_p), ctypes.byref(books)))
        extra["restart_books"] = (_dec(books.value) or None) if fn is not None else None
        extra["restart_warning"] = warning or None
        fn = _lib.optional("pb_status_job_unknown")
        if fn is not None:
            acquires = ctypes.c_uint64()
            extra["job_unknown_clients"] = int(fn(ctypes.cast(st, ctypes.c_void_p), ctypes.byref(acquires)))
            extra["job_unknown_total"] = acquires.value
        _staging(st, d, extra)
        return _after(d, "uptime_ms", extra)
    finally:
        lib.pb_status_free(st)


_STAGING_KEYS = ("h2d_bytes", "d2h_bytes", "h2d_copies", "d2h_copies", "driver_copies", "h2d_bytes_per_s",
                 "d2h_bytes_per_s", "ring_bytes", "rings", "ring_revoked", "ring_refused", "busy_ns")


def _staging(st: Any, d: Dict[str, Any], extra: Dict[str, Any]) -> None:
    """The staging figures pinctl status --json writes: the summary's four after job_unknown_total (0 from an
    older library), and each client row's "staging" (None when it never staged and holds no ring)."""
    fn = _lib.optional("pb_status_staging")
    sum_ = _lib.StatusStaging()
    if fn is not None:
        fn(ctypes.cast(st, ctypes.c_void_p), ctypes.byref(sum_))
    extra["staging_rings"] = int(sum_.rings)
    extra["staging_ring_bytes"] = int(sum_.ring_bytes)
    extra["staged_h2d_bytes"] = int(sum_.h2d_bytes)
    extra["staged_d2h_bytes"] = int(sum_.d2h_bytes)
    fn = _lib.optional("pb_status_client_staging")
    for i, row in enumerate(d["clients"]):
        cs = _lib.ClientStaging()
        have = fn is not None and fn(ctypes.cast(st, ctypes.c_void_p), i, ctypes.byref(cs)) == 1
        row["staging"] = {k: int(getattr(cs, k)) for k in _STAGING_KEYS} if have else None


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


def admin_revoke_reservation(ptr: int, reservation: int, deadline_ms: int) -> List[int]:
    """pb_admin_revoke(PB_REVOKE_RESERVATION): the reservation ends; the ids of the leases taken from it revoked."""
    lib = _lib.load()
    ids = ctypes.POINTER(ctypes.c_uint64)()
    n = ctypes.c_size_t()
    r = lib.pb_admin_revoke(ptr, _lib.PB_REVOKE_RESERVATION, reservation, 0, deadline_ms, ctypes.byref(ids),
                            ctypes.byref(n))
    if r < 0:
        _raise(r, f"revoking reservation {reservation}")
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


@dataclasses.dataclass(frozen=True)
class Bound:
    """One bound on what this client may still get (Client.headroom): ``kind`` as pinctl headroom names it
    ("budget", "uid_quota", "job_quota", "job_unknown", "no_revoke", "pressure", "uid_leases", "uid_chunks",
    "capacity", "connection_leases"); ``limit`` and ``used`` in bytes, or counts for the last four; ``left`` the
    bytes an acquire may have under it, None where a count cap bounds no bytes; ``reason`` the daemon's words."""

    kind: str
    limit: int
    used: int
    left: Optional[int]
    reason: str


@dataclasses.dataclass(frozen=True)
class Headroom:
    """What this client may still get now, from one state of the daemon (Client.headroom): an acquire of
    ``available`` bytes is granted, one of a page (``page_bytes``) more is refused by ``binding``, the bound of
    ``bounds`` that binds. ``state`` is the pressure state (normal, tight, critical)."""

    available: int
    page_bytes: int
    state: str
    bounds: List[Bound]
    binding: Bound


def headroom(ptr: int, no_revoke: bool, registration: bool) -> Headroom:
    """pb_headroom (Client.headroom)."""
    fn = _lib.optional("pb_headroom")
    if fn is None:
        _raise(-errno.EOPNOTSUPP, "asking the headroom: this libpinbroker predates pb_headroom (upgrade it)")
    name = _lib.optional("pb_bound_name")
    h = _lib.Headroom()
    flags = (_lib.PB_ACQUIRE_NO_REVOKE if no_revoke else 0) | (_lib.PB_HEADROOM_REGISTER if registration else 0)
    r = fn(ptr, flags, ctypes.byref(h))
    if r < 0:
        _raise(r, "asking the headroom")
    bounds = [
        Bound(kind=(_dec(name(b.kind)) or "unknown") if name else str(b.kind), limit=int(b.limit), used=int(b.used),
              left=None if b.left_bytes == _lib.PB_HEADROOM_UNBOUNDED else int(b.left_bytes),
              reason=_dec(b.reason) or "")
        for b in h.bounds[:h.n_bounds]
    ]
    return Headroom(available=int(h.available_bytes), page_bytes=int(h.page_bytes), state=_dec(h.state) or "",
                    bounds=bounds, binding=bounds[h.binding])


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
        "user": _user(int(li.uid)),
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
    if hasattr(li, "staging_ring"):
        d["staging_ring"] = bool(li.staging_ring)
    return d


#: The schema of Client.status()'s dict: pinctl status --json's (client/pinctl/pinctl-output.h JSON_SCHEMA_VERSION).
SCHEMA_VERSION = 1


def _user(uid: int) -> str:
    """A uid's user name, or the number, as pinctl prints it."""
    try:
        return pwd.getpwuid(uid).pw_name or str(uid)
    except (KeyError, OverflowError):
        return str(uid)


def _num(v: float) -> Optional[float]:
    """A figure as JSON has it: None for NaN or infinity (an absent threshold), as pinctl writes null."""
    return v if math.isfinite(v) else None


def _after(d: Dict[str, Any], key: str, extra: Dict[str, Any]) -> Dict[str, Any]:
    """d with extra's keys placed right after key (the order pinctl's JSON has)."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        out[k] = v
        if k == key:
            out.update(extra)
    return out


def _status_dict(s: _lib.Status, with_leases: bool) -> Dict[str, Any]:
    """struct pb_status as the dict ``pinctl status --json`` prints: the same keys, in its order, with the same
    nulls (client/pinctl/pinctl-output.c status_json); "leases" only with ``with_leases``. Figures that an older
    library lacks are 0 (or empty), as an older daemon sends them."""
    reg = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusRegistration)).contents \
        if _lib.has_registration() else None
    pages = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusPages)).contents if _lib.has_numa() else None
    jobs = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusJobs)).contents \
        if _lib.has_status_jobs() else None
    unb = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusUnbrokered)).contents \
        if jobs is not None and _lib.has_status_unbrokered() else None

    cls = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusClasses)).contents \
        if unb is not None and _lib.has_status_classes() else None

    warm = ctypes.cast(ctypes.pointer(s), ctypes.POINTER(_lib.StatusWarming)).contents \
        if cls is not None and _lib.has_status_warming() else None

    def reg_field(name: str) -> int:
        return int(getattr(reg, name)) if reg is not None else 0

    def unb_field(name: str) -> int:
        return int(getattr(unb, name)) if unb is not None else 0

    d: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "version": _dec(s.server_version) or "",
        "budget_bytes": int(s.budget_bytes),
        "uid_quota_bytes": int(s.uid_quota_bytes),
        "leased_bytes": int(s.leased_bytes),
        "pool_bytes": int(s.pool_bytes),
        "pool_idle_bytes": int(s.pool_idle_bytes),
        "free_bytes": max(0, int(s.budget_bytes) - int(s.leased_bytes)),
        "page_size_bytes": int(s.page_size_bytes),
        "chunk_size_bytes": int(s.chunk_size_bytes),
        # One class (the largest is the smallest) and no capacity from an older library, as from an older daemon.
        "chunk_max_bytes": int(cls.chunk_max_bytes) if cls is not None else int(s.chunk_size_bytes),
        "chunk_capacity": int(cls.chunk_capacity) if cls is not None else 0,
        # False from an older library, as from an older daemon (which served only once warm).
        "pool_warming": bool(warm.pool_warming) if warm is not None else False,
        "hugetlb": bool(s.hugetlb),
        "page_kind": (_dec(pages.page_kind) or "") if pages is not None else "unknown",
    }
    for name in ("thp_bytes", "thp_failures", "hugetlb_bytes", "huge_pages_free_bytes"):
        d[name] = int(getattr(pages, name)) if pages is not None else 0
    d["nodes"] = [
        {"node": n.node, "idle_bytes": n.idle_bytes, "lent_bytes": n.lent_bytes,
         "misplaced_bytes": n.misplaced_bytes, "gpus": n.gpus, "mem_free_bytes": n.mem_free_bytes}
        for n in ((pages.nodes[i] for i in range(pages.n_nodes)) if pages is not None else ())
    ]
    d["overdue_bytes"] = int(s.overdue_bytes)
    d["cached_idle_bytes"] = int(s.cached_idle_bytes)
    for name in ("registered_bytes", "no_revoke_bytes", "unbrokered_bytes"):
        d[name] = reg_field(name)
    # The unbrokered figures are clients' word: the dict says so, as pinctl's JSON does.
    d["unbrokered_source"] = "reported by clients, not verified"
    d["unbrokered_reported_bytes"] = unb_field("unbrokered_reported_bytes")
    d["unbrokered_cap_bytes"] = unb_field("unbrokered_cap_bytes")
    d["unbrokered_uids"] = [
        {"uid": u.uid, "user": _user(u.uid), "connections": u.connections, "reported_bytes": u.reported_bytes,
         "counted_bytes": u.counted_bytes}
        for u in ((unb.unbrokered_uids[i] for i in range(unb.n_unbrokered_uids)) if unb is not None else ())
    ]
    d["orphaned_bytes"] = unb_field("orphaned_bytes")
    d["prewarm_bytes"] = int(s.prewarm_bytes)
    d["waiting_acquires"] = int(s.waiting_acquires)
    d["pressure_state"] = _dec(s.pressure_state) or ""
    d["monitor_mode"] = _dec(s.monitor_mode) or ""
    d["uptime_ms"] = int(s.uptime_ms)
    d["signals"] = [
        {"name": _dec(g.name) or "", "value": _num(g.value), "tight": _num(g.tight), "critical": _num(g.critical),
         "unit": _dec(g.unit) or "", "available": bool(g.available)}
        for g in (s.signals[i] for i in range(s.n_signals))
    ]
    for key in ("transitions", "revocations"):
        arr, n = getattr(s, key), getattr(s, "n_" + key)
        d[key] = [{"age_ms": arr[i].age_ms, "text": _dec(arr[i].text) or ""} for i in range(n)]
    d["clients"] = []
    cgroups = jobs.client_cgroups if jobs is not None else None
    if s.clients and s.n_clients:
        rows = ctypes.cast(s.clients, ctypes.POINTER(_lib.row_types()[0]))
        for i in range(s.n_clients):
            c = rows[i]
            labels = _dec(c.labels) or ""
            d["clients"].append({
                "pid": c.pid, "uid": c.uid, "user": _user(c.uid), "name": _dec(c.name) or "", "leases": c.leases,
                "attached": int(getattr(c, "attached", 0)), "bytes": c.bytes,
                "unbrokered_bytes": int(getattr(c, "unbrokered_bytes", 0)),
                "cgroup": (_dec(cgroups[i]) or None) if cgroups else None,
                # Comma-joined in pb_client_info; a list, as in pinctl's JSON.
                "labels": [x for x in labels.split(",") if x],
            })
    d["jobs"] = []
    for j in ((jobs.jobs[i] for i in range(jobs.n_jobs)) if jobs is not None else ()):
        row: Dict[str, Any] = {"job": _dec(j.job) or "", "bytes": j.bytes, "leases": j.leases,
                               "quota_bytes": j.quota_bytes if j.has_quota else None}
        if j.has_quota:  # a rule and its source only with a quota, as pinctl writes them
            row["rule"] = _dec(j.rule) or ""
            row["source"] = _dec(j.source) or ""
        d["jobs"].append(row)
    if with_leases:
        d["leases"] = _lease_rows(s.leases, s.n_leases)
    return d
