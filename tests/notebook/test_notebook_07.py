"""Notebook 07 (the whole training iteration): each claim its prose makes is one its outputs show.

The same checks run on the notebook as committed (no kernel) and on a copy executed now on the CPU (slow), so that the
prose holds for the stored run and for what the code prints today. Where a GPU run and a CPU run print different
things (the magic's recordings, the timing table), the check follows the ``device:`` line of the notebook at hand.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

import nbcheck
from thunder_nb.notebook import export

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "07_whole_step.ipynb"
ROWS = ("eager PyTorch", "thunder_nb.jit(loss_fn)", "thunder_nb.jit_step", 'torch.compile(mode="reduce-overhead")')


def _code_cell(nb, marker: str):
    cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    assert len(cells) == 1, f"{len(cells)} code cells hold {marker!r}"
    return cells[0]


def _markdown_after(nb, cell) -> str:
    i = nb.cells.index(cell)
    return next(c.source for c in nb.cells[i + 1:] if c.cell_type == "markdown")


def _on_gpu(nb) -> bool:
    return not nbcheck.device_lines(nb)[0].startswith("CPU")


def check_blockers(nb):
    """"Under 100%": the logged loss's report names a host sync and a loss of the wrong form, at the user's line."""
    text = nbcheck.printed(_code_cell(nb, "thunder_nb.capturability(model, logged_loss"))
    share = re.search(r"logged_loss: ([\d.]+)% of the iteration in one graph", text)
    assert share and float(share.group(1)) < 100, text
    assert re.search(r"1\. host sync: item at cell .*`return loss, loss\.item\(\)", text), text
    assert re.search(r"2\. loss: loss_fn returns \(tensor, float\) at cell .*`return loss, loss\.item\(\)", text), text
    assert "read it after the step" in text and "return the loss alone" in text


def check_fixed_in_the_magic(nb):
    """The fixed loss: 100% in one graph; six steps against eager from the same state, equal; put back; one recording
    (what "without a schedule, SGD records once: see the magic's run above" points at)."""
    text = nbcheck.printed(_code_cell(nb, "%thunder_cudagraph --whole-step model,opt loss_fn(idx, targets)"))
    assert re.search(r"loss_fn: 100% of the iteration in one graph \((\d+) of \1 ops; optimizer: SGD", text), text
    assert "matches eager over 6 steps" in text and "your model and optimizer are as they were" in text
    assert re.search(r"^(graphs recorded +1|recordings +1 by capture's CPU stand-in)", text, re.M), text
    if _on_gpu(nb):
        assert re.search(r"^time per step +eager [\d.]+ ms, whole step [\d.]+ ms", text, re.M), text


def check_per_call(nb):
    """thunder_nb.jit(loss_fn): regions in the forward and the backward trace, each drawn as an <img> (untrusted-safe)."""
    cell = _code_cell(nb, "per_call = thunder_nb.jit(loss_fn)")
    text = nbcheck.printed(cell)
    for kind in ("forward", "backward"):
        m = re.search(rf"thunder_nb\.jit\(loss_fn\), {kind}: (\d+) region\(s\) of \d+ ops, (\d+) CUDA graph", text)
        assert m and int(m.group(1)) >= 1, text
        assert (int(m.group(2)) >= 1) == _on_gpu(nb), text
    html = [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
    assert len(html) == 2 and all('src="data:image/svg+xml;base64,' in h for h in html)
    assert not any("image/svg+xml" in o.get("data", {}) for o in cell.outputs)


def _loop(text: str, optimizer: str) -> dict:
    block = text[text.index(f"{optimizer}, lr x0.9 after each step"):]
    lrs = [float(v) for v in re.search(r"lr of each call: +(.*)", block).group(1).split(", ")]
    did = re.search(r"what each call did: (.*)", block).group(1).split(", ")
    recordings = int(re.search(r"recordings: (\d+) in 6 steps", block).group(1))
    warned = re.findall(r"RecordAgainWarning: (.*)", block)
    equal = re.search(r"losses: (.*)", block).group(1)
    return {"lrs": lrs, "did": did, "recordings": recordings, "warned": warned, "equal": equal}


def check_schedule(nb):
    """SGD with the schedule records at every call after the warm-up, one warning naming lr and the fix; AdamW records
    once and replays, the lr still following the schedule; both equal to eager."""
    sgd = _loop(nbcheck.printed(_code_cell(nb, "sgd_losses, _ = step_loop(sgd)")), "SGD")
    assert sgd["did"] == ["no graph"] * 3 + ["recorded"] * 3 and sgd["recordings"] == 3
    assert len(sgd["warned"]) == 1, sgd["warned"]  # "said once, not at every step"
    assert "'lr' changed" in sgd["warned"][0] and "Python number" in sgd["warned"][0] and "AdamW" in sgd["warned"][0]
    adamw = _loop(nbcheck.printed(_code_cell(nb, "adamw_losses, step = step_loop(adamw)")), "AdamW")
    assert adamw["did"] == ["no graph"] * 3 + ["recorded", "replayed", "replayed"] and adamw["recordings"] == 1
    assert adamw["warned"] == []
    for run in (sgd, adamw):
        assert run["equal"] == "equal to eager PyTorch's"
        assert all(a > b for a, b in zip(run["lrs"], run["lrs"][1:])), run["lrs"]  # the schedule is followed


def check_grad(nb):
    """.grad: the graph's tensor, overwritten by the next replay, equal to eager's gradient of that one step; None after
    zero_grad, the graph's tensor again after the next step."""
    text = nbcheck.printed(_code_cell(nb, "p = model.transformer.h[0].mlp.c_fc.weight"))
    for line in ("p.grad is the same tensor as before the step: True",
                 "and its values changed (the replay wrote over them): True",
                 "p.grad equals eager PyTorch's gradient of this one step: True",
                 "after optimizer.zero_grad(): p.grad is None",
                 "after the next step, p.grad is the graph's tensor again: True"):
        assert line in text, text


def check_record_again(nb):
    """weight_decay: recorded at once, then replayed; another batch shape: three calls without a graph, recorded at the
    fourth, replayed from the fifth; back at the full batch: replayed, no new recording, no warning."""
    cell = _code_cell(nb, 'step.optimizer.param_groups[0]["weight_decay"] = 0.0')
    text = nbcheck.printed(cell)
    parts = re.split(r"^(?=weight_decay 0\.01|a batch of|back to the full batch)", text, flags=re.M)[1:]
    assert len(parts) == 3, text
    decay, half, back = parts
    counts = [int(re.search(r"recordings so far: (\d+)", p).group(1)) for p in parts]
    assert "RecordAgainWarning: jit_step: recording the step again: param group 0's 'weight_decay' changed" in decay
    assert "what each call did: recorded, replayed;" in decay
    assert re.search(r"RecordAgainWarning: jit_step: recording the step again: the batch's argument 0 has shape", half)
    assert "what each call did: no graph, no graph, no graph, recorded, replayed;" in half
    assert "RecordAgainWarning" not in back and "what each call did: replayed, replayed;" in back
    assert counts[1] == counts[0] + 1 and counts[2] == counts[1], counts


def check_timings(nb):
    """On a GPU: the conditions, then a row for each configuration with its time and launches; on the CPU: says that the
    timings need a GPU."""
    text = nbcheck.printed(_code_cell(nb, "def training(row)"))
    if not _on_gpu(nb):
        assert text.strip() == ("timings need a GPU: without one, no CUDA graph runs (the stored outputs come from the "
                                "H200)")
        return
    assert re.search(r"NVIDIA .*, torch .*; nanoGPT [\d.]+M parameters, float32, batch \d+x\d+ tokens; AdamW; \d+ "
                     r"warm-up steps, then \d+ rounds of \d+ consecutive steps, the rows taking turns; the median "
                     r"round", text), text
    for name in ROWS:
        assert re.search(rf"^{re.escape(name)} +\d+ +\d+ +\d+$", text, re.M), f"no row for {name}: {text}"
        if name != "thunder_nb.jit_step":
            assert re.search(rf"thunder_nb\.jit_step against {re.escape(name)}: [\d.]+x (faster|slower) \(rounds: "
                             r"[\d.]+-[\d.]+\)$", text, re.M), text
    whole = re.search(r"^thunder_nb\.jit_step +\d+ +\d+ +(\d+)$", text, re.M)
    assert whole.group(1) == "1", "the prose says jit_step launches one graph a step"


CHECKS = [check_blockers, check_fixed_in_the_magic, check_per_call, check_schedule, check_grad, check_record_again,
          check_timings]


def check_prose(nb):
    """The figures and names of the prose are in the outputs; no error output; the CPU wording where it ran on the CPU."""
    assert nbcheck.figures_missing_from_outputs(nb) == []
    assert nbcheck.names_missing_from_outputs(nb, cpu_run=not _on_gpu(nb)) == []
    assert not [o for o in nbcheck.outputs(nb) if o.get("output_type") == "error"]


@pytest.fixture(scope="module")
def stored():
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Notebook 07 executed now, on this machine (the CPU in CI)."""
    nb = nbcheck.executed_once(NOTEBOOK, tmp_path_factory)
    assert export.error_outputs(nb) == []
    return nb


@pytest.mark.parametrize("check", CHECKS + [check_prose], ids=lambda c: c.__name__)
def test_stored_claims(stored, check):
    check(stored)


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS + [check_prose], ids=lambda c: c.__name__)
def test_fresh_claims(fresh, check):
    check(fresh)


def test_no_magic_cell_without_a_toggle(stored):
    """The --whole-step magic shows a report, no toggle: it runs as the line magic, so that the checks of the toggle
    cells (``%%thunder_cudagraph``: a widget and its static fallback) do not apply to it."""
    magic = [c for c in stored.cells if c.cell_type == "code" and "thunder_cudagraph" in c.source]
    assert magic and all(c.source.startswith("%thunder_cudagraph --whole-step ") for c in magic)
    assert nbcheck.widget_bundles(stored) == []
