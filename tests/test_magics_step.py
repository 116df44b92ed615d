"""``%%thunder_cudagraph --whole-step MODEL,OPTIMIZER loss_fn(batch)`` in a real IPython shell, on the CPU (issue #34).

The capturability report of the user's training step (the share of the iteration in one graph, each blocker with the
user's line in the cell and the fix), the whole step run against eager PyTorch under capture's CPU stand-in, the
user's model and optimizer put back afterwards, and one clear message per mistake with the namespace intact.
Real thunder, a small perceptron (thunder traces it in about a second).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from IPython.core.error import UsageError
from IPython.testing import globalipapp
from IPython.utils.capture import capture_output

from thunder_nb.step.report import StepComparison

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA GPU")

#: An earlier cell: the model, the optimizer (already one step in, so it has state to keep) and the batch.
SETUP = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    xb, yb = torch.randn(8, 8), torch.randint(0, 4, (8,))
    F.cross_entropy(model(xb), yb).backward()
    opt.step()
    """
)
CLEAN = "def loss_fn(x, y):\n    loss = F.cross_entropy(model(x), y)\n    return loss\n"
SYNC = "def loss_fn(x, y):\n    loss = F.cross_entropy(model(x), y)\n    return loss + 0 * loss.item()\n"
PRINTS = "def loss_fn(x, y):\n    loss = F.cross_entropy(model(x), y)\n    print(loss.item())\n    return loss\n"
UNTRACEABLE = ("def loss_fn(x, y):\n    keep = torch.nonzero(y)[:, 0]\n"
               "    return F.cross_entropy(model(x[keep]), y[keep])\n")


@pytest.fixture(scope="module")
def ip():
    shell = globalipapp.start_ipython() or globalipapp.get_ipython()  # NOTE: IPython starts it once
    shell.run_line_magic("load_ext", "thunder_nb")
    return shell


def run_whole_step(ip, line: str, cell: str) -> tuple[dict, StepComparison]:
    """Run the magic with ``-o result``; the one output it leaves (the progress line becomes the report) and the
    stored result."""
    ip.run_cell(SETUP)
    ip.user_ns.pop("result", None)
    with capture_output() as cap:
        ip.run_cell_magic("thunder_cudagraph", f"--whole-step {line} -o result loss_fn(xb, yb)", cell)
    shown = {}
    for o in cap.outputs:  # NOTE: updates of the progress line by display id: the last one is what stays
        if (o.transient or {}).get("display_id"):
            shown = o.data
    # NOTE: then the "next" line, its own output under the report
    assert [o.data["text/plain"].split(":")[0] for o in cap.outputs if not (o.transient or {}).get("display_id")] \
        == ["next"]
    result = ip.user_ns["result"]
    assert isinstance(result, StepComparison)
    assert shown["text/plain"] == result.to_text() and "<table>" in shown["text/html"]
    return shown, result


def state_of(ns) -> dict:
    opt = ns["opt"]
    return {
        "params": [p.detach().clone() for p in ns["model"].parameters()],
        "grads": [p.grad.clone() for p in ns["model"].parameters()],
        "opt": [(k, v.clone()) for s in opt.state.values() for k, v in sorted(s.items())],
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "rng": torch.get_rng_state(),
    }


def assert_same_state(before: dict, after: dict) -> None:
    for key in ("params", "grads"):
        assert all(torch.equal(a, b) for a, b in zip(before[key], after[key])), key
    assert [k for k, _ in before["opt"]] == [k for k, _ in after["opt"]] and len(before["opt"]) == 4 * 3
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(before["opt"], after["opt"]))
    assert before["groups"] == after["groups"]  # NOTE: lr stays a float, capturable as it was
    assert torch.equal(before["rng"], after["rng"])


# --- the report and the run -------------------------------------------------------------------------


def test_a_clean_step_is_one_graph_runs_equal_to_eager_and_puts_the_users_objects_back(ip):
    ip.run_cell(SETUP)
    before = state_of(ip.user_ns)
    with capture_output() as cap:
        ip.run_cell_magic("thunder_cudagraph", "--whole-step model,opt -o result loss_fn(xb, yb)", CLEAN)
    result = ip.user_ns["result"]
    text, following = cap.outputs[-2].data["text/plain"], cap.outputs[-1].data["text/plain"]
    assert text == result.to_text()
    # the next step, in the user's names, runs as written and trains the user's model
    assert following == result.next_step(model="model", optimizer="opt", call="loss_fn(xb, yb)")
    head, _, code = following.partition("\n")
    assert head.startswith("next: train with it: each call of train_step is opt.zero_grad(), loss_fn, backward and "
                           "opt.step()"), head
    assert textwrap.dedent(code).splitlines() == ["import thunder_nb",
                                                  "train_step = thunder_nb.jit_step(model, loss_fn, opt)",
                                                  "loss = train_step(xb, yb)"]
    lines = text.splitlines()
    assert lines[0].startswith("loss_fn: 100% of the iteration in one graph (") and lines[0].endswith(
        "ops; optimizer: AdamW (capturable=True, lr from a device tensor))")
    assert lines[1] == "  whole step: forward, loss, backward and optimizer step record as one CUDA graph"
    assert ("whole step          matches eager over 6 steps (losses, and 4 parameters after the last); emulated on "
            "the CPU (no GPU): recorded by capture's CPU stand-in instead of a CUDA graph, not timed") in lines
    assert "capture             emulated on the CPU: no GPU, so no CUDA graph; each replay runs" in text
    assert "time per step       not timed: the CPU stand-in says nothing about a CUDA graph's speed" in lines
    # NOTE: "graphs recorded 1" stood next to "no CUDA graph recorded": the stand-in's recording is counted as one
    assert "recordings          1 by capture's CPU stand-in (CUDA graphs: none, no GPU)" in lines
    assert "graphs recorded" not in text and "no CUDA graph recorded" not in text
    assert result.matches and result.ran and result.capture == "emulated" and result.graphs == 1
    assert result.report.whole_step and result.report.fraction == 1.0
    eager, whole = result.losses
    assert len(eager) == len(whole) == 6 and eager[-1] < eager[0]  # NOTE: it trained: the loss went down
    assert result.max_loss_error <= 1e-4 and result.max_param_error <= 1e-4
    assert_same_state(before, state_of(ip.user_ns))  # the user's model and optimizer, trained and put back
    first = [p.detach().clone() for p in ip.user_ns["model"].parameters()]
    ran = ip.run_cell(textwrap.dedent(code))
    assert ran.success and ip.user_ns["loss"].dim() == 0
    assert not all(torch.equal(a, p) for a, p in zip(first, ip.user_ns["model"].parameters()))  # one step taken


def test_an_item_in_the_step_is_a_host_sync_named_by_the_users_line_and_nothing_runs(ip):
    shown, result = run_whole_step(ip, "model,opt", SYNC)
    assert not result.ran and result.capture is None and result.steps == 0
    (blocker,) = result.report.blockers
    assert (blocker.kind, blocker.op) == ("host sync", "item")
    assert blocker.where == "line 4 of the cell: `return loss + 0 * loss.item()`"  # the magic's line is line 1
    lines = shown["text/plain"].splitlines()
    assert lines[0].startswith("loss_fn: ") and "% of the iteration in one graph (" in lines[0]
    assert 0.5 < result.report.fraction < 1
    assert lines[1] == "  1. host sync: item at line 4 of the cell: `return loss + 0 * loss.item()`"
    assert lines[2].startswith("     fix: return the tensor and read it after the step")
    assert "whole step  not run: 1 blocker stops the whole step (above)" in lines


def test_an_item_only_printed_is_python_side_state_named_by_the_users_line(ip):
    """thunder runs the print once, when it traces: the report says so instead of a silent 100%."""
    shown, result = run_whole_step(ip, "model,opt", PRINTS)
    (blocker,) = result.report.blockers
    assert blocker.kind == "python-side state" and blocker.where == "line 4 of the cell: `print(loss.item())`"
    assert "read loss.item() after the step" in blocker.fix
    assert "1. python-side state: item (its value only reaches Python) at line 4 of the cell" in shown["text/plain"]


def test_a_data_dependent_shape_is_a_dynamic_shape_blocker(ip):
    shown, result = run_whole_step(ip, "model,opt", UNTRACEABLE)
    (blocker,) = result.report.blockers
    assert (blocker.kind, blocker.op) == ("dynamic shape", "nonzero")
    assert blocker.where == "line 3 of the cell: `keep = torch.nonzero(y)[:, 0]`"
    assert shown["text/plain"].startswith("loss_fn: 0.0% of the iteration in one graph (thunder cannot trace it;")


def test_no_run_shows_the_report_only(ip):
    ip.run_cell(SETUP)
    with capture_output() as cap:
        ip.run_cell_magic("thunder_cudagraph", "--whole-step model,opt --no-run -o result loss_fn(xb, yb)", CLEAN)
    result = ip.user_ns["result"]
    assert result.report.whole_step and not result.ran
    assert "whole step  not run (--no-run)" in cap.outputs[-2].data["text/plain"]
    assert cap.outputs[-1].data["text/plain"].startswith("next: run it against eager PyTorch (without --no-run)")


# --- mistakes: one clear message each, the namespace intact -----------------------------------------


@pytest.mark.parametrize(
    "line, cell, message",
    [
        ("--whole-step modle,opt loss_fn(xb, yb)", CLEAN,
         "--whole-step modle,opt: modle failed: NameError: name 'modle' is not defined; modules in the namespace: "),
        ("--whole-step model,loss_fn loss_fn(xb, yb)", CLEAN,
         "--whole-step: 'loss_fn' is a function, not a torch.optim.Optimizer"),
        ("--whole-step opt,model loss_fn(xb, yb)", CLEAN,
         "--whole-step: 'opt' is an AdamW, not a torch.nn.Module (the model comes first: --whole-step "
         "MODEL,OPTIMIZER)"),
        ("--whole-step model,other loss_fn(xb, yb)",
         CLEAN + "other = torch.optim.SGD([torch.zeros(2, requires_grad=True)])\n",
         "--whole-step: other updates none of model's parameters (was it made for another model?)"),
        ("--whole-step model loss_fn(xb, yb)", CLEAN,
         "--whole-step needs MODEL,OPTIMIZER, the names of your nn.Module and your optimizer, not 'model'"),
        ("--whole-step model,opt --train loss_fn(xb, yb)", CLEAN, "--whole-step does not take --train"),
        ("--whole-step model,opt --capture off loss_fn(xb, yb)", CLEAN, "not with --capture off"),
        ("--whole-step model,opt loss_fn(xb, y=yb)", CLEAN,
         "--whole-step passes the batch as positional arguments: loss_fn(x, y), not keywords (y)"),
        ("--whole-step model,opt loss_fn(xb, yb[:3])", CLEAN,
         "loss_fn raised ValueError: Expected input batch_size (8) to match target batch_size (3). in eager PyTorch "
         "(line 3 of the cell: `loss = F.cross_entropy(model(x), y)`); your model and optimizer are as they were"),
    ],
    ids=["undefined", "not-an-optimizer", "swapped", "other-model", "one-name", "train", "capture-off", "keywords",
         "users-error"],
)
def test_mistakes_raise_one_usage_error_and_the_namespace_survives(ip, line, cell, message):
    ip.run_cell(SETUP)
    before = state_of(ip.user_ns)
    ip.user_ns.pop("result", None)
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_cell_magic("thunder_cudagraph", line.replace(" loss_fn(", " -o result loss_fn("), cell)
    assert message in str(info.value)
    assert all(not o.data.get("text/plain") for o in cap.outputs[-1:])  # no half report left behind
    assert "result" not in ip.user_ns
    assert_same_state(before, state_of(ip.user_ns))


@no_gpu
def test_capture_on_without_a_gpu_is_a_usage_error_before_the_cell_runs(ip):
    ip.run_cell(SETUP)
    with capture_output(), pytest.raises(UsageError, match=r"--whole-step: capture=True needs a CUDA GPU, and "
                                                          r"torch sees none"):
        ip.run_cell_magic("thunder_cudagraph", "--whole-step model,opt --capture on loss_fn(xb, yb)",
                          "ran = True\n" + CLEAN)
    assert "ran" not in ip.user_ns


def test_after_a_mistake_the_shell_runs_the_next_magic(ip):
    with capture_output() as cap:
        ip.run_cell("%%thunder_cudagraph --whole-step nothing,opt loss_fn(xb, yb)\n" + SETUP + CLEAN)
    shown = cap.stdout + cap.stderr
    assert shown.count("UsageError") == 1 and "Traceback" not in shown
    _, result = run_whole_step(ip, "model,opt", CLEAN)
    assert result.matches


def test_the_options_table_shows_a_default_of_zero_and_choices_that_are_not_strings(monkeypatch):
    """A default of 0 equals False, and ``",".join`` refuses numbers: the table keeps both."""
    import argparse

    from thunder_nb import magics

    parser = argparse.ArgumentParser()
    parser.add_argument("--warmup", type=int, default=0, help="steps")
    parser.add_argument("--level", type=int, choices=[1, 2], default=1, help="level")
    parser.add_argument("--quiet", action="store_true", help="quiet")
    parser.add_argument("--name", default="", help="name")
    monkeypatch.setattr(magics.ThunderCUDAGraphMagics.thunder_cudagraph, "parser", parser)
    rows = magics.options_markdown().splitlines()[3:]
    assert rows == ["| `--warmup WARMUP` | steps | `0` |", "| `--level {1,2}` | level | `1` |",
                    "| `--quiet` | quiet |  |", "| `--name NAME` | name |  |"]


# --- issue 53: the whole step's words --------------------------------------------------------------------------

PER_SAMPLE = "def loss_fn(x, y):\n    out = model(x)\n    return F.cross_entropy(out, y, reduction='none')\n"
FORMATS = "def loss_fn(x, y):\n    loss = F.cross_entropy(model(x), y)\n    print(f'loss {loss.item():.3f}')\n    return loss\n"


def everything_shown(cap) -> str:
    """Every text the magic left: its outputs (each update of the progress line too), stdout and stderr."""
    return "\n".join([*(o.data.get("text/plain", "") for o in cap.outputs),
                      *(o.data.get("text/html", "") for o in cap.outputs), cap.stdout, cap.stderr])


def test_a_loss_per_sample_says_its_shape_and_the_users_return_line(ip):
    """A loss of shape (8,) said "0.0% of the iteration in one graph" and pointed at the ``def``, without the shape."""
    shown, result = run_whole_step(ip, "model,opt", PER_SAMPLE)
    text = shown["text/plain"]
    assert text.splitlines()[0] == (
        "loss_fn: 0.0% of the iteration in one graph: the whole step needs a loss of one element, and loss_fn returns "
        "a tensor of shape (8,) (0 of 30 ops; optimizer: AdamW (capturable=True, lr from a device tensor))")
    assert ("  1. loss: loss_fn returns a tensor of shape (8,) at line 4 of the cell: "
            "`return F.cross_entropy(out, y, reduction='none')`") in text.splitlines()
    assert "def loss_fn" not in text and ".mean() or .sum()" in text


def test_no_proxy_repr_anywhere_when_the_loss_prints_an_item(ip):
    """``print(loss.item())`` in the loss printed ``FloatProxy name=f17, value=None`` while thunder traced it; an
    f-string with a format spec failed as "unsupported format string passed to FloatProxy.__format__"."""
    with capture_output() as cap:
        ip.run_cell(SETUP)
        ip.run_cell_magic("thunder_cudagraph", "--whole-step model,opt -o result loss_fn(xb, yb)", PRINTS)
    shown = everything_shown(cap)
    assert "Proxy" not in shown and "value=None" not in shown, shown
    assert "1 line that loss_fn printed while thunder traced it left out" in cap.stdout
    assert "python-side state: item (its value only reaches Python) at line 4 of the cell: `print(loss.item())`" \
        in ip.user_ns["result"].to_text()
    with capture_output() as cap:
        ip.run_cell_magic("thunder_cudagraph", "--whole-step model,opt -o result loss_fn(xb, yb)", FORMATS)
    shown = everything_shown(cap)
    assert "Proxy" not in shown, shown
    assert ("1. thunder: a format spec on a number thunder traces (an f-string such as f'{loss.item():.3f}') at line 4 "
            "of the cell") in shown
    assert "format loss.item() after the step" in shown


def test_a_host_sync_leaves_a_next_line_that_runs_with_graphs_around_it(ip):
    """What stops the whole step, and meanwhile `thunder_nb.jit` of the user's loss function, in the user's names: it
    runs as written and takes one step of the user's optimizer."""
    with capture_output() as cap:
        ip.run_cell(SETUP)
        ip.run_cell_magic("thunder_cudagraph", "--whole-step model,opt loss_fn(xb, yb)", SYNC)
    following = cap.outputs[-1].data["text/plain"]
    head, _, code = following.partition("\n")
    assert head.startswith("next: fix what stops it (above) and run this cell again; until then, thunder_nb.jit")
    assert textwrap.dedent(code).splitlines() == ["import thunder_nb", "loss_fn_jit = thunder_nb.jit(loss_fn)",
                                                  "opt.zero_grad()", "loss = loss_fn_jit(xb, yb)", "loss.backward()",
                                                  "opt.step()"]
    first = [p.detach().clone() for p in ip.user_ns["model"].parameters()]
    assert ip.run_cell(textwrap.dedent(code)).success
    assert not all(torch.equal(a, p) for a, p in zip(first, ip.user_ns["model"].parameters()))
