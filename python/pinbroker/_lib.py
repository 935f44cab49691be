# SPDX-License-Identifier: MIT
"""Finding libpinbroker.so and declaring its C API with ctypes (the layout of client/lib/pinbroker.h)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import glob
import os
import re
import threading
from typing import List, Optional, Tuple

from .errors import LibraryNotFound

#: The SONAME of the ABI this binding is written against (client/lib/CMakeLists.txt: SOVERSION 1).
SONAME = "libpinbroker.so.1"
#: The Debian/Ubuntu package that ships that library, named in LibraryNotFound's advice (kept with SONAME:
#: the package's name carries the SONAME's number).
DEBIAN_PACKAGE = "libpinbroker1"
#: Environment variable naming the library file to load, ahead of every other place.
LIBRARY_ENV = "PINBROKER_LIBRARY"

PB_ACQUIRE_WAIT = 1 << 0
PB_ACQUIRE_NO_CUDA = 1 << 1
PB_ACQUIRE_NO_CACHE = 1 << 2
PB_ACQUIRE_NO_REVOKE = 1 << 3
PB_ACQUIRE_MAPPED = 1 << 4
PB_REGISTER_CHARGE_ONLY = 1 << 5
PB_ACQUIRE_STAGING_RING = 1 << 10
PB_STATUS_LEASES = 1 << 0
PB_REVOKE_LEASE = 0
PB_REVOKE_UID = 1
PB_REVOKE_ALL = 2
PB_REVOKE_ORPHANS = 3
PB_REVOKE_ORPHANS_UID = 4
PB_REVOKE_RESERVATION = 5
PB_SHARE_TOKEN_LEN = 33  # 32 characters and the NUL

PB_PRIORITY_NORMAL = 0
PB_PRIORITY_CRITICAL = 1
PB_PRIORITY_BEST_EFFORT = 2

PB_MEM_PINNED = 0
PB_MEM_LOCKED = 1
PB_MEM_FALLBACK = 2


class ReservationInfo(ctypes.Structure):
    """struct pb_reservation_info."""

    _fields_ = [
        ("id", ctypes.c_uint64),
        ("uid", ctypes.c_uint32),
        ("name", ctypes.c_char * 64),
        ("job", ctypes.c_char * 256),
        ("state", ctypes.c_char * 16),
        ("shares", ctypes.c_uint32),
        ("share_bytes", ctypes.c_uint64),
        ("taken", ctypes.c_uint32),
        ("bytes_reserved", ctypes.c_uint64),
        ("members", ctypes.c_uint32),
        ("age_ms", ctypes.c_uint64),
    ]


class AcquireOpts(ctypes.Structure):
    """struct pb_acquire_opts."""

    _fields_ = [
        ("flags", ctypes.c_uint32),
        ("timeout_ms", ctypes.c_uint32),
        ("priority", ctypes.c_int),  # enum pb_priority
        ("label", ctypes.c_char_p),
    ]


class ClientInfo(ctypes.Structure):
    """struct pb_client_info."""

    _fields_ = [
        ("pid", ctypes.c_int32),
        ("uid", ctypes.c_uint32),
        ("leases", ctypes.c_uint32),
        ("bytes", ctypes.c_uint64),
        ("labels", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
    ]


class LeaseInfo(ctypes.Structure):
    """struct pb_lease_info."""

    _fields_ = [
        ("id", ctypes.c_uint64),
        ("pid", ctypes.c_int32),
        ("uid", ctypes.c_uint32),
        ("bytes", ctypes.c_uint64),
        ("label", ctypes.c_char_p),
        ("age_ms", ctypes.c_uint64),
        ("priority", ctypes.c_int),
        ("state", ctypes.c_char_p),
        ("idle_ms", ctypes.c_uint64),
        ("deadline_left_ms", ctypes.c_int64),
    ]


class ClientInfoShared(ctypes.Structure):
    """struct pb_client_info of a library with shared leases (pb_lease_share): one more field."""

    _fields_ = ClientInfo._fields_ + [("attached", ctypes.c_uint32)]


PB_LEASE_INFO_PIDS = 16


class LeaseInfoShared(ctypes.Structure):
    """struct pb_lease_info of a library with shared leases (pb_lease_share): the sharing fields."""

    _fields_ = LeaseInfo._fields_ + [
        ("shared", ctypes.c_int),
        ("holder_detached", ctypes.c_int),
        ("attachers", ctypes.c_uint32),
        ("n_attacher_pids", ctypes.c_size_t),
        ("attacher_pids", ctypes.c_int32 * PB_LEASE_INFO_PIDS),
    ]


class ClientInfoRegistration(ctypes.Structure):
    """struct pb_client_info of a library with registrations (pb_register): unbrokered bytes too."""

    _fields_ = ClientInfoShared._fields_ + [("unbrokered_bytes", ctypes.c_uint64)]


class LeaseInfoRegistration(ctypes.Structure):
    """struct pb_lease_info of a library with registrations (pb_register): the lease's kind too."""

    _fields_ = LeaseInfoShared._fields_ + [("registration", ctypes.c_int), ("no_revoke", ctypes.c_int)]


class LeaseInfoNuma(ctypes.Structure):
    """struct pb_lease_info of a library with NUMA placement (pb_lease_numa_node): the lease's node too."""

    _fields_ = LeaseInfoRegistration._fields_ + [("numa_node", ctypes.c_int), ("misplaced", ctypes.c_int)]


class LeaseInfoJob(ctypes.Structure):
    """struct pb_lease_info of a library with job quotas (pb_quota_list): the job it is charged to."""

    _fields_ = LeaseInfoNuma._fields_ + [("job", ctypes.c_char_p)]


class LeaseInfoSharedMemory(ctypes.Structure):
    """struct pb_lease_info of a library that charges shared-memory registrations once
    (pb_lease_shared_memory): the row's charge and the registrations of the same file."""

    _fields_ = LeaseInfoJob._fields_ + [
        ("charged_bytes", ctypes.c_uint64),
        ("registrants", ctypes.c_uint32),
        ("n_registrant_pids", ctypes.c_size_t),
        ("registrant_pids", ctypes.c_int32 * PB_LEASE_INFO_PIDS),
    ]


class LeaseInfoStaging(ctypes.Structure):
    """struct pb_lease_info of a library that names staging rings (pb_status_staging): staging_ring sits in what
    was padding after registrants, so every other member keeps its offset."""

    _fields_ = LeaseInfoJob._fields_ + [
        ("charged_bytes", ctypes.c_uint64),
        ("registrants", ctypes.c_uint32),
        ("staging_ring", ctypes.c_int),
        ("n_registrant_pids", ctypes.c_size_t),
        ("registrant_pids", ctypes.c_int32 * PB_LEASE_INFO_PIDS),
    ]


class ClientStaging(ctypes.Structure):
    """struct pb_client_staging (pb_status_client_staging)."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "h2d_bytes", "d2h_bytes", "h2d_copies", "d2h_copies", "driver_copies", "ring_revoked", "ring_refused",
        "busy_ns", "h2d_bytes_per_s", "d2h_bytes_per_s", "ring_bytes")] + [("rings", ctypes.c_uint32)]


class StatusStaging(ctypes.Structure):
    """struct pb_status_staging (pb_status_staging)."""

    _fields_ = [("rings", ctypes.c_uint32), ("ring_bytes", ctypes.c_uint64), ("h2d_bytes", ctypes.c_uint64),
                ("d2h_bytes", ctypes.c_uint64)]


PB_HEADROOM_BOUNDS_MAX = 16
PB_HEADROOM_UNBOUNDED = (1 << 64) - 1
PB_HEADROOM_REGISTER = 1 << 16


class HeadroomBound(ctypes.Structure):
    """struct pb_headroom_bound."""

    _fields_ = [("kind", ctypes.c_int), ("limit", ctypes.c_uint64), ("used", ctypes.c_uint64),
                ("left_bytes", ctypes.c_uint64), ("reason", ctypes.c_char * 256)]


class Headroom(ctypes.Structure):
    """struct pb_headroom (pb_headroom)."""

    _fields_ = [("available_bytes", ctypes.c_uint64), ("page_bytes", ctypes.c_uint64), ("n_bounds", ctypes.c_size_t),
                ("binding", ctypes.c_size_t), ("state", ctypes.c_char * 16),
                ("bounds", HeadroomBound * PB_HEADROOM_BOUNDS_MAX)]


class SignalInfo(ctypes.Structure):
    """struct pb_signal_info."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("value", ctypes.c_double),
        ("tight", ctypes.c_double),
        ("critical", ctypes.c_double),
        ("unit", ctypes.c_char_p),
        ("available", ctypes.c_int),
    ]


class EventInfo(ctypes.Structure):
    """struct pb_event_info."""

    _fields_ = [("age_ms", ctypes.c_uint64), ("text", ctypes.c_char_p)]


class Status(ctypes.Structure):
    """struct pb_status. The client and lease rows are void pointers: their struct depends on the
    library's version (row_types()), and arrays are indexed by the struct's size."""

    _fields_ = [
        ("schema_version", ctypes.c_uint32),
        ("server_version", ctypes.c_char_p),
        ("budget_bytes", ctypes.c_uint64),
        ("uid_quota_bytes", ctypes.c_uint64),
        ("leased_bytes", ctypes.c_uint64),
        ("pool_bytes", ctypes.c_uint64),
        ("pool_idle_bytes", ctypes.c_uint64),
        ("page_size_bytes", ctypes.c_uint64),
        ("chunk_size_bytes", ctypes.c_uint64),
        ("hugetlb", ctypes.c_int),
        ("overdue_bytes", ctypes.c_uint64),
        ("cached_idle_bytes", ctypes.c_uint64),
        ("prewarm_bytes", ctypes.c_uint64),
        ("waiting_acquires", ctypes.c_uint32),
        ("pressure_state", ctypes.c_char_p),
        ("monitor_mode", ctypes.c_char_p),
        ("uptime_ms", ctypes.c_uint64),
        ("n_clients", ctypes.c_size_t),
        ("clients", ctypes.c_void_p),
        ("n_leases", ctypes.c_size_t),
        ("leases", ctypes.c_void_p),
        ("n_signals", ctypes.c_size_t),
        ("signals", ctypes.POINTER(SignalInfo)),
        ("n_transitions", ctypes.c_size_t),
        ("transitions", ctypes.POINTER(EventInfo)),
        ("n_revocations", ctypes.c_size_t),
        ("revocations", ctypes.POINTER(EventInfo)),
    ]


class StatusRegistration(ctypes.Structure):
    """struct pb_status of a library with registrations (pb_register): three more summary figures."""

    _fields_ = Status._fields_ + [
        ("registered_bytes", ctypes.c_uint64),
        ("no_revoke_bytes", ctypes.c_uint64),
        ("unbrokered_bytes", ctypes.c_uint64),
    ]


class NodeInfo(ctypes.Structure):
    """struct pb_node_info: the pool on one NUMA node."""

    _fields_ = [
        ("node", ctypes.c_int),
        ("idle_bytes", ctypes.c_uint64),
        ("lent_bytes", ctypes.c_uint64),
        ("misplaced_bytes", ctypes.c_uint64),
        ("gpus", ctypes.c_uint32),
        ("mem_free_bytes", ctypes.c_uint64),
    ]


JOB_PATH_MAX = 512  # PB_JOB_PATH_MAX


class Job(ctypes.Structure):
    """struct pb_job: one job (cgroup) with leases or a quota."""

    _fields_ = [
        ("job", ctypes.c_char * JOB_PATH_MAX),
        ("bytes", ctypes.c_uint64),
        ("leases", ctypes.c_uint32),
        ("has_quota", ctypes.c_int),
        ("quota_bytes", ctypes.c_uint64),
        ("rule", ctypes.c_char * JOB_PATH_MAX),
        ("source", ctypes.c_char * 8),
    ]


class StatusPages(ctypes.Structure):
    """struct pb_status of a library with NUMA placement (pb_lease_numa_node): the pool's pages and nodes."""

    _fields_ = StatusRegistration._fields_ + [
        ("page_kind", ctypes.c_char_p),
        ("thp_bytes", ctypes.c_uint64),
        ("thp_failures", ctypes.c_uint64),
        ("hugetlb_bytes", ctypes.c_uint64),
        ("huge_pages_free_bytes", ctypes.c_uint64),
        ("n_nodes", ctypes.c_size_t),
        ("nodes", ctypes.POINTER(NodeInfo)),
    ]


class StatusJobs(ctypes.Structure):
    """struct pb_status of a library with per-job quotas (pb_quota_list): job rows and client cgroups."""

    _fields_ = StatusPages._fields_ + [
        ("n_jobs", ctypes.c_size_t),
        ("jobs", ctypes.POINTER(Job)),
        ("client_cgroups", ctypes.POINTER(ctypes.c_char_p)),
    ]


class UnbrokeredUid(ctypes.Structure):
    """struct pb_unbrokered_uid: one uid's unbrokered reports, summed over its connections."""

    _fields_ = [
        ("uid", ctypes.c_uint32),
        ("connections", ctypes.c_uint32),
        ("reported_bytes", ctypes.c_uint64),
        ("counted_bytes", ctypes.c_uint64),
    ]


class StatusUnbrokered(ctypes.Structure):
    """struct pb_status of a library with capped unbrokered reports and orphaned bytes (issue 22): the
    reports before the caps, the cap, the per-uid rows and the orphaned bytes."""

    _fields_ = StatusJobs._fields_ + [
        ("unbrokered_reported_bytes", ctypes.c_uint64),
        ("unbrokered_cap_bytes", ctypes.c_uint64),
        ("n_unbrokered_uids", ctypes.c_size_t),
        ("unbrokered_uids", ctypes.POINTER(UnbrokeredUid)),
        ("orphaned_bytes", ctypes.c_uint64),
    ]


class StatusClasses(ctypes.Structure):
    """struct pb_status of a library with chunk size classes (issue 27): the largest class and the chunks the
    daemon's fds and mappings allow."""

    _fields_ = StatusUnbrokered._fields_ + [
        ("chunk_max_bytes", ctypes.c_uint64),
        ("chunk_capacity", ctypes.c_uint64),
    ]


class StatusWarming(ctypes.Structure):
    """struct pb_status of a library whose start warm-up serves while it grows (issue 27): pool_warming."""

    _fields_ = StatusClasses._fields_ + [
        ("pool_warming", ctypes.c_int),
    ]


class StagingOpts(ctypes.Structure):
    """struct pb_staging_opts: settings of a client's staged copies (0: $PINBROKER_STAGING_* or the default)."""

    _fields_ = [
        ("ring_bytes", ctypes.c_size_t),
        ("slot_bytes", ctypes.c_size_t),
        ("threads", ctypes.c_uint),
        ("threshold_bytes", ctypes.c_size_t),
    ]


class StagingStats(ctypes.Structure):
    """struct pb_staging_stats: what a client's staged copies did."""

    _fields_ = [
        ("h2d_bytes", ctypes.c_uint64),
        ("d2h_bytes", ctypes.c_uint64),
        ("h2d_copies", ctypes.c_uint64),
        ("d2h_copies", ctypes.c_uint64),
        ("driver_copies", ctypes.c_uint64),
        ("ring_bytes", ctypes.c_uint64),
        ("ring_leases", ctypes.c_uint64),
        ("ring_revoked", ctypes.c_uint64),
        ("ring_refused", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
    ]


#: typedef int (*pb_revoke_fn)(pb_client *c, pb_lease *l, uint32_t deadline_ms, void *userdata);
REVOKE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p)

_vp = ctypes.c_void_p
_int = ctypes.c_int
_size = ctypes.c_size_t
_u64 = ctypes.c_uint64
_u32 = ctypes.c_uint32
_cstr = ctypes.c_char_p

# name: (restype, argtypes). Every one of these is in libpinbroker.so.1 (and was in .so.0).
_REQUIRED = {
    "pb_connect": (_int, [_cstr, ctypes.POINTER(_vp)]),
    "pb_disconnect": (None, [_vp]),
    "pb_acquire": (_int, [_vp, _size, ctypes.POINTER(AcquireOpts), ctypes.POINTER(_vp)]),
    "pb_acquire_or_fallback": (_vp, [_vp, _size, ctypes.POINTER(AcquireOpts)]),
    "pb_release": (_int, [_vp, _vp]),
    "pb_lease_data": (_vp, [_vp]),
    "pb_lease_size": (_size, [_vp]),
    "pb_lease_page_size": (_size, [_vp]),
    "pb_lease_id": (_u64, [_vp]),
    "pb_lease_kind": (_int, [_vp]),
    "pb_lease_cuda_registered": (_int, [_vp]),
    "pb_lease_hugetlb": (_int, [_vp]),
    "pb_lease_chunks": (_size, [_vp]),
    "pb_lease_fallback_reason": (_cstr, [_vp]),
    # void in the first release, int (0 or -ESTALE/-EINVAL) with shared leases: see set_idle_returns_int().
    "pb_lease_set_idle": (_int, [_vp, _int]),
    "pb_set_revoke_callback": (None, [_vp, REVOKE_FN, _vp]),
    "pb_set_cache_limit": (None, [_vp, _size]),
    "pb_cuda_available": (_int, [ctypes.POINTER(_cstr)]),
    "pb_last_error": (_cstr, []),
    "pb_strerror": (_cstr, [_int]),
    "pb_status_query": (_int, [_vp, ctypes.c_uint, ctypes.POINTER(ctypes.POINTER(Status))]),
    "pb_status_free": (None, [ctypes.POINTER(Status)]),
    "pb_leases_page": (
        _int,
        [_vp, _u64, _size, ctypes.POINTER(_vp), ctypes.POINTER(_size), ctypes.POINTER(_u64)],
    ),
    "pb_lease_info_free": (None, [_vp, _size]),
    "pb_admin_revoke": (
        _int,
        [_vp, _int, _u64, _u32, _u32, ctypes.POINTER(ctypes.POINTER(_u64)), ctypes.POINTER(_size)],
    ),
    "pb_admin_set": (_int, [_vp, _cstr, _cstr]),
}

# Added later (shared leases, issue 10): declared on first use, so this package still imports and works
# against a library that predates them.
_OPTIONAL = {
    # What this client may still get now, each bound with its reason (pinctl headroom).
    "pb_headroom": (_int, [_vp, ctypes.c_uint, ctypes.POINTER(Headroom)]),
    "pb_bound_name": (_cstr, [ctypes.c_int]),
    "pb_lease_share": (_int, [_vp, _vp, ctypes.POINTER(ctypes.c_uint32), _size, ctypes.c_char_p]),
    "pb_attach": (_int, [_vp, _cstr, ctypes.POINTER(_vp)]),
    "pb_lease_attached": (_int, [_vp]),
    "pb_lease_stale": (_int, [_vp]),
    # Registrations and unbrokered reports (issue 14).
    "pb_register": (_int, [_vp, _vp, _size, _vp, ctypes.POINTER(_vp)]),
    "pb_unregister": (_int, [_vp, _vp]),
    "pb_report_unbrokered": (_int, [_vp, ctypes.c_uint64]),
    # All-or-nothing reservations for groups of ranks.
    "pb_reserve": (_int, [_vp, _cstr, _u32, _u64, _u32, _u32, ctypes.POINTER(_u64)]),
    "pb_acquire_from": (_int, [_vp, _u64, _size, ctypes.POINTER(AcquireOpts), ctypes.POINTER(_vp)]),
    "pb_reservation_release": (_int, [_vp, _u64]),
    "pb_reservations": (
        _int,
        [_vp, ctypes.POINTER(ctypes.POINTER(ReservationInfo)), ctypes.POINTER(_size), ctypes.POINTER(_u64)],
    ),
    # Registrations of shared memory charged once (issue 26).
    "pb_lease_shared_memory": (_int, [_vp]),
    # Registration in pieces below the driver's per-call cap (issues 26, 27).
    "pb_lease_cuda_piece_bytes": (_size, [_vp]),
    # A rank of a shared region registers only its slice.
    "pb_attach_opts": (_int, [_vp, _cstr, _vp, ctypes.POINTER(_vp)]),
    "pb_lease_register_slice": (_int, [_vp, _size, _size, ctypes.c_uint32]),
    "pb_lease_cuda_slice": (_int, [_vp, ctypes.POINTER(_size), ctypes.POINTER(_size)]),
    # The daemon's cgroup namespace, kept out of struct pb_status (issue 28).
    "pb_status_cgroup_namespace": (_cstr, [_vp, ctypes.POINTER(_cstr)]),
    # What the daemon knew at start of what its predecessor lent (issue 38).
    "pb_status_restart_warning": (_cstr, [_vp, ctypes.POINTER(_cstr)]),
    # Clients whose job (cgroup) the daemon could not read, and their acquires under quota rules (issue 38).
    "pb_status_job_unknown": (ctypes.c_uint32, [_vp, ctypes.POINTER(ctypes.c_uint64)]),
    # Staged copies through a pinned ring leased from the broker (issue 39).
    "pb_copy_to_device": (_int, [_vp, _u64, _vp, _size, _vp]),
    "pb_copy_from_device": (_int, [_vp, _vp, _u64, _size, _vp]),
    "pb_staging_configure": (_int, [_vp, ctypes.POINTER(StagingOpts)]),
    "pb_staging_stats": (_int, [_vp, ctypes.POINTER(StagingStats)]),
    # Staging rings and clients' staged copies, kept out of struct pb_status and pb_client_info (issue 39).
    "pb_status_staging": (_int, [_vp, ctypes.POINTER(StatusStaging)]),
    "pb_status_client_staging": (_int, [_vp, _size, ctypes.POINTER(ClientStaging)]),
}


def _repo_candidates() -> List[str]:
    """Libraries in the build trees of the source checkout this package is run from, newest first.

    Only when the package sits in a checkout (python/pinbroker/ next to client/lib/pinbroker.h): an
    installed package never looks here.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isfile(os.path.join(root, "client", "lib", "pinbroker.h")):
        return []
    found = glob.glob(os.path.join(root, "build*", "client", SONAME))
    return sorted(found, key=lambda p: os.path.getmtime(p), reverse=True)


def _candidates() -> List[Tuple[str, str]]:
    """(what to dlopen, where it came from), in search order."""
    out: List[Tuple[str, str]] = []
    env = os.environ.get(LIBRARY_ENV)
    if env:
        # Named explicitly: this one or nothing, so a typo is not papered over by another copy.
        return [(env, "$" + LIBRARY_ENV)]
    out += [(p, "the source checkout's build tree") for p in _repo_candidates()]
    out.append((SONAME, "the dynamic linker's search path"))
    found = ctypes.util.find_library("pinbroker")
    if found and found != SONAME:
        out.append((found, "ctypes.util.find_library"))
    return out


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_load_error: Optional[LibraryNotFound] = None


def load() -> ctypes.CDLL:
    """Load libpinbroker once and declare its functions; raise LibraryNotFound saying what to do."""
    global _lib, _lib_path, _load_error
    with _lock:
        if _lib is not None:
            return _lib
        if _load_error is not None:
            raise _load_error
        tried = []
        for name, origin in _candidates():
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                tried.append(f"{name} ({origin}): {e}")
                continue
            missing = [f for f in _REQUIRED if not hasattr(lib, f)]
            if missing:
                tried.append(f"{name} ({origin}): not libpinbroker (lacks {', '.join(missing[:3])})")
                continue
            for fname, (res, args) in _REQUIRED.items():
                fn = getattr(lib, fname)
                fn.restype = res
                fn.argtypes = args
            _lib, _lib_path = lib, getattr(lib, "_name", name)
            return lib
        _load_error = LibraryNotFound(
            errno.ELIBACC,
            "cannot load libpinbroker: tried "
            + "; ".join(tried)
            + f". Install pinbroker's C library: install {DEBIAN_PACKAGE} (Debian/Ubuntu: apt install "
            f"{DEBIAN_PACKAGE}), or from source so that {SONAME} is on the linker's path (cmake --install "
            f"<build dir>, then ldconfig), or set {LIBRARY_ENV}=/path/to/{SONAME}",
        )
        raise _load_error


def path() -> Optional[str]:
    """The file the library was loaded from (what was passed to dlopen), or None before load()."""
    return _lib_path


def optional(name: str) -> Optional[ctypes._CFuncPtr]:  # type: ignore[name-defined]
    """A function of _OPTIONAL, declared on first use, or None when this library lacks it."""
    lib = load()
    try:
        fn = getattr(lib, name)
    except AttributeError:
        return None
    res, args = _OPTIONAL[name]
    fn.restype = res
    fn.argtypes = args
    return fn


def has_staging() -> bool:
    """True for a library with staged copies (pb_copy_to_device, issue 39)."""
    return hasattr(load(), "pb_copy_to_device")


def has_sharing() -> bool:
    """True for a library with shared leases (pb_lease_share): its status rows have the sharing fields and
    pb_lease_set_idle returns int. Both came with pb_lease_share (issue 10), so its presence decides."""
    return hasattr(load(), "pb_lease_share")


def has_registration() -> bool:
    """True for a library with registrations (pb_register): its status structs grew with it."""
    return hasattr(load(), "pb_register")


def has_status_jobs() -> bool:
    """True for a library with per-job quotas (pb_quota_list): its struct pb_status ends with job rows."""
    return hasattr(load(), "pb_quota_list")


def has_numa() -> bool:
    """True for a library with NUMA placement (pb_lease_numa_node): its lease rows grew with it."""
    return hasattr(load(), "pb_lease_numa_node")


def has_status_unbrokered() -> bool:
    """True for a library whose struct pb_status ends with the unbrokered caps, per-uid rows and orphaned
    bytes (issue 22). No function came with them; pb_set_cache_slack came after both, and a library of a
    later SONAME has them too."""
    lib = load()
    m = re.match(r"libpinbroker\.so\.(\d+)", os.path.basename(path() or ""))
    return hasattr(lib, "pb_set_cache_slack") or bool(m and int(m.group(1)) >= 1)


def has_status_classes() -> bool:
    """True for a library whose struct pb_status ends with the chunk classes (issue 27). No function came with
    them; pb_status_cgroup_namespace came in the same release."""
    return hasattr(load(), "pb_status_cgroup_namespace")


def has_status_warming() -> bool:
    """True for a library whose struct pb_status ends with pool_warming (issue 27): pb_status_pool_warming
    came with it."""
    return hasattr(load(), "pb_status_pool_warming")


def version() -> str:
    """The library's version (pb_version), "" for a library without it."""
    fn = getattr(load(), "pb_version", None)
    if fn is None:
        return ""
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    v = fn()
    return v.decode("utf-8", "replace") if v else ""


def row_types() -> Tuple[type, type]:
    """(client row struct, lease row struct) of the loaded library."""
    if hasattr(load(), "pb_status_staging"):
        return (ClientInfoRegistration, LeaseInfoStaging)
    if hasattr(load(), "pb_lease_shared_memory"):
        return (ClientInfoRegistration, LeaseInfoSharedMemory)
    if hasattr(load(), "pb_quota_list"):
        return (ClientInfoRegistration, LeaseInfoJob)
    if has_numa():
        return (ClientInfoRegistration, LeaseInfoNuma)
    if has_registration():
        return (ClientInfoRegistration, LeaseInfoRegistration)
    return (ClientInfoShared, LeaseInfoShared) if has_sharing() else (ClientInfo, LeaseInfo)


def last_error() -> str:
    """pb_last_error() of the calling thread, decoded."""
    return load().pb_last_error().decode("utf-8", "replace")


def strerror(err: int) -> str:
    """pb_strerror(-errno), decoded."""
    return load().pb_strerror(-abs(err)).decode("utf-8", "replace")
