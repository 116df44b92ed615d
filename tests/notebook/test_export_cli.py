"""``python -m thunder_nb export NOTEBOOK.ipynb``: one's own notebook as a standalone page, run as a user runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import nbcheck
from thunder_nb.notebook import export

REPO = Path(__file__).resolve().parents[2]
STATE, VIEW = export.WIDGET_STATE, export.WIDGET_VIEW
KERNELSPEC = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
CELLS = [
    "%load_ext thunder_nb",
    "import torch\nx = torch.randn(8)",
    "%%thunder_cudagraph --original legacy --repeats 2 f(x)\ndef f(x):\n    return x.sum().item()",
]


def write_notebook(path: Path, cells: list[str] = CELLS) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells], metadata=dict(KERNELSPEC))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def export_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "thunder_nb", "export", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def saved_state(html: str) -> str:
    m = re.search(rf'<script type="{re.escape(STATE)}">(.*?)</script>', html, re.S)
    return m.group(1) if m else ""


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """(notebook, page, the finished command): ``export mine.ipynb`` run from another folder."""
    root = tmp_path_factory.mktemp("export")
    notebook = write_notebook(root / "work" / "mine.ipynb")
    before = notebook.read_bytes()
    run = export_cli(str(notebook), cwd=root)
    assert notebook.read_bytes() == before  # the notebook itself is left alone
    return notebook, notebook.with_suffix(".html"), run


@pytest.mark.slow
def test_export_runs_the_notebook_and_writes_the_page_next_to_it(exported):
    notebook, page, run = exported
    assert run.returncode == 0, run.stderr
    assert f"HTML page: {page.resolve()}  " in run.stdout
    assert "thunder-nb: running mine.ipynb ..." in run.stderr and "mine.ipynb: ok" in run.stderr
    cells = sum(c.cell_type == "code" for c in nbformat.read(notebook, as_version=4).cells)
    # NOTE: each code cell as it ends
    assert re.search(rf"mine\.ipynb: code cell {cells} of {cells} done \(\d+\.\d s\)", run.stderr)
    assert "without encryption" not in run.stderr  # the kernel talks over a Unix socket, not TCP
    html = page.read_text(encoding="utf-8")
    assert "original (legacy): crashes (UnboundLocalError)" in html  # the magic's verdict, executed here
    assert "ToggleButtonsModel" in saved_state(html) and f'<script type="{VIEW}">' in html
    if export.widget_assets() is None:
        pytest.skip(f"widget JavaScript not in {export.default_assets_dir()}: run `bash dev.sh test` (npm)")
    assert 'data-thunder-nb="embed-amd.js"' in html and "unpkg.com/" not in html


@pytest.mark.slow
def test_no_execute_uses_the_saved_outputs_and_out_picks_the_folder(tmp_path, tmp_path_factory):
    # NOTE: a notebook run by a kernel with its widget state, as Jupyter saves it: the example's, run once for the session
    executed = nbcheck.executed_once(REPO / "notebooks" / export.EXAMPLE, tmp_path_factory)
    assert export.error_outputs(executed) == [] and STATE in executed.metadata["widgets"]
    widgets = len(nbcheck.widget_bundles(executed))
    assert widgets >= 1
    saved = tmp_path / "saved.ipynb"
    nbformat.write(executed, saved)
    run = export_cli("saved.ipynb", "--no-execute", "--out", "pages", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "running" not in run.stderr and "warning" not in run.stderr  # nothing ran; the state was there
    html = (tmp_path / "pages" / "saved.html").read_text(encoding="utf-8")
    assert "ToggleButtonsModel" in saved_state(html)

    del executed.metadata["widgets"]  # saved without widget state, as Jupyter does unless told otherwise
    nbformat.write(executed, tmp_path / "stateless.ipynb")
    run = export_cli("stateless.ipynb", "--no-execute", cwd=tmp_path)
    assert run.returncode == 0 and (tmp_path / "stateless.html").is_file()
    assert f"has {widgets} widget output(s) with no saved widget state" in run.stderr


@pytest.mark.slow
def test_mistakes_get_one_line_and_status_2(tmp_path):
    run = export_cli("nothing.ipynb", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.strip() == "thunder-nb: no such notebook: nothing.ipynb"
    (tmp_path / "notes.ipynb").write_text("not json")
    run = export_cli("notes.ipynb", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.startswith("thunder-nb: notes.ipynb is not a Jupyter notebook (")
    assert "Traceback" not in run.stderr


@pytest.mark.slow
def test_a_cell_that_raises_exits_1_with_the_page_written(tmp_path):
    write_notebook(tmp_path / "bad.ipynb", ["x = 1", "raise ValueError('boom')"])
    run = export_cli("bad.ipynb", cwd=tmp_path)
    assert run.returncode == 1
    assert "thunder-nb: bad.ipynb: cell 1: ValueError: boom" in run.stderr
    assert "ValueError" in (tmp_path / "bad.html").read_text(encoding="utf-8")


# --- in a real browser, offline ---------------------------------------------------------------------

try:  # NOTE: the browser helpers of test_browser.py, which skip with their reason when Chromium is missing
    from test_browser import _check_toggle, _missing, browser, open_offline, screenshots  # noqa: F401
except ImportError as e:  # pragma: no cover
    _WHY = f"test_browser.py helpers unavailable: {e}"

    def _missing() -> str:
        return _WHY


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_exported_page_switches_offline(exported, browser, screenshots):  # noqa: F811
    """The page of one's own notebook, from file:// with every other request refused: the toggle renders and switches."""
    _, page_path, run = exported
    assert run.returncode == 0, run.stderr
    if 'data-thunder-nb="embed-amd.js"' not in page_path.read_text(encoding="utf-8"):
        pytest.skip("the widget JavaScript is not inlined (.cache/widget-js/ missing: run `bash dev.sh test`, needs npm)")
    context, page, blocked, errors = open_offline(browser, page_path)
    try:
        _check_toggle(page, "export-offline", screenshots, whole_page=False)
        assert errors == [] and blocked == []
    finally:
        context.close()


@pytest.mark.slow
def test_a_kernel_that_dies_is_said_with_its_cell_and_the_notebook_is_not_run_again(tmp_path):
    """The kernel dies in the second cell: the command says so and where, in a line, and stops. Before, the failure
    (like an interrupted run's) was taken for a kernel that could not use Unix sockets, and the whole notebook ran
    again from its first cell over TCP: notebook 05 on a GPU machine ran twice in one device call (2026-12-06)."""
    ran = tmp_path / "ran.txt"
    notebook = write_notebook(tmp_path / "dies.ipynb", [
        f"open({str(ran)!r}, 'a').write('cell 1\\n')",
        "import os\nos._exit(1)",
        "print('never')",
    ])
    run = export_cli(str(notebook), cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "dies.ipynb: code cell 1 of 3 done" in run.stderr
    assert "dies.ipynb: the kernel died in code cell 2, after " in run.stderr, run.stderr[-3000:]
    assert ran.read_text() == "cell 1\n"  # NOTE: once: not run again over TCP
    assert "TCP" not in run.stderr and not notebook.with_suffix(".html").exists()


@pytest.mark.slow
def test_notebooks_runs_only_those_named_and_refuses_a_name_that_is_not_one(tmp_path):
    """``notebooks NAME ...``: the GPU machine lends a command ten minutes, so the notebooks run a few at a time."""

    def notebooks(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "thunder_nb", "notebooks", "--out", str(tmp_path), *args],
                              cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600)

    for name in ("0", "99"):  # NOTE: all of them, none of them
        run = notebooks(name)
        assert run.returncode == 2 and "01_del_bug.ipynb" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not list(tmp_path.iterdir())
    run = notebooks("notebooks/01_del_bug.ipynb", "01")  # NOTE: a path as tab completion gives it; the same one twice
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01_del_bug.html", "01_del_bug.ipynb"]


def test_the_stored_outputs_show_what_a_readers_kernel_shows(tmp_path, monkeypatch):
    """A batch run under ``PYTHONWARNINGS=ignore`` (the GPU machine's job) stored notebook 02 without the
    `RecaptureWarning` its text points at: the kernel starts without that variable, as a reader's does. A line the
    kernel sent in two pieces (a flush between them: under load, its timer's) is stored as one output, as Jupyter
    shows it: CI once read notebook 08's line as two and missed a cache update it printed."""
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    path = write_notebook(tmp_path / "warns.ipynb", ["import warnings\nwarnings.warn('shown to the reader')",
                                                      "print('a line', end=' ', flush=True)\nprint('in two pieces')"])
    nb = export.execute_notebook(path, timeout=120)
    streams = [o.get("text", "") for o in nb.cells[0].outputs if o.get("output_type") == "stream"]
    assert any("shown to the reader" in text for text in streams), nb.cells[0].outputs
    assert [(o.output_type, o.name, o.text) for o in nb.cells[1].outputs] == [
        ("stream", "stdout", "a line in two pieces\n")]


def test_the_help_of_every_command_ends_its_sentences():
    """``python -m thunder_nb --help`` once ended mid-sentence ("...standalone pages (the work is")."""
    from thunder_nb.__main__ import _parser

    parser = _parser()
    texts = [parser.description]
    texts += [p.description for p in parser._subparsers._group_actions[0].choices.values()]
    for text in texts:
        assert text and text.rstrip().endswith((".", ")")) and text.count("(") == text.count(")"), text
