"""Notebook 08 (decoding with a KV cache): each claim its prose makes is one its outputs show.

The same checks run on the notebook as committed (no kernel) and on a copy executed now on the CPU (slow), so that the
prose holds for the stored run and for what the code prints today. Where a GPU run and a CPU run print different
things (graphs recorded or regions run eagerly, the timing table), the check follows the ``device:`` line of the
notebook at hand.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import pytest

import nbcheck
from thunder_nb.notebook import export

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "08_kv_cache_decoding.ipynb"
ROWS = ("eager PyTorch", "thunder_nb.jit", "thunder_nb.jit, in_place_updates=False",
        'thunder_nb.jit, executors=["torchcompile"]', 'torch.compile(mode="reduce-overhead")')
# a KV cache's type as thunder comments it: "cpu f32[1, 4, 64, 32]" or "cuda:0 f32[1, 4, 64, 32]"
CACHE_TYPE = r'"(?:cpu|cuda:\d+) f32\[1, 4, 64, 32\]"'


def _code_cell(nb, marker: str):
    cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    assert len(cells) == 1, f"{len(cells)} code cells hold {marker!r}"
    return cells[0]


def _on_gpu(nb) -> bool:
    return not nbcheck.device_lines(nb)[0].startswith("CPU")


def _tokens(text: str, who: str) -> list[int]:
    m = re.search(rf"^{re.escape(who)}, (\d+) tokens: \[([\d, ]+)\]$", text, re.M)
    assert m, f"no token line for {who}: {text}"
    tokens = [int(t) for t in m.group(2).split(", ")]
    assert len(tokens) == int(m.group(1))
    return tokens


def check_model(nb):
    """litgpt's pythia-14m at 2 layers, a key and a value cache per layer of 64 positions, buffers of the model: what
    the prose says."""
    text = nbcheck.printed(_code_cell(nb, "net.set_kv_cache("))
    assert re.search(r"^litgpt GPT, config 'pythia-14m': 2 layers, width 128, [\d.]+M parameters, torch\.float32$",
                     text, re.M), text
    assert ("KV cache: a key tensor and a value tensor in each of the 2 layers, each of shape (1, 4, 64, 32) "
            "(batch, heads, positions, head size)") in text
    assert ("the caches are buffers of the model: transformer.h.0.attn.kv_cache.k, transformer.h.0.attn.kv_cache.v, "
            "transformer.h.1.attn.kv_cache.k, transformer.h.1.attn.kv_cache.v") in text
    assert re.search(r"^prompt: \[(\d+, ){7}\d+\]$", text, re.M), "the prose says the prompt is 8 tokens"


def check_tokens(nb):
    """thunder_nb.jit decodes eager PyTorch's greedy tokens, every one (24 steps on a GPU, 6 on the CPU)."""
    eager = _tokens(nbcheck.printed(_code_cell(nb, "eager_tokens = decode(net, prefill(net), steps)")), "eager PyTorch")
    assert len(eager) == (25 if _on_gpu(nb) else 7)
    text = nbcheck.printed(_code_cell(nb, "decoder = thunder_nb.jit(fresh())"))
    assert _tokens(text, "thunder_nb.jit") == eager
    assert f"tokens: equal to eager PyTorch's ({len(eager)} of {len(eager)})" in text


def check_graphs_per_shape(nb):
    """Two traces (one per input shape), one region each; on a GPU one graph each, recorded at the first call and
    replayed at every call, that one included (a region's replays count its calls); on the CPU no graph, the regions
    run eagerly; the position a copied input, no new trace; each trace's region drawn as an <img>."""
    steps = len(_tokens(nbcheck.printed(_code_cell(nb, "eager_tokens = decode(")), "eager PyTorch")) - 1
    cell = _code_cell(nb, "thunder.cache_misses(decoder)")
    text = nbcheck.printed(cell)
    assert (f"thunder's traces of the model: 2 (cache misses); calls that reused one: {steps - 1} (cache hits)"
            in text), text
    shapes = {}
    for what in ("prefill, input 1x8", "decode step, input 1x1"):
        lines = re.findall(rf"^{re.escape(what)}: region (CUDAGraph\d+) of \d+ ops, (.*)$", text, re.M)
        assert len(lines) == 1, f"{what}: not one region: {text}"
        shapes[what] = lines[0]
    calls = {"prefill, input 1x8": 1, "decode step, input 1x1": steps}
    for what, (region, did) in shapes.items():
        n = calls[what]
        if _on_gpu(nb):
            assert did == f"1 CUDA graph recorded (first call), replayed {n} time{'s' * (n != 1)}", did
        else:
            assert did == f"0 CUDA graphs recorded: ran eagerly {n} time{'s' * (n != 1)} (no GPU)", did
    assert len({region for region, _ in shapes.values()}) == 2
    copied = re.findall(r"^    inputs read where they lie: (\d+); copied in before each call: (.*)$", text, re.M)
    assert len(copied) == 2 and all({"idx", "input_pos"} <= set(c.split(", ")) for _, c in copied), copied
    html = [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]
    assert len(html) == 2 and all('src="data:image/svg+xml;base64,' in h for h in html)
    assert not any("image/svg+xml" in o.get("data", {}) for o in cell.outputs)


def check_cache_update(nb):
    """Thunder's own trace (the last before the CUDA-graph transform) holds each of the 4 cache updates as an
    out-of-place index_copy of the whole cache and a copy_ of it back; the fixed transform's region holds one
    thunder_nb_index_copy_ of the same cache and values instead, and neither of thunder's two; the report counts them
    and names the four caches as updated where they lie."""
    text = nbcheck.printed(_code_cell(nb, "def cache_updates(trace)"))
    thunders, fixed, report = re.split(r"^(?=the fixed transform's region|the report of the decode step says)", text,
                                       flags=re.M)
    made_by = re.match(r"thunder's trace \(Constructed by ([^)]*)\):", thunders)
    assert made_by and "CUDAGraph" not in made_by.group(1), thunders
    assert fixed.startswith("the fixed transform's region (Constructed by thunder-nb corrected CUDAGraph fusion):")
    pairs = re.findall(rf"^    (t\d+) = torch\.index_copy\((t\d+), -2, input_pos, (t\d+)\)  # \1: {CACHE_TYPE}\n"
                       rf"    (t\d+) = copy_\(\1, \2, grad_enabled=False\)  # \4: {CACHE_TYPE}$", thunders, re.M)
    assert len(pairs) == 4, thunders
    folded = re.findall(rf"^    (t\d+) = thunder_nb_index_copy_\((t\d+), -2, input_pos, (t\d+)\)  # \1: {CACHE_TYPE}$",
                        fixed, re.M)
    # NOTE: on failure, all the cell printed (CI once missed a fold: a line stored in two pieces, read as two)
    assert [(cache, values) for _, cache, values in folded] == [(cache, values) for _, cache, values, _ in pairs], text
    assert "torch.index_copy" not in fixed and "copy_(" not in fixed.replace("thunder_nb_index_copy_(", ""), text
    assert ("note: 4 partial updates that thunder made out of place (a copy of the whole tensor, then a copy_ back) "
            "run in place again") in report
    updated = re.search(r"^    updated in place: (.*) \((.*)\)$", report, re.M)
    assert updated, report
    assert updated.group(1).split(", ") == [f"t_transformer_h_{layer}_attn_kv_cache_{kv}" for layer in (0, 1)
                                            for kv in "kv"]
    assert "nothing to copy back" in updated.group(2)
    assert "one cache: 32 KiB ((1, 4, 64, 32), torch.float32); one position of it, what a decode step adds: 512 bytes" \
        in report


def check_timings(nb):
    """On a GPU: the conditions (device, dtype, model, rounds), a row for each version with its time, its ratio to
    reduce-overhead, its GPU time and its tokens against eager's (thunder_nb.jit's all equal), then each thunder_nb.jit
    version's executors; on the CPU: says that the timings need a GPU."""
    text = nbcheck.printed(_code_cell(nb, "class Loop"))
    if not _on_gpu(nb):
        assert text.strip() == ("timings need a GPU: without one, no CUDA graph runs (the stored outputs come from the "
                                "H200)")
        return
    assert re.search(r"NVIDIA .*, torch .*, lightning-thunder .*; litgpt 'pythia-14m', 2 layers, torch\.float32, "
                     r"batch 1, a cache of 64 positions; \d+ warm-up calls, then \d+ rounds of \d+ one-token calls per "
                     r"version, taking turns", text), text
    total = len(_tokens(nbcheck.printed(_code_cell(nb, "eager_tokens = decode(")), "eager PyTorch"))
    for name in ROWS:
        row = re.search(rf"^{re.escape(name)} +[\d.]+ +[\d,]+ +[\d.]+x +\d+  (\d+) of {total}$", text, re.M)
        assert row, f"no row for {name}: {text}"
        if name in ("eager PyTorch", "thunder_nb.jit", "thunder_nb.jit, in_place_updates=False"):
            assert row.group(1) == str(total), f"{name}: not every token equal to eager's"
    assert re.search(r"^torch\.compile\(mode=\"reduce-overhead\"\) +[\d.]+ +[\d,]+ +1\.00x", text, re.M)
    executors = dict(re.findall(r"^executors of (.*): (.*)$", text, re.M))
    assert set(executors) == {n for n in ROWS if n.startswith("thunder_nb.jit")}, executors
    assert "thunder_nb_torchcompile" in executors['thunder_nb.jit, executors=["torchcompile"]'].split(", ")
    assert "thunder_nb_torchcompile" not in executors["thunder_nb.jit"].split(", ")


CHECKS = [check_model, check_tokens, check_graphs_per_shape, check_cache_update, check_timings]


def check_prose(nb):
    """The figures and names of the prose are in the outputs; no error output; the CPU wording where it ran on the CPU."""
    assert nbcheck.figures_missing_from_outputs(nb) == []
    assert nbcheck.names_missing_from_outputs(nb, cpu_run=not _on_gpu(nb)) == []
    assert not [o for o in nbcheck.outputs(nb) if o.get("output_type") == "error"]


def test_prose_names_what_the_outputs_show():
    """The prose's words for what the outputs print: thunder's rewrite and the fixed form by their names, the option
    that keeps thunder's form, the two shapes."""
    text = nbcheck.markdown(nbformat.read(NOTEBOOK, as_version=4))
    for words in ("`index_copy_`", "`torch.index_copy`", "`copy_`", "`thunder_nb_index_copy_`", "in_place_updates=False",
                  "shape 1x8", "shape 1x1", "*functionalization*", "**KV cache**", "**prefill**", "**decode step**",
                  "`thunder.cache_misses`", 'torch.compile(mode="reduce-overhead")'):
        assert words in text, words


@pytest.fixture(scope="module")
def stored():
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Notebook 08 executed now, on this machine (the CPU in CI)."""
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


def test_no_magic_cell(stored):
    """The notebook decodes with thunder_nb.jit, not the magic: no toggle, so the toggle checks do not apply."""
    assert not any(nbcheck.is_magic_cell(c) for c in stored.cells)
    assert nbcheck.widget_bundles(stored) == []


def test_a_line_the_kernel_sent_in_two_pieces_reads_as_one(stored):
    """The kernel sends printed text in pieces (a flush on its timer can fall mid-line, under load): the checks read a
    cell as Jupyter shows it. CI once found a cache update missing, its line stored as two outputs ("    ", then the
    rest) and read as two lines."""
    nb = copy.deepcopy(stored)
    cell = _code_cell(nb, "def cache_updates(trace)")
    first = next(i for i, o in enumerate(cell.outputs) if "thunder_nb_index_copy_(" in o.get("text", ""))
    text = cell.outputs[first].text
    at = text.index("thunder_nb_index_copy_(")
    at = text.rindex("\n", 0, at) + 5  # NOTE: after the line's four spaces, before its name
    cell.outputs[first:first + 1] = [nbformat.v4.new_output("stream", name="stdout", text=text[:at]),
                                     nbformat.v4.new_output("stream", name="stdout", text=text[at:])]
    check_cache_update(nb)
