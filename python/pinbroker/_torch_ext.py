# SPDX-License-Identifier: MIT
"""Which prebuilt host allocator extension fits this torch: names, sidecars and the search, free of torch.

The extension (``csrc/host_allocator.cpp``) is compiled against one torch, one CUDA and one Python; loading it
into another is undefined behaviour, not an ImportError. So every build made by :mod:`pinbroker._build_ext`
(CMake's ``pinbroker_torch_ext`` target) or by the JIT fallback is a pair in one folder::

    pinbroker_host_allocator_t2_11_cu130_py312.so     # the module (PyInit_ of the same name)
    pinbroker_host_allocator_t2_11_cu130_py312.json   # what it was built against: the sidecar

and :func:`find` takes the first one, in the folders it is given, whose sidecar names exactly this torch
(``torch.__version__``), CUDA (``torch.version.cuda``), Python ABI (SOABI) and ``host_allocator.cpp`` (sha256).
It says why it passed over each of the others, for the error or warning the caller shows.

Nothing here imports torch: the versions are passed in, so the rules are tested on a host without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import sysconfig
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: Bumped when the sidecar's meaning changes; a sidecar of another format is passed over.
FORMAT = 1
#: Every build's module and file names start with this.
PREFIX = "pinbroker_host_allocator_"
#: Environment variable naming a folder searched first.
DIR_ENV = "PINBROKER_TORCH_EXT_DIR"
#: The folder next to libpinbroker's build-tree copy (CMake's build output: <build>/client/pinbroker-torch).
BUILD_TREE_DIR = "pinbroker-torch"
#: The folder under the installed library's directory (cmake --install: <libdir>/pinbroker/torch-ext).
INSTALL_DIR = os.path.join("pinbroker", "torch-ext")
#: The folder inside the package (a wheel or a copy that ships one).
PACKAGE_DIR = "_ext"


def version_tuple(v: str) -> Tuple[int, int]:
    """(major, minor) of a torch version string ("2.11.0+cu130", "1.13.0a0"); (0, 0) if unreadable."""
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def python_tag() -> str:
    """This interpreter in a module name: py312, py313t (free-threaded)."""
    return f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"


def python_abi() -> str:
    """This interpreter's extension ABI (SOABI: cpython-312-x86_64-linux-gnu)."""
    return str(sysconfig.get_config_var("SOABI") or python_tag())


def module_name(torch_version: str, cuda: Optional[str], py_tag: str) -> str:
    """The module (and file stem) for one torch minor, CUDA and Python: pinbroker_host_allocator_t2_11_cu130_py312.

    The name is compiled in (PyInit_<name>), so it cannot carry torch's full version; the sidecar does."""
    major, minor = version_tuple(torch_version)
    cu = "cu" + re.sub(r"[^0-9]", "", cuda) if cuda else "cpu"
    return f"{PREFIX}t{major}_{minor}_{cu}_{re.sub(r'[^0-9A-Za-z]', '', py_tag)}"


def sha256_file(path: str) -> Optional[str]:
    """The file's sha256 in hex, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def want(torch_version: str, cuda: Optional[str], source_sha256: Optional[str], *,
         py_tag: Optional[str] = None, py_abi: Optional[str] = None) -> Dict[str, Any]:
    """What a build must have been made against to be loaded here (source_sha256 None: not checked)."""
    tag = py_tag or python_tag()
    return {
        "module": module_name(torch_version, cuda, tag),
        "torch": torch_version,
        "cuda": cuda,
        "python": py_abi or python_abi(),
        "source_sha256": source_sha256,
    }


def sidecar(w: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
    """The sidecar for a build made against ``w`` (extra: the source path, the header's hash, ...)."""
    meta = {"format": FORMAT, "module": w["module"], "file": w["module"] + ".so", "torch": w["torch"],
            "cuda": w["cuda"], "python": w["python"], "source_sha256": w["source_sha256"]}
    meta.update(extra)
    return meta


def write_sidecar(folder: str, meta: Dict[str, Any]) -> str:
    """Write ``<module>.json`` into folder atomically (a reader sees the old one or the new one); its path."""
    path = os.path.join(folder, meta["module"] + ".json")
    fd, tmp = tempfile.mkstemp(prefix=".sidecar.", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _short(sha: Any) -> str:
    return str(sha)[:12] if sha else "none"


def mismatches(meta: Dict[str, Any], w: Dict[str, Any]) -> List[str]:
    """Why a build with this sidecar cannot be loaded where ``w`` is wanted; [] when it can."""
    if meta.get("format") != FORMAT:
        return [f"sidecar format {meta.get('format')!r}, this package reads {FORMAT}"]
    why = []
    if meta.get("torch") != w["torch"]:
        why.append(f"built for torch {meta.get('torch')}, this is {w['torch']}")
    if meta.get("cuda") != w["cuda"]:
        why.append(f"built for CUDA {meta.get('cuda')}, this torch has {w['cuda']}")
    if meta.get("python") != w["python"]:
        why.append(f"built for Python {meta.get('python')}, this is {w['python']}")
    if w["source_sha256"] is not None and meta.get("source_sha256") != w["source_sha256"]:
        why.append(f"built from another host_allocator.cpp (sha256 {_short(meta.get('source_sha256'))}, "
                   f"this package's is {_short(w['source_sha256'])})")
    if not why and meta.get("module") != w["module"]:
        why.append(f"its module is {meta.get('module')}, {w['module']} is wanted")
    return why


def _read_sidecar(path: str) -> Tuple[Optional[Dict[str, Any]], str]:
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"unreadable sidecar: {e}"
    if not isinstance(meta, dict):
        return None, "unreadable sidecar: not a JSON object"
    return meta, ""


def find(folders: Sequence[Tuple[str, str]], w: Dict[str, Any]) -> Tuple[Optional[Tuple[str, str, Dict[str, Any]]],
                                                                          List[str]]:
    """The first build in folders ((path, where it comes from), in order) that fits ``w``.

    Returns ((the .so's path, where, its sidecar) or None, one line per folder or file passed over)."""
    rejected: List[str] = []
    for folder, origin in folders:
        if not os.path.isdir(folder):
            rejected.append(f"{folder} ({origin}): no such folder")
            continue
        try:
            names = sorted(os.listdir(folder))
        except OSError as e:
            rejected.append(f"{folder} ({origin}): {e.strerror or e}")
            continue
        stems = sorted({n[:-5] for n in names if n.startswith(PREFIX) and n.endswith(".json")}
                       | {n[:-3] for n in names if n.startswith(PREFIX) and n.endswith(".so")})
        if not stems:
            rejected.append(f"{folder} ({origin}): no prebuilt extension in it")
            continue
        for stem in stems:
            so, js = os.path.join(folder, stem + ".so"), os.path.join(folder, stem + ".json")
            if not os.path.isfile(js):
                rejected.append(f"{so} ({origin}): no {stem}.json beside it, so what it was built against is unknown")
                continue
            meta, err = _read_sidecar(js)
            if meta is None:
                rejected.append(f"{js} ({origin}): {err}")
                continue
            why = mismatches(meta, w)
            if why:
                rejected.append(f"{so} ({origin}): " + "; ".join(why))
                continue
            lib = os.path.join(folder, os.path.basename(str(meta.get("file") or stem + ".so")))
            if not os.path.isfile(lib):
                rejected.append(f"{js} ({origin}): names {os.path.basename(lib)}, which is missing")
                continue
            return (lib, origin, meta), rejected
    return None, rejected


def loaded_library_dirs(lib_path: Optional[str], maps: str = "/proc/self/maps") -> List[str]:
    """The folders holding the libpinbroker that was loaded: its path's folder, and its real file's folder.

    A bare soname (found on the linker's path) is looked up in maps, where the dynamic linker mapped it."""
    paths: List[str] = []
    if lib_path and os.sep in lib_path:
        paths.append(os.path.abspath(lib_path))
    elif lib_path:
        try:
            with open(maps) as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libpinbroker.so"):
                        paths.append(parts[5].strip())
                        break
        except OSError:
            pass
    out: List[str] = []
    for p in paths:
        for d in (os.path.dirname(p), os.path.dirname(os.path.realpath(p))):
            if d not in out:
                out.append(d)
    return out


def jit_root(torch_cuda: Optional[str], environ: Optional[Dict[str, str]] = None) -> str:
    """Where torch's cpp_extension.load builds by default: $TORCH_EXTENSIONS_DIR, else the user's cache
    (torch_extensions/py312_cu130 under $XDG_CACHE_HOME or ~/.cache), one per user."""
    env = os.environ if environ is None else environ
    root = env.get("TORCH_EXTENSIONS_DIR")
    if root:
        return root
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    cu = "cpu" if torch_cuda is None else "cu" + torch_cuda.replace(".", "")
    return os.path.realpath(os.path.join(cache, "torch_extensions", f"{python_tag()}_{cu}"))


def search_folders(lib_path: Optional[str], package_dir: str, jit_dir: Optional[str],
                   environ: Optional[Dict[str, str]] = None) -> List[Tuple[str, str]]:
    """The folders to look in, in order, with where each comes from: $PINBROKER_TORCH_EXT_DIR; next to the
    libpinbroker that was loaded (pinbroker-torch/, then pinbroker/torch-ext/); the package's _ext/; the JIT's
    own folder from an earlier run."""
    env = os.environ if environ is None else environ
    out: List[Tuple[str, str]] = []
    if env.get(DIR_ENV):
        out.append((env[DIR_ENV], "$" + DIR_ENV))
    for d in loaded_library_dirs(lib_path):
        out.append((os.path.join(d, BUILD_TREE_DIR), "beside the loaded libpinbroker (cmake --build)"))
        out.append((os.path.join(d, INSTALL_DIR), "the loaded libpinbroker's libdir (cmake --install)"))
    out.append((os.path.join(package_dir, PACKAGE_DIR), "inside the pinbroker package"))
    if jit_dir:
        out.append((jit_dir, "an earlier JIT build"))
    seen: List[str] = []
    uniq = []
    for d, origin in out:
        key = os.path.normpath(d)
        if key not in seen:
            seen.append(key)
            uniq.append((d, origin))
    return uniq
