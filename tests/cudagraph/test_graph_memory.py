"""The runner's `GraphMemory`: what is read in place is graph memory not handed to the caller, or stable memory."""

from __future__ import annotations

import random

import torch

from thunder_nb.cudagraph.instances import Instance
from thunder_nb.cudagraph.memory import GraphMemory


def instance(index: int = 0) -> Instance:
    return Instance(graph=None, static_inputs=(), static_outputs=(), views=(), index=index)


def test_graph_memory_is_read_in_place_until_it_is_handed_to_the_caller_and_stable_memory_always():
    memory, inst = GraphMemory(), instance()
    owned, rotated, stable = 1000, 2000, 3000
    for ptr in (owned, rotated):
        memory.own(ptr, inst)
    memory.rotate(rotated, inst)  # NOTE: the caller's tensor now: copied when it comes back as an input
    memory.keep(stable)
    memory.rotate(stable, inst)  # NOTE: a parameter's memory stays read in place, whatever else happens to it
    memory.own(rotated, instance(1))  # NOTE: recorded again into memory a forward handed out: still the caller's
    assert [memory.reads_in_place(p) for p in (owned, rotated, stable, 4000)] == [True, False, True, False]
    assert memory.owner_of(rotated).index == 1 and memory.owner_of(4000) is None and rotated in inst.watched


def test_what_is_read_in_place_is_always_owned_memory_not_rotated_or_stable_memory():
    rng, memory, inst = random.Random(0), GraphMemory(), instance()
    for _ in range(2000):
        op, ptr = rng.choice(("own", "keep", "rotate")), rng.randrange(64)
        memory.own(ptr, inst) if op == "own" else memory.keep(ptr) if op == "keep" else memory.rotate(ptr, inst)
        assert memory.in_place == (set(memory.owner) - memory.rotated) | memory.stable


def test_a_parameter_seen_at_a_new_address_makes_its_storage_stable():
    memory, p = GraphMemory(), torch.nn.Parameter(torch.randn(4, 4))
    memory.add_parameter(p, p.data_ptr())
    assert memory.params == {id(p): p.data_ptr()} and memory.reads_in_place(p.untyped_storage().data_ptr())
    t = torch.randn(3)
    assert memory.where(t) == (t.untyped_storage().data_ptr(), None) and memory.foreign([t, 2.0]) == []


def test_an_output_in_memory_another_instance_writes_goes_out_as_a_fresh_alias_and_a_weights_view_as_it_is():
    """register: an output lying in an input's memory that another instance writes is one of `Instance.in_inputs` (a
    fresh alias each replay, so that keeping it raises the count its writer watches: tests/test_fuzz_regressions); one
    lying in a parameter's memory (a transposed weight saved for the backward) is not: no instance writes there, and
    an alias each call was host time on every forward (bench/results/2026-12-06-host-profile-cpu.md)."""
    memory, writer = GraphMemory(), instance()
    weight, other = torch.nn.Parameter(torch.randn(4, 3)), torch.randn(5)
    memory.add_parameter(weight, weight.data_ptr())
    memory.own(other.untyped_storage().data_ptr(), writer)
    inputs_memory = {t.untyped_storage().data_ptr() for t in (weight, other)}
    own = torch.randn(2)
    inst = Instance(graph=None, static_inputs=(weight, other), static_outputs=(weight.t(), other[1:], own, 3.0),
                    views=(), index=0)
    memory.register(inst, [], inputs_memory)
    assert inst.in_inputs == (1,)
    assert memory.owner_of(weight.untyped_storage().data_ptr()) is None
    assert memory.owner_of(other.untyped_storage().data_ptr()) is writer
    assert memory.owner_of(own.untyped_storage().data_ptr()) is inst
