"""Ops that names and types do not show unsafe in a graph: dropout attention's seed and offset, host data.

Both were found on real models (issue #29): nanoGPT with dropout killed the process (SIGSEGV) under thunder's
transform and thunder-nb's alike, and llama2's inference step (``h[:, [-1], :]``) failed capture. These tests
build the real CUDA traces on the CPU (fake CUDA tensors; thunder's sdpa executor symbols called as they are)
and check what the transform keeps out and what the checker predicts; `test_gpu_zoo.py` runs them for real.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import thunder
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from thunder.transforms.cudagraph import CUDAGraphTransform

import thunder_nb
from thunder_nb import render
from thunder_nb.diagnosis.ops import CAPTURE_DEPENDENT, CAPTURE_DEPENDENT_ATEN, capture_hazard
from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.notebook.comparison import TraceError
from thunder_nb.testing.modes import stock_transform


def _note_ops() -> set[str]:
    """The aten ops whose meta function cites torch's ``Note [Seed and Offset]`` (seed and offset on the CPU
    outside a capture, on the device inside one)."""
    source = Path(torch._meta_registrations.__file__).read_text()
    found = set()
    # NOTE: each registered meta function starts at its decorator; the note is cited in its body
    for chunk in re.split(r"\n(?=@register_meta)", source):
        if "Note [Seed and Offset]" in chunk:
            head = chunk.split("def ", 1)[0]
            found |= set(re.findall(r"aten\.(\w+)", head))
    return found


def test_every_op_of_torchs_seed_and_offset_note_is_in_the_table():
    ops = _note_ops()
    assert "_scaled_dot_product_efficient_attention" in ops, ops  # NOTE: the one nanoGPT's dropout crashed on
    assert ops <= set(CAPTURE_DEPENDENT_ATEN), sorted(ops - set(CAPTURE_DEPENDENT_ATEN))
    for symbols in CAPTURE_DEPENDENT_ATEN.values():
        assert set(symbols) <= set(CAPTURE_DEPENDENT)


def test_the_tables_positions_are_thunders_seed_offset_and_dropout_arguments():
    from thunder.executors import sdpaex

    symbols = {s.name: s for s in (sdpaex.sdpea_gradfwd, sdpaex.sdpfa_gradfwd, sdpaex.sdpea_bwd, sdpaex.sdpfa_bwd)}
    assert set(symbols) == set(CAPTURE_DEPENDENT)
    for name, dep in CAPTURE_DEPENDENT.items():
        params = list(inspect.signature(symbols[name].meta).parameters)
        assert params[dep.dropout] == "dropout_p", (name, params)
        assert [params[i] for i in dep.inputs] == (["philox_seed", "philox_offset"] if dep.inputs else []), name
    # NOTE: the forwards' outputs are named in their meta's comments: "# philox_seed", "# philox_offset"
    for name in ("sdpaex_grad_forward_scaled_dot_product_efficient_attention",
                 "sdpafx_grad_forward_scaled_dot_product_efficient_attention"):
        src = inspect.getsource(symbols[name].meta)
        returned = src[src.rindex("return"):]
        items = [line.strip() for line in returned.splitlines()]
        labels = [i.lstrip("# ") for i in items if i.startswith("#")]
        seed = labels.index("philox_seed") if "philox_seed" in labels else None
        assert seed is not None, src
        assert CAPTURE_DEPENDENT[name].outputs == (_position_of(returned, "philox_seed"),
                                                   _position_of(returned, "philox_offset")), name


def _position_of(returned: str, label: str) -> int:
    """The position of the returned item that follows the comment ``# label`` in a meta's return statement."""
    depth, position = 0, 0
    body = returned[returned.index("(") + 1:]
    for line in body.splitlines():
        stripped = line.strip()
        if stripped == f"# {label}":
            return position
        if stripped.startswith("#"):
            continue
        for ch in stripped:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch == "," and depth == 0:
                position += 1
    raise AssertionError(f"no # {label} in {returned}")


def attention_step(q, k, v, g, w, p):
    """Dropout attention forward and backward through thunder's sdpa executor's own symbols, with ops around them."""
    from thunder.executors.sdpaex import sdpea_bwd, sdpea_gradfwd

    q = q * w
    out, lse, seed, offset = sdpea_gradfwd(q, k, v, None, p, False, scale=None)
    y = out.sin()
    gq, gk, gv, _ = sdpea_bwd(g, q, k, v, None, out, lse, seed, offset, p, False, scale=None)
    return y.cos(), (gq * 2).sum(), gk + gv


def _traced(transform, dropout: float):
    from thunder.executors.sdpaex import sdpa_ex

    with FakeTensorMode():
        q, k, v, g = (torch.randn(1, 2, 16, 8, device="cuda") for _ in range(4))
        w = torch.randn(8, device="cuda")

    def step(q, k, v, g, w):
        return attention_step(q, k, v, g, w, dropout)

    jfn = thunder.jit(step, transforms=[transform], executors=[sdpa_ex, *thunder.get_default_executors()])
    thunder.compile_data(jfn)._get_computation_and_inputs(q, k, v, g, w)
    return thunder_nb.analyze(jfn)


def test_dropout_attention_and_its_backward_stay_out_of_the_fixed_transforms_regions():
    report = _traced(FixedCUDAGraphTransform(), 0.1)
    kept_out = [i.op.callee for i in report.forward.islands if i.reason == "capture-dependent"]
    assert kept_out == ["sdpaex_grad_forward_scaled_dot_product_efficient_attention",
                        "sdpaex_scaled_dot_product_efficient_attention_backward"]
    for region in report.forward.regions:
        assert not any(o.callee in CAPTURE_DEPENDENT for o in region.ops), region.name
    assert [d for d in report.defects if d.is_error] == []


def test_the_checker_predicts_that_thunders_transform_kills_the_process():
    report = _traced(CUDAGraphTransform(), 0.1)
    crashes = [d for d in report.defects if d.severity == "crashes the process"]
    assert [d.rule for d in crashes] == ["capture-dependent-in-region"] * 2
    # NOTE: the forward that makes the seed and the backward that reads it
    assert [d.value for d in crashes] == ["out, lse, seed, offset", "gq, gk, gv, _"]
    assert "SIGSEGV" in crashes[0].message
    assert "crashes the process capture-dependent-in-region at CUDAGraph1" in render.report_text(report)


def test_attention_without_dropout_stays_inside_the_region():
    # NOTE: with a literal 0 the seed and offset are empty host tensors in both modes and the backward never reads
    # them: capturing is safe, and nanoGPT without dropout keeps its one region per trace
    report = _traced(FixedCUDAGraphTransform(), 0.0)
    assert not any(i.reason == "capture-dependent" for i in report.forward.islands)
    (region,) = report.forward.regions
    assert "sdpaex_grad_forward_scaled_dot_product_efficient_attention" in {o.callee for o in region.ops}
    assert all(d.severity != "crashes the process" for d in _traced(CUDAGraphTransform(), 0.0).defects)


def _llama2_inference(transform):
    from thunder.tests.llama2_model import ModelArgs, Transformer

    with FakeTensorMode(), torch.device("cuda"):
        model = Transformer(ModelArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, multiple_of=32,
                                      max_seq_len=16, dropout=0.0)).eval()
        tokens = torch.randint(0, 64, (1, 16))
    jfn = thunder.jit(model, transforms=[transform])
    with torch.no_grad():
        thunder.compile_data(jfn)._get_computation_and_inputs(tokens)
    return thunder_nb.analyze(jfn)


@pytest.mark.slow
def test_a_list_index_in_llama2_inference_is_an_island_of_the_fixed_transform():
    report = _llama2_inference(FixedCUDAGraphTransform())
    (island,) = [i for i in report.forward.islands if i.reason == "host-data"]
    assert island.op.callee == "Tensor.__getitem__"
    assert "[-1]" in island.op.text  # NOTE: llama2_model.py: `self.output(h[:, [-1], :])`
    assert [d for d in report.defects if d.is_error] == []


@pytest.mark.slow
def test_the_checker_says_a_list_index_fails_capture_in_thunders_region():
    report = _llama2_inference(CUDAGraphTransform())
    (defect,) = [d for d in report.defects if d.rule == "host-data-in-region"]
    assert defect.severity == "error" and defect.region == "CUDAGraph1"
    assert "refuses that copy during capture" in defect.message


def test_torch_tensor_of_a_list_inside_the_function_is_kept_out_too():
    def scale(x):
        return (x.sin() * torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)).cos() + 1

    with FakeTensorMode():
        x = torch.randn(4, device="cuda")
    jfn = thunder.jit(scale, transforms=[FixedCUDAGraphTransform()])
    thunder.compile_data(jfn)._get_computation_and_inputs(x)
    trace = thunder.last_traces(jfn)[-1]
    hazards = [capture_hazard(b) for b in trace.bound_symbols if not getattr(b.sym, "is_fusion", False)]
    assert ("host-data", "tensor") in hazards or any(h and h[0] == "host-data" for h in hazards), trace
    for b in trace.bound_symbols:
        if getattr(b.sym, "is_fusion", False):
            assert all(capture_hazard(s) is None for s in b.subsymbols)


@pytest.mark.slow
@pytest.mark.parametrize("transform", [lambda: stock_transform(False), FixedCUDAGraphTransform], ids=["stock", "fixed"])
def test_a_cpu_trace_has_no_capture_hazard(transform):
    # NOTE: nothing is captured on the CPU: no region is split, no defect predicted
    from thunder.tests.llama2_model import ModelArgs, Transformer

    model = Transformer(ModelArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, multiple_of=32,
                                  max_seq_len=16, dropout=0.0)).eval()
    jfn = thunder.jit(model, transforms=[transform()])
    with torch.no_grad():
        jfn(torch.randint(0, 64, (1, 16)))
    report = thunder_nb.analyze(jfn)
    assert not any(d.rule == "host-data-in-region" for d in report.defects)
    assert not any(i.reason == "host-data" for i in report.forward.islands)


# --- thunder's own limits, worded: the component that refuses and what to try ---------------------


def _traced_error(fn, *args):
    return thunder_nb.compare(fn, args, execute=False)


def test_torch_where_of_a_condition_names_thunders_front_end_and_the_users_line():
    def route(x):
        rows, cols = torch.where(x > 0)  # NOTE: litgpt's mixtral MoE routes tokens like this
        return x[rows, cols].sum()

    with pytest.raises(TraceError) as e:
        _traced_error(route, torch.randn(4, 4))
    text = str(e.value)
    assert "thunder's torch front end (thunder.torch.where) refuses it" in text
    assert "rows, cols = torch.where(x > 0)" in text and "three-argument torch.where(cond, a, b)" in text


def test_inplace_dropout_names_the_component_and_the_fix_and_the_fix_runs():
    drop = torch.nn.Dropout(0.1, inplace=True)

    def head(x):
        return drop(x.sin()).cos()

    with pytest.raises(TraceError, match=r"thunder\.torch\.dropout\) refuses it .*set inplace = False"):
        _traced_error(head, torch.randn(8))
    drop.inplace = False  # NOTE: what the message says to do
    assert _traced_error(head, torch.randn(8)).fixed.forward.regions is not None


def test_no_sdpa_leaves_thunders_sdpa_executor_out_and_keeps_the_others():
    jfn = thunder_nb.jit(lambda x: x * 2, executors=["no-sdpa"])
    names = [e.name for e in thunder.compile_data(jfn).executors_list]
    assert "sdpa" not in names and "torch" in names
    fused = thunder_nb.jit(lambda x: x * 2, executors=["torchcompile", "no-sdpa"])
    names = [e.name for e in thunder.compile_data(fused).executors_list]
    assert names.index("thunder_nb_torchcompile") < names.index("torch") and "sdpa" not in names
    plain = thunder_nb.jit(lambda x: x * 2)
    names = [e.name for e in thunder.compile_data(plain).executors_list]
    assert "thunder_nb_sdpa" in names and "sdpa" not in names  # NOTE: thunder's, with the checker below


def test_thunder_nb_jits_sdpa_executor_refuses_a_mask_broadcast_over_the_batch():
    """Issue #31 (KV-cache decoding): litgpt's decode step passes a mask of batch 1 with a query of batch B; thunder's
    sdpa executor takes it and its meta then fails the trace ("grad_forward_sdpa: Expected all inputs to have same
    batch_size"). thunder_nb.jit's copy of that executor refuses such a call, so torch's attention runs it."""
    import thunder.torch as ltorch
    from thunder.core.proxies import tensorproxy
    from thunder.core.trace import TraceCtx, tracectx

    from thunder_nb.cudagraph.executors import checked_sdpa

    checker = checked_sdpa().implmap[ltorch.scaled_dot_product_attention.id].checker
    with FakeTensorMode():
        q, k, v = (torch.randn(2, 4, 1, 16, device="cuda") for _ in range(3))
        mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device="cuda")
        flat = torch.randn(2, 4, 16, device="cuda")
    with tracectx(TraceCtx()):
        pq, pk, pv, pm, pf = (tensorproxy(t, name=n) for t, n in zip((q, k, v, mask, flat), "qkvmf"))
        assert checker(pq, pk, pv, pm, 0.0, False, scale=None) is False
        assert checker(pf, pf, pf, None, 0.0, False, scale=None) is False  # NOTE: the meta wants 4 dimensions too
