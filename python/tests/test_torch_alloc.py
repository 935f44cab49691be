# SPDX-License-Identifier: MIT
"""pinbroker.torch.install() and the PINBROKER_TORCH start-up hook, where no torch >= 2.8 with CUDA runs: the
refusals say why, install_from_env() only warns, and the sitecustomize chains to the one it shadows. The
allocator itself runs on a GPU host: python/bench/torch_alloc_check.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from conftest import PYDIR, REPO

import pinbroker.torch_alloc as ta

AUTOTORCH = os.path.join(PYDIR, "pinbroker", "_autotorch")
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def _torch():
    return pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")


def _old_torch():
    torch = _torch()
    if ta._torch_version(torch.__version__) >= ta.MIN_TORCH:
        pytest.skip(f"torch {torch.__version__} is >= 2.8: the refusal of an old torch cannot be seen here")
    return torch


def test_torch_version_parsing():
    assert ta._torch_version("2.11.0+cu130") == (2, 11)
    assert ta._torch_version("1.13.0a0") == (1, 13)
    assert ta._torch_version("2.8.0.dev20250601") == (2, 8)
    assert ta._torch_version("garbage") == (0, 0)


def test_install_on_old_torch_says_which_torch_is_needed_and_found():
    torch = _old_torch()
    with pytest.raises(RuntimeError) as e:
        ta.install()
    assert "torch >= 2.8" in str(e.value)
    assert torch.__version__ in str(e.value)


def test_install_is_reexported_from_pinbroker_torch():
    _torch()
    pytest.importorskip("numpy")
    import pinbroker.torch as pbt

    assert pbt.install is ta.install and pbt.install_from_env is ta.install_from_env
    assert pbt.uninstall is ta.uninstall and pbt.allocator_stats() is None


def test_install_from_env_without_the_variable_does_nothing(monkeypatch):
    monkeypatch.delenv("PINBROKER_TORCH", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ta.install_from_env() is None
    monkeypatch.setenv("PINBROKER_TORCH", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ta.install_from_env() is None


def test_install_from_env_warns_and_does_not_raise(monkeypatch):
    _old_torch()
    monkeypatch.setenv("PINBROKER_TORCH", "1")
    with pytest.warns(RuntimeWarning, match=r"PINBROKER_TORCH=1.*torch >= 2\.8"):
        assert ta.install_from_env() is None


def test_include_dir_is_found_in_the_checkout(monkeypatch):
    monkeypatch.delenv(ta.INCLUDE_ENV, raising=False)
    assert os.path.samefile(ta._find_include_dir(), os.path.join(REPO, "client", "lib"))


def test_include_dir_from_the_environment_must_hold_the_header(monkeypatch, tmp_path):
    monkeypatch.setenv(ta.INCLUDE_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="holds no pinbroker.h"):
        ta._find_include_dir()
    (tmp_path / "pinbroker.h").write_text("/* */\n")
    assert ta._find_include_dir() == str(tmp_path)


def test_the_extension_source_ships_with_the_package():
    with open(ta._SOURCE) as f:
        src = f.read()
    # What the C++ relies on from the header; the rest compiles only against torch >= 2.8.
    for needle in ("at::setHostAllocator(at::kCUDA", "record_event(void *ptr, void *ctx, c10::Stream stream)",
                   "PB_ACQUIRE_NO_REVOKE | PB_ACQUIRE_MAPPED", '#include "pinbroker.h"', "copy_data"):
        assert needle in src


# ---------------------------------------------------------------- the sitecustomize


def _run(code: str, tmp_path, extra_path=(), env=None, timeout=120) -> subprocess.CompletedProcess:
    """code in a fresh /usr/bin/python3 whose PYTHONPATH is the autotorch directory, then extra_path."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PINBROKER_TORCH", "PYTHONNOUSERSITE")}
    e["PYTHONPATH"] = os.pathsep.join([AUTOTORCH, *extra_path, PYDIR])
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    e["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    if env:
        e.update(env)
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          timeout=timeout, cwd=str(tmp_path))


@pytest.fixture
def fake_site(tmp_path):
    """A directory with a sitecustomize that the autotorch one shadows; it leaves a mark."""
    d = tmp_path / "shadowed"
    d.mkdir()
    (d / "sitecustomize.py").write_text(
        "import builtins, sys\n"
        "builtins.FAKE_SITECUSTOMIZE_RAN = __name__\n"
        "sys.stderr.write('fake sitecustomize ran\\n')\n"
    )
    return d


CHECK = """
    import builtins, sys
    import sitecustomize
    print("ours", sitecustomize.__file__)
    print("shadowed", sitecustomize.shadowed)
    print("ran-as", getattr(builtins, "FAKE_SITECUSTOMIZE_RAN", None))
    print("hook", any(type(f).__name__ == "_TorchImportHook" for f in sys.meta_path))
"""


def _lines(out: str) -> dict:
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_sitecustomize_chains_to_the_one_it_shadows(tmp_path, fake_site):
    r = _run(CHECK, tmp_path, [str(fake_site)])
    assert r.returncode == 0, r.stderr
    got = _lines(r.stdout)
    assert got["ours"] == os.path.join(AUTOTORCH, "sitecustomize.py")
    assert got["shadowed"] == str(fake_site / "sitecustomize.py")
    assert got["ran-as"] == "sitecustomize"
    assert got["hook"] == "False"  # no PINBROKER_TORCH: nothing else


def test_sitecustomize_without_pinbroker_torch_leaves_torch_alone(tmp_path, fake_site):
    _torch()
    r = _run(CHECK + "    import torch\n    print('pb', 'pinbroker.torch_alloc' in sys.modules)\n", tmp_path,
             [str(fake_site)], env={"PINBROKER_TORCH": "0"})
    assert r.returncode == 0, r.stderr
    got = _lines(r.stdout)
    assert got["hook"] == "False" and got["pb"] == "False"
    assert "pinbroker" not in r.stderr.replace("fake sitecustomize ran", "")


def test_sitecustomize_hook_installs_after_import_torch_and_never_breaks_it(tmp_path, fake_site):
    _old_torch()
    code = CHECK + """
    import torch
    print("torch", torch.__version__, torch.tensor([1, 2]).sum().item())
    print("hook-after", any(type(f).__name__ == "_TorchImportHook" for f in sys.meta_path))
    print("pb", "pinbroker.torch_alloc" in sys.modules)
    """
    r = _run(code, tmp_path, [str(fake_site)], env={"PINBROKER_TORCH": "1"})
    assert r.returncode == 0, r.stderr
    got = _lines(r.stdout)
    assert got["shadowed"] == str(fake_site / "sitecustomize.py")
    assert got["hook"] == "True" and got["hook-after"] == "False"
    assert got["torch"].endswith(" 3")  # torch works
    assert got["pb"] == "True"  # install_from_env ran once torch was in
    assert "RuntimeWarning" in r.stderr and "torch >= 2.8" in r.stderr, r.stderr


def test_sitecustomize_survives_a_shadowed_one_that_raises(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "sitecustomize.py").write_text("raise ValueError('broken site')\n")
    r = _run("import sitecustomize; print('alive', sitecustomize.shadowed)", tmp_path, [str(d)],
             env={"PINBROKER_TORCH": "1"})
    assert r.returncode == 0, r.stderr
    assert "alive " + str(d / "sitecustomize.py") in r.stdout
    assert "broken site" in r.stderr


def test_sitecustomize_with_nothing_to_chain_to(tmp_path):
    # -S-like isolation is not available for site itself; -I would drop PYTHONPATH. So: an empty sys.path
    # remainder is simulated by asking _chain() directly, in a process where the only sitecustomize is ours.
    code = """
    import sys, sitecustomize
    sys.path[:] = [p for p in sys.path if p.endswith("_autotorch")]
    sitecustomize.shadowed = None
    sitecustomize._chain()
    print("shadowed", sitecustomize.shadowed)
    """
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert _lines(r.stdout)["shadowed"] == "None"


# ---------------------------------------------------------------- the GPU check


def test_gpu_check_skips_without_cuda(tmp_path):
    torch = _torch()
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the check runs for real on the GPU host")
    r = subprocess.run([PYTHON, os.path.join(PYDIR, "bench", "torch_alloc_check.py")], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": PYDIR})
    assert r.returncode == 77, r.stdout + r.stderr
    assert "SKIP" in r.stdout


# -- the cache of freed blocks: its cap and slack (the allocator's cache rules themselves are libpinbroker's:
#    tests/integration/check_itest_cache.c; the allocator on a GPU: python/bench/torch_alloc_check.py)

def test_cache_settings_default_to_a_quarter_of_the_uid_quota_and_exact_size(start_daemon, monkeypatch):
    monkeypatch.delenv(ta.CACHE_ENV, raising=False)
    monkeypatch.delenv(ta.CACHE_SLACK_ENV, raising=False)
    d = start_daemon("--uid-quota", "128M")
    assert ta._cache_settings(d.socket, None, None) == (32 << 20, 0)
    d2 = start_daemon()  # no uid quota given: the budget (256M) is the base
    cap, slack = ta._cache_settings(d2.socket, None, None)
    assert slack == 0 and cap == int(min(d2.status(False)["uid_quota_bytes"] or (256 << 20), 256 << 20) * 0.25)


def test_cache_settings_from_arguments_and_environment(monkeypatch):
    monkeypatch.setenv(ta.CACHE_ENV, "512M")
    monkeypatch.setenv(ta.CACHE_SLACK_ENV, "10%")
    # No daemon is asked when both are given: the socket does not exist.
    assert ta._cache_settings("/nonexistent/pb.sock", None, None) == (512 << 20, 10)
    assert ta._cache_settings("/nonexistent/pb.sock", 0, 0) == (0, 0)
    monkeypatch.setenv(ta.CACHE_ENV, "lots")
    with pytest.raises(RuntimeError, match=r"PINBROKER_TORCH_CACHE='lots' is not a size"):
        ta._cache_settings("/nonexistent/pb.sock", None, 0)
    monkeypatch.setenv(ta.CACHE_SLACK_ENV, "half")
    with pytest.raises(RuntimeError, match="not a percentage"):
        ta._cache_settings("/nonexistent/pb.sock", 1, None)
    with pytest.raises(RuntimeError, match="0..100 percent"):
        ta._cache_settings("/nonexistent/pb.sock", 1, 101)
    with pytest.raises(RuntimeError, match=">= 0 bytes"):
        ta._cache_settings("/nonexistent/pb.sock", -1, 0)


def test_the_extension_reports_fallbacks_and_keeps_a_cache():
    """The C++ side, read: it uses the library's cache and reports torch's own pinned bytes as unbrokered
    (compiled and run on a GPU host by tests/gpu/run-torch.sh; here torch 1.13 cannot build it)."""
    src = open(ta._SOURCE).read()
    for needle in ("pb_set_cache_limit", "pb_set_cache_slack", "pb_cache_stats", "pb_report_unbrokered",
                   "libpinbroker-preload"):
        assert needle in src, needle
