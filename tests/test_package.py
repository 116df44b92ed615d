"""The package itself: imports, layering, and the set-up scripts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


#: One fresh Python for both checks below, in this order (the first imports thunder_nb alone, the second thunder too):
#: each prints its own line, ``<name>: ok`` or what failed.
FRESH_IMPORT = """
import traceback
def check(name, code):
    try:
        exec(code, {})
        print(f"{name}: ok")
    except BaseException:
        print(f"{name}: " + traceback.format_exc().replace(chr(10), " | "))
check("light", '''
import sys, thunder_nb
assert 'IPython' not in sys.modules, 'IPython imported'
assert 'thunder' not in sys.modules, 'thunder imported eagerly'
assert 'graphviz' not in sys.modules, 'graphviz imported eagerly (render is imported with the package)'
import torch; assert not torch.cuda.is_initialized()
''')
check("names", '''
import thunder_nb
from thunder_nb.fix import FixedCUDAGraphTransform, LegacyCUDAGraphTransform, jit
from thunder.transforms.cudagraph import CUDAGraphTransform
assert thunder_nb.FixedCUDAGraphTransform is FixedCUDAGraphTransform
assert thunder_nb.LegacyCUDAGraphTransform is LegacyCUDAGraphTransform and thunder_nb.jit is jit
assert issubclass(FixedCUDAGraphTransform, CUDAGraphTransform)
assert all(callable(getattr(thunder_nb, n)) for n in ('compare', 'analyze', 'check', 'jit_step',
                                                      'capturability', 'load_ipython_extension'))
''')
"""


@pytest.fixture(scope="module")
def fresh_import() -> dict[str, str]:
    """name -> ``ok`` or the traceback of that check, from one fresh Python (`FRESH_IMPORT`)."""
    out = subprocess.run([sys.executable, "-c", FRESH_IMPORT], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(line.split(": ", 1) for line in out.stdout.splitlines() if line.startswith(("light: ", "names: ")))


def test_import_needs_neither_ipython_nor_a_gpu(fresh_import):
    assert fresh_import.get("light") == "ok", fresh_import


def test_render_never_imports_thunder_and_analysis_never_imports_render():
    render = "".join(p.read_text() for p in (ROOT / "thunder_nb" / "render").glob("*.py"))
    analysis = (ROOT / "thunder_nb" / "diagnosis" / "analysis.py").read_text()
    assert "import thunder" not in render and "from thunder" not in render
    assert "render" not in "".join(l for l in analysis.splitlines() if "import" in l)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash dev.sh test" in readme and "bash dev.sh example" in readme
    assert "bash dev.sh test" in ci


def test_dev_sh_never_installs_into_the_system_python():
    """Debian's python3 refuses ``pip install`` (PEP 668): dev.sh installs uv into its own virtualenv only."""
    dev = (ROOT / "dev.sh").read_text()
    assert "python3 -m pip" not in dev and "--break-system-packages" not in dev
    assert 'python3 -m venv "$UV_VENV"' in dev and '"$UV_VENV/bin/python" -m pip install' in dev


def test_the_public_names_stay_where_users_import_them(fresh_import):
    """#30 moved the modules behind the front doors; what users import from ``thunder_nb`` stays put."""
    assert fresh_import.get("names") == "ok", fresh_import
