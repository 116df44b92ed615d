"""Collectives in the diagnosis (issue 52): thunder's ``ddp`` and ``fsdp`` put ``all_reduce``, ``all_gather``,
``reduce_scatter`` and their ``wait`` in the traces; the report calls them what they are (islands of reason
"collective", drawn as collectives), and the checker finds where a graph would hold them (``collective-in-region``)
or where a collective's handle goes into or out of a region (``handle-crosses-region``).

The traces are thunder's own: ``ddp``/``fsdp`` around ``thunder.jit(model, transforms=[CUDAGraphTransform()])``
against the same around ``thunder_nb.jit(model)``, built under torch.distributed on gloo with one process (a world
of size 1 still puts every collective in the traces). Without a GPU the traces are built, not run (thunder's runner
needs CUDA); the source-text tests need no process group at all.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import thunder
import torch
from thunder.transforms.cudagraph import CUDAGraphTransform

import thunder_nb
from thunder_nb.diagnosis.analysis import analyze_source
from thunder_nb.diagnosis.model import ERROR_RULES, Defect
from thunder_nb.diagnosis.ops import COLLECTIVE_NAMES, classify_bsym, classify_op, parse_type
from thunder_nb.testing import fuzz

NEW_RULES = ("collective-in-region", "handle-crosses-region")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def found(defects, rule: str) -> list[Defect]:
    return [d for d in defects if d.rule == rule]


@pytest.fixture(scope="module")
def world():
    """torch.distributed on gloo, one process (a FileStore in a temporary file): what ``ddp`` and ``fsdp`` need."""
    import torch.distributed as dist

    if dist.is_initialized():  # NOTE: another module's group: use it as it is
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "init"), rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def traced(wrap: str, compile_model) -> object:
    """``ddp`` or ``fsdp`` around ``compile_model(model)``, its traces built for one batch (nothing runs)."""
    from thunder.distributed import ddp, fsdp

    jfn = compile_model(make_model())
    module = ddp(jfn) if wrap == "ddp" else fsdp(jfn, device=torch.device("cpu"))
    thunder.compile_data(module)._get_computation_and_inputs(torch.randn(6, 4))
    return module


def stock(model):
    return thunder.jit(model, transforms=[CUDAGraphTransform()])


@pytest.fixture(scope="module")
def reports(world):
    """The report of each configuration: thunder's transform and thunder-nb's, under ``ddp`` and ``fsdp``."""
    return {
        (wrap, name): thunder_nb.analyze(traced(wrap, compile_model))
        for wrap in ("ddp", "fsdp")
        for name, compile_model in (("stock", stock), ("fixed", thunder_nb.jit))
    }


# --- the classification: one place for the transform and the checker ---------------------------------------------


def test_collectives_are_classified_by_name_and_by_their_handle():
    """By name (the prim, or thunder's torch executor's implementation of it), or by a communication handle taken or
    made: ``("collective", <the collective>)``; pack and unpack (copies into a bucket) may join a region."""
    tensor, future = parse_type("cpu f32[4]"), parse_type("FUTURE thunder.devices.Device(type='cpu') f32[4]")
    assert classify_op("torch_all_reduce_prim_impl", [tensor], [future]) == ("collective", "all_reduce")
    assert classify_op("torch_wait_prim_impl", [future], [tensor]) == ("collective", "wait")
    assert classify_op("reduce_scatter", [tensor], [tensor]) == ("collective", "reduce_scatter")
    assert classify_op("some_op", [future], [tensor]) == ("collective", "some_op")
    assert {"all_gather", "torch_all_gather_prim_impl", "synchronize", "stash_grad_for_fsdp"} <= COLLECTIVE_NAMES
    assert not {"pack", "unpack", "torch_pack_prim_impl", "pack_for_fsdp"} & COLLECTIVE_NAMES


def test_every_new_rule_is_an_error_the_fuzzer_knows():
    """Error severity (`ERROR_RULES`), and an entry in the fuzzer's table of how each error rule shows (it refuses to
    run without one); eagerly neither shows, since a region run as Python launches and waits each call."""
    for rule in NEW_RULES:
        assert rule in ERROR_RULES
        defect = Defect(rule, "backward", "CUDAGraph1", "ft1", 1, "", "")
        assert defect.severity == "error"
        assert fuzz.shows(defect, False) == "never" and fuzz.shows(defect, True) == "may"


# --- the checker on source text ------------------------------------------------------------------------------------

SPLIT = '''\
def computation(x):
  # x: "cpu f32[4]"
  [ft1] = CUDAGraph1(x)
  [t2] = CUDAGraph2(ft1)
  return t2

def CUDAGraph1(x):
  # x: "cpu f32[4]"
  t0 = torch.sin(x)  # t0: "cpu f32[4]"
  ft1 = torch_all_reduce_prim_impl(t0, _DistributedReduceOps_SUM_0, _ProcessGroup_1, True, False)  # ft1: "FUTURE thunder.devices.Device(type='cpu') f32[4]"
  return [ft1]

def CUDAGraph2(ft1):
  t2 = torch_wait_prim_impl(ft1)  # t2: "cpu f32[4]"
  t3 = torch.cos(t2)  # t3: "cpu f32[4]"
  return [t3]
'''


def test_a_wait_in_another_region_than_its_collective():
    """The all-reduce in one region, its wait in the next: the handle leaves one graph and enters the other. One
    defect for the handle, in the region that waits, naming both; each collective in a region is one more."""
    trace = analyze_source(SPLIT)
    (crossing,) = found(trace.defects, "handle-crosses-region")
    assert (crossing.region, crossing.value) == ("CUDAGraph2", "ft1")
    assert "all_reduce launched in CUDAGraph1" in crossing.message and "waits for it" in crossing.message
    assert "capture refuses a wait on work launched outside it" in crossing.message
    inside = found(trace.defects, "collective-in-region")
    assert sorted((d.region, d.value) for d in inside) == [("CUDAGraph1", "ft1"), ("CUDAGraph2", "t2")]
    assert "the collective all_reduce is recorded into a CUDA graph" in inside[0].message


def test_a_handle_a_region_hands_out_to_a_wait_at_top_level():
    source = SPLIT.replace("[t2] = CUDAGraph2(ft1)", "t2 = torch_wait_prim_impl(ft1)  # t2: \"cpu f32[4]\"")
    source = source[:source.index("def CUDAGraph2")]
    trace = analyze_source(source)
    (crossing,) = found(trace.defects, "handle-crosses-region")
    assert (crossing.region, crossing.value) == ("CUDAGraph1", "ft1")
    assert "hands out its handle ft1, which is read at top level (wait)" in crossing.message
    assert "the recording's collective, not the replay's" in crossing.message
    # NOTE: the wait at top level is an island of reason "collective", never an unfused op
    assert [(i.reason, i.detail) for i in trace.islands] == [("collective", "wait")]


def test_a_collective_and_its_wait_at_top_level_are_no_defect():
    source = '''\
def computation(x):
  # x: "cpu f32[4]"
  [t0] = CUDAGraph1(x)
  ft1 = torch_all_reduce_prim_impl(t0, _DistributedReduceOps_SUM_0, _ProcessGroup_1, True, False)  # ft1: "FUTURE thunder.devices.Device(type='cpu') f32[4]"
  del t0
  t2 = torch_wait_prim_impl(ft1)  # t2: "cpu f32[4]"
  del ft1
  return t2

def CUDAGraph1(x):
  # x: "cpu f32[4]"
  t0 = torch.sin(x)  # t0: "cpu f32[4]"
  return [t0]
'''
    trace = analyze_source(source)
    assert not [d for d in trace.defects if d.rule in NEW_RULES]
    assert [(i.name, i.label) for i in trace.islands] == [("island1", "collective: all_reduce"),
                                                         ("island3", "collective: wait")]


# --- thunder's traces: the stock transform against the fixed one ---------------------------------------------------


@pytest.mark.slow
def test_the_stock_transform_captures_ddps_all_reduces_and_their_waits(reports):
    """``ddp(thunder.jit(model, transforms=[CUDAGraphTransform()]))``: thunder's can_fuse takes the all-reduces and
    their waits into the backward's region; each is a ``collective-in-region`` error. Around ``thunder_nb.jit`` they
    run outside the graphs: no defect at all."""
    report = reports[("ddp", "stock")]
    inside = found(report.defects, "collective-in-region")
    assert {d.trace for d in inside} == {"backward"}
    callees = sorted(d.message.split(" ", 1)[0] for d in inside)
    assert callees == ["torch_all_reduce_prim_impl"] * 4 + ["torch_wait_prim_impl"] * 4
    assert all(d.severity == "error" and d.region == report.backward.regions[0].name for d in inside)
    assert not found(report.defects, "handle-crosses-region")  # NOTE: each handle stays inside the one region
    assert thunder_nb.check(reports[("ddp", "fixed")]) == []


@pytest.mark.slow
def test_the_stock_transform_waits_inside_a_region_for_fsdps_all_gathers_launched_outside(reports):
    """``fsdp(thunder.jit(model, transforms=[CUDAGraphTransform()]))``: the forward launches three all-gathers at top
    level (one-op groups) and waits for them inside the region that launches the fourth: three handles cross into it.
    The backward's reduce-scatters and waits are all inside its region. The fixed transform: neither rule."""
    report = reports[("fsdp", "stock")]
    crossing = found(report.defects, "handle-crosses-region")
    assert len(crossing) == 3 and {(d.trace, d.region) for d in crossing} == {("forward", "CUDAGraph1")}
    assert all("the handle of all_gather launched at top level, and waits for it" in d.message for d in crossing)
    inside = {(d.trace, d.message.split(" ", 1)[0]) for d in found(report.defects, "collective-in-region")}
    assert inside == {("forward", "torch_all_gather_prim_impl"), ("forward", "torch_wait_prim_impl"),
                      ("backward", "torch_reduce_scatter_prim_impl"), ("backward", "torch_wait_prim_impl")}
    assert not [d for d in reports[("fsdp", "fixed")].defects if d.rule in NEW_RULES]


@pytest.mark.slow
def test_the_report_and_the_diagram_call_collectives_collectives(reports):
    """The fixed transform's backward under ``ddp``: the launches and waits are islands of reason "collective" (the
    report called them unfused ops, "capturable, but no region took it"), drawn as arrow boxes with a legend line."""
    from thunder_nb.render.dot import region_diagram

    report = reports[("ddp", "fixed")]
    backward = report.backward
    assert [i.label for i in backward.islands] == ["collective: all_reduce"] * 4 + ["collective: wait"] * 4
    assert not backward.unfused
    text = report.to_text()
    assert "collective: all_reduce: ft" in text and "unfused: torch_all_reduce_prim_impl" not in text
    source = region_diagram(backward).source
    assert source.count("shape=cds") == 8 and "collective: wait" in source
    assert "arrow box: a collective or its wait" in source
    merged = region_diagram(backward, collapse=True).source  # NOTE: a large model's: adjacent collectives, one node
    assert merged.count("shape=cds") == 1 and "all_reduce ×4, wait ×4" in merged


@pytest.mark.slow
def test_the_transform_asks_the_classifier(world):
    """The fixed transform keeps what `classify_bsym` calls a collective out of its regions (no check of its own):
    the backward's collectives, each classified so, all sit at top level."""
    module = traced("ddp", thunder_nb.jit)
    backward = thunder.last_backward_traces(module)[-1]
    top = [b for b in backward.bound_symbols if classify_bsym(b) is not None]
    assert sorted({classify_bsym(b) for b in top}) == [("collective", "all_reduce"), ("collective", "wait")]
    for b in backward.bound_symbols:
        if getattr(b.sym, "is_fusion", False):
            assert all(classify_bsym(s) is None for s in b.subsymbols), b.sym.name


@pytest.mark.slow
def test_ddp_around_thunder_nb_jit_with_inductor_keeps_the_collectives_out_of_its_fusions(world):
    """``ddp(thunder_nb.jit(model, executors=["torchcompile"]))``: thunder-nb's inductor executor asks the same
    classifier, so no all-reduce enters an inductor fusion (one did before the classifier knew collectives, and
    ``ddp``'s bucketing then failed with IndexError looking for the gradient inside the fusion)."""
    module = traced("ddp", lambda m: thunder_nb.jit(m, executors=["torchcompile"]))
    backward = thunder.last_backward_traces(module)[-1]
    top = [b.sym.name for b in backward.bound_symbols]
    assert top.count("torch_all_reduce_prim_impl") == 4 and top.count("torch_wait_prim_impl") == 4
    assert thunder_nb.check(thunder_nb.analyze(module)) == []
