"""The package itself: imports, layering, and the set-up scripts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_needs_neither_ipython_nor_a_gpu():
    code = (
        "import sys, thunder_nb\n"
        "assert 'IPython' not in sys.modules, 'IPython imported'\n"
        "assert 'thunder' not in sys.modules, 'thunder imported eagerly'\n"
        "assert 'graphviz' not in sys.modules, 'graphviz imported eagerly (render is imported with the package)'\n"
        "import torch; assert not torch.cuda.is_initialized()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


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


def test_the_public_names_stay_where_users_import_them():
    """#30 moved the modules behind the front doors; what users import from ``thunder_nb`` stays put."""
    code = (
        "import thunder_nb\n"
        "from thunder_nb.fix import FixedCUDAGraphTransform, LegacyCUDAGraphTransform, jit\n"
        "from thunder.transforms.cudagraph import CUDAGraphTransform\n"
        "assert thunder_nb.FixedCUDAGraphTransform is FixedCUDAGraphTransform\n"
        "assert thunder_nb.LegacyCUDAGraphTransform is LegacyCUDAGraphTransform and thunder_nb.jit is jit\n"
        "assert issubclass(FixedCUDAGraphTransform, CUDAGraphTransform)\n"
        "assert all(callable(getattr(thunder_nb, n)) for n in ('compare', 'analyze', 'check', 'jit_step',\n"
        "                                                         'capturability', 'load_ipython_extension'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
