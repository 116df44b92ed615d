"""``%%thunder_cudagraph`` in a real IPython shell: published outputs, the namespace, and one clear message per mistake."""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import ipywidgets
import pytest
import torch
from IPython.core.error import UsageError
from IPython.testing import globalipapp
from IPython.utils.capture import capture_output
from ipywidgets.widgets.widget_link import Link

from thunder_nb import render
from thunder_nb.notebook.comparison import Comparison

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
    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # NOTE: IPython starts it once
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
    """Run the magic; its outputs as a notebook keeps them, the "next" line under the verdict taken out (checked to be
    there, right under it: `next_of` gives it), and the toggle's static fallback (checked to follow the widget's
    output, named after its model: `tests/notebook/test_widget_kernel.py` checks its content)."""
    with capture_output() as cap:
        result = ip.run_cell_magic("thunder_cudagraph", line, cell)
    assert result is None
    outs = final_outputs(cap)
    nexts = [i for i, o in enumerate(outs) if o.get("text/plain", "").startswith("next: ")]
    assert nexts == [1], [o.get("text/plain", "")[:60] for o in outs]
    fallbacks = [i for i, o in enumerate(outs) if "tnb-static" in o.get("text/html", "")]
    views = [i for i, o in enumerate(outs) if VIEW in o]
    assert fallbacks == [i + 1 for i in views], (fallbacks, views)
    for i in views:
        assert f'tnb-static tnb-fallback-{outs[i][VIEW]["model_id"]}"' in outs[i + 1]["text/html"]
    return [o for i, o in enumerate(outs) if i != 1 and i not in fallbacks], cap


def next_of(cap) -> str:
    """The "next" line the magic showed under its verdict."""
    return next(o["text/plain"] for o in final_outputs(cap) if o.get("text/plain", "").startswith("next: "))


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
    assert "fixed: 0 regions, 1 island, nothing captured: 1 op alone" in verdict["text/plain"]  # NOTE: the sum
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
    for option in ("-f NAME, --function NAME", "--original {stock,legacy}", "--train", "--lr LR", "-o NAME, --output NAME",
                   "--views LIST", "--no-run", "--repeats N", "--capture {auto,on,off}"):
        assert option in doc
    with capture_output() as cap:
        ip.run_cell("%%thunder_cudagraph?\n")
    assert "--capture {auto,on,off}" in cap.stdout + "".join(str(o.data) for o in cap.outputs)


# --- training a module, as it is usually written ---------------------------------------------------

MODULE = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    xb = torch.randn(4, 8)
    """
)
PARAMS = "model.0.weight, model.0.bias, model.2.weight, model.2.bias (4 tensors)"


def snapshot(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def test_train_a_module_that_an_earlier_cell_defined(ip):
    """``step`` reaches ``model`` as a global: every parameter's gradient is compared; the user's model is untouched."""
    ip.run_cell(MODULE)
    before = snapshot(ip.user_ns["model"])
    outs, _ = run_magic(ip, "--train --repeats 2 -o trained step(xb)", "def step(x):\n    return model(x).pow(2).mean()\n")
    verdict, run = outs[0]["text/plain"], outs[-1]["text/plain"]
    assert "fixed: 2 regions, 0 islands, matches eager, grads match" in verdict
    assert verdict.startswith("original (stock): ") and "grads match" in verdict.split("; ")[0]
    assert re.search(r"^gradients of +" + re.escape(PARAMS) + "$", run, re.M), run
    assert ip.user_ns["trained"].trainable == ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias")
    model = ip.user_ns["model"]
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_train_through_a_closure_and_a_helper_with_sgd_steps(ip):
    """A closure over the module and a helper that uses a global weight; ``--lr`` steps each run's own copy."""
    ip.run_cell(MODULE + "scale = torch.ones(1, requires_grad=True)\n")
    before = snapshot(ip.user_ns["model"])
    cell = textwrap.dedent(
        """
        def loss_of(out):
            return (out * scale).pow(2).mean()

        def make_step(net):
            def step(x):
                return loss_of(net(x))
            return step

        step = make_step(model)
        """
    )
    outs, _ = run_magic(ip, "--train --lr 0.05 --repeats 3 -o stepped step(xb)", cell)
    c = ip.user_ns["stepped"]
    assert c.trainable == ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "scale")
    assert c.steps == 1 + 2 + 3 and c.lr == 0.05
    for key in ("fixed", "original"):
        out = c.results[key]
        assert out.ok and out.grads_match and out.params_match, (key, out)
    assert "grads match, params match after 6 SGD steps" in outs[0]["text/plain"]
    assert "an SGD step (lr 0.05) after each of 6 calls" in outs[-1]["text/plain"]
    assert all(torch.equal(a, b) for a, b in zip(before, ip.user_ns["model"].parameters()))
    assert ip.user_ns["scale"].grad is None


# --- the cell runs as any cell does -----------------------------------------------------------------


def test_the_shell_runs_the_cell(ip):
    """Run events fire for the cell, its last expression is displayed, and the namespace keeps its names."""
    seen = []
    ip.events.register("post_run_cell", seen.append)
    try:
        outs, cap = run_magic(ip, "--views run --repeats 2 f(x)", SEED + "shown = 6 * 7\nshown\n")
    finally:
        ip.events.unregister("post_run_cell", seen.append)
    assert [r.info.raw_cell for r in seen] == [SEED + "shown = 6 * 7\nshown\n"] and seen[0].success
    assert "42" in cap.stdout  # the displayhook showed the last expression, as in any cell
    assert ip.user_ns["shown"] == 42


@pytest.mark.parametrize(
    "cell, message",
    [
        (
            "import torch\nx = torch.randn(8)\ndef f(x):\n    y = x + 1\n    raise ValueError('boom')\n",
            "f raised ValueError: boom (line 6 of the cell: `raise ValueError('boom')`): the function's own code fails",
        ),
        (
            "import torch\nx = torch.randn(8)\ndef f(x):\n    y = x.sin()\n    return torch.nonzero(y)\n",
            "thunder cannot trace nonzero in f (line 6 of the cell: `return torch.nonzero(y)`): its result's shape "
            "depends on the values in the tensor, and thunder 0.2.6 has no support for data-dependent shapes. "
            "Keep it outside the function you compile",
        ),
        (
            "import torch\nx = torch.randn(8)\ndef f(x):\n    return x[x > 0].sum()\n",
            "thunder cannot trace indexing with a boolean mask (x[mask]) in f (line 5 of the cell: `return x[x > 0].sum()`)",
        ),
        (
            "import torch\nx = torch.randn(8)\ndef f(x):\n    return x.tolist()\n",
            "thunder cannot trace .tolist() in f (line 5 of the cell: `return x.tolist()`): it turns a tensor into Python data",
        ),
        (
            "import torch\nx = torch.randn(8)\ndef f(x):\n    return x.numpy()\n",
            "thunder cannot trace .numpy() in f (line 5 of the cell: `return x.numpy()`)",
        ),
    ],
    ids=["user-error", "nonzero", "mask", "tolist", "numpy"],
)
def test_failures_name_the_line_and_say_what_to_do(ip, cell, message):
    with capture_output(), pytest.raises(UsageError) as info:
        ip.run_cell_magic("thunder_cudagraph", "f(x)", cell)
    text = str(info.value)
    assert message in text
    assert "Exception" not in text and "registration" not in text and "FakeTensor" not in text  # no thunder internals


def test_an_error_in_a_function_of_an_earlier_cell_names_that_cell(ip):
    ip.run_cell("import torch\ndef helper(x):\n    raise KeyError('w')\n")
    with capture_output(), pytest.raises(UsageError) as info:
        ip.run_cell_magic("thunder_cudagraph", "f(torch.ones(2))", "def f(x):\n    return helper(x)\n")
    assert "f raised KeyError: 'w' (cell In[" in str(info.value) and "line 3: `raise KeyError('w')`)" in str(info.value)


@pytest.mark.slow
def test_thunders_first_import_is_a_progress_line(tmp_path):
    """In a fresh process the first magic says it is importing thunder before the silent seconds that takes."""
    code = textwrap.dedent(
        """
        import sys
        from IPython.testing import globalipapp
        from IPython.utils.capture import capture_output
        ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # NOTE: IPython starts it once
        ip.run_line_magic("load_ext", "thunder_nb")
        assert "thunder" not in sys.modules
        with capture_output() as cap:
            ip.run_cell_magic("thunder_cudagraph", "--no-run f(torch.ones(3))", "import torch\\ndef f(x):\\n    return x.sin()\\n")
        for o in cap.outputs:
            print(repr(o.data.get("text/plain", "")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    shown = out.stdout.splitlines()
    assert shown[0] == repr("thunder-nb: importing torch and thunder (the first time takes a few seconds)…")
    assert "tracing f with the fixed transform" in shown[1]


# --- mistakes: one clear message each -------------------------------------------------------------


@pytest.mark.parametrize(
    "line, cell, message",
    [
        ("--bogus f(x)", SEED, "unrecognized arguments: --bogus"),
        ("--views diagram,x f(x)", SEED, "unknown view: 'x' (must be one of ['diagram', 'lifetimes', 'source', 'run'])"),
        ("--original nightly f(x)", SEED, "argument --original: invalid choice: 'nightly'"),
        ("--repeats 0 f(x)", SEED, "--repeats must be at least 1, not 0"),
        ("--repeats 100000000 f(x)", SEED, "--repeats must be at most 10000, not 100000000"),
        ("", SEED, "missing call: write the call to compile on the magic line, e.g. %%thunder_cudagraph f(x)"),
        ("--train", SEED, "missing call"),
        ("f(x) --train", SEED, "options go before the call"),
        ("f(nope)", SEED, "the call f(nope) failed: NameError: name 'nope' is not defined"),
        ("f(1 / 0)", SEED, "the call f(1 / 0) failed: ZeroDivisionError: division by zero"),
        ("f(x)", "def f(:\n    pass\n", "syntax error in the cell, line 2"),  # the magic's line is line 1
        ("h(x)", "x = 1\n", "no function 'h': the cell defines no function, and 'h' is not in the namespace"),
        ("-f nothing f(x)", SEED, "no function 'nothing' in the namespace (the cell defines: f)"),
        ("--train f(x)", SEED, "training needs a tensor that requires grad: an input of f, or a parameter of a module"),
        ("--lr 0.1 f(x)", SEED, "--lr needs --train"),
        ("--executors inductor f(x)", SEED,
         "unknown executor: 'inductor' (must be one of ['torchcompile', 'torchcompile_cat', 'nvfuser', 'no-sdpa'])"),
        ("--executors nvfuser f(x)", SEED, "executor 'nvfuser' is not available: no nvFuser wheel matches this torch"),
        ("--train --lr -1 f(x)", SEED, "--lr must be a positive number, not -1.0"),
        ("--peers=3 f(x)", SEED, "argument --peers: ignored explicit argument '3'"),
        ("--peers 3 f(x)", SEED, "unexpected words before the call: 3"),
        ("--peers --no-run f(x)", SEED, "--peers needs a run (it times torch.compile): not with --no-run"),
        ("-f x f(x)", SEED, "'x' is a Tensor, not a function"),
        ("-f n f(x)", "n = 3\n", "'n' is an int, not a function"),
        ("bad(x)", "import torch\nx = torch.randn(3)\ndef bad(x):\n    return float(x.sum())\n",
         "thunder cannot trace float() of a tensor in bad (line 5 of the cell: `return float(x.sum())`)"),
    ],
)
def test_mistakes_raise_one_usage_error(ip, line, cell, message):
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_cell_magic("thunder_cudagraph", line, cell)
    assert message in str(info.value)
    assert all(not o.get("text/plain") for o in final_outputs(cap))  # no half report left behind


@pytest.mark.slow  # NOTE: inductor compiles (its first use in a process checks the CPU's vector units: seconds)
def test_peers_times_torch_compile_reduce_overhead_too(ip):
    outs, _ = run_magic(ip, "--peers --repeats 2 -o cmp_peers g(x)", ISLAND)
    cmp = ip.user_ns["cmp_peers"]
    verdict, _, run = outs
    assert cmp.peers and cmp.results["peer"].ok
    assert "torch.compile reduce-overhead: matches eager" in verdict["text/plain"]
    assert "check torch.compile reduce-overhead  matches eager" in run["text/plain"]
    assert "torch.compile reduce-overhead " in run["text/plain"].split("timings", 1)[1]


def test_a_bad_peers_is_one_usage_error_and_the_namespace_survives(ip):
    ip.run_cell("import torch\nkept = torch.arange(3)\n")
    with capture_output() as cap:
        ip.run_cell("%%thunder_cudagraph --peers=3 f(kept)\nkept = None\n")
    shown = cap.stdout + cap.stderr
    assert shown.count("UsageError") == 1 and "ignored explicit argument '3'" in shown and "Traceback" not in shown
    assert torch.equal(ip.user_ns["kept"], torch.arange(3))  # NOTE: the cell did not run, nothing was rebound


def test_a_typo_in_the_callee_is_a_usage_error_naming_what_the_cell_defines(ip):
    """The call names no function: nothing is guessed (it once compiled the cell's last function), nothing runs."""
    ip.user_ns.pop("cmp_typo", None)
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_cell_magic("thunder_cudagraph", "-o cmp_typo ff(x)",
                          "import torch\nx = torch.randn(4)\ndef helper(x):\n    return x\ndef f(x):\n    return x.sin()\n")
    assert str(info.value) == ("no function 'ff': the cell defines helper, f, and 'ff' is not in the namespace "
                               "(call a function by its name, or name one with -f NAME)")
    assert "cmp_typo" not in ip.user_ns and callable(ip.user_ns["f"])  # NOTE: the cell ran; no report was made
    assert all(not o.get("text/plain") for o in final_outputs(cap))


def test_cell_error_keeps_what_ran_before(ip):
    ip.user_ns.pop("before", None)
    with pytest.raises(UsageError, match=r"the cell raised ZeroDivisionError: division by zero \(line 4 of the cell: `1 / 0`\)"):
        ip.run_cell_magic("thunder_cudagraph", "f(x)", "before = 41\nbefore += 1\n1 / 0\nafter = 1\n")
    assert ip.user_ns["before"] == 42 and "after" not in ip.user_ns


def test_usage_error_prints_one_line_without_traceback(ip):
    with capture_output() as cap:
        ip.run_cell("%%thunder_cudagraph --views x f(x)\npass\n")
    shown = cap.stdout + cap.stderr
    assert "UsageError: unknown view: 'x'" in shown and "Traceback" not in shown


@no_gpu
def test_capture_on_without_gpu(ip):
    with pytest.raises(UsageError, match=r"capture=True needs a CUDA GPU, and torch sees none"):
        ip.run_cell_magic("thunder_cudagraph", "--capture on f(x)", SEED)


def test_without_dot_shows_dot_source_and_text_with_one_warning(ip, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` anywhere
    monkeypatch.setattr(render.backend, "_dot_missing_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs, _ = run_magic(ip, "--repeats 2 g(x)", ISLAND)
    diagram_warnings = [w for w in caught if issubclass(w.category, render.DiagramWarning)]
    assert len(diagram_warnings) == 1 and "apt-get install graphviz" in str(diagram_warnings[0].message)
    # NOTE: shown as the magic's, in one line: not thunder-nb's file and the line of its code under it
    assert diagram_warnings[0].filename == "%%thunder_cudagraph" and diagram_warnings[0].lineno == 1
    # NOTE: printed as thunder-nb's, as every warning of its own is (tests/test_warning_format.py), not as the magic's
    assert warnings.formatwarning(diagram_warnings[0].message, render.DiagramWarning, diagram_warnings[0].filename,
                                  1) == f"thunder-nb: DiagramWarning: {diagram_warnings[0].message}\n"
    original, fixed = (pane.value for pane in widget_of(outs[1]).children[1].children)
    for pane in (original, fixed):
        assert "digraph" in pane and "tnb-text" in pane and "thunder-nb report: g" in pane
        assert "<svg" in pane  # the lifetime view needs no Graphviz


@pytest.mark.dot
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not on PATH")
def test_a_diagram_dot_cannot_lay_out_in_time_is_said_and_the_rest_shows(ip, monkeypatch):
    monkeypatch.setattr(render.backend, "DOT_SECONDS", 1e-4)  # NOTE: every layout runs past it
    outs, _ = run_magic(ip, "--repeats 2 -o slow_drawing g(x)", ISLAND)
    original, fixed = (pane.value for pane in widget_of(outs[1]).children[1].children)
    for pane in (original, fixed):
        assert "not drawn: Graphviz&#x27;s dot took more than 0.0001 s to lay out the diagram and was stopped" in pane
        assert "tnb-text" in pane and "thunder-nb report: g" in pane and "tnb-lifetime" in pane
    assert ip.user_ns["slow_drawing"].results["fixed"].ok  # NOTE: the run and the namespace are there


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


@pytest.mark.slow
def test_executors_torchcompile_puts_inductor_fusions_inside_the_fixed_regions(ip):
    """``--executors torchcompile``: both sides compiled with thunder's torch_compile_ex, the fixed one equal to eager."""
    cell = textwrap.dedent(
        """
        import torch
        xs = torch.randn(64, 64)
        def g(x):
            y = torch.tanh(x * 1.5 + 0.25)
            s = y.sum().item()
            return torch.sigmoid(y) * s
        """
    )
    with capture_output() as out:
        ip.run_cell_magic("thunder_cudagraph", "--executors torchcompile --repeats 2 -o cmp_tc g(xs)", cell)
    assert "inductor compiles each fused group at the first call" in out.stdout + out.stderr + "".join(
        str(o.data) for o in out.outputs), "no progress line before inductor's compile"
    cmp = ip.user_ns["cmp_tc"]
    assert cmp.results["fixed"].ran and cmp.results["fixed"].matches, cmp.results["fixed"]
    import thunder

    fused = [b.sym.name for b in thunder.last_traces(cmp.functions["fixed"])[-1].bound_symbols
             for b in ([b] + list(b.subsymbols)) if b.sym.name.startswith("TorchCompile")]
    assert fused, "no inductor fusion in the fixed trace"


#: ``%%thunder_cudagraph?`` as IPython shows it, up to its last line (the magic's file)
HELP = textwrap.dedent(
    """\
    Docstring:
    Usage:

      %%thunder_cudagraph [-f NAME] [--original {stock,legacy}] [--train]
                          [--lr LR] [-o NAME] [--views LIST] [--no-run]
                          [--repeats N] [--capture {auto,on,off}]
                          [--executors LIST] [--peers]
                          [--whole-step MODEL,OPTIMIZER]
                          [call ...]

    Run the cell, then compile the call on the magic line with the original and
    the fixed CUDA-graph transform.

    Shows a one-line verdict, what to do next (code in your names), a toggle
    between the original and the fixed side (region diagram, value lifetimes,
    generated code with defect lines highlighted) and the run: the value, its
    check against eager PyTorch, timings and CUDA graphs captured. The original
    failing is part of the report. Example, with `model` an `nn.Module` defined
    anywhere in the notebook:

        %%thunder_cudagraph --train --lr 0.01 -o cmp step(xb)
        def step(x):
            return model(x).pow(2).mean()

    For a function an earlier cell defined, the line magic needs no cell:
    `%thunder_cudagraph step(xb)`. With `--whole-step model,opt loss_fn(xb, yb)`
    it diagnoses and runs the whole training iteration instead (forward, backward
    and `opt.step()` as one CUDA graph, `thunder_nb.jit_step`), against eager
    PyTorch. Ctrl-C stops it; your variables stay as they were.

    positional arguments:
      call                  the call to compile and run, e.g. f(x): its arguments
                            are evaluated in the notebook's namespace after the
                            cell ran; the function is its callee (or -f NAME)

    options:
      -f NAME, --function NAME
                            the function to compile (default: the call's callee)
      --original {stock,legacy}
                            what to compare the fixed transform with: thunder's
                            CUDAGraphTransform (stock) or the July 2024 behaviour
                            of issue #728 (legacy); default: stock
      --train               call .backward() on the scalar result and compare the
                            gradients of every tensor that requires grad that the
                            function reaches (arguments, and the parameters of
                            modules it reaches through arguments, closures or the
                            globals it names) with eager's
      --lr LR               with --train: follow every call by an SGD step (p -=
                            LR * p.grad) on each run's own copy of the parameters,
                            and check the parameters against eager's after the
                            last step
      -o NAME, --output NAME
                            store the Comparison (with --whole-step: the
                            StepComparison) in the namespace under NAME
      --views LIST          comma-separated views to show, from
                            diagram,lifetimes,source,run (default: all)
      --no-run              compile and trace only: run and time nothing
      --repeats N           calls timed per version, after 2 warm-up calls (median
                            and 10th-90th percentile shown); default 20, at most
                            10000
      --capture {auto,on,off}
                            auto: capture CUDA graphs when the inputs are on a
                            GPU, else run regions eagerly; on: always capture
                            (needs a GPU); off: never capture
      --executors LIST      comma-separated fusion executors put before thunder's
                            defaults, for both transforms: torchcompile (inductor
                            fuses ops inside regions; its first call compiles for
                            a while), torchcompile_cat, nvfuser; no-sdpa leaves
                            thunder's sdpa executor out; default: none (thunder's
                            defaults)
      --peers               also check and time torch.compile(fn,
                            mode="reduce-overhead") on the same inputs; the
                            verdict then gives the fixed side's speed against
                            eager and against it (its failing is reported, not
                            raised)
      --whole-step MODEL,OPTIMIZER
                            check one whole training iteration as one CUDA graph
                            (thunder_nb.jit_step): name your nn.Module and
                            torch.optim optimizer, and the call is your loss
                            function on one batch, e.g. --whole-step model,opt
                            loss_fn(xb, yb). Shows what share of the iteration one
                            graph holds and what stops the rest, each with your
                            line and the fix; when nothing does, runs 6 steps (3
                            uncaptured, the recording, 2 replays) against eager
                            PyTorch from the same state and times --repeats
                            consecutive steps of each (without a GPU: capture's
                            CPU stand-in, not timed). Your model and optimizer are
                            trained, then put back as they were"""
)


def test_help_reads_as_a_cell_magics_usage(ip):
    """``%%thunder_cudagraph?``, the whole text: IPython's "Docstring:" header (every magic's help has it), the usage
    line with ``%%`` under "Usage:" and its continuation lines under its first argument, plain text (no
    reStructuredText ``::``, double backticks or ``<...>`` around a value), 78 columns whatever the terminal."""
    text = ip.object_inspect_text("%%thunder_cudagraph")
    shown, file_line = text.rsplit("\n", 1)
    assert re.fullmatch(r"File: +\S*thunder_nb/magics\.py", file_line), file_line
    assert shown == HELP, "\n".join(difflib.unified_diff(HELP.splitlines(), shown.splitlines(), lineterm=""))
    assert max(map(len, shown.splitlines())) <= 78


# --- issue 53: the line magic, the next line, the count while timing -------------------------------------------


def test_the_line_magic_compiles_a_function_an_earlier_cell_defined(ip):
    """``%thunder_cudagraph f(x)``: no cell to run; ``%%thunder_cudagraph f(x)`` with an empty body gets IPython's
    message, which now names the line magic."""
    ip.run_cell(ISLAND)
    with capture_output() as cap:
        assert ip.run_line_magic("thunder_cudagraph", "--repeats 2 -o from_line g(x)") is None
    outs = final_outputs(cap)
    assert outs[0]["text/plain"] == ip.user_ns["from_line"].verdict()
    assert "fixed: 1 region, 0 islands, matches eager" in outs[0]["text/plain"]
    assert outs[1]["text/plain"].startswith("next: compile g with the fixed transform")
    with pytest.raises(UsageError, match=r"cell body is empty\. Did you mean the line magic %thunder_cudagraph"):
        ip.run_cell_magic("thunder_cudagraph", "g(x)", "")
    with pytest.raises(UsageError, match="no function 'nowhere'"):
        ip.run_line_magic("thunder_cudagraph", "nowhere(x)")


def test_the_next_line_is_code_in_the_users_names_that_runs(ip):
    """Under the verdict: the user's function and arguments in `thunder_nb.jit`, and the code runs as written in the
    user's namespace (the result equals the function's own)."""
    outs, cap = run_magic(ip, "--repeats 2 g(x)", ISLAND)
    following = next_of(cap)
    head, _, code = following.partition("\n")
    assert head == "next: compile g with the fixed transform, and call it as before:"
    assert textwrap.dedent(code).splitlines() == [
        "import thunder_nb",
        "g_jit = thunder_nb.jit(g)  # or thunder.jit(g, transforms=[thunder_nb.FixedCUDAGraphTransform()])",
        "out = g_jit(x)"]
    assert ip.run_cell(textwrap.dedent(code)).success
    assert torch.equal(ip.user_ns["out"], ip.user_ns["g"](ip.user_ns["x"]))
    html = next(o for o in final_outputs(cap) if o.get("text/plain") == following)["text/html"]
    assert "<code>import thunder_nb\ng_jit = thunder_nb.jit(g)" in html


def test_train_next_is_jit_step_with_the_model_and_optimizer_the_namespace_has(ip):
    """``--train`` on a module: `jit_step` with the user's model and the optimizer of its parameters found in the
    namespace, then a call of the returned step; it runs, and takes a step of the user's optimizer."""
    ip.run_cell(MODULE + "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n")
    _, cap = run_magic(ip, "--train --repeats 2 step(xb)", "def step(x):\n    return model(x).pow(2).mean()\n")
    head, _, code = next_of(cap).partition("\n")
    assert head.startswith("next: train with the whole iteration as one CUDA graph: each call of train_step is "
                           "opt.zero_grad(), step, backward and opt.step()"), head
    assert textwrap.dedent(code).splitlines() == [
        "import thunder_nb", "train_step = thunder_nb.jit_step(model, step, opt)", "loss = train_step(xb)",
        "# check it against eager first: %%thunder_cudagraph --whole-step model,opt step(xb)"]
    before = snapshot(ip.user_ns["model"])
    assert ip.run_cell(textwrap.dedent(code)).success
    assert not all(torch.equal(a, b) for a, b in zip(before, ip.user_ns["model"].parameters()))
    # tensors trained outside a module: thunder_nb.jit of the function, and backward as before
    _, cap = run_magic(ip, "--train --repeats 2 --executors no-sdpa step(x, w1, w2)", MLP)
    code = textwrap.dedent(next_of(cap).partition("\n")[2])
    assert code.splitlines() == ["import thunder_nb", "step_jit = thunder_nb.jit(step, executors=['no-sdpa'])",
                                 "loss = step_jit(x, w1, w2)", "loss.backward()"]
    assert ip.run_cell(code).success and ip.user_ns["w1"].grad is not None


def test_repeating_counts_the_calls_on_the_progress_line(ip):
    """A long ``--repeats`` says how far it got: the progress line counts the timed calls (every half second)."""
    cell = "import time, torch\nx = torch.randn(8)\ndef slow(x):\n    time.sleep(0.03)\n    return x.sin()\n"
    with capture_output() as cap:
        ip.run_cell_magic("thunder_cudagraph", "--repeats 40 --views run slow(x)", cell)
    lines = [o.data["text/plain"] for o in cap.outputs if (o.transient or {}).get("display_id")]
    counts = [line for line in lines if re.fullmatch(r"thunder-nb: timing slow in eager PyTorch: \d+ of 40 calls…", line)]
    assert counts, lines
    done = [int(re.search(r"(\d+) of", line).group(1)) for line in counts]
    assert done == sorted(done) and 0 < done[0] < 40
    assert not lines[-1].startswith("thunder-nb:")  # the progress line became the verdict
