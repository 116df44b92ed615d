"""jit_step on the CPU (issue #34): the whole iteration under the CPU stand-in for capture, against eager PyTorch.

The stand-in (``capture="emulated"``, what ``"auto"`` picks without CUDA) takes the same path as a CUDA graph: the
same guards, warm-up steps, static batch buffers, and a replay that writes the loss and gradients into the memory of
the recording. Real thunder, real models (thunder's nanoGPT from `thunder_nb.testing.models`); the guard tests use a
two-layer perceptron, which thunder traces in a second rather than several.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from thunder_nb.step import Capturability, RecordAgainWarning, StepRefused, capturability, jit_step
from thunder_nb.testing.models import model_case
from thunder_nb.testing.zoo import TOLERANCES
from thunder_nb.notebook.values import compare_values

RTOL, ATOL = TOLERANCES["logged"]


def _same(values, reference):
    return compare_values(values, reference, rtol=RTOL, atol=ATOL, reference="eager's")


def _state(net):
    return {n: p.detach().clone() for n, p in net.named_parameters()}


# --- nanoGPT: numerics, the logged loss, the refusal ------------------------------------------------

_GPT = dict(layers=1, width=32, vocab=64, batch=2, seq=16)


def test_nanogpt_whole_step_equals_eager_and_a_logged_item_reads_eagers_number():
    eager = model_case("nanoGPT", **_GPT)
    opt = torch.optim.AdamW(eager.model.parameters(), lr=1e-3)
    losses = []
    for i in range(6):
        opt.zero_grad()
        loss = eager.step(*eager.make_batch(i))
        loss.backward()
        opt.step()
        losses.append(loss.item())

    case = model_case("nanoGPT", **_GPT)
    step = jit_step(case.model, case.step, torch.optim.AdamW(case.model.parameters(), lr=1e-3))
    kept = [step(*case.make_batch(i)) for i in range(6)]
    logged = [k.item() for k in kept]  # NOTE: read after all six: each returned loss is a copy, not the graph's buffer

    c = _same({"losses": logged, "state": _state(case.model)}, {"losses": losses, "state": _state(eager.model)})
    assert c.matches, c.difference
    # NOTE: 3 warm-up steps, then one recording replayed three times
    assert step.graphs_recorded == 1 and step.recordings == ["first recording"] and step.captured
    grads = {n: p.grad for n, p in case.model.named_parameters()}
    c = _same(grads, {n: p.grad for n, p in eager.model.named_parameters()})
    assert c.matches, c.difference  # NOTE: .grad holds the last step's gradients, as after eager's last step


@pytest.mark.slow  # NOTE: nanoGPT's step traced twice (jit_step, then capturability)
def test_a_host_sync_in_the_step_is_refused_with_the_op_and_the_users_line_before_anything_runs():
    case = model_case("nanoGPT", **_GPT, log_loss=True)
    before = _state(case.model)
    opt = torch.optim.AdamW(case.model.parameters(), lr=1e-3)
    step = jit_step(case.model, case.step, opt)
    with pytest.raises(StepRefused) as info:
        step(*case.make_batch(0))
    message = str(info.value)
    assert message.startswith("jit_step cannot record this step as one CUDA graph: host sync: item at ")
    assert "models.py:" in message and "`return loss, loss.item()`" in message
    assert "Fix: return the tensor and read it after the step" in message
    assert [b.kind for b in info.value.blockers] == ["host sync", "loss"]
    assert not opt.state and all(torch.equal(before[n], p) for n, p in case.model.named_parameters())

    report = capturability(case.model, case.step, opt, *case.make_batch(0))
    assert isinstance(report, Capturability) and not report.whole_step
    assert 0.5 < report.fraction < 1 and report.in_graph < report.ops
    text = str(report)
    assert text.startswith("nanoGPT_step_logged: ") and "of the iteration in one graph" in text
    assert "1. host sync: item at " in text and "`return loss, loss.item()`" in text
    assert "2. loss: loss_fn returns (tensor, float) at " in text
    html = report._repr_html_()
    assert html.index("host sync") < html.index("<code>item</code>") < html.index("loss_fn returns")


# --- the guards, on a small perceptron --------------------------------------------------------------


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batch(i, n=8):
    g = torch.Generator().manual_seed(i)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def _loss_of(net):
    def mlp_loss(x, y):
        return F.cross_entropy(net(x), y)

    return mlp_loss


def _eager_mlp(batches, make_opt, *, between=None, accumulate=1, max_grad_norm=None, make_net=_mlp):
    net = make_net()
    opt = make_opt(net)
    losses = []
    for i, (x, y) in enumerate(batches):
        if between:
            between(i, net, opt)
        opt.zero_grad()
        total = 0.0
        for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate)):
            loss = F.cross_entropy(net(xs), ys) / accumulate
            loss.backward()
            total = total + loss.detach()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
        opt.step()
        losses.append(float(total))
    return losses, _state(net)


def _stepped(batches, make_opt, *, between=None, make_net=_mlp, **options):
    net = make_net()
    opt = make_opt(net)
    step = jit_step(net, _loss_of(net), opt, **options)
    losses = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i, batch in enumerate(batches):
            if between:
                between(i, net, opt)
            losses.append(step(*batch).item())
    again = [str(w.message) for w in seen if issubclass(w.category, RecordAgainWarning)]
    return losses, _state(net), step, again


def _adamw(net):
    return torch.optim.AdamW(net.parameters(), lr=1e-2)


def _sgd(net):
    return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def test_a_new_batch_shape_records_again_with_a_warning_that_says_what_changed():
    batches = [_batch(i) for i in range(5)] + [_batch(i, n=4) for i in range(5, 10)]
    losses, state = _eager_mlp(batches, _adamw)
    got, got_state, step, again = _stepped(batches, _adamw)
    assert again == ["jit_step: recording the step again: the batch's argument 0 has shape (4, 8) (was (8, 8))"]
    assert step.graphs_recorded == 2
    assert step.recordings == ["first recording", "the batch's argument 0 has shape (4, 8) (was (8, 8))"]
    c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
    assert c.matches, c.difference


def test_model_eval_and_a_replaced_parameter_record_again_and_stay_equal_to_eager():
    def between(i, net, opt):
        if i == 5:
            net.eval()  # NOTE: no dropout here: the numbers do not change, the trace does
        if i == 7:
            with torch.no_grad():
                net[0].weight.data = net[0].weight.data.clone()

    batches = [_batch(i) for i in range(9)]
    losses, state = _eager_mlp(batches, _sgd, between=between)
    got, got_state, step, again = _stepped(batches, _sgd, between=between, warmup=1)
    assert again == ["jit_step: recording the step again: Sequential is now in eval mode (model.train() / "
                     "model.eval())",
                     "jit_step: recording the step again: parameter Linear.weight now lives in other memory (its "
                     ".data was set)"]
    c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
    assert c.matches, c.difference


def test_an_sgd_lr_change_records_again_and_adamw_reads_its_lr_at_every_step():
    def between(i, net, opt):
        if i in (4, 6):
            opt.param_groups[0]["lr"] *= 0.5

    batches = [_batch(i) for i in range(8)]
    for make, expected in ((_sgd, 2), (_adamw, 0)):
        losses, state = _eager_mlp(batches, make, between=between)
        got, got_state, step, again = _stepped(batches, make, between=between, warmup=1)
        # NOTE: each cause is said once (a scheduler would say it at every step); every change still records again
        assert len(again) == min(expected, 1) and step.graphs_recorded == 1 + expected, (again, step.recordings)
        c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
        assert c.matches, (make.__name__, c.difference)
    sgd_warning = _stepped(batches, _sgd, between=between, warmup=1)[3][0]
    assert sgd_warning.startswith("jit_step: recording the step again: param group 0's 'lr' changed from 0.1 to 0.05 "
                                  "(SGD's step reads it as a Python number, fixed in the graph;")


def test_an_lr_scheduler_steps_equal_eager():
    batches = [_batch(i) for i in range(7)]
    scheds = {}

    def between(i, net, opt):
        if opt not in scheds:
            scheds[opt] = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        elif i:
            scheds[opt].step()

    losses, state = _eager_mlp(batches, _adamw, between=between)
    got, got_state, step, again = _stepped(batches, _adamw, between=between)
    assert not again and step.graphs_recorded == 1
    c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
    assert c.matches, c.difference


def test_gradient_accumulation_and_clipping_run_inside_the_step_equal_to_eager():
    batches = [_batch(i) for i in range(6)]
    losses, state = _eager_mlp(batches, _adamw, accumulate=4, max_grad_norm=0.05)
    got, got_state, step, again = _stepped(batches, _adamw, accumulate=4, max_grad_norm=0.05)
    assert not again and step.graphs_recorded == 1
    c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
    assert c.matches, c.difference
    assert float(step.last_grad_norm) > 0.05  # NOTE: the norm before clipping: clipping did act
    with pytest.raises(ValueError, match=r"accumulate=4: the batch's argument 0 has shape \(6, 8\), whose first "):
        step(*_batch(0, n=6))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_batch_the_loss_function_updates_in_place_is_updated_for_the_caller_as_in_eager(accumulate):
    """A loss function that updates its batch in place (``x.mul_(0.5)``, an augmentation written in place) leaves the
    caller's batch as eager PyTorch does after every step, the replayed ones too, and trains as eager does. Before,
    only the warm-up steps reached the caller's batch: a replay updated the graph's copy of it."""

    def run(make_step):
        net = _mlp()
        opt = _adamw(net)

        def loss_fn(x, y):
            x.mul_(0.5)
            return F.cross_entropy(net(x), y)

        step = make_step(net, loss_fn, opt)
        seen = []
        for i in range(6):
            x, y = _batch(i)
            seen.append((float(step(x, y)), x.clone()))
        return seen, _state(net)

    def eager(net, loss_fn, opt):
        def step(x, y):
            opt.zero_grad()
            total = 0.0
            for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate)):
                loss = loss_fn(xs, ys) / accumulate
                loss.backward()
                total += float(loss.detach())
            opt.step()
            return total
        return step

    want, want_state = run(eager)
    got, got_state = run(lambda net, fn, opt: jit_step(net, fn, opt, warmup=2, accumulate=accumulate))
    for i, ((loss, x), (ref_loss, ref_x)) in enumerate(zip(got, want)):
        assert torch.equal(x, ref_x), f"step {i}: the caller's batch is not eager's"
    c = _same({"losses": [loss for loss, _ in got], "state": got_state},
              {"losses": [loss for loss, _ in want], "state": want_state})
    assert c.matches, c.difference


def test_grad_between_steps_zero_grad_and_the_loss_buffer():
    net = _mlp()
    opt = _adamw(net)
    step = jit_step(net, _loss_of(net), opt, warmup=1, copy_loss=False)
    step(*_batch(0))
    first = step(*_batch(1))  # NOTE: the recording: from here on the loss is the graph's own buffer
    value = first.item()
    grads = [p.grad for p in net.parameters()]
    second = step(*_batch(2))
    assert second is first and first.item() != value  # NOTE: copy_loss=False: the next replay overwrote it
    assert all(p.grad is g for p, g in zip(net.parameters(), grads))  # NOTE: gradients stay in the graph's memory
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in net.parameters())
    step(*_batch(3))
    assert all(p.grad is g for p, g in zip(net.parameters(), grads)) and step.graphs_recorded == 1
    opt.zero_grad(set_to_none=False)  # NOTE: the step overwrites gradients, never accumulates into them
    after_zero = step(*_batch(4)).item()

    again = _mlp()
    ref = jit_step(again, _loss_of(again), _adamw(again), warmup=1)
    assert [ref(*_batch(i)).item() for i in range(5)][-1] == after_zero


def test_what_the_step_refuses_and_why():
    net = _mlp()

    def two_values(x, y):
        out = net(x)
        return F.cross_entropy(out, y), out

    with pytest.raises(StepRefused, match=r"loss: loss_fn returns \(tensor, tensor\) at .*test_step\.py:\d+: "
                                          r"`return F\.cross_entropy\(out, y\), out`"):  # its return line
        jit_step(net, two_values, _adamw(net))(*_batch(0))
    with pytest.raises(StepRefused, match=r"optimizer: LBFGS at optimizer.step\(\). Fix: LBFGS has no capturable step"):
        jit_step(net, _loss_of(net), torch.optim.LBFGS(net.parameters()))(*_batch(0))
    with pytest.raises(StepRefused, match="jit_step needs grad mode: grad mode: torch.no_grad\\(\\) at "), torch.no_grad():
        jit_step(net, _loss_of(net), _adamw(net))(*_batch(0))
    with pytest.raises(ValueError, match="capture=True needs the model on a CUDA device"):
        jit_step(net, _loss_of(net), _adamw(net), capture=True)

    def reads_the_loss(x, y):
        loss = F.cross_entropy(net(x), y)
        return loss + 0.0 * loss.item()

    with pytest.raises(StepRefused, match=r"host sync: item at .*test_step\.py:\d+: `return loss \+ 0\.0 \* loss"):
        jit_step(net, reads_the_loss, _adamw(net))(*_batch(0))
    # NOTE: capture=False trains uncaptured and refuses nothing: the same host sync runs, as in eager PyTorch
    uncaptured = jit_step(net, reads_the_loss, _adamw(net), capture=False)
    losses = [uncaptured(*_batch(0)).item() for _ in range(2)]
    assert losses[1] < losses[0] and uncaptured.graphs_recorded == 0


def test_capturability_of_a_clean_step_is_the_whole_iteration():
    net = _mlp()
    report = capturability(net, _loss_of(net), _sgd(net), *_batch(0))
    assert report.whole_step and report.fraction == 1.0 and report.in_graph == report.ops
    head = (f"mlp_loss: 100% of the iteration in one graph ({report.ops} of {report.ops} ops; optimizer: SGD (no "
            "step counter; lr fixed in the graph))")
    assert str(report).splitlines() == [
        head,
        "  whole step: forward, loss, backward and optimizer step record as one CUDA graph",
        "  note: shapes: recorded for [8, 8] float32, [8] int64; another shape records again",
    ]
    assert "whole step" in report._repr_html_() and repr(report).startswith("Capturability('mlp_loss', 100% in one")


def test_an_item_whose_value_only_reaches_python_is_refused_as_python_side_state():
    """thunder runs the Python of the loss function once, when it traces: a logged ``.item()`` inside would log the
    first step's number only; the report and the step both name the line."""
    net = _mlp()
    logged = []

    def logs_the_loss(x, y):
        loss = F.cross_entropy(net(x), y)
        logged.append(loss.item())
        return loss

    report = capturability(net, logs_the_loss, _adamw(net), *_batch(0))
    (blocker,) = report.blockers
    assert blocker.kind == "python-side state" and blocker.op == "item (its value only reaches Python)"
    assert blocker.where.endswith("`logged.append(loss.item())`") and blocker.line and blocker.filename
    assert report.in_graph == report.ops - 1
    with pytest.raises(StepRefused, match=r"python-side state: item .* at .*test_step\.py:\d+: `logged\.append"):
        jit_step(net, logs_the_loss, _adamw(net))(*_batch(0))


def test_compare_step_runs_the_step_against_eager_and_puts_the_state_back():
    from thunder_nb.step import compare_step

    net = _mlp()
    opt = _adamw(net)
    before = _state(net)
    result = compare_step(net, _loss_of(net), opt, *_batch(0))
    assert result.matches and result.capture == "emulated" and result.graphs == 1 and result.steps == 6
    assert not result.timings and "not timed" in result.to_text()
    assert not opt.state and all(p.grad is None for p in net.parameters())
    assert all(torch.equal(before[n], p) for n, p in net.named_parameters())


# --- what the guards see besides the batch (review of #34) ------------------------------------------


def _bn_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def _replace_head(i, net, opt):
    if i == 4:
        torch.manual_seed(1)
        net[2] = torch.nn.Linear(16, 4)  # NOTE: not in the optimizer: trained by nothing, read by the loss


def _freeze_first_weight(i, net, opt):
    if i == 4:
        net[0].weight.requires_grad_(False)


def _rebind_running_mean(i, net, opt):
    if i == 4:
        net[1].running_mean = torch.zeros(16)


@pytest.mark.parametrize("between, make_net, expected", [
    (_replace_head, _mlp, "submodule Sequential.2 was replaced by a Linear"),
    (_freeze_first_weight, _mlp, "parameter Linear.weight now has requires_grad=False"),
    (_rebind_running_mean, _bn_mlp, "buffer BatchNorm1d.running_mean was replaced by another tensor"),
], ids=["submodule", "requires_grad", "buffer"])
def test_a_replaced_submodule_a_requires_grad_change_and_a_rebound_buffer_record_again(between, make_net, expected):
    """A replay never calls thunder: on a GPU it would run the old module, update the old buffer, train the frozen
    weight. The CPU stand-in calls thunder again, so the values cannot show it: the warning does."""
    batches = [_batch(i) for i in range(8)]
    losses, state = _eager_mlp(batches, _sgd, between=between, make_net=make_net)
    got, got_state, step, again = _stepped(batches, _sgd, between=between, make_net=make_net, warmup=1)
    # NOTE: thunder's cache finds a replaced submodule by its name, whatever its class: the step traces anew and says so
    done = ("; thunder traces the loss function anew, as a new thunder.jit (its cache checks neither which members a "
            "module has nor the class of the module at a name, and would run the old trace)"
            if expected.startswith("submodule") else "")
    assert again == [f"jit_step: recording the step again: {expected}{done}"]
    assert step.graphs_recorded == 2 and step.recordings == ["first recording", expected]
    c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
    assert c.matches, c.difference


def test_a_replaced_parameter_records_again_once_not_at_every_later_step():
    def between(i, net, opt):
        if i == 4:
            net[0].weight = torch.nn.Parameter(net[0].weight.detach().clone())

    batches = [_batch(i) for i in range(10)]
    losses, state = _eager_mlp(batches, _sgd, between=between)
    got, got_state, step, again = _stepped(batches, _sgd, between=between)
    assert again == ["jit_step: recording the step again: parameter Linear.weight was replaced by another tensor"]
    assert step.graphs_recorded == 2
    c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
    assert c.matches, c.difference


def test_warmup_zero_is_refused_and_the_optimizers_lazy_state_is_made_before_a_recording(monkeypatch):
    """Adam's moments (and SGD's momentum) are made at a parameter's first ``optimizer.step()``: made inside a graph,
    each replay would make them anew. A param group added later gets one uncaptured step before the recording."""
    from thunder_nb.step import Step

    net = _mlp()
    with pytest.raises(ValueError, match=r"warmup must be >= 1 \(got 0\)"):
        jit_step(net, _loss_of(net), _adamw(net), warmup=0)

    missing = []
    record = Step._record

    def checked(self, batch, key):
        opt = self.optimizer
        missing.extend(p.shape for g in opt.param_groups for p in g["params"] if not opt.state.get(p))
        return record(self, batch, key)

    monkeypatch.setattr(Step, "_record", checked)

    def adamw_first_layer(net):
        return torch.optim.AdamW(net[0].parameters(), lr=1e-2)

    def unfreeze(i, net, opt):
        if i == 4:
            opt.add_param_group({"params": list(net[2].parameters())})

    batches = [_batch(i) for i in range(8)]
    losses, state = _eager_mlp(batches, adamw_first_layer, between=unfreeze)
    got, got_state, step, again = _stepped(batches, adamw_first_layer, between=unfreeze, warmup=1)
    assert missing == [] and step.graphs_recorded == 2
    assert again == ["jit_step: recording the step again: the optimizer's param groups changed"]
    c = _same({"losses": got, "state": got_state}, {"losses": losses, "state": state})
    assert c.matches, c.difference


def test_load_state_dict_after_construction_gets_the_capture_settings_again(monkeypatch):
    """``load_state_dict`` replaces the param groups (capturable False, lr a number): the recording after it sets them
    again, or Adam's capture health check raises on a GPU. Here the CPU is made a capturable device for Adam."""
    import importlib

    from torch.optim.optimizer import _get_capturable_supported_devices as devices

    monkeypatch.setattr(importlib.import_module("torch.optim.adam"), "_get_capturable_supported_devices",
                        lambda supports_xla=True: [*devices(supports_xla), "cpu"])
    net = _mlp()
    opt = _adamw(net)
    saved = torch.optim.AdamW(net.parameters(), lr=5e-3).state_dict()  # NOTE: a plain optimizer's: no state
    step = jit_step(net, _loss_of(net), opt, warmup=1)
    step._capturable = step._tensor_lr = True  # NOTE: what a CUDA model gets
    step._set_up_optimizer()
    assert all(g["capturable"] and isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(3):
            step(*_batch(i))
        opt.load_state_dict(saved)
        assert not opt.param_groups[0]["capturable"] and opt.param_groups[0]["lr"] == 5e-3
        for i in range(3, 6):
            step(*_batch(i))
    again = [str(w.message) for w in seen if issubclass(w.category, RecordAgainWarning)]
    assert again == ["jit_step: recording the step again: the optimizer's state was replaced (load_state_dict)"]
    group = opt.param_groups[0]
    assert group["capturable"] and isinstance(group["lr"], torch.Tensor) and float(group["lr"]) == pytest.approx(5e-3)
    assert step._lrs == [group["lr"]]  # NOTE: the tensor the recording reads is the one a schedule writes
    assert all(opt.state[p]["step"].dtype == torch.float32 for p in net.parameters())


def test_a_recorded_step_refuses_a_call_under_no_grad():
    net = _mlp()
    step = jit_step(net, _loss_of(net), _adamw(net), warmup=1)
    step(*_batch(0))
    step(*_batch(1))
    before = _state(net)
    with pytest.raises(StepRefused, match="jit_step needs grad mode: grad mode: torch.no_grad\\(\\) at "), torch.no_grad():
        step(*_batch(2))
    assert all(torch.equal(before[n], p) for n, p in net.named_parameters())


def test_jit_step_and_thunder_nb_jit_take_the_same_executors():
    """Both build ``thunder.jit``'s executor list with one helper: thunder's sdpa executor is the checked one."""
    import thunder

    import thunder_nb
    from thunder_nb.cudagraph.executors import checked_sdpa

    def names_of(jfn):  # NOTE: less the executor thunder makes for each function
        return [e.name for e in thunder.compile_data(jfn).executors_list if not e.name.startswith("__ad_hoc")]

    net = _mlp()
    for names in ((), ("no-sdpa",), ("torchcompile",)):
        got = names_of(jit_step(net, _loss_of(net), _adamw(net), executors=names)._jfn)
        expected = names_of(thunder_nb.jit(_loss_of(net), executors=names))
        assert got == expected and "sdpa" not in got, names
        assert (checked_sdpa().name in got) == ("no-sdpa" not in names)


def test_the_step_takes_captures_one_vocabulary_plus_the_cpu_stand_in():
    """jit_step's ``capture`` is thunder-nb's one vocabulary (auto, True/'on', False/'off', 'emulated'), resolved
    by the model's device."""
    from thunder_nb.cudagraph.capture import Capture, parse_capture, resolve

    cpu = torch.device("cpu")
    resolved = [resolve(parse_capture(c), cpu, auto=Capture.EMULATED) for c in ("auto", "off", False, "emulated")]
    assert resolved == [Capture.EMULATED, Capture.OFF, Capture.OFF, Capture.EMULATED]
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        resolve(parse_capture("on"), cpu, what="the model", auto=Capture.EMULATED)
    with pytest.raises(ValueError, match=r"capture must be one of 'auto', True \('on'\), False \('off'\) or 'emulated'"):
        parse_capture("yes")
