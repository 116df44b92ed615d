"""thunder-nb's own warnings are printed as one line addressed to the user, in a script, a notebook and the magic;
every other warning keeps Python's format, and all of them stay filterable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import nbformat
import pytest
import torch

import thunder_nb
from thunder_nb.fix import EagerFallbackWarning
from thunder_nb.notebook import export

ROOT = Path(__file__).resolve().parent.parent
EAGER = ("thunder-nb: EagerFallbackWarning: no CUDA tensors in this region, so regions run eagerly and no CUDA graph "
         "is captured")

# NOTE: what a user runs: thunder_nb.jit on the CPU (regions eagerly, one EagerFallbackWarning), a number from an
# island that takes new values past max_values (RecaptureWarning, raised from thunder's generated code: Python printed
# `thunder.computation_4:14:` and the line `[t16] = CUDAGraph2(t13, f14)`), and a warning of the user's own
SCRIPT = textwrap.dedent(
    """
    import importlib, warnings
    import torch, thunder, thunder_nb
    from thunder_nb.fix import FixedCUDAGraphTransform
    from thunder_nb.testing import emulated_capture

    def f(x):
        return (x.sin() * 2).cos()

    def g(x):
        y = x.sin().cos()
        s = y.sum().item()
        return (y * s).exp()

    thunder_nb.jit(f)(torch.randn(4))
    with emulated_capture():
        t = FixedCUDAGraphTransform(capture=False, scalar_handoff=False, max_values=3)
        t.cuda_graph_runner.capture = True
        jg = thunder.jit(g, transforms=[t])
        for i in range(6):
            jg(torch.randn(64))
    warnings.warn("the user's own")
    before = warnings.formatwarning
    importlib.reload(thunder_nb)
    thunder_nb.cudagraph.notices.install_warning_format()
    print("wrapped once:", warnings.formatwarning is before)
    """
)


def _stderr_lines(stderr: str) -> list[str]:
    # NOTE: thunder's own warning at import, about an executor nobody asked for, is not the subject here
    return [line for line in stderr.splitlines() if "transformer_engine module not found" not in line]


def _this_checkout(monkeypatch) -> None:
    """A script's or a kernel's ``import thunder_nb`` finds this checkout's, wherever it runs."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.mark.slow  # NOTE: a fresh interpreter imports thunder (about 10 s)
def test_a_script_prints_thunder_nbs_warnings_as_one_line_and_others_as_python_does(tmp_path, monkeypatch):
    _this_checkout(monkeypatch)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "wrapped once: True"
    lines = _stderr_lines(run.stderr)
    user_line = SCRIPT.splitlines().index('warnings.warn("the user\'s own")') + 1
    assert len(lines) == 4 and lines[0] == EAGER, run.stderr
    assert re.fullmatch(r"thunder-nb: RecaptureWarning: CUDAGraph2: f\d+ took more than 3 values \(each would capture "
                        r"a new graph\): the region runs without a graph from now on", lines[1]), run.stderr
    assert lines[2:] == [f"{script}:{user_line}: UserWarning: the user's own", '  warnings.warn("the user\'s own")']


def test_thunder_nbs_warnings_stay_filterable_and_catchable():
    def f(x):
        return x.sin().cos() * 2

    with pytest.warns(EagerFallbackWarning, match="no CUDA tensors in this region"):
        thunder_nb.jit(f)(torch.randn(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        with pytest.raises(EagerFallbackWarning):
            thunder_nb.jit(f)(torch.randn(4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=EagerFallbackWarning)
        thunder_nb.jit(f)(torch.randn(4))
    assert not [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    # NOTE: the format changes for thunder-nb's categories only, wherever the warning was raised
    assert warnings.formatwarning("thunder-nb: m", EagerFallbackWarning, "/lib/torchex.py", 169, "return fn()") == (
        "thunder-nb: EagerFallbackWarning: m\n")
    assert warnings.formatwarning("m", UserWarning, "/lib/x.py", 3, "code()") == (
        "/lib/x.py:3: UserWarning: m\n  code()\n")


@pytest.mark.slow
def test_a_notebook_shows_thunder_nbs_warning_as_one_line(tmp_path, monkeypatch):
    """Outside the magic, in a kernel as a reader's notebook runs: the stream holds the one line, no library path."""
    _this_checkout(monkeypatch)
    cells = ["import torch, thunder_nb\n\ndef f(x):\n    return (x.sin() * 2).cos()",
             "thunder_nb.jit(f)(torch.randn(4)).shape"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    path = tmp_path / "warns.ipynb"
    nbformat.write(nb, path)
    ran = export.execute_notebook(path, timeout=300)
    assert not export.error_outputs(ran)
    stderr = "".join(o["text"] for o in ran.cells[1].outputs if o.get("name") == "stderr")
    assert _stderr_lines(stderr) == [EAGER], stderr
