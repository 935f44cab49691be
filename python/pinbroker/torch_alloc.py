# SPDX-License-Identifier: MIT
"""torch's CUDA host allocator backed by pinbrokerd: every pinned tensor is an exact-size lease.

Usage::

    import pinbroker.torch
    alloc = pinbroker.torch.install()          # torch >= 2.8 with CUDA; loads the prebuilt C++ extension
    x = torch.empty(n, pin_memory=True)        # leased from pinbrokerd: exactly n bytes, page-rounded
    print(alloc.stats())

After :func:`install`, everything torch pins goes through the broker: ``torch.empty(..., pin_memory=True)``,
``Tensor.pin_memory()``, the DataLoader's pin thread, ``non_blocking`` copies to the CPU. Stock torch rounds
each pinned allocation up to a power of two and caches it (a 2.08 GiB tensor took 4 GiB on the H200); here
each is one lease of the requested size, counted by the daemon under the label ``torch:<pid>`` (or
$PINBROKER_LABEL), and given back when the tensor is freed and the CUDA work recorded on it (``non_blocking``
copies) has completed, into a cache of freed blocks: a later request of the same page-rounded size takes
one back without asking the daemon (microseconds, as torch's own cache). Cached blocks stay leases the daemon
counts (shown idle, revoked first under pressure); ``empty_cache()`` gives them back, and a cap (default a
quarter of the uid's quota, $PINBROKER_TORCH_CACHE) bounds them.

Leases are taken with PB_ACQUIRE_NO_REVOKE (torch cannot hand a tensor's memory back on request), so the
daemon never revokes a block torch holds and refuses new ones under pressure instead; only cached blocks are
revoked. A refused lease, and one CUDA did not register, falls back to torch's own allocator;
:meth:`HostAllocator.stats` counts those, and what torch's allocator holds pinned is reported to the daemon
as unbrokered memory (``pinctl status``), unless the interposer runs in the process and counts it itself.

The C++ part (``csrc/host_allocator.cpp``) is compiled ahead of time against the torch that is there:
``cmake --build`` does it when torch >= 2.8 with CUDA is found at configure time (PINBROKER_TORCH_EXT,
next to the build tree's libpinbroker in ``client/pinbroker-torch/``; ``cmake --install`` puts it in
``<libdir>/pinbroker/torch-ext/``), or ``python3 -m pinbroker._build_ext --out DIR``. :func:`install` loads
the first build whose sidecar (``<module>.json``) names exactly this torch version, CUDA, Python ABI and
``host_allocator.cpp``, looking in $PINBROKER_TORCH_EXT_DIR, beside the libpinbroker :mod:`pinbroker._lib`
loaded (``pinbroker-torch/``, then ``pinbroker/torch-ext/``), the package's ``_ext/``, then the JIT folder
of an earlier run (:mod:`pinbroker._torch_ext` has the rules): no compiler, a fraction of a second.
Only when none fits is it built here, with ``torch.utils.cpp_extension.load`` (20-40 s on the H200 host;
it needs a C++ compiler, ninja, the CUDA headers torch was built against and pinbroker.h, found in the
checkout's client/ or an installed include folder) into the user's torch extension folder
($TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions/py<ver>_cu<ver>/<module>); the warning then says
why each build found was passed over. $PINBROKER_TORCH_JIT=0 makes that an error instead.
:attr:`HostAllocator.built` says which ("prebuilt" or "jit"), :attr:`HostAllocator.extension_path` which
file. The extension links nothing of pinbroker's: it opens the libpinbroker that :mod:`pinbroker._lib` found.

Installing does not initialise CUDA (the first pinned allocation does, as in stock torch), so a program can
install before it forks: see ``pinbroker/_autotorch/sitecustomize.py``, which installs right after
``import torch`` when PINBROKER_TORCH=1 (``pinctl run``).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _lib, _torch_ext

__all__ = ["HostAllocator", "install", "install_from_env", "uninstall", "allocator_stats", "MIN_TORCH"]

#: at::HostAllocator and at::setHostAllocator came with torch 2.8 (ATen/core/CachingHostAllocator.h).
MIN_TORCH = (2, 8)
#: Environment variable that makes install_from_env() install (set by ``pinctl run``).
ENV = "PINBROKER_TORCH"
#: Environment variable naming a directory that holds pinbroker.h, ahead of every other place.
INCLUDE_ENV = "PINBROKER_INCLUDE_DIR"
#: Environment variable that, set to 0, forbids building the extension at run time (no prebuilt one: an error).
JIT_ENV = "PINBROKER_TORCH_JIT"

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "csrc", "host_allocator.cpp")
_LOG_TAIL_LINES = 40

_lock = threading.Lock()
_ext: Optional["_Loaded"] = None
_installed: Optional["HostAllocator"] = None


_torch_version = _torch_ext.version_tuple


def _find_include_dir() -> str:
    """The directory holding pinbroker.h: $PINBROKER_INCLUDE_DIR, the checkout's client/lib/ (when this package
    is run from one), then the include directories next to the library and of this interpreter."""
    env = os.environ.get(INCLUDE_ENV)
    if env:
        if os.path.isfile(os.path.join(env, "pinbroker.h")):
            return env
        raise RuntimeError(f"${INCLUDE_ENV}={env} holds no pinbroker.h")
    cands: List[str] = [os.path.join(os.path.dirname(os.path.dirname(_HERE)), "client", "lib")]
    lib = _lib.path()
    if lib and os.sep in lib:
        libdir = os.path.dirname(os.path.realpath(lib))
        cands += [os.path.join(libdir, "..", "include"), os.path.join(libdir, "..", "..", "include")]
    cands += [os.path.join(sys.prefix, "include"), "/usr/local/include", "/usr/include"]
    for d in cands:
        if os.path.isfile(os.path.join(d, "pinbroker.h")):
            return os.path.normpath(d)
    raise RuntimeError(
        "pinbroker.torch.install: cannot find pinbroker.h (tried " + ", ".join(os.path.normpath(c) for c in cands)
        + f"); install pinbroker's C headers (cmake --install <build dir>) or set {INCLUDE_ENV}"
    )


def _check_torch() -> Any:
    """torch, once it is known to be new enough and built with CUDA; RuntimeError otherwise."""
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(f"pinbroker.torch.install needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}: {e}") from None
    ver = getattr(torch, "__version__", "?")
    if _torch_version(str(ver)) < MIN_TORCH:
        raise RuntimeError(
            f"pinbroker.torch.install needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (at::setHostAllocator, "
            f"ATen/core/CachingHostAllocator.h); found torch {ver}"
        )
    if getattr(torch.version, "cuda", None) is None:
        raise RuntimeError(f"pinbroker.torch.install: CUDA is not available (torch {ver} is built without CUDA)")
    # device_count() asks NVML first, so it does not initialise CUDA (which would break a later fork()).
    if torch.cuda.device_count() < 1:
        raise RuntimeError(f"pinbroker.torch.install: CUDA is not available (torch {ver} sees no CUDA device)")
    return torch


def _cpp_extension_load(cpp_extension: Any, name: str, include_dir: str, build_dir: str, verbose: bool) -> Any:
    """Build (when out of date) and import the extension as module ``name`` in build_dir: the one recipe of
    the JIT fallback and of pinbroker._build_ext, so both make the same thing (build_dir/<name>.so)."""
    return cpp_extension.load(
        name=name,
        sources=[_SOURCE],
        extra_include_paths=[include_dir],
        extra_cflags=["-O2"],
        extra_ldflags=["-ldl"],
        with_cuda=True,
        build_directory=build_dir,
        verbose=verbose,
        is_python_module=True,
    )


class _Loaded:
    """The extension module and how this process got it: ``built`` is "prebuilt" or "jit"."""

    def __init__(self, module: Any, path: str, built: str, origin: str, seconds: float, passed_over: List[str]):
        self.module = module
        self.path = path
        self.built = built
        self.origin = origin
        self.seconds = seconds
        self.passed_over = passed_over


def _import_prebuilt(name: str, path: str) -> Any:
    """Import the extension module at path (torch already imported: it links libtorch by soname)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"no module spec for {path}")
    module = importlib.util.module_from_spec(spec)  # dlopen and PyInit_<name>: the names must agree
    loader.exec_module(module)
    if not hasattr(module, "install"):
        raise ImportError(f"{path} is not pinbroker's host allocator (it has no install())")
    return module


def _jit_allowed() -> bool:
    return (os.environ.get(JIT_ENV) or "1").strip().lower() not in ("0", "no", "false", "off")


def _find_prebuilt(want: Dict[str, Any], jit_dir: str) -> Tuple[Optional[_Loaded], List[str]]:
    """The first prebuilt build that fits this torch and imports; and why each other one was passed over."""
    passed_over: List[str] = []
    t0 = time.monotonic()
    for folder in _torch_ext.search_folders(_lib.path(), _HERE, jit_dir):
        found, rejected = _torch_ext.find([folder], want)
        passed_over += rejected
        if found is None:
            continue
        path, origin, meta = found
        try:
            module = _import_prebuilt(str(meta["module"]), path)
        except ImportError as e:  # e.g. a torch rebuilt in place under the same version: keep looking
            passed_over.append(f"{path} ({origin}): fits, but does not import: {e}")
            continue
        return _Loaded(module, path, "prebuilt", origin, time.monotonic() - t0, passed_over), passed_over
    return None, passed_over


def _how_to_prebuild() -> str:
    return ("`cmake --build <build dir>` builds one when torch is found at configure time "
            "(-DPINBROKER_TORCH_EXT=ON to insist; installed into <libdir>/pinbroker/torch-ext), or "
            "`python3 -m pinbroker._build_ext --out DIR` then $" + _torch_ext.DIR_ENV + "=DIR")


def _load_extension(torch: Any, verbose: bool) -> _Loaded:
    """The extension: a prebuilt one that fits this torch, else (unless $PINBROKER_TORCH_JIT=0) built now
    with torch.utils.cpp_extension.load into the JIT folder (one per user, or $TORCH_EXTENSIONS_DIR)."""
    global _ext
    if _ext is not None:
        return _ext
    want = _torch_ext.want(str(torch.__version__), torch.version.cuda, _torch_ext.sha256_file(_SOURCE))
    jit_dir = os.path.join(_torch_ext.jit_root(torch.version.cuda), want["module"])
    loaded, passed_over = _find_prebuilt(want, jit_dir)
    if loaded is not None:
        _ext = loaded
        return _ext
    why = "no prebuilt extension fits torch {} (CUDA {}, {}): {}".format(
        want["torch"], want["cuda"], want["python"], "; ".join(passed_over) or "none found")
    if not _jit_allowed():
        raise RuntimeError(f"pinbroker.torch.install: {why}. ${JIT_ENV}=0 forbids building it now: "
                           + _how_to_prebuild())
    warnings.warn(f"pinbroker.torch: {why}. Building it now with a compiler (20-40 s, once per torch); "
                  + _how_to_prebuild() + " ahead of time", RuntimeWarning, stacklevel=3)
    include_dir = _find_include_dir()
    try:
        from torch.utils import cpp_extension
    except ImportError as e:
        raise RuntimeError(
            f"pinbroker.torch.install: {why}, and torch.utils.cpp_extension is unavailable: {e}") from None
    t0 = time.monotonic()
    try:
        os.makedirs(jit_dir, exist_ok=True)
        # A sidecar left by an older build must not vouch for what is being rebuilt.
        try:
            os.unlink(os.path.join(jit_dir, want["module"] + ".json"))
        except FileNotFoundError:
            pass
        module = _cpp_extension_load(cpp_extension, want["module"], include_dir, jit_dir, verbose)
    except Exception as e:  # a compiler error, no compiler, no ninja, no CUDA headers: all say so in e
        lines = str(e).strip().splitlines()
        tail = "\n".join(lines[-_LOG_TAIL_LINES:])
        raise RuntimeError(
            f"pinbroker.torch.install: {why}; building the host allocator extension ({_SOURCE}) failed: "
            f"{type(e).__name__}. It needs a C++ compiler, ninja and the CUDA headers torch {torch.__version__} "
            f"was built with (CUDA_HOME). The build log ends:\n{tail}"
        ) from e
    path = os.path.join(jit_dir, want["module"] + ".so")
    try:  # the next process loads this build as a prebuilt one, with no compiler
        if os.path.isfile(path):
            _torch_ext.write_sidecar(jit_dir, _torch_ext.sidecar(want, source=_SOURCE, built_by="jit"))
    except OSError:
        pass
    _ext = _Loaded(module, path, "jit", "built now (" + jit_dir + ")", time.monotonic() - t0, passed_over)
    return _ext


class HostAllocator:
    """The installed allocator: :meth:`stats`, :meth:`empty_cache`, :meth:`uninstall`. One per process."""

    def __init__(self, ext: Any, *, library: str, socket: Optional[str], label: str, priority: int,
                 loaded: Optional[_Loaded] = None) -> None:
        self._ext = ext
        self.library = library
        #: The extension file this process loaded, "prebuilt" or "jit" (compiled by this process), where it
        #: was found, the seconds finding and loading (or building) it took, and the builds passed over.
        self.extension_path: Optional[str] = loaded.path if loaded else None
        self.built: Optional[str] = loaded.built if loaded else None
        self.extension_origin: Optional[str] = loaded.origin if loaded else None
        self.extension_load_s: Optional[float] = loaded.seconds if loaded else None
        self.extension_passed_over: List[str] = list(loaded.passed_over) if loaded else []
        self.socket = socket
        self.label = label
        self.priority = priority
        #: What install(staging=True) did (pinbroker.torch_staging.Staging), or None.
        self.staging: Optional[Any] = None

    @property
    def installed(self) -> bool:
        """True while torch's CUDA host allocator is this one."""
        return bool(self._ext.installed())

    def stats(self) -> Dict[str, Any]:
        """Counters: allocations, live_blocks, allocated_bytes (requested, live), leased_bytes (page-rounded,
        including freed blocks whose copies are still in flight), peaks, blocks_waiting, events_pending,
        released, fallbacks / fallback_bytes / fallback_reasons / last_fallback, cuda_errors, the time
        spent in pb_acquire / pb_release (µs), the cache's cache_cap_bytes / cache_slack_pct / cached_bytes /
        cached_blocks / cache_hits / cache_misses / cache_kept / cache_evicted / cache_revoked, and
        unbrokered_reported_bytes (torch's own pinned bytes, as last reported to the daemon). ``torch.cuda.host_memory_stats()`` shows the same through
        torch's HostStats."""
        return dict(self._ext.stats())

    def empty_cache(self) -> None:
        """Give back every cached block and every freed block whose copies completed, and empty torch's own
        pinned cache (fallbacks, and tensors pinned before install). ``torch._C._host_emptyCache()`` and
        ``torch.cuda.empty_host_cache()`` do the same."""
        self._ext.empty_cache()

    def uninstall(self) -> bool:
        """Put torch's allocator back for new allocations; False if this one was not installed. Blocks
        still alive stay leased until freed; since their later copies are reported to torch's allocator,
        each one freed after this waits for the devices to go idle before it is given back."""
        with _lock:
            return bool(self._ext.uninstall())

    def __repr__(self) -> str:
        try:
            s = self.stats()
            what = f"{s['live_blocks']} blocks, {s['allocated_bytes']} bytes, {s['fallbacks']} fallbacks"
        except Exception as e:  # repr must not raise
            what = f"stats unavailable: {e}"
        state = "installed" if self._installed_quiet() else "uninstalled"
        return f"<pinbroker.torch.HostAllocator {state}, label {self.label!r}: {what}>"

    def _installed_quiet(self) -> bool:
        try:
            return self.installed
        except Exception:
            return False


def _socket_of(client: Any) -> Optional[str]:
    if client is None:
        return None
    if isinstance(client, (str, os.PathLike)):
        return os.fspath(client)
    path = getattr(client, "path", None)
    if isinstance(path, str):
        return path
    raise TypeError(f"client must be a pinbroker.Client, a socket path or None, not {type(client).__name__}")


#: Environment variables for the cache of freed blocks (install()'s cache_bytes and cache_slack_pct).
CACHE_ENV = "PINBROKER_TORCH_CACHE"
CACHE_SLACK_ENV = "PINBROKER_TORCH_CACHE_SLACK"
#: Default cap of the cache: this share of the uid's quota (or of the budget, when the uid has none).
CACHE_SHARE = 0.25


def _cache_settings(socket: Optional[str], cache_bytes: Optional[int], cache_slack_pct: Optional[int]
                    ) -> Tuple[int, int]:
    """The cache's cap in bytes and its slack in percent: the arguments, else $PINBROKER_TORCH_CACHE (a size:
    "2G", "512M", "0" disables) and $PINBROKER_TORCH_CACHE_SLACK (percent), else a quarter of the uid's quota
    (of the budget without one) and 0: only a request of the same page-rounded size reuses a block."""
    if cache_slack_pct is None:
        env = os.environ.get(CACHE_SLACK_ENV, "").strip()
        try:
            cache_slack_pct = int(env.rstrip("%")) if env else 0
        except ValueError:
            raise RuntimeError(f"${CACHE_SLACK_ENV}={env!r} is not a percentage (e.g. 0, 10)") from None
    if cache_slack_pct < 0 or cache_slack_pct > 100:
        raise RuntimeError(f"the cache slack must be 0..100 percent, not {cache_slack_pct}")
    if cache_bytes is None:
        env = os.environ.get(CACHE_ENV, "").strip()
        if env:
            cache_bytes = _parse_size(env, CACHE_ENV)
    if cache_bytes is None:
        from ._client import connect
        with connect(socket) as c:
            st = c.status()
        budget = int(st.get("budget_bytes") or 0)
        quota = int(st.get("uid_quota_bytes") or 0)
        base = min(quota, budget) if quota and budget else (quota or budget)
        cache_bytes = int(base * CACHE_SHARE)
    if cache_bytes < 0:
        raise RuntimeError(f"the cache cap must be >= 0 bytes, not {cache_bytes}")
    return int(cache_bytes), int(cache_slack_pct)


def _parse_size(text: str, what: str) -> int:
    """A size as pinctl takes one: a number with an optional K/M/G/T suffix (powers of 1024), or bytes."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise RuntimeError(f"${what}={text!r} is not a size (e.g. 0, 512M, 4G)")
    return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))


def install(*, client: Union[Any, str, None] = None, label: Optional[str] = None, priority: int = 0,
            cache_bytes: Optional[int] = None, cache_slack_pct: Optional[int] = None,
            verbose: bool = False, staging: bool = True) -> HostAllocator:
    """Make pinbrokerd's leases torch's CUDA host memory (pinned tensors); returns the :class:`HostAllocator`.

    ``client``: a :class:`pinbroker.Client` or a socket path naming the daemon (None: $PINBROKER_SOCKET, else
    /run/pinbroker/pinbroker.sock). The allocator makes its own connection there, for the life of the
    process: pinned tensors may outlive any Client object, and closing one must not take their memory.
    ``label``: shown by ``pinctl leases`` (default $PINBROKER_LABEL, else ``torch:<pid>``). ``priority``:
    at::setHostAllocator's; an allocator installed with a higher one is not replaced (RuntimeError).
    ``cache_bytes``: the most freed blocks kept for reuse (default $PINBROKER_TORCH_CACHE, else a quarter of
    the uid's quota); ``cache_slack_pct``: how much larger than a request a reused block may be (default
    $PINBROKER_TORCH_CACHE_SLACK, else 0: the same page-rounded size only). ``verbose`` shows the extension's
    build, when no prebuilt one fits and it is built now. ``staging`` (default True) also routes blocking copies
    between pageable CPU tensors and CUDA through a pinned ring leased from the broker
    (:func:`pinbroker.torch_staging.install`: ``Tensor.cuda``, ``.to``, ``.cpu``, ``.copy_``; nothing is patched
    under ``pinctl run``, whose interposer stages them itself); :attr:`HostAllocator.staging` says what it did.

    Idempotent: a second call returns the installed allocator (and reinstalls it after :func:`uninstall`).
    Raises RuntimeError for torch older than 2.8, a torch without CUDA or no CUDA device, no prebuilt
    extension with $PINBROKER_TORCH_JIT=0, a failed build (with the end of its log), no pinbroker.h for
    that build, no libpinbroker, or no daemon answering.
    """
    torch = _check_torch()
    alloc = _install_allocator(torch, client, label, priority, cache_bytes, cache_slack_pct, verbose)
    if staging:
        from . import torch_staging

        alloc.staging = torch_staging.install(client=_socket_of(client))
    return alloc


def _install_allocator(torch: Any, client: Union[Any, str, None], label: Optional[str], priority: int,
                       cache_bytes: Optional[int], cache_slack_pct: Optional[int], verbose: bool) -> HostAllocator:
    global _installed
    with _lock:
        if _installed is not None and _installed.installed:
            return _installed
        try:
            _lib.load()
        except OSError as e:
            raise RuntimeError(f"pinbroker.torch.install: {e.strerror or e}") from e
        libpath = _lib.path() or _lib.SONAME
        loaded = _load_extension(torch, verbose)
        ext = loaded.module
        socket = _socket_of(client)
        if _installed is not None:
            label = _installed.label  # one allocator per process: its label and connection stay
        if label is None:
            label = os.environ.get("PINBROKER_LABEL") or f"torch:{os.getpid()}"
        cap, slack = _cache_settings(socket, cache_bytes, cache_slack_pct)
        try:
            ext.install(libpath, socket or "", label, int(priority), cap, slack)
        except RuntimeError as e:
            raise RuntimeError(str(e).splitlines()[0] if str(e) else "pinbroker.torch.install failed") from e
        if _installed is None:
            _installed = HostAllocator(ext, library=libpath, socket=socket, label=label, priority=int(priority),
                                       loaded=loaded)
        _installed.priority = int(priority)
        return _installed


def uninstall() -> bool:
    """Put torch's own allocator back (see :meth:`HostAllocator.uninstall`) and its own Tensor copy methods
    (:func:`pinbroker.torch_staging.uninstall`); False if neither was installed."""
    staged = False
    if "pinbroker.torch_staging" in sys.modules:
        staged = sys.modules["pinbroker.torch_staging"].uninstall()
    return (_installed.uninstall() if _installed is not None else False) or staged


def allocator_stats() -> Optional[Dict[str, Any]]:
    """:meth:`HostAllocator.stats` of the installed allocator, or None before :func:`install`."""
    return _installed.stats() if _installed is not None else None


def _env_on(value: Optional[str]) -> bool:
    return (value or "").strip().lower() in ("1", "yes", "true", "on")


def install_from_env() -> Optional[HostAllocator]:
    """:func:`install` when $PINBROKER_TORCH is 1 (``pinctl run`` sets it); None otherwise.

    Never raises: a failure (old torch, no CUDA, no compiler, no daemon) is a RuntimeWarning, and torch
    keeps its own allocator. Returns the allocator, or None.
    """
    if not _env_on(os.environ.get(ENV)):
        return None
    try:
        return install()
    except Exception as e:
        msg = str(e)
        if len(msg) > 4000:
            msg = msg[:1000] + "\n...\n" + msg[-3000:]
        warnings.warn(f"pinbroker: {ENV}=1, but torch keeps its own pinned-memory allocator: {msg}",
                      RuntimeWarning, stacklevel=2)
        return None
