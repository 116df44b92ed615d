"""The analysis model and the static checker, on real thunder 0.2.6 traces (CPU)."""

from __future__ import annotations

import textwrap

import pytest
import thunder
import torch
from thunder.transforms.cudagraph import CUDAGraphTransform

import programs
import thunder_nb
from thunder_nb.diagnosis.analysis import analyze_source, classify_op, estimate_kernels, parse_type
from thunder_nb.diagnosis.model import TypeInfo
from thunder_nb.diagnosis.judge import assert_equal


def jit_and_call(fn, *args, transform=None, **jit_kwargs):
    """Compile ``fn`` with a CUDA-graph transform, call it, and return (jfn, error or None)."""
    jfn = thunder.jit(fn, transforms=[transform or CUDAGraphTransform()], **jit_kwargs)
    try:
        jfn(*args)
    except Exception as e:  # capture fails without a GPU; the traces stay
        return jfn, e
    return jfn, None


def by_rule(defects):
    return sorted((d.rule, d.region or "top", d.value) for d in defects)


# --- thunder's stock transform -----------------------------------------------------------------


def test_seed_reproducer_under_stock_transform():
    jfn, err = jit_and_call(programs.seed, programs.vec())
    report = thunder_nb.analyze(jfn, error=err)
    assert report.function == "seed" and report.transform == "stock"
    assert report.error.startswith("RuntimeError")  # no GPU: capture fails, traces stay
    fwd = report.forward
    assert report.backward is None
    # one region holding the sum and (wrongly, #727) the item
    (region,) = fwd.regions
    assert (region.name, region.inputs, region.outputs) == ("CUDAGraph1", ("x",), ("f10",))
    assert [o.callee for o in region.compute_ops] == ["torch.sum", "Tensor.item"]
    assert region.static_mask == (False,)
    assert region.user_lines and all(u.code == "return x.sum().item()" for u in region.user_lines)
    assert [(i.reason, i.detail) for i in fwd.outside] == [("bookkeeping", "return")] and fwd.islands == ()
    # lifetimes
    x, t9, f10 = (fwd.value(n) for n in ("x", "t9", "f10"))
    assert x.defined is None and x.defined_in == "input" and x.crosses_region_boundary
    assert [s.label() for s in x.dels] == ["CUDAGraph1[1]@0"]
    assert t9.defined_in == "CUDAGraph1" and not t9.crosses_region_boundary
    assert [s.label() for s in t9.uses] == ["CUDAGraph1[2]@0"]
    assert f10.is_scalar and f10.returned and f10.crosses_region_boundary
    # defects: #727 (item captured) and the region deleting its input x
    assert by_rule(report.defects) == [
        ("host-sync-in-region", "CUDAGraph1", "f10"),
        ("region-deletes-outside-value", "CUDAGraph1", "x"),
    ]
    sync = next(d for d in report.defects if d.rule == "host-sync-in-region")
    assert region.source.splitlines()[sync.line - 1].strip().startswith("f10 = Tensor.item(t9)")
    assert sync.severity == "error" and sync.hint


def test_island_program_under_stock_transform():
    jfn, err = jit_and_call(programs.island, programs.vec())
    fwd = thunder_nb.analyze(jfn, error=err).forward
    (region,) = fwd.regions  # consecutive fusion swallows the item: no island at all
    assert [o.callee for o in region.compute_ops] == [
        "torch.sin", "torch.cos", "torch.sum", "Tensor.item", "torch.mul", "torch.exp",
    ]
    assert fwd.user_islands == ()
    assert by_rule(fwd.defects) == [
        ("host-sync-in-region", "CUDAGraph1", "f20"),
        ("region-deletes-outside-value", "CUDAGraph1", "x"),
        ("returned-graph-memory", "top", "t22"),
    ]
    f20 = fwd.value("f20")
    assert f20.is_scalar and f20.defined_in == "CUDAGraph1" and not f20.crosses_region_boundary


def test_mlp_forward_and_backward_under_stock_transform():
    jfn, err = jit_and_call(programs.mlp, *programs.mlp_inputs())
    report = thunder_nb.analyze(jfn, error=err)
    fwd, bwd = report.forward, report.backward
    assert bwd is not None and bwd.kind == "backward" and bwd.name == "backward_fn"
    (r1,) = fwd.regions
    assert (r1.inputs, r1.outputs) == (("x", "w1", "w2"), ("t47", "t48", "t52"))
    (r2,) = bwd.regions
    assert (r2.name, r2.inputs, r2.outputs) == ("CUDAGraph2", ("t27", "w2", "t48", "t47", "x"), ("t58", "t61"))
    # in backward the saved tensors that forward's graph produced (t48, t47) are static inputs
    assert r2.static_mask == (False, False, True, True, False)
    assert {i.reason for i in bwd.outside} == {"bookkeeping", "collection"} and bwd.islands == ()
    # the region swallowed the outer dels: every region input stays alive to the end of backward
    assert by_rule(bwd.defects) == sorted(
        [("never-freed", "top", n) for n in ("t27", "w2", "t48", "t47", "x")]
        + [("region-deletes-outside-value", "CUDAGraph2", n) for n in ("t27", "w2", "t48", "t47", "x")]
        # the gradients are CUDAGraph2's output buffers, handed to autograd as they are
        + [("returned-graph-memory", "top", n) for n in ("t58", "t61")]
    )
    assert by_rule(fwd.defects) == [
        ("region-deletes-outside-value", "CUDAGraph1", n) for n in ("w1", "w2", "x")
    ] + [
        ("returned-graph-memory", "top", "t52"),  # the loss is CUDAGraph1's output buffer
        ("saved-graph-memory", "top", "t47"),  # activations saved for the backward in graph memory
        ("saved-graph-memory", "top", "t48"),
    ]


def test_saved_scalar_backward_asserts_in_stock_transform():
    x, w = programs.vec(), programs.vec(seed_=1).requires_grad_()
    jfn, err = jit_and_call(programs.saved_scalar, x, w)
    assert isinstance(err, AssertionError)  # THUNDER.md: hard-coded bound_symbols[2]/[9]
    report = thunder_nb.analyze(jfn, error=err)
    assert "backward trace has no regions" in report.notes[0]


def test_device_transfer_program_on_a_cuda_trace_built_without_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    jfn = thunder.jit(programs.transfer, transforms=[CUDAGraphTransform()])
    with FakeTensorMode():
        x = torch.randn(8, device="cuda")
    thunder.compile_data(jfn)._get_computation_and_inputs(x)
    fwd = thunder_nb.analyze(jfn).forward
    assert fwd.is_cuda
    (region,) = fwd.regions
    assert [o.callee for o in region.compute_ops] == ["torch.sin", "Tensor.cpu", "torch.mul", "Tensor.to", "torch.add"]
    assert by_rule(fwd.defects) == [
        ("cpu-op-in-region", "CUDAGraph1", "t11"),  # cpu(): cuda:0 -> cpu
        ("cpu-op-in-region", "CUDAGraph1", "t12"),  # mul on CPU tensors
        ("cpu-op-in-region", "CUDAGraph1", "t13"),  # to(cuda): cpu -> cuda:0
        ("region-deletes-outside-value", "CUDAGraph1", "x"),
        ("returned-graph-memory", "top", "t14"),  # thunder hands out its static output buffer
    ]


# --- the checker on source text (defects no thunder 0.2.6 trace produces) -----------------------


ISSUE_728 = textwrap.dedent(
    '''
    def CUDAGraph1(x):
      t0 = torch.sum(x, None, False, dtype=None)  # t0: "cuda:0 f32[]"
      del x
      del t0
      return [t0]
    '''
)


def test_use_after_del_in_728_region_text():
    defects = thunder_nb.check(ISSUE_728)
    assert [(d.rule, d.region, d.value, d.line) for d in defects] == [
        ("region-deletes-outside-value", "CUDAGraph1", "x", 4),
        ("region-deletes-output", "CUDAGraph1", "t0", 5),
        ("use-after-del", "CUDAGraph1", "t0", 6),
    ]
    uad = next(d for d in defects if d.rule == "use-after-del")
    assert uad.line == 6 and "del t0" in uad.message


def test_top_level_rules_on_text():
    src = textwrap.dedent(
        '''
        def computation(x):
          # x: "cuda:0 f32[8]"
          [t1, f2] = CUDAGraph1(x)
          del t1
          t3 = torch.exp(t1)  # t3: "cuda:0 f32[8]"
          t4 = torch.neg(x)  # t4: "cuda:0 f32[8]"
          del t3
          del t3
          [t5] = CUDAGraph2(t4, f2)
          return (t5,)

        def CUDAGraph1(x):
          t1 = torch.sin(x)  # t1: "cuda:0 f32[8]"
          f2 = Tensor.item(t1)  # f2: "float ?"
          return [t1, f2]

        def CUDAGraph2(t4, f2):
          del t4
          t5 = torch.mul(f2, f2)  # t5: "cuda:0 f32[8]"
          return [t5]
        '''
    )
    assert by_rule(thunder_nb.check(src)) == [
        ("dead-region-input", "CUDAGraph2", "t4"),
        ("double-del", "top", "t3"),
        ("host-sync-in-region", "CUDAGraph1", "f2"),
        ("never-freed", "top", "t4"),
        ("region-deletes-outside-value", "CUDAGraph2", "t4"),
        ("scalar-region-input", "CUDAGraph2", "f2"),
        ("use-after-del", "top", "t1"),
    ]


def test_check_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="not valid Python"):
        thunder_nb.check("def f(:\n")
    with pytest.raises(TypeError, match="Report, a thunder trace or source text"):
        thunder_nb.check(42)


def test_analyze_before_any_call_says_so():
    jfn = thunder.jit(programs.seed, transforms=[CUDAGraphTransform()])
    with pytest.raises(ValueError, match="call it once"):
        thunder_nb.analyze(jfn)


# --- the shared op classifier ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cuda:0 f32[8, 16]", TypeInfo("tensor", "f32", (8, 16), "cuda:0", "cuda:0 f32[8, 16]")),
        ("cpu bf16[]", TypeInfo("tensor", "bf16", (), "cpu", "cpu bf16[]")),
        ("float ?", TypeInfo("number", "float", None, None, "float ?")),
        ("int 5", TypeInfo("number", "int", None, None, "int 5")),
        ("Collection", TypeInfo("collection", None, None, None, "Collection")),
    ],
)
def test_parse_type(text, expected):
    assert parse_type(text) == expected


def test_classify_op():
    cuda = TypeInfo("tensor", "f32", (8,), "cuda:0")
    cpu = TypeInfo("tensor", "f32", (8,), "cpu")
    num = TypeInfo("number", "float")
    assert classify_op("Tensor.item", [cuda], [num]) == ("host-sync", "item")
    assert classify_op("ltorch.whatever", [cuda], [num]) == ("host-sync", "whatever")
    assert classify_op("Tensor.size", [cuda], [num]) is None  # metadata: no sync
    assert classify_op("Tensor.to", [cpu], [cuda]) == ("device-transfer", "cpu -> cuda:0")
    assert classify_op("torch.mul", [cpu], [cpu], cuda_trace=True) == ("cpu-op", "mul")
    assert classify_op("torch.mul", [cpu], [cpu], cuda_trace=False) is None
    assert classify_op("torch.sin", [cuda], [cuda], cuda_trace=True) is None
    assert classify_op("torch.sin", [cuda], [cuda], sync_tag=True) == ("host-sync", "sin")


def test_no_false_positive_on_a_clean_fixed_trace_source():
    src = textwrap.dedent(
        '''
        def computation(x):
          # x: "cuda:0 f32[8]"
          [t1] = CUDAGraph1(x)
          del x
          f2 = Tensor.item(t1)  # f2: "float ?"
          del t1
          return (f2,)

        def CUDAGraph1(x):
          t0 = torch.sin(x)  # t0: "cuda:0 f32[8]"
          t1 = torch.sum(t0, None, False, dtype=None)  # t1: "cuda:0 f32[]"
          del t0
          return [t1]
        '''
    )
    assert thunder_nb.check(src) == []
    tr = analyze_source(src)
    assert [(i.reason, i.detail) for i in tr.outside] == [("host-sync", "item"), ("bookkeeping", "return")]


def test_analyze_trace_gives_a_report_of_one_trace():
    jfn = thunder.jit(programs.island, transforms=[CUDAGraphTransform()])
    try:
        jfn(programs.vec())
    except Exception:
        pass
    report = thunder_nb.analyze_trace(thunder.last_traces(jfn)[-1])
    assert isinstance(report, thunder_nb.Report) and report.transform == "stock"
    assert report.forward.regions[0].name == "CUDAGraph1" and "host-sync-in-region" in report.rules
    assert thunder_nb.check(report) == list(report.defects)


# --- kernels per region ------------------------------------------------------------------------


def five_and_a_view(x):
    """Five elementwise ops and a view: five kernels."""
    a = torch.sin(x) * 2.0
    b = torch.cos(a).reshape(-1)
    return torch.tanh(b + 1.0)


def test_kernels_count_ops_that_launch_work_and_not_views():
    jfn, _ = jit_and_call(five_and_a_view, programs.vec())
    (region,) = thunder_nb.analyze(jfn).forward.regions
    bases = [o.callee.rsplit(".", 1)[-1] for o in region.compute_ops]
    assert sorted(bases) == sorted(["sin", "mul", "cos", "reshape", "add", "tanh"])
    assert region.kernels == 5 and region.launches_saved == 4 and region.fusions == ()


def test_estimate_kernels_leaves_out_number_arithmetic_and_same_dtype_conversions():
    source = textwrap.dedent(
        '''\
        def CUDAGraph1(x, f1):
          # x: "cuda:0 f32[8]"
          # f1: "float ?"
          f2 = operator.mul(f1, 2.0)  # f2: "float ?"
          t3 = Tensor.to(x, torch.float32)  # t3: "cuda:0 f32[8]"
          t4 = Tensor.to(t3, torch.bfloat16)  # t4: "cuda:0 bf16[8]"
          t5 = torch.mul(t4, f2)  # t5: "cuda:0 bf16[8]"
          t6 = TorchCompile0(t5)  # t6: "cuda:0 bf16[8]"
          del t3
          return [t6]
        '''
    )
    (region,) = analyze_source(source).regions
    assert [g.name for g in region.fusions] == ["TorchCompile0"] and region.fusions[0].ops == ()
    # the bf16 conversion, the mul and the fusion; not the number arithmetic, the same-dtype `to` or the del
    assert region.kernels == 3
    ops = region.ops
    assert estimate_kernels(ops, {}) == 5  # NOTE: without types every call but the del counts
    assert estimate_kernels(ops[:1], {"f1": TypeInfo("number"), "f2": TypeInfo("number")}) == 0


@pytest.mark.slow
def test_kernels_of_a_region_with_an_inductor_fusion():
    from thunder_nb.cudagraph.executors import executor_list
    from thunder_nb.fix import FixedCUDAGraphTransform
    from thunder_nb.testing.emulate import emulated_capture

    transform = FixedCUDAGraphTransform(capture=False)
    transform.cuda_graph_runner.capture = True  # NOTE: emulated_capture takes the capture path on the CPU
    jfn = thunder.jit(five_and_a_view, transforms=[transform], executors=executor_list(["torchcompile"]))
    with emulated_capture():
        x = programs.vec()
        assert_equal(jfn(x), five_and_a_view(x))
    report = thunder_nb.analyze(jfn)
    (region,) = report.forward.regions
    (group,) = region.fusions
    assert group.name.startswith("TorchCompile") and group.executor == "inductor"
    assert group.ops == ("sin", "mul", "cos", "reshape", "add", "tanh")
    assert [o.callee for o in region.compute_ops] == [group.name]
    assert region.kernels == 1 and region.launches_saved == 0 and report.launch_us_saved == 0
    assert str(group) == f"{group.name}: 6 ops fused (inductor)"


def test_estimate_kernels_counts_no_kernel_for_thunders_alias_and_reshape_prims():
    """thunder's torch executor writes its prims by their implementation names: shallow_copy (an alias) and the reshape
    prim (a view of a contiguous tensor) launch nothing; in the nanoGPT forward they were 41 of 142 ops counted."""
    source = textwrap.dedent(
        '''\
        def CUDAGraph1(x):
          # x: "cuda:0 f32[2, 4]"
          t1 = shallow_copy(x)  # t1: "cuda:0 f32[2, 4]"
          t2 = torch_prims_reshape_impl(t1, (8,))  # t2: "cuda:0 f32[8]"
          t3 = torch.sin(t2)  # t3: "cuda:0 f32[8]"
          return [t3]
        '''
    )
    (region,) = analyze_source(source).regions
    assert region.kernels == 1
