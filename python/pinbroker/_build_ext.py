# SPDX-License-Identifier: MIT
"""Build torch's host allocator extension ahead of time, so that no process compiles it at run time.

    python3 -m pinbroker._build_ext --out DIR [--include DIR] [--build-dir DIR] [--verbose]
    python3 -m pinbroker._build_ext --check

Compiles ``csrc/host_allocator.cpp`` against the torch of the interpreter that runs it, with
``torch.utils.cpp_extension.load`` (the same recipe as the JIT fallback in :mod:`pinbroker.torch_alloc`),
and puts ``<module>.so`` and its sidecar ``<module>.json`` (torch's full version, CUDA, Python ABI, the
source's sha256: see :mod:`pinbroker._torch_ext`) into DIR. :func:`pinbroker.torch.install` loads it from
there when DIR is $PINBROKER_TORCH_EXT_DIR, ``pinbroker-torch/`` beside libpinbroker (CMake's build tree:
``<build>/client/pinbroker-torch``) or ``<libdir>/pinbroker/torch-ext`` (cmake --install).

Exit status: 0 when built, or "skipped: <why>" (no torch, torch older than 2.8, torch without CUDA): there is
nothing to build for; 1 when the build failed (the end of its log on stderr); 2 for bad arguments.
``--check`` builds nothing: it exits 0 and prints ``usable: ...`` with ``module=`` and ``torch_version_file=``
lines when a build can be made here (torch, CUDA, a CUDA toolkit, ninja, a C++ compiler), else 3 and
``skipped: <why>``. CMake's configure step asks it (python/CMakeLists.txt, PINBROKER_TORCH_EXT).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
import time
from typing import Any, List, Optional, Tuple

from . import _torch_ext
from . import torch_alloc as _ta

_LOG_TAIL_LINES = 60
#: --check's status when no build can be made here.
EXIT_UNUSABLE = 3


def torch_or_reason() -> Tuple[Any, str]:
    """(torch, "") when a build can be made against it, else (None, why not)."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install raising anything at import
        return None, f"torch is not importable by {sys.executable} ({type(e).__name__}: {e})"
    ver = str(getattr(torch, "__version__", "?"))
    if _torch_ext.version_tuple(ver) < _ta.MIN_TORCH:
        return None, f"torch {ver} is older than {_ta.MIN_TORCH[0]}.{_ta.MIN_TORCH[1]} (at::setHostAllocator)"
    if getattr(torch.version, "cuda", None) is None:
        return None, f"torch {ver} has no CUDA (torch.version.cuda is None)"
    return torch, ""


def toolchain_problem() -> str:
    """Why cpp_extension cannot build a CUDA extension here ("" when it can): no CUDA toolkit, ninja or C++."""
    try:
        from torch.utils import cpp_extension
    except Exception as e:
        return f"torch.utils.cpp_extension is unavailable ({e})"
    if not getattr(cpp_extension, "CUDA_HOME", None):
        return "no CUDA toolkit (set CUDA_HOME, or put nvcc on PATH): its headers are needed"
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja, or apt-get install ninja-build)"
    cxx = cpp_extension.get_cxx_compiler() if hasattr(cpp_extension, "get_cxx_compiler") else "c++"
    if not shutil.which(cxx):
        return f"no C++ compiler ({cxx} is not on PATH; set CXX)"
    return ""


def _want(torch: Any) -> dict:
    return _torch_ext.want(str(torch.__version__), torch.version.cuda, _torch_ext.sha256_file(_ta._SOURCE))


def check() -> int:
    torch, why = torch_or_reason()
    if torch is None:
        print(f"skipped: {why}")
        return EXIT_UNUSABLE
    why = toolchain_problem()
    if why:
        print(f"skipped: torch {torch.__version__} with CUDA {torch.version.cuda}, but {why}")
        return EXIT_UNUSABLE
    w = _want(torch)
    print(f"usable: torch {w['torch']} with CUDA {w['cuda']} ({w['python']}, {sys.executable})")
    print(f"module={w['module']}")
    print(f"torch_version_file={os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), 'version.py')}")
    return 0


def _install_file(src: str, dst: str) -> None:
    """Copy src to dst by rename, so a process that has the old dst mapped keeps it intact."""
    tmp = os.path.join(os.path.dirname(dst), "." + os.path.basename(dst) + ".tmp")
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dst)


def build(out: str, include: Optional[str], build_dir: Optional[str], verbose: bool) -> int:
    torch, why = torch_or_reason()
    if torch is None:
        print(f"pinbroker._build_ext: skipped: {why}")
        return 0
    w = _want(torch)
    name = w["module"]
    try:
        include = include or _ta._find_include_dir()
    except RuntimeError as e:
        print(f"pinbroker._build_ext: {e}", file=sys.stderr)
        return 1
    out = os.path.abspath(out)
    bdir = os.path.join(os.path.abspath(build_dir or os.path.join(out, ".build")), name)
    os.makedirs(out, exist_ok=True)
    os.makedirs(bdir, exist_ok=True)
    t0 = time.monotonic()
    with open(os.path.join(bdir, ".pinbroker-build.flock"), "w") as held:
        # One build of this folder at a time; ours is released if this process dies, unlike torch's own
        # "lock" file, which a killed build leaves behind and every later load() would wait on for ever.
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            os.unlink(os.path.join(bdir, "lock"))
        except FileNotFoundError:
            pass
        try:
            from torch.utils import cpp_extension

            _ta._cpp_extension_load(cpp_extension, name, include, bdir, verbose)
        except Exception as e:  # compiler errors, no ninja, no CUDA headers: cpp_extension says which in e
            lines: List[str] = str(e).strip().splitlines()
            tail = "\n".join(lines[-_LOG_TAIL_LINES:])
            print(f"pinbroker._build_ext: building {name} from {_ta._SOURCE} against torch {w['torch']} "
                  f"(CUDA {w['cuda']}) failed: {type(e).__name__}. The build log ends:\n{tail}", file=sys.stderr)
            return 1
        built = os.path.join(bdir, name + ".so")
        if not os.path.isfile(built):
            print(f"pinbroker._build_ext: cpp_extension.load did not leave {built}", file=sys.stderr)
            return 1
        _install_file(built, os.path.join(out, name + ".so"))
        header = os.path.join(include, "pinbroker.h")
        _torch_ext.write_sidecar(out, _torch_ext.sidecar(
            w, source=_ta._SOURCE, pinbroker_h_sha256=_torch_ext.sha256_file(header), built_by="pinbroker._build_ext",
            built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
    print(f"pinbroker._build_ext: built {os.path.join(out, name + '.so')} for torch {w['torch']}, CUDA {w['cuda']}, "
          f"{w['python']} in {time.monotonic() - t0:.1f} s")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pinbroker._build_ext", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for <module>.so and <module>.json")
    ap.add_argument("--include", help="folder holding pinbroker.h (default: found as the JIT build finds it)")
    ap.add_argument("--build-dir", help="folder for the intermediate files (default: OUT/.build)")
    ap.add_argument("--verbose", action="store_true", help="show the compiler's command lines")
    ap.add_argument("--check", action="store_true", help="only say whether a build can be made here")
    args = ap.parse_args(argv)
    if args.check:
        return check()
    if not args.out:
        ap.error("--out DIR is needed (or --check)")
    return build(args.out, args.include, args.build_dir, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
