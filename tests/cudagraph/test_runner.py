"""The runner's per-call work: its cache key against thunder's, the batched copy-out, hand-out plans, recapture causes."""

from __future__ import annotations

import re
import warnings

import pytest
import thunder
import torch
from thunder.transforms.cudagraph import to_arg_descriptor

import thunder_nb
from thunder_nb import internals
from thunder_nb.cudagraph.keys import KeyAgain, descriptor
from thunder_nb.cudagraph.runner import ThunderNBRunner
from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.testing import emulated_capture
from thunder_nb.testing.models import model_case
from thunder_nb.testing.modes import make_transform
from thunder_nb.diagnosis.judge import assert_equal


def emulated(**options) -> FixedCUDAGraphTransform:
    return make_transform(FixedCUDAGraphTransform, "emulated", **options)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def args_of_every_kind() -> tuple:
    base = torch.arange(24.0).reshape(4, 6)
    return (
        base,
        base.t(),  # transposed view
        base[1:, ::2],  # strided view with an offset
        torch.nn.Parameter(torch.ones(3)),
        torch.zeros(2, dtype=torch.int64),
        torch.tensor(2.5),  # 0-d
        torch.empty(0, 3),  # no elements
        3, 2.0, True, None, "s", (1, 2),
    )


def test_the_key_describes_inputs_as_thunders_descriptor_does():
    runner = ThunderNBRunner(capture=True)
    args = args_of_every_kind()
    mask, key = runner.key("CUDAGraph1", args)
    assert descriptor(key[2]) == to_arg_descriptor(*args)
    assert descriptor(runner.key("CUDAGraph1", ())[1][2]) == to_arg_descriptor()
    # NOTE: a parameter is read in place (and views of its memory from then on); plain tensors are copied
    assert mask == (False, False, False, True) + (False,) * 9
    assert key[3] == (args[3].data_ptr(),)


def test_the_key_reads_module_buffers_parameter_views_and_graph_memory_in_place_and_demoted_inputs_not():
    runner = ThunderNBRunner(capture=True)
    counts = runner.counts("CUDAGraph1")
    weight = torch.nn.Parameter(torch.randn(4, 4))
    buffer, plain, owned = torch.randn(4), torch.randn(4), torch.randn(8)
    runner.stable_inputs["CUDAGraph1"] = frozenset({1})
    runner.memory.own(owned.untyped_storage().data_ptr(), object())
    args = (weight.detach().t(), buffer, plain, owned[2:], weight)
    mask, key = runner.key("CUDAGraph1", args)
    # NOTE: the transposed weight comes before the weight itself: not yet known, so copied on this first call
    assert mask == (False, True, False, True, True)
    mask, key = runner.key("CUDAGraph1", args)
    assert mask == (True, True, False, True, True)
    assert key[3] == tuple(a.data_ptr() for a, m in zip(args, mask) if m)
    counts.demoted[3] = "owned: took too many addresses"
    assert runner.key("CUDAGraph1", args)[0] == (True, True, False, False, True)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(5, 7),
    lambda: torch.randn(7, 5).t(),
    lambda: torch.randn(4, 6)[:, ::2],
    lambda: torch.randn(3, 1).expand(3, 4),  # overlapping: clone makes it dense
    lambda: torch.randn(2, 3, 4).permute(2, 0, 1),
    lambda: torch.randn(0, 3),
    lambda: torch.tensor(float("nan")),
    lambda: torch.randint(0, 9, (6,), dtype=torch.int32),
    lambda: torch.randn(4, dtype=torch.bfloat16),
], ids=["dense", "transposed", "strided", "expanded", "permuted", "empty", "0-d nan", "int32", "bf16"])
def test_copy_all_lays_out_and_copies_each_tensor_as_clone_does(make):
    tensors = [make(), make(), torch.randn(3)]
    copies = internals.copy_all(tensors)
    for t, c in zip(tensors, copies):
        ref = t.clone()
        assert c.dtype == ref.dtype and c.shape == ref.shape and c.stride() == ref.stride()
        assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or t.numel() == 0
        assert torch.equal(bits(c), bits(ref))
    assert all(c.untyped_storage().data_ptr() != d.untyped_storage().data_ptr()
               for c, d in zip(copies, copies[1:]) if c.numel() and d.numel())


def test_copy_all_clones_where_autograd_records_the_copy_and_keeps_subclasses():
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    x, y = internals.copy_all([a * 2, b * 3])
    assert x.grad_fn is not None and y.grad_fn is not None
    (x.sum() + y.sum()).backward()
    assert torch.equal(a.grad, torch.full((3,), 2.0)) and torch.equal(b.grad, torch.full((3,), 3.0))
    p = torch.nn.Parameter(torch.randn(2))
    with torch.no_grad():
        copies = internals.copy_all([p, torch.randn(2)])
    assert type(copies[0]) is type(p.clone()) and torch.equal(copies[0], p.detach())


def test_hand_out_takes_actions_as_any_sequence_and_plans_each_length_apart():
    with emulated_capture():  # NOTE: a real recording of a region, so that its outputs lie in memory the runner owns
        t = emulated(rotation=0)  # NOTE: "copy" copies (rotation would hand out a forward's returned tensor as it lies)
        jfn = thunder.jit(lambda x: (x.exp(), x.sin()), transforms=[t])
        jfn(torch.randn(4))
    runner = t.cuda_graph_runner
    (inst,) = runner.cuda_graph_cache[runner.counts("CUDAGraph1").last_key]
    out0, out1 = inst.static_outputs
    before = runner.hand_out_stats("forward")
    elsewhere = torch.randn(4)
    handed = runner.hand_out("forward", ["copy", "guard", "as-is"], out0, out1, elsewhere)
    assert handed[2] is elsewhere
    assert torch.equal(handed[0], out0) and handed[0].untyped_storage().data_ptr() != out0.untyped_storage().data_ptr()
    # NOTE: a guarded tensor goes out as it is, watched: held while anything outside the runner references it
    assert handed[1] is out1 and inst.held()
    del out1, handed
    assert not inst.held()
    # NOTE: the same actions over fewer tensors: a plan of its own (the first two actions only)
    handed = runner.hand_out("forward", ("copy", "guard", "as-is"), out0, inst.static_outputs[1])
    assert len(handed) == 2 and handed[1] is inst.static_outputs[1] and inst.held()
    del handed
    assert not inst.held()
    # NOTE: a returned tensor sharing memory with a saved one is guarded with it, not copied: a fresh alias
    handed = runner.hand_out("forward", ("copy", "guard"), out0[1:], out0)
    assert handed[0].data_ptr() == out0[1:].data_ptr() and handed[1] is out0 and handed[0] is not out0
    del out0
    assert inst.held()
    alias = handed.pop(0)
    del handed
    assert inst.held()  # NOTE: the alias alone holds the storage
    del alias
    assert not inst.held()
    stats = runner.hand_out_stats("forward")
    assert (stats.calls - before.calls, stats.copied - before.copied, stats.guarded - before.guarded) == (3, 2, 4)


def test_a_lent_tensor_that_is_not_the_graphs_own_object_is_lent_and_watched_by_its_storage():
    """A lent position holding another object in graph memory (a view made outside the region) takes the per-call path.

    It goes out as a fresh alias, and its instance is held while that alias lives, as a lent own output is.
    """
    with emulated_capture():
        t = emulated()
        jfn = thunder.jit(lambda x: (x.exp(), x.sin()), transforms=[t])
        jfn(torch.randn(4))
    runner = t.cuda_graph_runner
    (inst,) = runner.cuda_graph_cache[runner.counts("CUDAGraph1").last_key]
    assert not inst.held()
    at = inst.static_outputs[0][1:].data_ptr()
    before = runner.hand_out_stats("backward")
    for _ in range(2):  # NOTE: no memo serves it: the same path on every call
        # NOTE: a view in the graph's memory, but not one of its output objects; gone once handed out
        (lent,) = runner.hand_out("backward", ("lend",), inst.static_outputs[0][1:])
        assert lent.data_ptr() == at and lent._base is None and inst.lent and inst.held()
        del lent
        assert not inst.held()
    stats = runner.hand_out_stats("backward")
    assert (stats.calls - before.calls, stats.lent - before.lent, stats.copied - before.copied) == (2, 2, 0)


def test_recapture_causes_name_the_input_and_what_changed():
    def island(x):
        y = x.sin().cos()
        s = y.sum().item()
        return (y * s).exp()

    def layer(x, w):
        return (x @ w).tanh()

    t = emulated(scalar_handoff=False)
    jfn = thunder.jit(island, transforms=[t])
    u = emulated()
    jlayer = thunder.jit(layer, transforms=[u])
    with emulated_capture(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            jfn(torch.randn(8, generator=torch.Generator().manual_seed(i)))
        x = torch.randn(2, 4)
        with torch.no_grad():
            for w in (torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4, 4))):
                jlayer(x, w)
    second = thunder_nb.analyze(jfn).forward.regions[1]
    causes = [g.cause for g in second.graphs]
    assert len(causes) == 3 and causes[0] == "first call", causes
    assert all(re.fullmatch(r"\w+: value -?\d+\.\d+(e-?\d+)? -> -?\d+\.\d+(e-?\d+)?", c) for c in causes[1:]), causes
    (region,) = thunder_nb.analyze(jlayer).forward.regions
    assert [g.cause for g in region.graphs] == [
        "first call", "w lies at another address (another tensor, e.g. another layer's weights)"]


@pytest.mark.slow
def test_a_training_step_replays_both_regions_with_the_same_hand_outs_every_step():
    """Steady state of a real training step: one graph per region, every saved tensor guarded, every gradient lent.

    The saved tensors go out as the forward graph's own tensors, watched by reference counts: once
    the backward has run they are free, and the forward instance replays again (one instance). The
    gradients go to autograd as aliases of the backward graph's memory, which become the parameters'
    ``.grad``; once reset, the backward instance replays again (one instance).
    """
    case = model_case("nanoGPT", "cpu", batch=2, seq=16, width=32, layers=1)  # NOTE: one block: as with two
    t = emulated()
    jfn = thunder.jit(case.step, transforms=[t])
    with emulated_capture():
        for seed in range(4):
            jfn(*case.make_batch(seed)).backward()
            grads = [p.grad for p in case.model.parameters()]
            runner = t.cuda_graph_runner
            # NOTE: the tied embedding/head weight gets two gradients, which autograd's engine adds out of place
            outside = [n for (n, _), g in zip(case.model.named_parameters(), grads) if runner.memory.where(g)[1] is None]
            assert outside == ["transformer.wte.weight"], outside
            del grads
            for p in case.model.parameters():
                p.grad = None
    report = thunder_nb.analyze(jfn)
    for region in report.forward.regions + report.backward.regions:
        assert len(region.graphs) == 1 and region.stats.replays == 4
    forward, backward = t.cuda_graph_runner.hand_out_stats("forward"), t.cuda_graph_runner.hand_out_stats("backward")
    plan = report.forward.hand_out
    in_graph = set(plan.saved) & set(plan.graph_memory)
    # NOTE: names that may lie in graph memory; those that do are guarded, the same ones at every step
    assert forward.calls == 4 and forward.guarded % 4 == 0 and 20 < forward.guarded // 4 <= len(in_graph)
    assert forward.copied == 4  # the loss
    # NOTE: every gradient is lent (the tied embedding/head weight gets two: autograd adds the second into the first)
    assert backward.calls == 4 and backward.guarded == 0 and backward.copied == 0
    assert backward.lent == 4 * len(report.backward.hand_out.graph_memory) >= 4 * len(list(case.model.parameters()))
    for region in report.forward.regions + report.backward.regions:
        assert region.stats.instances == 1 and region.stats.held_calls == 0, region.name
    for region in report.forward.regions + report.backward.regions:
        # NOTE: from the second step on, each call's key was proved again (the tied weight at two positions too)
        counts = t.cuda_graph_runner.counts(region.name)
        assert counts.again is not None and counts.again_misses == 0, region.name


@pytest.mark.slow
def test_a_graphs_outputs_that_are_views_are_kept_as_plain_aliases_and_saved_as_they_are():
    """Views among a recorded graph's outputs become plain aliases of the same memory (no ``_base``).

    thunder's autograd connection detaches each saved tensor that is a view, on every call; a plain
    alias it saves as it is, so the tensor autograd holds is the graph's own output (watched object by
    object), or a transposed weight. Views of another graph's memory stay views (test_fuzz_regressions'
    test_a_saved_view_of_another_graphs_memory_holds_that_graph_until_the_backward says why).
    """
    case = model_case("nanoGPT", "cpu", batch=2, seq=16, width=32, layers=1)  # NOTE: one block: as with two
    t = emulated()
    jfn = thunder.jit(case.step, transforms=[t], **thunder_nb.fix.ONE_AUTOGRAD_FUNCTION)
    with emulated_capture():
        for seed in range(2):
            jfn(*case.make_batch(seed)).backward()
            for p in case.model.parameters():
                p.grad = None
    instances = [inst for v in t.cuda_graph_runner.cuda_graph_cache.values() for inst in v]
    weights = {p.untyped_storage().data_ptr() for p in case.model.parameters()}
    outputs = [o for inst in instances for o in inst.static_outputs if isinstance(o, torch.Tensor)]
    assert outputs and all(o._base is None for o in outputs)
    storages = [o.untyped_storage().data_ptr() for o in outputs]
    # NOTE: outputs sharing memory (reshapes, transposes of another output): the region's views, still in place
    assert len(set(storages) - weights) < len([s for s in storages if s not in weights])
    assert weights & set(storages)  # NOTE: transposed weights, saved for the backward
    runner = t.cuda_graph_runner
    with emulated_capture():
        loss = jfn(*case.make_batch(3))
    saved = loss.grad_fn.saved_tensors
    own = [s for s in saved if id(s) in runner.memory.own_outputs]
    assert len(own) > 20 and all(runner.memory.own_outputs[id(s)].tensor is s for s in own)


def test_copy_into_copies_each_pair_whatever_their_dtypes_and_layouts():
    sources = [torch.randn(3, 4).t(), torch.randint(0, 9, (5,)), torch.randn(2, 2, dtype=torch.float64)]
    targets = [torch.empty_like(s) for s in sources]
    internals.copy_into(targets, sources)
    assert all(torch.equal(t, s) and t.stride() == s.stride() for t, s in zip(targets, sources))
    x = torch.randn(3, requires_grad=True)
    targets = [torch.zeros(3), torch.zeros(3)]
    internals.copy_into(targets, [x * 2, x.detach()])
    targets[0].sum().backward()  # NOTE: autograd recorded the copy, as with copy_
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_two_forwards_before_each_backward_replay_two_instances_round_after_round():
    """The second forward's instance is recorded while the first's tensors are held; in every later round
    both replay, and neither runs without its graph: the counts `held` compares stay right across `rebase`."""
    from programs import mlp, mlp_inputs

    x, w1, w2 = mlp_inputs()
    t = emulated()
    jfn = thunder.jit(mlp, transforms=[t])
    with emulated_capture(), warnings.catch_warnings():
        warnings.simplefilter("error", thunder_nb.cudagraph.runner.HeldOutputsWarning)
        for _ in range(4):
            (jfn(x, w1, w2) + jfn(x * 2, w1, w2)).backward()
            instances = [inst for v in t.cuda_graph_runner.cuda_graph_cache.values() for inst in v]
            assert instances and not any(inst.held() for inst in instances)
    region = thunder_nb.analyze(jfn).forward.regions[0]
    assert region.stats.instances == 2 and region.stats.replays == 8 and region.stats.eager_calls == 0


@pytest.mark.parametrize("change", [
    "same objects", "new tensors, same layouts", "a plain tensor in graph memory", "a square weight transposed in place",
    "a parameter's data moved", "a static view at another offset", "another dtype", "a number's type", "a number's value",
    "a string", "a tensor for a number", "requires_grad", "a tied weight untied",
])
def test_a_calls_key_is_proved_again_only_where_key_would_make_the_same_one(change):
    """`KeyAgain` stands in for `key` when it holds: whatever changes between calls, holding means the same key."""
    runner = ThunderNBRunner(capture=True)
    weight = torch.nn.Parameter(torch.randn(4, 4))
    args = args_of_every_kind() + (weight, weight.detach()[1:], weight)  # NOTE: tied: one parameter at two positions
    runner.key("CUDAGraph1", args)  # NOTE: the parameter's memory is known from here: the view is static
    mask, key = runner.key("CUDAGraph1", args)
    assert mask[-3:] == (True, True, True)
    again = runner.key_again("CUDAGraph1", args, mask)
    new = list(args)
    if change == "new tensors, same layouts":
        new[:3] = [torch.randn(4, 6), torch.randn(4, 6).t(), torch.randn(4, 6)[1:, ::2]]
        new[4:7] = [torch.zeros(2, dtype=torch.int64), torch.tensor(1.0), torch.empty(0, 3)]
    elif change == "a plain tensor in graph memory":
        runner.memory.own(args[0].untyped_storage().data_ptr(), object())
    elif change == "a square weight transposed in place":
        weight.data = weight.data.t()  # NOTE: the same object, address and sizes; other strides
    elif change == "a parameter's data moved":
        weight.data = weight.data.clone()
    elif change == "a static view at another offset":
        new[-2] = weight.detach()[2:]
    elif change == "another dtype":
        new[4] = torch.zeros(2, dtype=torch.int32)
    elif change == "a number's type":
        new[7] = 3.0
    elif change == "a number's value":
        new[8] = 2.5
    elif change == "a string":
        new[11] = "t"
    elif change == "a tensor for a number":
        new[7] = torch.tensor(3)
    elif change == "requires_grad":
        new[0] = args[0].clone().requires_grad_()
    elif change == "a tied weight untied":
        new[-1] = torch.nn.Parameter(weight.detach().clone())
    new = tuple(new)
    same = runner.key("CUDAGraph1", new)[1] == key
    holds = again.holds(new, runner.memory)
    if change == "requires_grad":  # NOTE: not in the key; the guard is stricter there, which costs a `_key` call
        assert same and not holds
    else:
        assert holds == same == (change in ("same objects", "new tensors, same layouts")), (holds, same)


def test_a_weight_transposed_in_place_between_replays_gets_its_own_graph_and_the_right_result():
    """thunder's prologue checks sizes, not strides: the runner's key, proved again on each call, must see them."""
    w = torch.nn.Parameter(torch.randn(8, 8))

    def f(x):
        return (x @ w).sin()

    t = emulated()
    jfn = thunder.jit(f, transforms=[t])
    x = torch.randn(3, 8)
    with emulated_capture(), torch.no_grad():
        for _ in range(3):
            assert_equal(jfn(x), f(x))
        counts = t.cuda_graph_runner.counts(next(iter(t.cuda_graph_runner.python_callables)))
        assert counts.again is not None  # NOTE: the later calls were proved, not keyed
        w.data = w.data.t()
        for _ in range(3):
            assert_equal(jfn(x), f(x))
    region = thunder_nb.analyze(jfn).forward.regions[0]
    assert len(region.graphs) == 2 and region.stats.replays == 6


def test_a_region_whose_proof_keeps_failing_on_the_same_key_stops_proving_it():
    """``requires_grad`` is in the guard and not in the key: flipping it every call would pay for both, so the region
    stops making proofs after a few such calls, and every call still replays the one graph with the right result."""
    from types import SimpleNamespace

    runner = ThunderNBRunner(capture=True)
    runner.python_callables["CUDAGraph1"] = (lambda x, y: [x * 2 + y], None)
    runner.trace_symbols["CUDAGraph1"] = (None, [SimpleNamespace(name="x"), SimpleNamespace(name="y")])
    counts = runner.counts("CUDAGraph1")
    y = torch.randn(4)
    with emulated_capture(), torch.no_grad():
        for i in range(10):
            x = torch.randn(4).requires_grad_(bool(i % 2))
            assert_equal(runner.call_cuda_graph("CUDAGraph1", x, y)[0], x * 2 + y)
            if i == 1:
                assert counts.again is not None
    assert counts.again is None and counts.again_misses == 4
    assert len(counts.graphs) == 1 and counts.replays == 10


@pytest.mark.slow
@pytest.mark.parametrize("model", ["nanoGPT", "llama2"])
def test_every_proof_a_training_run_relies_on_is_the_key_key_makes(model, monkeypatch):
    """Each call whose key was proved (`KeyAgain`) is keyed by `key` as well: the two must agree, on real models'
    steps, with the batch size changing, two forwards before their backwards, and a weight transposed in place."""
    proved = []
    holds = KeyAgain.holds
    call = ThunderNBRunner.call_cuda_graph

    def checked_call(self, fn_name, *args):
        counts = self.counts(fn_name)
        again = counts.again
        if again is not None and holds(again, args, self.memory):
            assert self.key(fn_name, args)[1] == counts.last_key, fn_name
            proved.append(fn_name)
        return call(self, fn_name, *args)

    monkeypatch.setattr(ThunderNBRunner, "call_cuda_graph", checked_call)
    case = model_case(model, "cpu", batch=2, seq=16, width=32, layers=1)
    jfn = thunder.jit(case.step, transforms=[emulated()])
    square = next(p for p in case.model.parameters() if p.ndim == 2 and p.shape[0] == p.shape[1])
    with emulated_capture():
        for step in range(8):
            if step == 4:
                with torch.no_grad():
                    square.data = square.data.t()  # NOTE: same object, address and sizes; other strides
            idx, targets = case.make_batch(step)
            if step == 6:
                idx, targets = idx[:1], targets[:1]
            if step == 7:  # NOTE: two forwards, then their backwards
                a, b = jfn(idx, targets), jfn(*case.make_batch(99))
                (a + b).backward()
            else:
                loss = jfn(idx, targets)
                assert_equal(loss, case.step(idx, targets))
                loss.backward()
            for p in case.model.parameters():
                p.grad = None
    assert len(proved) >= 6, proved


@pytest.mark.parametrize("fails", ["capture", "first replay"])
def test_the_stock_side_counts_a_graph_only_when_one_was_made(fails, monkeypatch):
    """A capture that raised made no graph (notebook 05 labelled such a region 'captured, 1 graph'); one that was
    made and whose first replay raised is in thunder's cache and replays later, so it counts."""
    from gpu_or_emulated import capturing, stock
    from thunder_nb.testing import emulate

    def f(x):
        return ((x * 2).sin() + 1).cos()

    calls = [0]
    where = "__init__" if fails == "capture" else "replay"
    original = getattr(emulate.EmulatedGraph, where)

    def once(self, *args):
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError(f"the {fails} fails")
        return original(self, *args)

    monkeypatch.setattr(emulate.EmulatedGraph, where, once)
    transform = stock("emulated")
    jfn = thunder.jit(f, transforms=[transform])
    x = torch.randn(8)
    with capturing("emulated"):
        with pytest.raises(RuntimeError, match=f"the {fails} fails"):
            jfn(x)
        jfn(x)
        jfn(x)
    runner = transform.cuda_graph_runner
    (name,) = runner.python_callables
    assert len(runner.region_stats(name).graphs) == runner.graphs_captured == 1


@pytest.mark.parametrize("side", ["stock", "fixed"])
def test_a_region_whose_recording_raised_says_so_until_a_graph_is_made(side, monkeypatch):
    """Notebook 05's stock region, whose capture failed on the `.item()` inside it, read "not run" in its diagram next
    to the verdict's "capture fails", and notebook 01's legacy region likewise next to "crashes (UnboundLocalError)":
    the runner keeps a recording's error, and the region's state, label and fill say what raised until a later call
    makes a graph. On the CPU the error cannot come out of a capture: it reads "raised" with the error's type (the
    GPU test of a failed capture checks "capture failed")."""
    from gpu_or_emulated import capturing, stock
    from thunder_nb import render
    from thunder_nb.render.common import STATE_FILL
    from thunder_nb.testing import emulate

    def f(x):
        return ((x * 2).sin() + 1).cos()

    calls = [0]
    original = emulate.EmulatedGraph.__init__

    def once(self, *args):
        calls[0] += 1
        if calls[0] == 1:
            raise UnboundLocalError("cannot access local variable 't8' where it is not associated with a value")
        return original(self, *args)

    monkeypatch.setattr(emulate.EmulatedGraph, "__init__", once)
    transform = stock("emulated") if side == "stock" else emulated()
    jfn = thunder.jit(f, transforms=[transform])
    x = torch.randn(8)
    with capturing("emulated"):
        with pytest.raises(UnboundLocalError):
            jfn(x)
        (region,) = thunder_nb.analyze(jfn).forward.regions
        assert region.stats.state == "raised" and region.captured is None and not region.stats.capture_failed
        assert region.stats.failed.startswith("UnboundLocalError: cannot access local variable 't8'")
        assert region.stats.state_text == "raised UnboundLocalError" and "raised UnboundLocalError" in repr(region)
        dot = render.region_diagram(thunder_nb.analyze(jfn).forward).source
        assert "raised UnboundLocalError" in dot and STATE_FILL["raised"] in dot
        jfn(x)
    (region,) = thunder_nb.analyze(jfn).forward.regions
    assert region.stats.state == "captured", "a graph made later makes the region captured"


def test_a_view_of_an_input_whose_copy_has_other_strides_is_copied_out_with_a_thunder_nb_warning():
    """An input with overlapping elements (``expand``) is copied into a contiguous buffer: a returned view of it cannot
    be made again on the caller's tensor, so it is copied out, and the warning says so in thunder-nb's category (one
    line to the user, `thunder_nb.cudagraph.notices.install_warning_format`), not as a bare UserWarning."""
    from thunder_nb.cudagraph.notices import ViewCopyWarning, is_own

    def f(x):
        return x[1:], x * 2

    x = torch.randn(3, 1).expand(3, 4)
    with emulated_capture():
        jfn = thunder.jit(f, transforms=[emulated()])
        with pytest.warns(ViewCopyWarning, match="returns a view of its input 0, whose copy has other strides") as got:
            view, doubled = jfn(x)
    assert all(is_own(w.category) for w in got if issubclass(w.category, ViewCopyWarning))
    assert torch.equal(view, x[1:]) and torch.equal(doubled, x * 2)
