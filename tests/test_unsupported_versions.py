"""thunder-nb on a thunder or torch it was not written for (issue 51): `thunder_nb.internals.supported` is False, every
fast path that reads their private parts takes thunder's own path, the results still equal eager's, and one
`VersionWarning` says so.

The fallback is forced the documented way, ``THUNDER_NB_UNSUPPORTED=1`` (`thunder_nb.internals.UNSUPPORTED_VARIABLE`),
in a fresh process: `supported` is asked once per process and the warning is given once per process, so neither can be
seen again in this one. Real thunder, real traces; capture is emulated (`thunder_nb.testing.emulated_capture`), so the
runner takes its capture path and its hand-out and held-guard on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from thunder_nb import internals

#: Run with THUNDER_NB_UNSUPPORTED=1: every entry point once (thunder_nb.jit, the transform under it, jit_step,
#: analyze), each judged against eager by thunder_nb.judge; prints one JSON line of facts.
_SCRIPT = r'''
import copy, json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import thunder
    import torch
    import torch.nn.functional as F
    from thunder.executors.torch_compile import torch_compile_ex

    import thunder_nb
    from thunder_nb import internals
    from thunder_nb.cudagraph.executors import jit_executors
    from thunder_nb.diagnosis.judge import TRAINED, judge
    from thunder_nb.testing import emulated_capture, modes

    facts = {"supported": internals.supported(), "judged": {}}

    def judged(name, actual, eager, **kw):
        j = judge(actual, eager, **kw)
        facts["judged"][name] = j.difference if not j.equal else None

    # a traced function without autograd: every result kept, each compared after the last call
    def scaled(a, b):
        return (a.sin() * b + 1.0).relu()

    g = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)) for _ in range(4)]
    with emulated_capture():
        jfn = thunder_nb.jit(scaled, capture=modes.jit_capture("emulated"))
        transform = internals.jit_transforms(jfn)[0]
        modes.emulate_runner(transform, "emulated")
        kept = [jfn(a, b) for a, b in inputs]
    judged("function", kept, [scaled(a, b) for a, b in inputs])
    # NOTE: fast_call's hit path, or thunder's own call path (its function, or `without_cyclic_gc`'s wrapper of it)
    facts["fast_call"] = "thunder_nb" in jfn.__code__.co_filename and jfn.__code__.co_name != "thunders_path"
    facts["function_graphs"] = transform.graphs_captured

    # a training loop through thunder_nb.jit: a module's parameters (the prologue's lookups), two forwards before one
    # backward (what the held-guard is for), SGD steps; against eager from the same weights
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(net)

    def loss_of(model):
        return lambda x, y: F.mse_loss(model(x), y)

    batches = [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(8)]
    losses, ref_losses = [], []
    with emulated_capture():
        jloss = thunder_nb.jit(loss_of(net), capture=modes.jit_capture("emulated"))
        transform = internals.jit_transforms(jloss)[0]
        modes.emulate_runner(transform, "emulated")
        for step in range(4):
            (x1, y1), (x2, y2) = batches[2 * step], batches[2 * step + 1]
            for model, f, out in ((net, jloss, losses), (ref, loss_of(ref), ref_losses)):
                model.zero_grad()
                first, second = f(x1, y1), f(x2, y2)
                (first + second).backward()
                out.append((first.detach(), second.detach()))
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad
    judged("losses", losses, ref_losses, tolerance=TRAINED)
    judged("weights", dict(net.named_parameters()), dict(ref.named_parameters()), tolerance=TRAINED)
    runner = transform.cuda_graph_runner
    facts["loop_graphs"] = transform.graphs_captured
    facts["rotation"] = runner.rotation
    facts["lend_gradients"] = transform.lend_gradients
    facts["notes"] = transform.notes
    report = thunder_nb.analyze(jloss)
    facts["analyzed_regions"] = len(report.forward.regions) + len(report.backward.regions)

    # the whole step as one graph (its CPU stand-in): AdamW, six steps
    torch.manual_seed(1)
    net2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ref2 = copy.deepcopy(net2)
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (net2, ref2))
    step = thunder_nb.jit_step(net2, loss_of(net2), opt, capture="emulated")
    step_losses = [step(*batches[i]) for i in range(6)]
    eager_losses = []
    for i in range(6):
        ref_opt.zero_grad()
        loss = loss_of(ref2)(*batches[i])
        loss.backward()
        ref_opt.step()
        eager_losses.append(loss.detach())
    judged("step losses", step_losses, eager_losses, tolerance=TRAINED)
    judged("step weights", dict(net2.named_parameters()), dict(ref2.named_parameters()), tolerance=TRAINED)
    facts["step_graphs"] = step.graphs_recorded

    facts["torchcompile_is_thunders"] = torch_compile_ex in jit_executors(["torchcompile"])
    import dis
    from thunder.core import interpreter as thunders_interpreter
    from thunder.core import transforms as thunders_transforms
    from thunder.transforms import autodiff as thunders_autodiff
    from thunder.executors import data_dependent_partition as thunders_partition
    from thunder_nb.internals import (attention, buffers, checkpoint, embedding, grads, instance_norm, interpolate,
                                      losses, named_tuples, nll_loss, ordering, padding, pooling, python_random,
                                      random_ops, saved, star_args, tensor_api, torch_metadata, tracing, variance,
                                      weight_norm)
    facts["thunders_interpreter"] = (thunders_interpreter.dis is dis and not tracing.installed()
                                     and thunders_interpreter.globals_lookup.__module__ == thunders_interpreter.__name__)
    rules = thunders_transforms._grad_fn_map
    facts["thunders_backward"] = (not grads.installed()
                                  and thunders_transforms.put_grad is thunders_transforms.prims.put_grad
                                  and not ({"torch.clamp", "torch.sigmoid", "torch.index_put", "torch.relu6",
                                            "torch.diagonal"} | {
                                      getattr(thunders_transforms.prims.PrimIDs, name)
                                      for name in ("FLIP", "INDEX_ADD", "LERP", "REMAINDER", "PROD", "MINIMUM",
                                                   "UNFOLD")})
                                  & rules.keys()
                                  and rules[thunders_transforms.prims.PrimIDs.POW].__wrapped__
                                  is thunders_transforms._pow_grad)
    split, grad = thunders_autodiff.split_into_forward_and_backward, thunders_autodiff.grad_transform_on_trace
    facts["thunders_split"] = (not saved.installed() and split.__module__ == thunders_autodiff.__name__
                               and grad.__module__ == thunders_autodiff.__name__)
    facts["thunders_ordering"] = (not ordering.installed()
                                  and thunders_partition.Graph.__module__ == thunders_partition.__name__)
    from thunder.core import jit_ext
    facts["thunders_checkpoint"] = (not checkpoint.installed() and jit_ext._general_jit_lookaside_map[
        torch.utils.checkpoint.checkpoint].__module__ == jit_ext.__name__)
    import thunder.torch as ltorch
    facts["thunders_label_smoothing"] = (not losses.installed()
                                         and ltorch._cross_entropy_loss_label_smoothing.__module__ == ltorch.__name__)
    from thunder.core import module as thunders_module
    facts["thunders_instance_norm"] = (not instance_norm.installed()
                                       and ltorch.instance_norm.meta.__module__ == ltorch.__name__)
    facts["thunders_named_tuples"] = (not named_tuples.installed() and jit_ext.record_source_loc_in_symbol_header
                                      .__module__ == jit_ext.__name__)
    facts["thunders_pad"] = not padding.installed() and ltorch.pad.meta.__module__ == ltorch.__name__
    facts["thunders_embedding"] = (not embedding.installed() and ltorch._torch_to_thunder_function_map[
        torch.nn.functional.embedding] is ltorch.embedding)
    facts["thunders_variance"] = (not variance.installed()
                                  and ltorch._torch_to_thunder_function_map[torch.var] is ltorch.var)
    facts["thunders_interpolate"] = (not interpolate.installed()
                                     and ltorch.interpolate.meta.__module__ == ltorch.__name__)
    facts["thunders_nll_loss"] = (not nll_loss.installed() and ltorch._torch_to_thunder_function_map[
        torch.nn.functional.nll_loss] is ltorch.nll_loss)
    facts["thunders_pooling"] = (not pooling.installed() and ltorch._torch_to_thunder_function_map[
        torch.nn.functional.max_pool2d] is ltorch.max_pool2d)
    wrap_args = thunders_interpreter.wrap_args_from_list
    facts["thunders_star_args"] = not star_args.installed() and wrap_args.__module__ == thunders_interpreter.__name__
    facts["thunders_weight_norm"] = (not weight_norm.installed()
                                     and torch._weight_norm not in ltorch._torch_to_thunder_function_map)
    from thunder.torch.langctx import _method_name_to_fn_map
    from thunder.torch.langctx import _property_name_to_fn_map as tensor_properties
    facts["thunders_tensor_api"] = (not tensor_api.installed() and "H" not in tensor_properties
                                    and ltorch.clone.meta.__module__ == ltorch.__name__
                                    and torch.eye not in ltorch._torch_to_thunder_function_map
                                    and "fill_" not in _method_name_to_fn_map
                                    and _method_name_to_fn_map["unfold"].id == "torch.nn.functional.unfold")
    import torch.nn.functional as F
    from thunder.torch.langctx import _method_name_to_fn_map as tensor_methods
    facts["thunders_random_ops"] = (not random_ops.installed() and all(
        "AUTO_REGISTERED" in str(ltorch._torch_to_thunder_function_map[fn].tags)
        for fn in (torch.feature_dropout, torch.alpha_dropout, F.dropout2d, F.gumbel_softmax))
        and "bernoulli_" not in tensor_methods)
    lookasides = jit_ext._general_jit_lookaside_map
    facts["thunders_attention"] = (not attention.installed() and F.multi_head_attention_forward in lookasides
                                   and torch.backends.mha.get_fastpath_enabled not in lookasides)
    facts["thunders_getattr"] = (not torch_metadata.installed() and jit_ext._general_jit_lookaside_map[getattr]
                                 .__module__ == jit_ext.__name__)
    facts["thunders_lookaside_function"] = (not python_random.installed()
                                            and jit_ext.general_jit_lookaside.__module__ == jit_ext.__name__)
    facts["thunders_set_buffer"] = (not buffers.installed() and thunders_module.ThunderModule.set_buffer.__module__
                                    == thunders_module.__name__)

facts["version_warnings"] = [str(w.message) for w in caught if issubclass(w.category, internals.VersionWarning)]
facts["own_warnings"] = sorted({w.category.__name__ for w in caught if w.category.__module__.startswith("thunder_nb")})
print(json.dumps(facts))
'''


@pytest.fixture(scope="module")
def unsupported() -> dict:
    """The facts `_SCRIPT` prints, run in a process where thunder-nb takes the versions as unsupported."""
    env = {**os.environ, internals.UNSUPPORTED_VARIABLE: "1"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # NOTE: the module's fixture runs every entry point in a fresh process (about 5 s)
def test_the_fallback_gives_eagers_results_through_every_entry_point(unsupported):
    assert unsupported["supported"] is False
    assert unsupported["judged"] == {"function": None, "losses": None, "weights": None, "step losses": None,
                                     "step weights": None}
    # NOTE: the capture path was taken: graphs (emulated) were recorded and replayed, not every region run eagerly
    assert unsupported["function_graphs"] >= 1 and unsupported["step_graphs"] == 1
    # NOTE: one forward and one backward graph for the whole loop: the hand-out guards nothing without use counts, it
    # copies what the backward saves out of graph memory, so the second forward replays the first one's graph (were
    # saved tensors guarded, each forward would find the last one's held and record another instance, up to 16)
    assert unsupported["loop_graphs"] == 2, unsupported["loop_graphs"]
    assert unsupported["analyzed_regions"] >= 2


@pytest.mark.slow  # NOTE: the module's fixture runs every entry point in a fresh process (about 5 s)
def test_each_fast_path_takes_thunders_own(unsupported):
    assert not unsupported["fast_call"]  # thunder's call path on every call
    assert any("prologue left as thunder made it" in n for n in unsupported["notes"])  # no module walks
    assert unsupported["torchcompile_is_thunders"]  # thunder's executor: no implementation map of thunder-nb's
    assert unsupported["thunders_interpreter"]  # thunder's tracing as it is (thunder_nb.internals.tracing)
    assert unsupported["thunders_backward"]  # thunder's backward as it is (thunder_nb.internals.grads)
    assert unsupported["thunders_split"]  # thunder's split as it is (thunder_nb.internals.saved)
    assert unsupported["thunders_ordering"]  # thunder's dataflow ordering as it is (thunder_nb.internals.ordering)
    assert unsupported["thunders_checkpoint"]  # thunder's checkpoint lookaside (thunder_nb.internals.checkpoint)
    assert unsupported["thunders_label_smoothing"]  # thunder's cross entropy as it is (thunder_nb.internals.losses)
    assert unsupported["thunders_set_buffer"]  # thunder's ThunderModule.set_buffer as it is (internals.buffers)
    assert unsupported["thunders_instance_norm"]  # thunder's instance_norm as it is (internals.instance_norm)
    assert unsupported["thunders_named_tuples"]  # thunder's lookasides as they are (internals.named_tuples)
    assert unsupported["thunders_pad"]  # thunder's pad as it is (internals.padding)
    assert unsupported["thunders_interpolate"]  # thunder's interpolate as it is (internals.interpolate)
    assert unsupported["thunders_embedding"]  # thunder's embedding as it is (internals.embedding)
    assert unsupported["thunders_variance"]  # thunder's var and std as they are (internals.variance)
    assert unsupported["thunders_nll_loss"]  # thunder's nll_loss symbol as it is (internals.nll_loss)
    assert unsupported["thunders_pooling"]  # thunder's pooling symbols as they are (internals.pooling)
    assert unsupported["thunders_star_args"]  # thunder's CALL_FUNCTION_EX as it is (internals.star_args)
    assert unsupported["thunders_weight_norm"]  # no rule for torch._weight_norm (internals.weight_norm)
    assert unsupported["thunders_tensor_api"]  # no x.H, thunder's clone as it is (internals.tensor_api)
    assert unsupported["thunders_random_ops"]  # thunder's opaque random calls as they are (internals.random_ops)
    assert unsupported["thunders_attention"]  # thunder's opaque attention call as it is (internals.attention)
    assert unsupported["thunders_getattr"]  # thunder's getattr lookaside as it is (internals.torch_metadata)
    assert unsupported["thunders_lookaside_function"]  # thunder's lookaside function (internals.python_random)
    # NOTE: no use counts: nothing is handed out to stay in graph memory (gradients copied, no rotation), and a graph
    # whose saved tensors went to a backward is not replayed again (`internals.use_counters`)
    assert unsupported["rotation"] == 0 and unsupported["lend_gradients"] is False


@pytest.mark.slow  # NOTE: the module's fixture runs every entry point in a fresh process (about 5 s)
def test_one_version_warning_names_the_versions_and_what_is_slower(unsupported):
    assert unsupported["own_warnings"] == ["VersionWarning"]  # NOTE: and no other warning of thunder-nb's
    (message,) = unsupported["version_warnings"]
    found = internals.found_versions()
    assert f"lightning-thunder {internals.THUNDER_VERSION} and torch {internals.TORCH_VERSION}.x" in message
    assert f"found lightning-thunder {found['lightning-thunder']} and torch {found['torch']}" in message
    assert f"{internals.UNSUPPORTED_VARIABLE} is set" in message and "slower" in message


def test_the_pinned_stack_is_supported_and_takes_the_fast_paths():
    """The control: in the suite's own process the pinned versions are supported, nothing warns, and the same entry
    point takes thunder-nb's call path."""
    import thunder_nb

    assert internals.supported()
    with warnings.catch_warnings():
        warnings.simplefilter("error", internals.VersionWarning)
        assert internals.check_versions()
        jfn = thunder_nb.jit(lambda a: a + 1.0, capture="off")
    assert "thunder_nb" in jfn.__code__.co_filename
