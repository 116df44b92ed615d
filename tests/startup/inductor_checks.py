"""Inductor's checks of the CPU's vector ISA, made once for the checkout and kept, in every process the tests start.

Inductor's first compile in a process checks each vector ISA the CPU's flags name by building a small kernel and loading
it in a fresh Python that imports torch. ``TORCHINDUCTOR_VEC_ISA_OK`` skips only the base ISA's check: on a CPU with
avx512_bf16 and avx512_vnni torch 2.11 still starts six such Pythons, about 12 s of CPU, at the first compile of every
process: each pytest worker, and each notebook kernel, README snippet and rank that compiles with inductor (2026-12-06).
The answer is the same for the same code, flags, compiler and torch (torch's own key for the built kernel): the first
process to need one checks, under a lock, and writes it next to inductor's kernels (``TORCHINDUCTOR_CACHE_DIR``); every
other process, and later sessions, read it.

`install` applies this to the running process: at once where inductor's module is imported, else when it is.
``tests/startup/sitecustomize.py`` calls it at the start of every Python that ``tests/conftest.py`` puts this folder
on the ``PYTHONPATH`` of (the kernels, subprocesses and ranks the tests start inherit it).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

MODULE = "torch._inductor.cpu_vec_isa"


def _keep_answers(module) -> None:
    """``module.VecISA.check_build`` reads a kept answer, and checks (under a lock) only where none is kept."""
    check = module.VecISA.check_build
    if getattr(check, "once", False) or "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        return
    folder = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "vec-isa-checks"

    def check_build(self, code: str) -> bool:
        import filelock

        key = f"{module._get_isa_dry_compile_fingerprint(self._arch_flags)}\n{code}"
        done = folder / hashlib.sha1(key.encode()).hexdigest()
        folder.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(f"{done}.lock"):
            if not done.exists():
                done.write_text("ok" if check(self, code) else "failed")
            return done.read_text() == "ok"

    check_build.once = True
    module.VecISA.check_build = check_build


class _WhenImported(importlib.abc.MetaPathFinder):
    """Finds inductor's module as Python would, and keeps the answers once it has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _keep_answers(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Keep the ISA checks' answers in this process (now, or when inductor's module is imported)."""
    if MODULE in sys.modules:
        _keep_answers(sys.modules[MODULE])
    elif not any(isinstance(f, _WhenImported) for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenImported())
