# SPDX-License-Identifier: MIT
"""The prebuilt host allocator extension, on a host without torch >= 2.8: which build fits (torch version, CUDA,
Python ABI, source hash, the file itself), the folders' order, why each build is passed over, PINBROKER_TORCH_JIT=0,
and pinbroker._build_ext's "skipped" path. A stand-in torch package (a tiny C module in place of the extension)
carries a build through _build_ext and back through the lookup's import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import types

import pytest

from conftest import PYDIR

import pinbroker.torch_alloc as ta
from pinbroker import _torch_ext as te

TORCH = "2.11.0+cu130"
CUDA = "13.0"
SHA = "a" * 64
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def _want(**kw):
    args = dict(torch_version=TORCH, cuda=CUDA, source_sha256=SHA, py_tag="py312",
                py_abi="cpython-312-x86_64-linux-gnu")
    args.update(kw)
    return te.want(args.pop("torch_version"), args.pop("cuda"), args.pop("source_sha256"), **args)


def _build(folder, w, so=True, **override):
    """A fake build in folder: <module>.so (unless so=False) and its sidecar, with fields overridden."""
    os.makedirs(folder, exist_ok=True)
    meta = te.sidecar(w)
    meta.update(override)
    te.write_sidecar(str(folder), meta)
    if so:
        with open(os.path.join(folder, meta["module"] + ".so"), "wb") as f:
            f.write(b"\x7fELF not really")
    return os.path.join(folder, meta["module"] + ".so")


def test_module_name_encodes_torch_minor_cuda_and_python():
    assert te.module_name("2.11.0+cu130", "13.0", "py312") == "pinbroker_host_allocator_t2_11_cu130_py312"
    assert te.module_name("2.8.0", "12.8", "py313t") == "pinbroker_host_allocator_t2_8_cu128_py313t"
    assert te.module_name("2.9.1", None, "py311") == "pinbroker_host_allocator_t2_9_cpu_py311"
    assert ta._torch_version("2.11.0+cu130") == (2, 11)


def test_a_matching_build_is_found(tmp_path):
    w = _want()
    so = _build(tmp_path / "a", w)
    found, rejected = te.find([(str(tmp_path / "a"), "here")], w)
    assert found is not None and found[0] == so and found[1] == "here"
    assert found[2]["torch"] == TORCH and found[2]["source_sha256"] == SHA
    assert rejected == []


@pytest.mark.parametrize("override,why", [
    ({"torch": "2.11.1+cu130"}, "built for torch 2.11.1+cu130, this is 2.11.0+cu130"),
    ({"cuda": "12.8"}, "built for CUDA 12.8, this torch has 13.0"),
    ({"python": "cpython-311-x86_64-linux-gnu"}, "built for Python cpython-311-x86_64-linux-gnu, this is cpython-312"),
    ({"source_sha256": "b" * 64}, "built from another host_allocator.cpp (sha256 bbbbbbbbbbbb, this package's is "
                                  "aaaaaaaaaaaa)"),
    ({"format": 99}, "sidecar format 99"),
])
def test_a_build_made_against_something_else_is_passed_over_saying_why(tmp_path, override, why):
    w = _want()
    so = _build(tmp_path, w, **override)
    found, rejected = te.find([(str(tmp_path), "the folder")], w)
    assert found is None
    assert len(rejected) == 1 and rejected[0].startswith(f"{so} (the folder): ") and why in rejected[0], rejected


def test_another_torch_minor_is_a_file_of_another_name_and_says_which_torch(tmp_path):
    old = _want(torch_version="2.10.0+cu130")
    _build(tmp_path, old)
    found, rejected = te.find([(str(tmp_path), "x")], _want())
    assert found is None
    assert "pinbroker_host_allocator_t2_10_cu130_py312.so" in rejected[0]
    assert "built for torch 2.10.0+cu130, this is 2.11.0+cu130" in rejected[0]


def test_the_source_hash_is_not_checked_when_the_source_is_not_shipped(tmp_path):
    _build(tmp_path, _want())
    found, _ = te.find([(str(tmp_path), "x")], _want(source_sha256=None))
    assert found is not None


def test_missing_file_missing_sidecar_bad_sidecar_empty_and_absent_folders(tmp_path):
    w = _want()
    _build(tmp_path / "nofile", w, so=False)
    os.makedirs(tmp_path / "nosidecar")
    (tmp_path / "nosidecar" / (w["module"] + ".so")).write_bytes(b"x")
    os.makedirs(tmp_path / "bad")
    (tmp_path / "bad" / (w["module"] + ".json")).write_text("{not json")
    os.makedirs(tmp_path / "empty")
    folders = [(str(tmp_path / d), d) for d in ("nofile", "nosidecar", "bad", "empty", "absent")]
    found, rejected = te.find(folders, w)
    assert found is None and len(rejected) == 5, rejected
    assert "(nofile): names " + w["module"] + ".so, which is missing" in rejected[0]
    assert "(nosidecar): no " + w["module"] + ".json beside it" in rejected[1]
    assert "(bad): unreadable sidecar" in rejected[2]
    assert rejected[3].endswith("(empty): no prebuilt extension in it")
    assert rejected[4].endswith("(absent): no such folder")


def test_the_first_folder_that_fits_wins_and_earlier_misfits_are_listed(tmp_path):
    w = _want()
    _build(tmp_path / "one", w, torch="2.11.1")
    two = _build(tmp_path / "two", w)
    three = _build(tmp_path / "three", w)
    found, rejected = te.find([(str(tmp_path / d), d) for d in ("one", "two", "three")], w)
    assert found[0] == two and found[0] != three
    assert len(rejected) == 1 and "(one): built for torch 2.11.1" in rejected[0]


def test_search_order_env_then_beside_the_library_then_package_then_jit(tmp_path):
    real = tmp_path / "real"
    os.makedirs(real)
    (real / "libpinbroker.so.1.2.0").write_bytes(b"")
    link = tmp_path / "links"
    os.makedirs(link)
    os.symlink(real / "libpinbroker.so.1.2.0", link / "libpinbroker.so.1")
    folders = te.search_folders(str(link / "libpinbroker.so.1"), "/pkg/pinbroker", "/jit/x",
                                environ={te.DIR_ENV: "/env/dir"})
    assert [f for f, _ in folders] == [
        "/env/dir",
        str(link / "pinbroker-torch"), str(link / "pinbroker" / "torch-ext"),
        str(real / "pinbroker-torch"), str(real / "pinbroker" / "torch-ext"),
        "/pkg/pinbroker/_ext", "/jit/x",
    ]
    assert folders[0][1] == "$PINBROKER_TORCH_EXT_DIR"
    # No variable, no library: the package's and the JIT's folders only.
    assert [f for f, _ in te.search_folders(None, "/pkg/pinbroker", None, environ={})] == ["/pkg/pinbroker/_ext"]


def test_a_library_found_by_soname_is_located_in_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
                    "7f02-7f03 r-xp 00000000 08:01 2 /opt/pb/lib/libpinbroker.so.1.2.0\n")
    assert te.loaded_library_dirs("libpinbroker.so.1", maps=str(maps)) == ["/opt/pb/lib"]
    assert te.loaded_library_dirs(None) == []


def test_the_build_tree_folder_beside_the_loaded_library_is_searched():
    import pinbroker._lib as lib

    lib.load()
    got = [f for f, _ in te.search_folders(lib.path(), "/pkg", None, environ={})]
    libdir = os.path.dirname(os.path.realpath(lib.path()))
    assert os.path.join(libdir, "pinbroker-torch") in got


def test_jit_folder_honours_torch_extensions_dir_else_the_users_cache(tmp_path):
    assert te.jit_root("13.0", {"TORCH_EXTENSIONS_DIR": "/x/ext"}) == "/x/ext"
    got = te.jit_root("13.0", {"XDG_CACHE_HOME": str(tmp_path)})
    assert got == os.path.join(os.path.realpath(tmp_path), "torch_extensions", te.python_tag() + "_cu130")


def _fake_torch_object(version=TORCH, cuda=CUDA):
    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda))


@pytest.fixture
def no_loaded_ext(monkeypatch, tmp_path):
    """ta with no extension loaded yet, an empty JIT folder, and only $PINBROKER_TORCH_EXT_DIR to search."""
    monkeypatch.setattr(ta, "_ext", None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "jit"))
    monkeypatch.setenv(te.DIR_ENV, str(tmp_path / "ext"))
    monkeypatch.setattr(ta._lib, "path", lambda: None)
    return tmp_path


def test_no_jit_allowed_is_an_error_saying_why_each_build_was_passed_over(no_loaded_ext, monkeypatch):
    w = te.want(TORCH, CUDA, te.sha256_file(ta._SOURCE))
    _build(no_loaded_ext / "ext", w, torch="2.10.0+cu130")
    monkeypatch.setenv("PINBROKER_TORCH_JIT", "0")
    with pytest.raises(RuntimeError) as e:
        ta._load_extension(_fake_torch_object(), verbose=False)
    msg = str(e.value)
    assert "no prebuilt extension fits torch 2.11.0+cu130" in msg
    assert "built for torch 2.10.0+cu130, this is 2.11.0+cu130" in msg
    assert "$PINBROKER_TORCH_JIT=0 forbids building it now" in msg
    assert "cmake --build" in msg and "python3 -m pinbroker._build_ext" in msg
    assert ta._ext is None


def test_the_jit_fallback_warns_why_before_it_builds(no_loaded_ext, monkeypatch):
    monkeypatch.delenv("PINBROKER_TORCH_JIT", raising=False)

    def no_header():
        raise RuntimeError("cannot find pinbroker.h (test)")

    monkeypatch.setattr(ta, "_find_include_dir", no_header)
    with pytest.warns(RuntimeWarning, match=r"no prebuilt extension fits torch 2\.11\.0\+cu130.*no such folder.*"
                                            r"Building it now"):
        with pytest.raises(RuntimeError, match="cannot find pinbroker.h"):
            ta._load_extension(_fake_torch_object(), verbose=False)


def test_build_script_skips_on_this_torch_and_exits_0(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=PYDIR, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([PY, "-m", "pinbroker._build_ext", "--out", str(out)], capture_output=True, text=True,
                       env=env, timeout=120)
    have = subprocess.run([PY, "-c", "import torch, sys; sys.exit(0 if (torch.version.cuda and "
                           "tuple(int(x) for x in torch.__version__.split('.')[:2]) >= (2, 8)) else 1)"],
                          capture_output=True, env=env).returncode == 0
    if have:
        pytest.skip("this host's torch can build the extension: the skip path cannot be seen here")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pinbroker._build_ext: skipped: torch" in r.stdout
    assert "older than 2.8" in r.stdout or "not importable" in r.stdout or "has no CUDA" in r.stdout
    assert not out.exists() or not os.listdir(out)
    c = subprocess.run([PY, "-m", "pinbroker._build_ext", "--check"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert c.returncode == 3 and c.stdout.startswith("skipped: torch"), c.stdout + c.stderr


# A stand-in torch: version 2.11.0+cu130 with CUDA 13.0, whose cpp_extension.load compiles a tiny C module
# named as asked (with an install()), so a build goes through _build_ext and the lookup's import for real.
_FAKE_CPP_EXTENSION = textwrap.dedent('''
    import importlib.util, os, subprocess, sys, sysconfig
    CUDA_HOME = "/usr/local/cuda"
    def is_ninja_available():
        return True
    def get_cxx_compiler():
        return "cc"
    def load(name, sources, extra_cflags=None, extra_ldflags=None, extra_include_paths=None, build_directory=None,
             verbose=False, with_cuda=None, is_python_module=True):
        assert with_cuda and is_python_module and os.path.isdir(build_directory)
        assert os.path.isfile(os.path.join(extra_include_paths[0], "pinbroker.h"))
        if os.environ.get("FAKE_TORCH_FAIL"):
            raise RuntimeError("Error building extension '%s':\\nhost_allocator.cpp:1: error: fake failure" % name)
        c = os.path.join(build_directory, "m.c")
        with open(c, "w") as f:
            f.write("#include <Python.h>\\n"
                    "static PyObject *inst(PyObject *s, PyObject *a) { Py_RETURN_NONE; }\\n"
                    "static PyMethodDef m[] = {{\\"install\\", inst, METH_VARARGS, 0}, {0}};\\n"
                    "static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, \\"%s\\", 0, -1, m};\\n"
                    "PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&d); }\\n" % (name, name))
        so = os.path.join(build_directory, name + ".so")
        subprocess.check_call(["cc", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"], c, "-o", so])
        spec = importlib.util.spec_from_file_location(name, so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
''')


@pytest.fixture
def fake_torch(tmp_path):
    if not shutil.which("cc") or not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("needs cc and Python.h to build the stand-in extension")
    root = tmp_path / "faketorch"
    (root / "torch" / "utils").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(
        "from . import version\n__version__ = '2.11.0+cu130'\n")
    (root / "torch" / "version.py").write_text("cuda = '13.0'\n__version__ = '2.11.0+cu130'\n")
    (root / "torch" / "utils" / "__init__.py").write_text("")
    (root / "torch" / "utils" / "cpp_extension.py").write_text(_FAKE_CPP_EXTENSION)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), PYDIR]), PYTHONDONTWRITEBYTECODE="1")
    for k in (te.DIR_ENV, "PINBROKER_TORCH_JIT", "FAKE_TORCH_FAIL"):
        env.pop(k, None)
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "jit")
    return env


def test_build_script_builds_into_out_with_a_sidecar_and_the_lookup_imports_it(tmp_path, fake_torch):
    out = tmp_path / "out"
    check = subprocess.run([sys.executable, "-m", "pinbroker._build_ext", "--check"], capture_output=True, text=True,
                           env=fake_torch, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith("usable: torch 2.11.0+cu130 with CUDA 13.0")
    name = te.module_name("2.11.0+cu130", "13.0", te.python_tag())
    assert f"module={name}\n" in check.stdout and "torch_version_file=" in check.stdout
    r = subprocess.run([sys.executable, "-m", "pinbroker._build_ext", "--out", str(out), "--build-dir",
                        str(tmp_path / "bld")], capture_output=True, text=True, env=fake_torch, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(out)) == [name + ".json", name + ".so"]
    meta = json.loads((out / (name + ".json")).read_text())
    assert meta["torch"] == "2.11.0+cu130" and meta["cuda"] == "13.0" and meta["python"] == te.python_abi()
    assert meta["source_sha256"] == te.sha256_file(ta._SOURCE) and meta["module"] == name
    # A fresh process of that torch finds and imports it, with no compiler and no JIT allowed.
    code = textwrap.dedent('''
        import torch, pinbroker.torch_alloc as ta, pinbroker._torch_ext as te
        ta._lib.path = lambda: None
        w = te.want(torch.__version__, torch.version.cuda, te.sha256_file(ta._SOURCE))
        loaded = ta._load_extension(torch, verbose=False)
        print(loaded.built, loaded.path, loaded.origin, hasattr(loaded.module, "install"))
    ''')
    env = dict(fake_torch, PINBROKER_TORCH_JIT="0", PINBROKER_TORCH_EXT_DIR=str(out), PATH="/nonexistent")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split() == ["prebuilt", str(out / (name + ".so")), "$PINBROKER_TORCH_EXT_DIR", "True"]


def test_a_fitting_build_that_does_not_import_is_passed_over_for_the_next(tmp_path, fake_torch):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "pinbroker._build_ext", "--out", str(out)], capture_output=True,
                       text=True, env=fake_torch, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    name = te.module_name("2.11.0+cu130", "13.0", te.python_tag())
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(out / (name + ".json"), broken)
    (broken / (name + ".so")).write_bytes(b"not an ELF file")
    jit = tmp_path / "jit" / name
    shutil.copytree(out, jit)  # an earlier JIT build: the last folder searched
    code = textwrap.dedent('''
        import torch, pinbroker.torch_alloc as ta
        ta._lib.path = lambda: None
        loaded = ta._load_extension(torch, verbose=False)
        print(loaded.built, loaded.origin)
        print("\\n".join(loaded.passed_over))
    ''')
    env = dict(fake_torch, PINBROKER_TORCH_JIT="0", PINBROKER_TORCH_EXT_DIR=str(broken))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "prebuilt an earlier JIT build"
    assert any(str(broken) in ln and "fits, but does not import" in ln for ln in lines[1:]), p.stdout


def test_build_script_failure_exits_nonzero_with_the_log_tail(tmp_path, fake_torch):
    env = dict(fake_torch, FAKE_TORCH_FAIL="1")
    r = subprocess.run([sys.executable, "-m", "pinbroker._build_ext", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1
    assert "failed: RuntimeError. The build log ends:" in r.stderr and "error: fake failure" in r.stderr
    assert not (tmp_path / "out").exists() or not [n for n in os.listdir(tmp_path / "out") if n.endswith(".so")]


def test_the_jit_build_leaves_a_sidecar_so_the_next_process_loads_it_prebuilt(tmp_path, fake_torch):
    code = textwrap.dedent('''
        import warnings, torch, pinbroker.torch_alloc as ta
        ta._lib.path = lambda: None
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            loaded = ta._load_extension(torch, verbose=False)
        print(loaded.built, len(w))
    ''')
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=fake_torch, timeout=60)
    assert first.returncode == 0 and first.stdout.split() == ["jit", "1"], first.stdout + first.stderr
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(fake_torch, PINBROKER_TORCH_JIT="0"), timeout=60)
    assert second.returncode == 0 and second.stdout.split() == ["prebuilt", "0"], second.stdout + second.stderr
