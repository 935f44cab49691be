# SPDX-License-Identifier: MIT
"""Staged tensor copies: a pageable CPU tensor to a CUDA tensor and back through a pinned ring leased from
pinbrokerd (issue 39), at close to pinned memory's rate, with torch's own results.

Usage::

    import pinbroker.torch
    pinbroker.torch.install()             # staging=True by default: .cuda(), .to(cuda), .cpu(), copy_ are staged
    x = torch.randn(1 << 28).cuda()       # pageable 1 GiB: through the ring
    pinbroker.torch.uninstall()           # torch's own methods back

    y = pinbroker.torch.to_device(x_cpu)  # or call the helpers, without patching anything
    z = pinbroker.torch.to_host(y)

What is staged. ``Tensor.cuda()``, ``Tensor.to(<cuda device>)``, ``Tensor.cpu()``, ``Tensor.to("cpu")`` and
``Tensor.copy_`` between a CUDA tensor and a CPU tensor, when all of these hold (:func:`reason` says which one
does not):

- the CPU tensor is contiguous, ordinary (pageable) memory, and its bytes are at or over the threshold (the
  client's, $PINBROKER_STAGING_THRESHOLD, default 1 MiB); the CUDA tensor is contiguous too;
- the copy is blocking (``non_blocking=False``), changes no dtype and, for ``copy_``, no shape (no broadcast);
- the memory format asked is ``torch.preserve_format`` or ``torch.contiguous_format``;
- no autograd graph is to be recorded (no tensor that requires grad while grad mode is on);
- the tensors are plain (``torch.Tensor`` or ``nn.Parameter``), without names, conjugate or negative bits, and
  no ``torch.compile`` tracing or torch function mode is active;
- ``copy_`` only where this torch can bump the destination's version counter
  (``torch.autograd.graph.increment_version``), as its own ``copy_`` does.

Everything else, and a copy the library declines (pinned or registered memory, no daemon, the ring refused or
revoked, a stream being captured), is torch's own call, unchanged. A staged copy gives what torch gives: a
result of the same size, strides, dtype and device (``empty_strided`` as torch's ``_to_copy`` makes one), the copy
made on the device's current stream, and, as torch's blocking copies do (``memcpy_and_sync``), that stream
synchronised before the call returns.

Under ``pinctl run`` the interposer stages torch's copies in the driver calls themselves (non_blocking ones too),
so :func:`install` patches nothing there (``mode == "interposer"``).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Dict, Optional, Tuple

__all__ = ["install", "uninstall", "installed", "stats", "reason", "to_device", "to_host", "copy_", "Staging"]

_lock = threading.Lock()
_client: Any = None
_client_pid = 0
_client_failed: Optional[str] = None
_client_failed_at = 0.0
#: Seconds before a failed connection is tried again (the library's ring back-off is 5 s too).
RETRY_S = 5.0
_patched: Dict[str, Any] = {}  # name -> torch's own method, while installed
_own_attr: Dict[str, bool] = {}  # name -> whether torch.Tensor itself (not its C base) defined it
_counts: Dict[str, int] = {}
_mode = "off"


class Staging:
    """What :func:`install` did: ``mode`` is "patched" (torch's methods go through the ring), "interposer"
    (``pinctl run`` stages torch's copies itself: nothing patched) or "off"."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def stats(self) -> Dict[str, Any]:
        return stats()

    def __repr__(self) -> str:
        return f"<pinbroker.torch staging {self.mode}>"


# ---------------------------------------------------------------- the client and the driver context


def _get_client() -> Any:
    """The process's staging client (connected on first use, and again in a forked child), or None when no
    daemon answers (then every copy is torch's own; the reason is counted; tried again after RETRY_S)."""
    global _client, _client_pid, _client_failed, _client_failed_at
    pid = os.getpid()
    if _client is not None and _client_pid == pid and not _client.closed:
        return _client
    with _lock:
        if _client is not None and _client_pid == pid and not _client.closed:
            return _client
        if _client_failed is not None and _client_pid == pid and time.monotonic() - _client_failed_at < RETRY_S:
            return None
        from . import _lib
        from ._client import connect

        _client_pid = pid
        try:
            if not _lib.has_staging():
                raise NotImplementedError(f"the libpinbroker loaded from {_lib.path()} has no staged copies "
                                          "(pb_copy_to_device): upgrade it")
            _client = connect(_socket)
            if _threshold is not None:
                _client.configure_staging(threshold=_threshold)
            _client_failed = None
        except (OSError, NotImplementedError) as e:  # BrokerError, LibraryNotFound are OSErrors
            _client, _client_failed, _client_failed_at = None, str(e), time.monotonic()
        return _client


_socket: Optional[str] = None
_threshold: Optional[int] = None  # install()'s, given to the client; None: the environment's or the default


def _env_threshold() -> int:
    from ._staging import env_threshold

    return env_threshold()


#: The smallest copy staged, as the staging client will see it: checked first, before anything else.
_thr = _env_threshold()


class _Cuda:
    """The driver calls that make dptr's context current on this thread around a staged copy: torch binds its
    primary context lazily, and a thread that only reused cached blocks may have none current yet."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.get = lib.cuCtxGetCurrent
        self.get.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.set = lib.cuCtxSetCurrent
        self.set.argtypes = [ctypes.c_void_p]
        self.attr = lib.cuPointerGetAttribute
        self.attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]

    def enter(self, dptr: int) -> Optional[int]:
        """Make dptr's context current; returns the one to restore (None: nothing changed)."""
        cur, want = ctypes.c_void_p(), ctypes.c_void_p()
        if self.get(ctypes.byref(cur)) != 0 or self.attr(ctypes.byref(want), 1, dptr) != 0:  # 1: CONTEXT
            return None
        if not want.value or cur.value == want.value:
            return None
        self.set(want)
        return cur.value or 0

    def leave(self, prev: Optional[int]) -> None:
        if prev is not None:
            self.set(prev or None)


_cuda: Optional[_Cuda] = None


def _driver() -> Optional[_Cuda]:
    global _cuda
    if _cuda is None:
        try:
            _cuda = _Cuda()
        except (OSError, AttributeError):
            return None
    return _cuda


# ---------------------------------------------------------------- the decisions (no I/O)


def _count(what: str) -> None:
    _counts[what] = _counts.get(what, 0) + 1


def _plain(torch: Any, t: Any) -> Optional[str]:
    """Why tensor t is not one a byte copy may stand in for torch's, or None."""
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        return "a tensor subclass"
    if t.layout is not torch.strided:
        return "not a strided tensor"
    if not t.is_contiguous():
        return "not contiguous"
    if t.is_conj() or t.is_neg():
        return "a conjugate or negative view"
    if getattr(t, "is_quantized", False):
        return "quantized"
    if any(n is not None for n in t.names):
        return "named dimensions"
    return None


def _context(torch: Any, tensors: Tuple[Any, ...]) -> Optional[str]:
    """Why the calling context rules a staged copy out (autograd, tracing, modes), or None."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "autograd records the copy"
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", None) and compiler.is_compiling():
        return "torch.compile is tracing"
    mode = getattr(torch._C, "_is_torch_function_mode_enabled", None)
    if mode is not None and mode():
        return "a torch function mode is active"
    return None


def _memory_format_ok(torch: Any, fmt: Any) -> bool:
    return fmt is None or fmt is torch.preserve_format or fmt is torch.contiguous_format


def _cuda_device(torch: Any, device: Any) -> Any:
    """torch.device of a .cuda() / .to() device argument (None: the current CUDA device)."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


def reason(src: Any, dst_device: Any, *, dtype: Any = None, non_blocking: bool = False, memory_format: Any = None,
           dst: Any = None, threshold: Optional[int] = None) -> Optional[str]:
    """Why a copy of ``src`` to ``dst_device`` (or into ``dst``, for copy_) is torch's own and not staged, or None
    when it is staged (given a daemon and a ring). ``threshold`` defaults to the staging client's."""
    import torch

    dst_device = torch.device(dst_device)
    if src.device.type == "cpu" and dst_device.type == "cuda":
        host = src
    elif src.device.type == "cuda" and dst_device.type == "cpu":
        host = dst
    else:
        return "not between CPU and CUDA"
    if non_blocking:
        return "non_blocking"
    if dtype is not None and dtype != src.dtype:
        return "a dtype conversion"
    if dst is not None and dst.dtype != src.dtype:
        return "a dtype conversion"
    if dst is not None and dst.shape != src.shape:
        return "a broadcast (the shapes differ)"
    if not _memory_format_ok(torch, memory_format):
        return "a memory format other than preserve/contiguous"
    for t in (src, dst):
        if t is not None:
            why = _plain(torch, t)
            if why is not None:
                return why
    nbytes = src.nelement() * src.element_size()
    if nbytes < (threshold if threshold is not None else _thr):
        return "under the threshold"
    why = _context(torch, (src,) if dst is None else (src, dst))
    if why is not None:
        return why
    if dst is not None and _increment_version(torch) is None:
        return "this torch cannot bump copy_'s version counter"
    if dst is not None and dst.is_inference() and not torch.is_inference_mode_enabled():
        return "an inference tensor outside inference mode"  # torch's copy_ refuses it
    if host is not None and host.is_pinned():
        return "pinned memory"
    return None


def _increment_version(torch: Any) -> Any:
    graph = getattr(torch.autograd, "graph", None)
    return getattr(graph, "increment_version", None) if graph is not None else None


# ---------------------------------------------------------------- the copies


def _ready() -> Optional[Tuple[Any, "_Cuda"]]:
    """(staging client, driver calls), or None (counted why) when this process cannot stage: every copy is then
    torch's own."""
    client = _get_client()
    drv = _driver() if client is not None else None
    if client is None or drv is None:
        _count("no staging client (stats()['no_client'] says why)" if client is None else "no libcuda.so.1")
        return None
    return client, drv


def _staged(torch: Any, ready: Tuple[Any, "_Cuda"], src: Any, dst: Any) -> bool:
    """Copy src's bytes into dst (one CPU, one CUDA, same bytes) through the ring on the CUDA device's current
    stream, then synchronise that stream as torch's blocking copies do. A driver error raises RuntimeError, as
    torch's own copy does. False, with nothing done, when the client was closed meanwhile (interpreter exit)."""
    from .errors import NotConnected

    client, drv = ready
    to_device = dst.device.type == "cuda"
    dev = dst.device if to_device else src.device
    dptr = dst.data_ptr() if to_device else src.data_ptr()
    host = src.data_ptr() if to_device else dst.data_ptr()
    nbytes = src.nelement() * src.element_size()
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        prev = drv.enter(dptr)
        try:
            client._copy_raw(to_device, dptr, host, nbytes, stream.cuda_stream or None)
        except NotConnected:  # refused before the library was called: torch's own copy
            _count("the staging client is closed")
            return False
        except OSError as e:
            raise RuntimeError(f"pinbroker staged copy of {nbytes} bytes {'to' if to_device else 'from'} "
                               f"{dev}: {e.strerror or e}") from None
        finally:
            drv.leave(prev)
        stream.synchronize()
    _count("staged h2d" if to_device else "staged d2h")
    return True


def _new_like(torch: Any, src: Any, device: Any, memory_format: Any) -> Any:
    """The result torch's _to_copy makes for a contiguous src: its strides kept (preserve_format), or contiguous."""
    if memory_format is torch.contiguous_format:
        return torch.empty(src.shape, dtype=src.dtype, device=device)
    return torch.empty_strided(src.shape, src.stride(), dtype=src.dtype, device=device)


def _try_to(src: Any, device: Any, dtype: Any, non_blocking: bool, memory_format: Any) -> Any:
    """A staged src.to(device): the new tensor, or None when torch's own call must make it (counted why)."""
    import torch

    try:
        why = reason(src, device, dtype=dtype, non_blocking=non_blocking, memory_format=memory_format)
    except Exception as e:  # the decision never raises where torch's call would not
        why = f"undecided ({type(e).__name__})"
    if why is not None:
        _count(why)
        return None
    ready = _ready()
    if ready is None:
        return None
    out = _new_like(torch, src, device if src.device.type == "cpu" else torch.device("cpu"), memory_format)
    return out if _staged(torch, ready, src, out) else None


def to_device(t: Any, device: Any = None, *, memory_format: Any = None) -> Any:
    """``t.cuda(device)`` through the ring when :func:`reason` allows, else torch's own (works without install)."""
    import torch

    if t.device.type == "cuda":
        return _orig("cuda")(t, device, memory_format=memory_format or torch.preserve_format)
    out = _try_to(t, _cuda_device(torch, device), None, False, memory_format)
    if out is not None:
        return out
    return _orig("cuda")(t, device, memory_format=memory_format or torch.preserve_format)


def to_host(t: Any, *, memory_format: Any = None) -> Any:
    """``t.cpu()`` through the ring when :func:`reason` allows, else torch's own (works without install)."""
    import torch

    if t.device.type == "cuda":
        out = _try_to(t, torch.device("cpu"), None, False, memory_format)
        if out is not None:
            return out
    return _orig("cpu")(t, memory_format=memory_format or torch.preserve_format)


def copy_(dst: Any, src: Any, non_blocking: bool = False) -> Any:
    """``dst.copy_(src)`` through the ring when :func:`reason` allows, else torch's own (works without install)."""
    import torch

    try:
        why = reason(src, dst.device, non_blocking=non_blocking, dst=dst)
    except Exception as e:
        why = f"undecided ({type(e).__name__})"
    if _copy_staged(torch, why, src, dst):
        return dst
    return _orig("copy_")(dst, src, non_blocking)


def _copy_staged(torch: Any, why: Optional[str], src: Any, dst: Any) -> bool:
    """copy_ through the ring when why is None and this process can stage; its version bumped as torch's is."""
    if why is not None:
        _count(why)
        return False
    ready = _ready()
    if ready is None or not _staged(torch, ready, src, dst):
        return False
    _increment_version(torch)(dst)
    return True


# ---------------------------------------------------------------- the patched methods


def _orig(name: str) -> Any:
    import torch

    return _patched.get(name) or getattr(torch.Tensor, name)


def _cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _patched["cuda"]
    try:  # the cheapest tests first, inline: a small copy pays a fraction of a microsecond
        if self.is_cuda or self.nelement() * self.element_size() < _thr:
            return orig(self, *args, **kwargs)
    except Exception:  # a tensor without a size in bytes (nested, ...): torch's own
        return orig(self, *args, **kwargs)
    parsed = _parse_cuda(args, kwargs)
    if parsed is None:
        _count("arguments not understood")
        return orig(self, *args, **kwargs)
    import torch

    device, non_blocking, memory_format = parsed
    try:
        device = _cuda_device(torch, device)
    except Exception:  # no CUDA, a bad device: torch's call says what is wrong
        return orig(self, *args, **kwargs)
    if device.type != "cuda":
        return orig(self, *args, **kwargs)
    out = _try_to(self, device, None, non_blocking, memory_format)
    return out if out is not None else orig(self, *args, **kwargs)


def _parse_cuda(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tuple[Any, bool, Any]]:
    """(device, non_blocking, memory_format) of Tensor.cuda's arguments, or None for anything else."""
    if len(args) > 2 or set(kwargs) - {"device", "non_blocking", "memory_format"}:
        return None
    names = ("device", "non_blocking")
    got = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in got:
            return None
        got[k] = v
    nb = got.get("non_blocking", False)
    if not isinstance(nb, bool):
        return None
    return got.get("device"), nb, got.get("memory_format")


def _to(self: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _patched["to"]
    try:
        if self.nelement() * self.element_size() < _thr:
            return orig(self, *args, **kwargs)
    except Exception:
        return orig(self, *args, **kwargs)
    import torch

    try:
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if device is None or device.type == self.device.type:
            return orig(self, *args, **kwargs)
        if device.type == "cuda" and device.index is None:
            device = _cuda_device(torch, device)
    except Exception:  # bad arguments, no CUDA: torch's call raises its own error
        return orig(self, *args, **kwargs)
    out = _try_to(self, device, dtype, bool(non_blocking), memory_format)
    return out if out is not None else orig(self, *args, **kwargs)


def _cpu(self: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _patched["cpu"]
    try:
        if not self.is_cuda or self.nelement() * self.element_size() < _thr:
            return orig(self, *args, **kwargs)
    except Exception:
        return orig(self, *args, **kwargs)
    if args or set(kwargs) - {"memory_format"}:
        _count("arguments not understood")
        return orig(self, *args, **kwargs)
    import torch

    out = _try_to(self, torch.device("cpu"), None, False, kwargs.get("memory_format"))
    return out if out is not None else orig(self, *args, **kwargs)


def _copy(self: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
    orig = _patched["copy_"]
    try:
        if self.is_cuda == getattr(src, "is_cuda", self.is_cuda) or self.nelement() * self.element_size() < _thr:
            return orig(self, src, *args, **kwargs)
    except Exception:
        return orig(self, src, *args, **kwargs)
    if len(args) > 1 or set(kwargs) - {"non_blocking"} or (args and "non_blocking" in kwargs):
        return orig(self, src, *args, **kwargs)
    nb = args[0] if args else kwargs.get("non_blocking", False)
    if not isinstance(nb, bool):
        return orig(self, src, *args, **kwargs)
    import torch

    if not isinstance(src, torch.Tensor):
        return orig(self, src, *args, **kwargs)
    try:
        why = reason(src, self.device, non_blocking=nb, dst=self)
    except Exception as e:
        why = f"undecided ({type(e).__name__})"
    if _copy_staged(torch, why, src, self):
        return self
    return orig(self, src, *args, **kwargs)


_WRAPPERS = {"cuda": _cuda, "to": _to, "cpu": _cpu, "copy_": _copy}


def _staging_env_off() -> bool:
    """$PINBROKER_STAGING=0: staging is off for this process, in the interposer and here alike."""
    return (os.environ.get("PINBROKER_STAGING") or "1").strip().lower() in ("0", "no", "false", "off")


def _interposer_loaded() -> bool:
    """Whether libpinbroker-preload.so (``pinctl run``) is mapped in this process."""
    try:
        with open("/proc/self/maps") as f:
            return any("libpinbroker-preload" in line for line in f)
    except OSError:
        return False


def install(client: Any = None, threshold: Any = None, *, force: bool = False) -> Staging:
    """Route torch's blocking copies between pageable CPU tensors and CUDA through the ring: patches
    ``Tensor.cuda``, ``Tensor.to``, ``Tensor.cpu`` and ``Tensor.copy_`` (see the module's notes for what is staged).

    ``client``: a socket path or a :class:`pinbroker.Client` whose socket to use (None: $PINBROKER_SOCKET, else
    the default); the staging client is this module's own connection, made at the first copy at or over the
    threshold. ``threshold``: the smallest copy staged (bytes or "1M"; None: $PINBROKER_STAGING_THRESHOLD, else
    1 MiB). Nothing is patched, unless ``force``, under ``pinctl run`` (the interposer stages torch's copies
    already: mode "interposer") or with $PINBROKER_STAGING=0 (mode "off"). Idempotent; :func:`uninstall` restores
    torch's methods."""
    global _socket, _threshold, _thr, _mode, _client, _client_failed
    import torch

    from ._staging import parse_size

    socket = None
    if isinstance(client, (str, os.PathLike)):
        socket = os.fspath(client)
    elif client is not None:
        socket = getattr(client, "path", None)
        if not isinstance(socket, str):
            raise TypeError(f"client must be a pinbroker.Client, a socket path or None, not {type(client).__name__}")
    thr = None if threshold is None else parse_size(threshold, "threshold")
    with _lock:
        if socket != _socket or thr != _threshold:
            if _client is not None and _client_pid == os.getpid():
                _client.close()
            _client, _client_failed = None, None
        _socket, _threshold = socket, thr
        _thr = thr if thr is not None else _env_threshold()
        if not force and _staging_env_off():
            return Staging("off")
        if not force and _interposer_loaded():
            _mode = "interposer"
            return Staging(_mode)
        for name, fn in _WRAPPERS.items():
            if name not in _patched:
                _patched[name] = getattr(torch.Tensor, name)
                _own_attr[name] = name in torch.Tensor.__dict__
                setattr(torch.Tensor, name, fn)
        _mode = "patched"
        return Staging(_mode)


def uninstall() -> bool:
    """Put torch's own Tensor methods back; False when nothing was patched."""
    global _mode
    import torch

    with _lock:
        was = bool(_patched)
        for name, fn in list(_patched.items()):
            if _own_attr.pop(name, True):
                setattr(torch.Tensor, name, fn)
            else:
                delattr(torch.Tensor, name)  # inherited from torch._C's base again, as before install
            del _patched[name]
        _mode = "off"
        return was


def installed() -> str:
    """"patched", "interposer" or "off"."""
    return _mode


def stats() -> Dict[str, Any]:
    """The copies seen by the patched methods and helpers ("staged h2d", "staged d2h", and one count per reason
    a copy was left to torch), and the staging client's counters (:meth:`pinbroker.Client.staging_stats`)."""
    out: Dict[str, Any] = {"mode": _mode, "copies": dict(_counts)}
    if _client_failed is not None:
        out["no_client"] = _client_failed
    if _client is not None and not _client.closed:
        try:
            out["client"] = _client.staging_stats().__dict__
        except (OSError, NotImplementedError) as e:
            out["client"] = str(e)
    return out
