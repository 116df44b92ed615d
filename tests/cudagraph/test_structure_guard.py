"""The prologue's check of the members of the modules a trace reached (issue 50, point 3): thunder_nb.jit traces anew
where a module gained or lost a submodule, parameter, buffer or instance attribute, or changed class.

Thunder's cache checks the tensors, the attributes the trace read and each module's ``training`` flag, but not which
members a module has: a trace that branched on ``hasattr(model, "head2")`` keeps hitting after ``model.head2 = ...``
(plain ``thunder.jit`` too). `thunder_nb.cudagraph.prologue.ModuleWalk` keeps each reached module's members at its
first call (right after thunder traced) and raises `StructureChanged` where they differ; the prologue fails, and
thunder traces again. Training loops against eager from the same initial state (an AdamW step outside the jitted
loss), and the walk's own semantics.
"""

from __future__ import annotations

import pytest
import thunder
import torch
from torch import nn

import thunder_nb
from thunder_nb.cudagraph.prologue import ModuleWalk, StructureChanged

from structure_changes import (STEPS, Net, add_an_attribute, add_and_remove_a_parameter, add_head2_at, adamw,
                               assert_same_training, batch, freeze_and_unfreeze, make_net, model_loss, remove_head2,
                               train_state)

_add_head2 = add_head2_at(5)


class _Whole(Net):
    """The loss inside the module's forward: ``thunder_nb.jit(module)``, whose origin is a `thunder.ThunderModule`."""

    def forward(self, idx, y):
        return model_loss(self, self.emb(idx).mean(1), y)


def _add_then_remove_head2(i, net, opt):
    """Attached, then deleted: the first trace (no head2) serves again."""
    _add_head2(i, net, opt)
    if i == 9:
        del net.head2


SCENARIOS = {
    "submodule-added": (_add_head2, False),
    "submodule-removed": (remove_head2, True),
    "frozen-and-unfrozen": (freeze_and_unfreeze, False),
    "parameter-added-and-removed": (add_and_remove_a_parameter, False),
    "attribute-added": (add_an_attribute, False),
    "submodule-added-then-removed": (_add_then_remove_head2, False),
}


def _train(between, with_head2, jit=None, cls=Net):
    """``STEPS`` AdamW steps around the loss, eager or jitted by ``jit`` (the loss function, or the module for
    `_Whole`); the losses, the final state, and the jitted function."""
    net = make_net(cls, with_head2)
    opt = adamw(net)
    if cls is _Whole:
        fn = net
    else:
        def fn(idx, y):
            return model_loss(net, net(idx), y)
    run = fn if jit is None else jit(fn)
    losses = []
    for i in range(STEPS):
        between(i, net, opt)
        opt.zero_grad()
        loss = run(*batch(i))
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses, train_state(net, opt), run


def _jit(fn):
    return thunder_nb.jit(fn, capture=False)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_thunder_nb_jit_traces_anew_where_a_reached_modules_members_changed(scenario):
    between, with_head2 = SCENARIOS[scenario]
    eager = _train(between, with_head2)
    got = _train(between, with_head2, _jit)
    assert_same_training(got[0], got[1], eager[0], eager[1])


def test_a_module_jitted_whole_traces_anew_where_its_model_gains_a_submodule():
    """``thunder_nb.jit(module)``: the prologue's origin is the `thunder.ThunderModule`; the modules reached are its
    wrapped model's (its module cache), whose ``forward`` branches on ``hasattr(self, "head2")``."""
    eager = _train(_add_head2, False, cls=_Whole)
    got = _train(_add_head2, False, _jit, cls=_Whole)
    assert_same_training(got[0], got[1], eager[0], eager[1])
    assert thunder.compile_stats(got[2]).cache_misses == 2  # NOTE: the first trace, and one after head2 came


def test_the_change_is_a_miss_of_the_old_entry_once_and_the_new_entry_hits():
    net = make_net()

    def fn(idx, y):
        return model_loss(net, net(idx), y)

    jfn = _jit(fn)
    stats = thunder.compile_stats(jfn)
    for _ in range(3):
        jfn(*batch(0))
    assert (stats.cache_misses, stats.cache_hits) == (1, 2)
    net.head2 = nn.Linear(8, 4)
    for _ in range(3):
        jfn(*batch(0))
    assert (stats.cache_misses, stats.cache_hits) == (2, 4)
    _, (walk, *_) = _walks(jfn)
    assert walk._guard is not None  # NOTE: the new entry's walk is proved by its guard again


def _walks(jfn):
    """The `ModuleWalk`s of the last prologue, by their bound symbols."""
    bsyms = [b for b in thunder.last_prologue_traces(jfn)[-1].bound_symbols
             if b.sym.name.startswith("thunder_nb_module_walk")]
    return bsyms, [b._call_ctx[b.sym.name] for b in bsyms]


def test_thunders_own_cache_keeps_the_old_trace():
    """The premise: plain thunder.jit runs the trace made without head2 after head2 is attached (thunder 0.2.6)."""
    net = make_net()

    def fn(idx, y):
        return model_loss(net, net(idx), y)

    jfn = thunder.jit(fn)
    before = jfn(*batch(0))
    net.head2 = nn.Linear(8, 4)
    assert torch.equal(jfn(*batch(0)), before)
    assert not torch.equal(fn(*batch(0)), before)


# --- the walk ------------------------------------------------------------------------------------------------------

_LOOKUPS = [("submodule", "block"), ("parameter", "block.0.weight"), ("buffer", "block.steps"),
            ("parameter", "head.weight")]


def _tree() -> nn.Module:
    root = nn.Module()
    root.block = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    root.block.register_buffer("steps", torch.zeros(()))
    root.head = nn.Linear(4, 2)
    return root


class _Other(nn.Sequential):
    pass


@pytest.mark.parametrize("change, words", [
    (lambda r: setattr(r, "head2", nn.Linear(2, 2)), "Module has a new submodule head2"),
    (lambda r: delattr(r.block, "1"), "submodule 1 of Sequential (at block) was removed"),
    (lambda r: r.block.register_parameter("extra", nn.Parameter(torch.ones(1))),
     "Sequential (at block) has a new parameter extra"),
    (lambda r: delattr(r.head, "bias"), "parameter bias of Linear (at head) was removed"),
    (lambda r: r.head.register_buffer("mask", torch.ones(1)), "Linear (at head) has a new buffer mask"),
    (lambda r: delattr(r.block, "steps"), "buffer steps of Sequential (at block) was removed"),
    (lambda r: setattr(r, "flag", True), "Module has a new instance attribute flag"),
    (lambda r: delattr(r.head, "in_features"), "instance attribute in_features of Linear (at head) was removed"),
    (lambda r: setattr(r.block, "__class__", _Other), "the module at block is now a _Other (was a Sequential)"),
    (lambda r: r.block._modules.update({"0": r.block._modules.pop("0")}),
     "Sequential (at block)'s submodules are in another order"),
], ids=["submodule-added", "submodule-removed", "parameter-added", "parameter-removed", "buffer-added",
        "buffer-removed", "attribute-added", "attribute-removed", "class-swapped", "order"])
def test_a_change_of_a_reached_modules_members_fails_the_walk_with_its_words(change, words):
    """Each change fails the walk's C guard first (the next call would otherwise return the last call's objects
    unchecked), then the walk's comparison, which says what changed; at every later call too."""
    root = _tree()
    walk = ModuleWalk(_LOOKUPS)
    first = walk(root)
    assert walk(root) is first  # NOTE: proved by the guard
    change(root)
    for _ in range(2):
        with pytest.raises((StructureChanged, AttributeError)) as info:  # NOTE: or the lookup the change broke
            walk(root)
    if info.type is StructureChanged:
        assert str(info.value) == f"since the function was traced, {words}: thunder traces it again"
    else:
        assert words.startswith(("parameter bias", "buffer steps"))  # NOTE: a member a lookup reads


@pytest.mark.parametrize("change", [
    lambda r: setattr(r.head, "weight", nn.Parameter(torch.ones(2, 4))),
    lambda r: r.block.__setitem__(1, nn.LayerNorm(4)),
    lambda r: setattr(r.block, "steps", torch.ones(())),
    lambda r: setattr(r, "training", False),
    lambda r: setattr(r.head, "in_features", 5),
], ids=["parameter-replaced", "submodule-replaced", "buffer-replaced", "training-flag", "attribute-value"])
def test_a_member_replaced_under_its_name_is_no_change_of_members(change):
    """What thunder's own checks see (a tensor, an attribute's value, the training flag) or the walk reads anew (the
    object at a name) is not a change of members: the walk answers as the methods do, and its guard serves again."""
    root = _tree()
    walk = ModuleWalk(_LOOKUPS)
    walk(root)
    change(root)
    found = walk(root)
    assert all(a is getattr(root, f"get_{kind}")(t) for a, (kind, t) in zip(found, _LOOKUPS))
    assert walk(root) is found  # NOTE: a guard made anew proves the next call


def test_members_that_come_back_pass_again():
    """A module attached and then deleted: the first walk's members are the live ones again, and its guard serves."""
    root = _tree()
    walk = ModuleWalk(_LOOKUPS)
    first = walk(root)
    root.head2 = nn.Linear(2, 2)
    with pytest.raises(StructureChanged):
        walk(root)
    del root.head2
    again = walk(root)
    assert all(a is b for a, b in zip(again, first)) and walk(root) is again


def test_the_walk_that_reads_by_method_compares_the_members_on_every_call():
    """A module looking attributes up its own way gets no guard: every call walks, and compares."""
    class OwnLookup(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def __getattr__(self, name):
            return super().__getattr__(name)

    root = nn.Module()
    root.own = OwnLookup()
    walk = ModuleWalk([("parameter", "own.lin.weight")])
    walk(root)
    walk(root)
    assert walk._guard is None
    root.own.extra = nn.Linear(2, 2)
    with pytest.raises(StructureChanged, match="OwnLookup \\(at own\\) has a new submodule extra"):
        walk(root)
