# SPDX-License-Identifier: MIT
"""sitecustomize for ``pinctl run``: with PINBROKER_TORCH=1, torch's pinned memory comes from pinbrokerd.

``pinctl run`` puts this directory first on PYTHONPATH, so Python's site module imports this file at start-up
instead of the sitecustomize it would have found further along sys.path (Debian ships one in
/usr/lib/python3.X). That one is run first, by path, as if it had been found: nothing of it is lost.

Then, only when PINBROKER_TORCH=1: a finder on sys.meta_path waits for ``import torch``; once torch's
``__init__`` has finished, it calls :func:`pinbroker.torch_alloc.install_from_env` once and takes itself off
sys.meta_path. A program that never imports torch pays nothing but the finder's name check.

Why right after the import, and not at the first pinned allocation: torch asks at::getHostAllocator() from
C++ with no Python hook in between, so the first allocation cannot be intercepted. Installing does not
initialise CUDA (the extension captures torch's allocator and connects to the daemon; the first pinned
allocation initialises CUDA, as in stock torch), so a program that forks workers after ``import torch`` is
unaffected. The extension is loaded prebuilt (cmake --build makes it: see pinbroker.torch_alloc); only
where none fits this torch does the first run build it (20-40 s: that first ``import torch`` waits for it).

Nothing here may break the program: every failure is a warning, and ``import torch`` still succeeds.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The file of the sitecustomize this one shadows and ran, or None.
shadowed = None


def _same_dir(p):
    try:
        return os.path.realpath(p or os.curdir) == os.path.realpath(_HERE)
    except (OSError, ValueError):
        return False


def _chain():
    """Run the sitecustomize that the rest of sys.path holds, as site.py would have."""
    global shadowed
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if not _same_dir(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    shadowed = spec.origin
    module = importlib.util.module_from_spec(spec)
    # Its own name while it runs (some check __name__ or sys.modules); this module is sitecustomize after.
    me = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if me is not None:
            sys.modules["sitecustomize"] = me
    sys.modules["_pinbroker_shadowed_sitecustomize"] = module


def _env_on(value):
    return (value or "").strip().lower() in ("1", "yes", "true", "on")


def _warn(what, exc):
    try:
        sys.stderr.write(f"pinbroker sitecustomize: {what}: {type(exc).__name__}: {exc}\n")
    except Exception:
        pass


def _after_torch():
    """Install the allocator; the package is found on sys.path, else next to this directory."""
    try:
        import pinbroker.torch_alloc as ta
    except ImportError:
        root = os.path.dirname(os.path.dirname(_HERE))
        if not os.path.isfile(os.path.join(root, "pinbroker", "__init__.py")):
            raise
        sys.path.append(root)
        import pinbroker.torch_alloc as ta
    ta.install_from_env()


class _TorchImportHook:
    """A sys.meta_path finder that only wraps torch's loader so that _after_torch runs once torch is in."""

    def __init__(self):
        self.busy = False
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.busy or self.done:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            self.done = True
            loader = spec.loader
            exec_module = loader.exec_module

            # Set on this loader object only (each module has its own): module.__loader__ stays the real one.
            def exec_then_install(module):
                exec_module(module)
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
                try:
                    _after_torch()
                except Exception as e:
                    _warn("installing the pinbroker host allocator failed; torch keeps its own", e)

            loader.exec_module = exec_then_install
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            return spec
        finally:
            self.busy = False


def _main():
    try:
        _chain()
    except Exception as e:
        _warn(f"the shadowed sitecustomize ({shadowed}) raised", e)
    if not _env_on(os.environ.get("PINBROKER_TORCH")):
        return
    try:
        if "torch" in sys.modules:
            _after_torch()
        else:
            sys.meta_path.insert(0, _TorchImportHook())
    except Exception as e:
        _warn("cannot watch for import torch", e)


_main()
