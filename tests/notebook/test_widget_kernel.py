"""The toggle widget in a real kernel (nbclient): outputs, the widget state a static export is built from, and
the static HTML fallback, an output of its own after the widget's, that frontends without the widget's JavaScript show
and the widget's panes hide."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest
from nbclient import NotebookClient

import nbcheck
from thunder_nb.notebook.widget import toggle

pytestmark = pytest.mark.slow  # NOTE: a real kernel, started once for the module (about 16 s)

VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"

CELLS = [
    "%load_ext thunder_nb",
    textwrap.dedent(
        """\
        %%thunder_cudagraph --repeats 2 -o cmp g(x)
        import torch
        x = torch.randn(8)
        def g(x):
            y = x.sin().cos()
            s = y.sum().item()
            return (y * s).exp()
        """
    ),
    "print(cmp.verdict())",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook after a kernel ran it with widget state stored, as nbconvert --execute saves it."""
    folder = tmp_path_factory.mktemp("nb")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}, store_widget_state=True
    )
    client.execute()
    nbformat.validate(nb)
    return nb


def test_no_errors(executed):
    errors = [o for o in nbcheck.outputs(executed) if o["output_type"] == "error"]
    assert errors == []
    verdict = "".join(o.get("text", "") for o in executed.cells[2].outputs)
    assert verdict.startswith("original (stock): item inside CUDAGraph1")


def test_outputs_in_order(executed):
    magic = [o for o in executed.cells[1].outputs if o["output_type"] == "display_data"]
    assert len(magic) == 5
    verdict, following, view, fallback, run = magic
    assert following["data"]["text/plain"].startswith("next: ")  # what to do next, under the verdict
    assert "fixed: 1 region, 0 islands, matches eager" in verdict["data"]["text/plain"]  # progress became the verdict
    assert VIEW in view["data"]
    assert set(fallback["data"]) == {"text/html"} and "tnb-static" in fallback["data"]["text/html"]
    assert "timings" in run["data"]["text/plain"] and "<table" in run["data"]["text/html"]


def test_saved_widget_state_switches_without_a_kernel(executed):
    state = executed.metadata["widgets"][STATE]["state"]
    by_name: dict[str, list[str]] = {}
    for model_id, model in state.items():
        by_name.setdefault(model["model_name"], []).append(model_id)
    (buttons_id,) = by_name["ToggleButtonsModel"]
    (stack_id,) = by_name["StackModel"]
    buttons, stack = state[buttons_id]["state"], state[stack_id]["state"]
    # NOTE: the stored state opens on the fixed side
    assert buttons["_options_labels"] == ["original (stock)", "fixed"] and buttons["index"] == 1
    assert stack["selected_index"] == 1 and len(stack["children"]) == 2
    links = [state[i]["state"] for i in by_name["LinkModel"]]
    assert {"source": [f"IPY_MODEL_{buttons_id}", "index"], "target": [f"IPY_MODEL_{stack_id}", "selected_index"]} in [
        {"source": link["source"], "target": link["target"]} for link in links
    ]
    panes = [state[c.removeprefix("IPY_MODEL_")]["state"]["value"] for c in stack["children"]]
    for pane in panes:
        assert "lifetimes" in pane and "generated code" in pane
        if shutil.which("dot"):
            assert pane.count("<svg") >= 2
    assert "g: original (stock)" in panes[0] and "g: fixed" in panes[1]
    view = next(o for o in executed.cells[1].outputs if VIEW in o.get("data", {}))
    box = state[view["data"][VIEW]["model_id"]]["state"]
    assert box["children"] == [f"IPY_MODEL_{buttons_id}", f"IPY_MODEL_{stack_id}"]


def test_toggle_needs_two_labels():
    with pytest.raises(ValueError, match="two labels"):
        toggle("<b>a</b>", "<b>b</b>", labels=("one",))


def test_the_static_fallback_is_an_output_of_its_own_that_the_widget_hides(executed):
    """The widget's output is its view and a text line, no text/html (nbconvert would write only the view, untrusted
    JupyterLab both); the next output is static HTML of both sides (fixed open, original in <details>), named after
    the widget's model, and each pane of the widget carries the style that hides it where the widget is drawn."""
    outs = executed.cells[1].outputs
    (at,) = [i for i, o in enumerate(outs) if VIEW in o.get("data", {})]
    data, fallback = outs[at]["data"], outs[at + 1]["data"]
    assert set(data) == {VIEW, "text/plain"}
    assert data["text/plain"] == "toggle: original (stock) | fixed"
    model_id = data[VIEW]["model_id"]
    static = fallback["text/html"]
    assert f'<div class="thunder-nb tnb-static tnb-fallback-{model_id}">' in static
    fixed_at, original_at = static.index("g: fixed"), static.index("<details><summary>original (stock)</summary>")
    assert fixed_at < original_at < static.index("g: original (stock)")
    if shutil.which("dot"):
        # NOTE: as <img> with a data: URI, which JupyterLab shows in a notebook that is not trusted (inline SVG it removes)
        assert "<svg" not in static
        assert static[:original_at].count('<img class="tnb-img tnb-diagram-img"') >= 1  # the fixed side's diagram
        assert static[original_at:].count('<img class="tnb-img tnb-diagram-img"') >= 1  # the original's, in <details>
    assert "<script" not in static
    state = executed.metadata["widgets"][STATE]["state"]
    stack = next(m for m in state.values() if m["model_name"] == "StackModel")
    for child in stack["state"]["children"]:
        pane = state[child.removeprefix("IPY_MODEL_")]["state"]["value"]
        assert pane.startswith(f"<style>.tnb-fallback-{model_id},.jp-OutputArea-child:has(.tnb-fallback-{model_id})")


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot on PATH (apt-get install graphviz)")
def test_nbconvert_to_markdown_shows_the_diagrams(executed, tmp_path):
    """``jupyter nbconvert --to markdown`` (and so any renderer that ignores widgets) shows both sides' diagrams."""
    src = tmp_path / "toggle.ipynb"
    nbformat.write(executed, src)
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "markdown", str(src)], check=True,
                   capture_output=True, timeout=120)
    md = (tmp_path / "toggle.md").read_text(encoding="utf-8")
    assert md.count('<img class="tnb-img tnb-diagram-img"') >= 2
    assert md.index("g: fixed") < md.index("<summary>original (stock)</summary>")
    assert "widget-view+json" not in md
