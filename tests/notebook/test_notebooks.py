"""Every teaching notebook runs clean in a real kernel (eager mode without a GPU); `python -m thunder_nb example` end to end.

The text-against-output checks of `test_notebook_text.py` (on the committed outputs) run here on the
fresh execution too, so that a notebook's text holds on CPU as well as for the stored GPU run.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import nbformat
import pytest

import nbcheck
from thunder_nb.notebook import export

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
#: the notebooks with a %%thunder_cudagraph toggle
WITH_TOGGLE = {"01_del_bug.ipynb", "04_training_step.ipynb", "05_nanogpt_training.ipynb", "06_real_model.ipynb"}

VIEW = export.WIDGET_VIEW
STATE = export.WIDGET_STATE


def test_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS][:1] == [export.EXAMPLE] and len(NOTEBOOKS) >= 6
    assert export.find_notebooks() == (REPO / "notebooks").resolve()
    with pytest.raises(FileNotFoundError, match=r"no notebooks found \(looked in .*/nowhere\).*checkout of thunder-nb"):
        export.find_notebooks(REPO / "nowhere")


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=lambda p: p.stem)
def executed(request, tmp_path_factory):
    """(file name, the notebook run top to bottom by a fresh kernel with its widget state stored)."""
    nb = nbcheck.executed_once(request.param, tmp_path_factory)
    nbformat.validate(nb)
    return request.param.name, nb


def _widget_state(nb) -> dict:
    return nb.metadata.get("widgets", {}).get(STATE, {}).get("state", {})


@pytest.mark.slow
def test_runs_without_errors(executed):
    name, nb = executed
    errors = export.error_outputs(nb)
    assert not errors, f"{name}: " + "\n".join(f"{e}\n" + "\n".join(e.traceback) for e in errors)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), f"{name}: a cell did not run"
    stderr = "".join(o.get("text", "") for o in nbcheck.outputs(nb) if o.get("name") == "stderr")
    assert "Traceback" not in stderr, f"{name}: {stderr}"


@pytest.mark.slow
def test_draws_svg(executed):
    """A diagram or a lifetime view is drawn: an SVG (or an <img> of one) in an HTML output or a widget pane, and never
    a bare image/svg+xml output, which JupyterLab leaves blank in an untrusted notebook."""
    name, nb = executed
    raw = [o for o in nbcheck.outputs(nb) if "image/svg+xml" in o.get("data", {})]
    assert raw == [], f"{name}: {len(raw)} image/svg+xml output(s): show a picture as HTML (svg_img)"
    texts = [str(o.get("data", {}).get("text/html", "")) for o in nbcheck.outputs(nb)]
    texts += [str(m["state"].get("value", "")) for m in _widget_state(nb).values()]
    assert any("<svg" in t or 'src="data:image/svg+xml;base64,' in t for t in texts), f"{name}: no SVG in its outputs"


@pytest.mark.slow
def test_toggle_view_and_state(executed):
    """01, 04, 05 and 06 show the toggle: per magic cell a widget view whose saved state has the buttons jslinked to the panes."""
    name, nb = executed
    views = [o["data"][VIEW]["model_id"] for o in nbcheck.outputs(nb) if VIEW in o.get("data", {})]
    if name not in WITH_TOGGLE:
        assert views == []
        return
    state = _widget_state(nb)
    magic_cells = [c for c in nb.cells if nbcheck.is_toggle_cell(c)]
    assert len(views) == len(magic_cells) and all(v in state for v in views), f"{name}: a widget view without saved state"
    links = [[m["state"]["source"], m["state"]["target"]] for m in state.values() if m["model_name"] == "LinkModel"]
    for view in views:
        box = state[view]
        assert box["model_name"] == "VBoxModel"
        buttons_id, stack_id = (c.removeprefix("IPY_MODEL_") for c in box["state"]["children"])
        assert state[buttons_id]["model_name"] == "ToggleButtonsModel"
        assert state[buttons_id]["state"]["_options_labels"][1] == "fixed"
        assert state[stack_id]["model_name"] == "StackModel" and len(state[stack_id]["state"]["children"]) == 2
        assert [[f"IPY_MODEL_{buttons_id}", "index"], [f"IPY_MODEL_{stack_id}", "selected_index"]] in links


@pytest.mark.slow
def test_text_names_appear_in_fresh_outputs(executed):
    """The trace names and checker rules the text mentions show up on CPU too (thunder's numbering is not the H200's)."""
    name, nb = executed
    missing = nbcheck.names_missing_from_outputs(nb, cpu_run=True)
    assert not missing, f"{name}: the text names {missing}, which no output of a CPU run shows"


@pytest.mark.slow
def test_cpu_run_says_what_it_does(executed):
    """Without a GPU the outputs say so: the device line, and every failing stock capture is explained."""
    name, nb = executed
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine: the CPU wording is not used")
    assert nbcheck.device_lines(nb) == ["CPU only: regions run eagerly, no graph is captured"]
    text = nbcheck.output_text(nb)
    no_driver = text.count("Found no NVIDIA driver")
    explained = text.count("no GPU here: thunder's transform needs one to capture")
    assert no_driver <= explained, f"{name}: {no_driver} 'no NVIDIA driver' errors, {explained} explained"


@pytest.mark.slow
def test_static_fallback(executed):
    """After each magic's widget comes a static HTML copy of both sides, an output of its own that the widget hides."""
    name, nb = executed
    for i, outputs, at in nbcheck.toggle_outputs(nb):
        problems = nbcheck.fallback_problems(outputs, at, nbcheck.toggle_labels(nb, outputs[at]["data"]))
        assert not problems, f"{name}, cell {i}: " + "; ".join(problems)


@pytest.mark.slow
def test_nanogpt_step_equals_eager(executed):
    """05's claim: the fixed transform's training step gives eager PyTorch's logged loss and gradients, capture and replay."""
    name, nb = executed
    if name != "05_nanogpt_training.ipynb":
        pytest.skip("the nanoGPT notebook only")
    text = nbcheck.output_text(nb)
    assert text.count(": equal to eager") == 2 and "DIFFERS" not in text
    assert "FixedCUDAGraphTransform against eager PyTorch" in text
    assert not nbcheck.op_counts_unmatched(nb), nbcheck.op_counts_unmatched(nb)


@pytest.mark.slow
def test_replay_section_shows_each_hand_out(executed):
    """03's claims: thunder's transform loses kept results and gradients of two forwards; the fixed one keeps all."""
    name, nb = executed
    if name != "03_lifetimes_and_memory.ipynb":
        pytest.skip("the lifetimes notebook only")
    text = nbcheck.output_text(nb)
    assert re.search(r"thunder CUDAGraphTransform +kept results, call by call: .*WRONG", text)
    assert re.search(r"FixedCUDAGraphTransform +kept results, call by call: equal, equal, equal\n", text)
    assert re.search(r"thunder CUDAGraphTransform +gradients, step by step: .*WRONG", text)
    assert re.search(r"FixedCUDAGraphTransform +gradients, step by step: equal, equal, equal\n", text)
    assert "still held for a backward" in text and re.search(r"lent [1-9]", text)


@pytest.mark.slow
def test_real_model_loop(executed):
    """06's claims: on litgpt's GPT the stock transform's kept losses are wrong, thunder_nb.jit's loop equals eager."""
    name, nb = executed
    if name != "06_real_model.ipynb":
        pytest.skip("the real-model notebook only")
    text = nbcheck.output_text(nb)
    assert "thunder_nb.jit(loss_fn)                  logged equal, kept equal, weights equal" in text
    assert re.search(r"thunder CUDAGraphTransform +logged equal, kept WRONG, weights equal", text)
    assert "fixed: 0 findings" in text and "wrong result returned-graph-memory" in text


def test_error_outputs_stop_at_the_failing_cell(tmp_path):
    src = tmp_path / "bad.ipynb"
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in ["x = 1", "raise ValueError('boom')", "y = 2"]],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, src)
    out = export.execute_notebook(src, timeout=60)
    (err,) = export.error_outputs(out)
    assert (err.cell, err.ename, err.evalue) == (1, "ValueError", "boom")
    assert str(err) == "cell 1: ValueError: boom"
    assert out.cells[2].execution_count is None  # like nbconvert --execute: nothing runs after the error
    assert nbformat.read(src, as_version=4).cells[0].outputs == []  # the file is left alone


def test_export_without_assets_warns_and_uses_cdns(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("hi")])
    nb.metadata["widgets"] = {STATE: {"state": {}, "version_major": 2, "version_minor": 0}}
    with pytest.warns(export.OfflineWidgetWarning, match="need network"):
        page = export.export_html(nb, tmp_path / "p.html", assets_dir=tmp_path / "nothing-here")
    html = page.read_text()
    assert 'src="https://cdnjs.cloudflare.com/ajax/libs/require.js' in html and "unpkg.com/" in html


def test_export_inlines_assets(tmp_path):
    assets = tmp_path / "js"
    assets.mkdir()
    (assets / "require.js").write_text("var requirejs_stub = '</script><!-- x';")
    (assets / "embed-amd.js").write_text("var embed_stub = 1;")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("hi")])
    nb.metadata["widgets"] = {STATE: {"state": {}, "version_major": 2, "version_minor": 0}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", export.OfflineWidgetWarning)
        html = export.export_html(nb, tmp_path / "sub" / "p.html", assets_dir=assets).read_text()
    assert r"var requirejs_stub = '<\/script><\!-- x';" in html  # still the same JS, no longer ends the element
    head, body = html.split("<body", 1)
    assert "requirejs_stub" in head and "embed_stub" in body
    assert "unpkg.com" not in html and "require.min.js" not in html
    assert "libs/mathjax" not in html  # no LaTeX, no MathJax: the page asks the network for nothing
    nb.cells.append(nbformat.v4.new_markdown_cell("the area is $\\pi r^2$"))
    assert "libs/mathjax" in export.export_html(nb, tmp_path / "math.html", assets_dir=assets).read_text()


@pytest.mark.slow
def test_example_command(tmp_path_factory):
    """``python -m thunder_nb example --out DIR``: the executed notebook and a page that needs no network for its widget."""
    run, out = nbcheck.example_once(tmp_path_factory)
    assert run.returncode == 0, run.stderr
    notebook, page = out / export.EXAMPLE, out / export.EXAMPLE.replace(".ipynb", ".html")
    assert f"executed notebook: {notebook.resolve()}\n" in run.stdout
    assert f"HTML page:         {page.resolve()}  " in run.stdout
    nb = nbformat.read(notebook, as_version=4)
    assert export.error_outputs(nb) == [] and STATE in nb.metadata["widgets"]
    html = page.read_text(encoding="utf-8")
    state = re.search(rf'<script type="{re.escape(STATE)}">(.*?)</script>', html, re.S)
    assert state and "ToggleButtonsModel" in state.group(1) and "LinkModel" in state.group(1)
    assert f'<script type="{VIEW}">' in html

    assets = export.widget_assets()
    if assets is None:
        assert "need network" in run.stderr
        pytest.skip(
            f"widget JavaScript not in {export.default_assets_dir()}: run `bash dev.sh test` (fetches it with npm); "
            "the page was written with CDN links and the warning was shown"
        )
    for name, js in assets.items():
        assert js[:500] in html and js[-500:] in html, f"{name} is not inlined"
    assert "need network" not in run.stderr
    for cdn in ("cdnjs.cloudflare.com/ajax/libs/require.js", "unpkg.com/", "html-manager@*/dist/embed-amd.js"):
        assert cdn not in html
    assert not re.search(r"<script[^>]*\bsrc=\"https?:[^\"]*(require|embed-amd)", html)
