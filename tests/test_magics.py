"""``%%thunder_cudagraph`` in a real IPython shell: published outputs, the namespace, and one clear message per mistake."""

from __future__ import annotations

import textwrap
import warnings

import ipywidgets
import pytest
import torch
from IPython.core.error import UsageError
from IPython.testing.globalipapp import get_ipython
from IPython.utils.capture import capture_output
from ipywidgets.widgets.widget_link import Link

from thunder_nb import render
from thunder_nb.compare import Comparison

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `pytest -m gpu` there)")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA GPU")

SEED = textwrap.dedent(
    """
    import torch
    x = torch.randn(8)
    def f(x):
        return x.sum().item()
    """
)
ISLAND = textwrap.dedent(
    """
    import torch
    x = torch.randn(8)
    def g(x):
        y = x.sin().cos()
        s = y.sum().item()
        return (y * s).exp()
    """
)
MLP = textwrap.dedent(
    """
    import torch
    x = torch.randn(4, 8)
    w1 = torch.randn(8, 16, requires_grad=True)
    w2 = torch.randn(16, 2, requires_grad=True)
    def step(x, w1, w2):
        h = torch.relu(x @ w1)
        return (h @ w2).pow(2).mean()
    """
)
VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def ip():
    shell = get_ipython()
    shell.run_line_magic("load_ext", "thunder_nb")
    return shell


def final_outputs(cap) -> list[dict]:
    """The outputs as a notebook keeps them: a display updated by id shows its last content, in place."""
    out: list[dict] = []
    where: dict[str, int] = {}
    for o in cap.outputs:
        display_id = (o.transient or {}).get("display_id")
        if display_id in where:
            out[where[display_id]] = o.data
            continue
        if display_id:
            where[display_id] = len(out)
        out.append(o.data)
    return out


def run_magic(ip, line: str, cell: str):
    with capture_output() as cap:
        result = ip.run_cell_magic("thunder_cudagraph", line, cell)
    assert result is None
    return final_outputs(cap), cap


def widget_of(output: dict) -> ipywidgets.Widget:
    return ipywidgets.widgets.widget._instances[output[VIEW]["model_id"]]


def links_of(box: ipywidgets.VBox) -> list[Link]:
    buttons, stack = box.children
    return [
        w
        for w in list(ipywidgets.widgets.widget._instances.values())
        if isinstance(w, Link) and w.source == (buttons, "index") and w.target == (stack, "selected_index")
    ]


# --- what the user sees ---------------------------------------------------------------------------


def test_seed_reproducer_outputs_in_order(ip):
    outs, _ = run_magic(ip, "-o cmp --repeats 2 f(x)", SEED)
    cmp = ip.user_ns["cmp"]
    assert isinstance(cmp, Comparison) and cmp.function == "f"
    assert ip.user_ns["f"](ip.user_ns["x"]) == ip.user_ns["x"].sum().item()  # the cell ran in the namespace
    verdict, view, run = outs
    assert verdict["text/plain"] == cmp.verdict()
    assert verdict["text/plain"].startswith("original (stock): item inside CUDAGraph1")
    assert "fixed: 0 regions, 2 islands, matches eager" in verdict["text/plain"]
    assert VIEW in view
    run_text = run["text/plain"]
    for key in ("device", "value", "check fixed", "check original (stock)", "timings", "graphs captured"):
        assert key in run_text
    assert run_text.index("value") < run_text.index("check fixed") < run_text.index("timings") < run_text.index("graphs captured")
    assert "<table" in run["text/html"]


def test_toggle_widget_is_linked_in_the_browser(ip):
    outs, _ = run_magic(ip, "--repeats 2 f(x)", SEED)
    box = widget_of(outs[1])
    buttons, stack = box.children
    assert isinstance(buttons, ipywidgets.ToggleButtons) and buttons.options == ("original (stock)", "fixed")
    assert isinstance(stack, ipywidgets.Stack) and stack.selected_index == 1 and buttons.index == 1  # the fixed side
    assert [type(c) for c in stack.children] == [ipywidgets.HTML, ipywidgets.HTML]
    assert len(links_of(box)) == 1  # jslink: switching needs no kernel
    # no kernel-side callback beyond what a fresh widget carries itself
    fresh = ipywidgets.ToggleButtons(options=["a", "b"])
    assert len(buttons._trait_notifiers["index"]["change"]) == len(fresh._trait_notifiers["index"]["change"])
    fresh.close()


@pytest.mark.dot
def test_panes_have_diagram_lifetimes_and_highlighted_source(ip):
    outs, _ = run_magic(ip, "--repeats 2 f(x)", SEED)
    original, fixed = (pane.value for pane in widget_of(outs[1]).children[1].children)
    for pane in (original, fixed):
        assert pane.count("<svg") >= 2  # region diagram and lifetime view
        assert pane.index("tnb-diagram") < pane.index("lifetimes") < pane.index("generated code")
    assert 'class="tnb-defect-line"' in original and "host-sync-in-region" in original
    assert 'class="tnb-defect-line"' not in fixed


def test_island_against_legacy_reports_the_crash(ip):
    outs, _ = run_magic(ip, "--original legacy --repeats 2 g(x)", ISLAND)
    verdict = outs[0]["text/plain"]
    assert verdict.startswith("original (legacy): crashes (UnboundLocalError), t19 used after del in CUDAGraph1")
    assert "fixed: 1 region, 0 islands, matches eager" in verdict
    assert "fails at run: UnboundLocalError" in outs[2]["text/plain"]


def test_mlp_training_step(ip):
    outs, _ = run_magic(ip, "--train --repeats 2 -o trained step(x, w1, w2)", MLP)
    assert "fixed: 2 regions, 0 islands, matches eager, grads match" in outs[0]["text/plain"]
    assert ip.user_ns["trained"].training
    assert ip.user_ns["w1"].grad is None  # the user's tensors are never touched


def test_no_run_traces_only(ip):
    outs, _ = run_magic(ip, "--no-run -o traced g(x)", ISLAND)
    assert outs[0]["text/plain"].endswith("fixed: 1 region, 0 islands, not run")
    assert "not run (--no-run)" in outs[2]["text/plain"]
    assert ip.user_ns["traced"].timings == {}


@pytest.mark.parametrize(
    "views, kinds",
    [("diagram", ["verdict", "widget"]), ("run", ["verdict", "run"]), ("source,lifetimes", ["verdict", "widget"])],
)
def test_views_select_outputs(ip, views, kinds):
    outs, _ = run_magic(ip, f"--views {views} --repeats 2 f(x)", SEED)
    seen = ["widget" if VIEW in o else ("run" if "tnb-run" in o.get("text/html", "") else "verdict") for o in outs]
    assert seen == kinds


def test_function_named_with_f_and_call_with_strings(ip):
    cell = textwrap.dedent(
        """
        import torch
        def scale(x, how):
            return x * 2 if how == "a  b" else x
        """
    )
    outs, _ = run_magic(ip, '-f scale --repeats 2 -o named scale(torch.ones(3), how="a  b")', cell)
    assert ip.user_ns["named"].function == "scale"
    assert "tensor float32[3] on cpu [2, 2, 2]" in outs[2]["text/plain"]


def test_help_lists_the_arguments(ip):
    doc = ip.find_cell_magic("thunder_cudagraph").__doc__
    for option in ("-f NAME, --function NAME", "--original {stock,legacy}", "--train", "-o NAME, --output NAME",
                   "--views LIST", "--no-run", "--repeats N", "--capture {auto,on,off}"):
        assert option in doc
    with capture_output() as cap:
        ip.run_cell("%%thunder_cudagraph?\n")
    assert "--capture {auto,on,off}" in cap.stdout + "".join(str(o.data) for o in cap.outputs)


# --- mistakes: one clear message each -------------------------------------------------------------


@pytest.mark.parametrize(
    "line, cell, message",
    [
        ("--bogus f(x)", SEED, "unrecognized arguments: --bogus"),
        ("--views diagram,x f(x)", SEED, "unknown view: 'x' (must be one of ['diagram', 'lifetimes', 'source', 'run'])"),
        ("--original nightly f(x)", SEED, "argument --original: invalid choice: 'nightly'"),
        ("--repeats 0 f(x)", SEED, "--repeats must be at least 1, not 0"),
        ("", SEED, "missing call: write the call to compile on the magic line, e.g. %%thunder_cudagraph f(x)"),
        ("--train", SEED, "missing call"),
        ("f(x) --train", SEED, "options go before the call"),
        ("f(nope)", SEED, "the call f(nope) failed: NameError: name 'nope' is not defined"),
        ("f(1 / 0)", SEED, "the call f(1 / 0) failed: ZeroDivisionError: division by zero"),
        ("f(x)", "def f(:\n    pass\n", "syntax error in the cell, line 1"),
        ("h(x)", "x = 1\n", "no function defined: the cell defines no function and 'h' is not defined"),
        ("-f nothing f(x)", SEED, "no function 'nothing' in the namespace (the cell defines: f)"),
        ("--train f(x)", SEED, "training needs an input of f that requires grad"),
        ("bad(x)", "import torch\nx = torch.randn(3)\ndef bad(x):\n    return float(x.sum())\n",
         "thunder cannot trace bad: NotImplementedError: casting a TensorProxy to a Python float"),
    ],
)
def test_mistakes_raise_one_usage_error(ip, line, cell, message):
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_cell_magic("thunder_cudagraph", line, cell)
    assert message in str(info.value)
    assert all(not o.get("text/plain") for o in final_outputs(cap))  # no half report left behind


def test_without_a_named_function_the_last_one_the_cell_defines_is_compiled(ip):
    """The call's callee names no function: the last function of the cell runs with the call's arguments."""
    with capture_output():
        ip.run_cell_magic("thunder_cudagraph", "-o cmp run(x)", "import torch\nx = torch.randn(4)\ndef helper(x):\n    return x\ndef k(x):\n    return x.sin().cos().sum().item()\n")
    assert ip.user_ns["cmp"].fixed.function == "k"


def test_cell_error_keeps_what_ran_before(ip):
    ip.user_ns.pop("before", None)
    with pytest.raises(UsageError, match=r"the cell raised ZeroDivisionError: division by zero on line 3"):
        ip.run_cell_magic("thunder_cudagraph", "f(x)", "before = 41\nbefore += 1\n1 / 0\nafter = 1\n")
    assert ip.user_ns["before"] == 42 and "after" not in ip.user_ns


def test_usage_error_prints_one_line_without_traceback(ip):
    with capture_output() as cap:
        ip.run_cell("%%thunder_cudagraph --views x f(x)\npass\n")
    shown = cap.stdout + cap.stderr
    assert "UsageError: unknown view: 'x'" in shown and "Traceback" not in shown


@no_gpu
def test_capture_on_without_gpu(ip):
    with pytest.raises(UsageError, match=r"capturing CUDA graphs \(capture on\) needs a CUDA GPU, and torch sees none"):
        ip.run_cell_magic("thunder_cudagraph", "--capture on f(x)", SEED)


def test_without_dot_shows_dot_source_and_text_with_one_warning(ip, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` anywhere
    monkeypatch.setattr(render.backend, "_dot_missing_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs, _ = run_magic(ip, "--repeats 2 g(x)", ISLAND)
    diagram_warnings = [w for w in caught if issubclass(w.category, render.DiagramWarning)]
    assert len(diagram_warnings) == 1 and "apt-get install graphviz" in str(diagram_warnings[0].message)
    original, fixed = (pane.value for pane in widget_of(outs[1]).children[1].children)
    for pane in (original, fixed):
        assert "digraph" in pane and "tnb-text" in pane and "thunder-nb report: g" in pane
        assert "<svg" in pane  # the lifetime view needs no Graphviz


# --- GPU: real capture ----------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_gpu_magic_captures(ip):
    seed = SEED.replace("torch.randn(8)", 'torch.randn(8, device="cuda")')
    island = ISLAND.replace("torch.randn(8)", 'torch.randn(8, device="cuda")')
    outs, _ = run_magic(ip, "--capture on --repeats 5 -o gpu_seed f(x)", seed)
    print("GPU magic seed:", outs[0]["text/plain"])
    print(outs[2]["text/plain"])
    assert outs[0]["text/plain"].startswith("original (stock): capture fails, item inside CUDAGraph1")
    outs, _ = run_magic(ip, "--capture on --repeats 20 -o gpu_island g(x)", island)
    print("GPU magic island:", outs[0]["text/plain"])
    print(outs[2]["text/plain"])
    c = ip.user_ns["gpu_island"]
    assert c.results["fixed"].ok and c.graphs["fixed"] >= 1 and c.on_cuda
    assert "eager mode" not in outs[0]["text/plain"]
