"""The static checker: the rules that find the #728/#727 family of defects, graph-memory hazards, and collectives
(thunder's ``ddp`` and ``fsdp``) that a graph would replay wrong."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model import Defect, Op, TypeInfo
from .ops import (IN_PLACE_NAMES, VIEW_NAMES, WRITES_ARGUMENT, alias_root, base_name, classify_op, collective_op,
                  is_future)
from .plans import HandOutPlan, HandOutStats, RegionPlan, RegionStats
from .source import ParsedFunction

__all__ = ["TraceFacts", "check_trace", "graph_derived", "is_cuda", "classify_statement", "UNKNOWN"]

UNKNOWN = TypeInfo("other")


@dataclass(slots=True)
class TraceFacts:
    """What the checker and the model builder know of one trace: its parsed source, types, plans and stats."""

    kind: str
    name: str
    provenance: str
    top: ParsedFunction | None
    regions: dict[str, ParsedFunction]
    types: dict[str, TypeInfo]
    static_masks: dict[str, tuple[bool, ...]] = field(default_factory=dict)
    sync_outputs: frozenset[str] = frozenset()
    # output name -> `ops.capture_hazard` of the live symbol that makes it (what the source text does not show)
    hazards: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    plans: dict[str, RegionPlan] = field(default_factory=dict)
    stats: dict[str, RegionStats] = field(default_factory=dict)
    hand_out: HandOutPlan | None = None  # None: the transform hands everything out as it is (thunder's)
    returned: frozenset[str] = frozenset()  # tensors handed to the caller (from the live trace)
    saved: frozenset[str] = frozenset()  # tensors saved for the backward (from the live trace)
    aliases: frozenset[str] = frozenset()  # results of in-place copies: the destination's memory, not new memory
    hand_out_stats: HandOutStats = HandOutStats()
    # NOTE: top-level inputs the caller passes as arguments (not globals, closures or a jitted module's own
    # tensors); None when unknown (source text). A static slot filled from an argument can get another tensor.
    arguments: frozenset[str] | None = None

    def handed_over(self, region: str) -> frozenset[str]:
        """Numbers handed to ``region`` on the device."""
        plan = self.plans.get(region)
        return frozenset(h.number for h in plan.scalar_handoffs) if plan else frozenset()

    def written_back(self, region: str) -> frozenset[str]:
        """Inputs of ``region`` the runner writes back to the caller's tensor after each replay."""
        plan = self.plans.get(region)
        return frozenset(plan.write_back) if plan else frozenset()


def _alias_names(fns: Iterable[ParsedFunction]) -> frozenset[str]:
    return frozenset(
        n for fn in fns for op in fn.ops if op.callee.rsplit(".", 1)[-1] in IN_PLACE_NAMES for n in op.outputs
    )


def classify_statement(op: Op, facts: TraceFacts, cuda: bool) -> tuple[str, str] | None:
    """`ops.classify_op` of a statement, or the `ops.capture_hazard` its live symbol had."""
    if cuda and facts.hazards:
        hazard = next((facts.hazards[o] for o in op.outputs if o in facts.hazards), None)
        if hazard is not None:
            return hazard
    return classify_op(
        op.callee,
        [facts.types.get(n, UNKNOWN) for n in op.inputs],
        [facts.types.get(n, UNKNOWN) for n in op.outputs],
        sync_tag=any(o in facts.sync_outputs for o in op.outputs),
        cuda_trace=cuda,
    )


def is_cuda(types: Mapping[str, TypeInfo]) -> bool:
    return any(t.kind == "tensor" and (t.device or "").startswith("cuda") for t in types.values())


class _Findings:
    """Defects of one function (the top level, or one region), as the rules add them."""

    def __init__(self, fn: ParsedFunction, facts: TraceFacts, region: bool):
        self.fn, self.facts, self.region = fn, facts, region
        self.defects: list[Defect] = []

    def add(self, rule: str, value: str | None, line: int | None, message: str, hint: str) -> None:
        where = self.fn.name if self.region else None
        self.defects.append(Defect(rule, self.facts.kind, where, value, line, message, hint))


def _check_fn(fn: ParsedFunction, facts: TraceFacts, *, region: bool, cuda: bool) -> list[Defect]:
    """Apply every rule to one function (the top level, or one region)."""
    found = _Findings(fn, facts, region)
    returned = {n for op in fn.ops if op.kind == "return" for n in op.inputs}
    deleted, uses = _check_statements(found, returned, cuda)
    if region:
        _check_region_inputs(found, deleted, uses)
    else:
        _check_never_freed(found, returned)
    return found.defects


def _check_statements(found: _Findings, returned: set[str], cuda: bool) -> tuple[dict[str, int], dict[str, int]]:
    """Dels, uses after them, and ops that must not be captured; return (deleted name -> line, uses per name)."""
    fn, region = found.fn, found.region
    params = set(fn.params)
    deleted: dict[str, int] = {}
    reported_uad: set[str] = set()
    uses: dict[str, int] = {}
    for op in fn.ops:
        if op.kind == "del":
            for n in op.inputs:
                if n in deleted:
                    found.add("double-del", n, op.line, f"{n} is deleted twice (first on line {deleted[n]})",
                              "delete each name once, after its last use")
                    continue
                deleted[n] = op.line
                if region and n in returned:
                    found.add("region-deletes-output", n, op.line, f"{fn.name} deletes {n}, one of its own outputs",
                              "protect region outputs from the region's del pass")
                elif region and n in params:
                    found.add("region-deletes-outside-value", n, op.line,
                              f"{fn.name} deletes {n}, which was produced outside the region",
                              "delete values produced outside a region at top level, after their last consumer")
            continue
        for n in op.inputs:
            if n in deleted and n not in reported_uad:
                reported_uad.add(n)
                found.add("use-after-del", n, op.line, f"{n} is used after `del {n}` on line {deleted[n]}",
                          "move the del after the last use (or drop it from the region)")
            uses[n] = uses.get(n, 0) + 1
        for n in op.outputs:
            deleted.pop(n, None)
            reported_uad.discard(n)
        if region and op.kind == "call":
            c = classify_statement(op, found.facts, cuda)
            if c is not None:
                reason, detail = c
                what = ", ".join(op.outputs) or op.callee
                if reason == "host-sync":
                    found.add("host-sync-in-region", what, op.line,
                              f"{op.callee} ({detail}) reads a device value on the host inside {fn.name}",
                              "keep data-dependent ops out of regions (an island)")
                elif reason == "host-data":
                    found.add("host-data-in-region", what, op.line,
                              f"{op.callee} inside {fn.name} copies host data (a list index, torch.tensor(list), a "
                              "numpy constant) onto the device: CUDA refuses that copy during capture",
                              "keep ops that make tensors from host data out of regions (FixedCUDAGraphTransform "
                              "does), or index with a slice (h[:, -1:]) or a device tensor made once")
                elif reason == "collective":
                    what_op = "the wait on a collective" if detail == "wait" else f"the collective {detail}"
                    found.add("collective-in-region", what, op.line,
                              f"{op.callee} inside {fn.name}: {what_op} is recorded into a CUDA graph. A replay "
                              "repeats it without the process group (no handle to wait for, no timeout watching it; "
                              "gloo's collectives run on the host, where nothing is recorded), and a rank that "
                              "records the region again (a new shape, a result still held) runs its warm-up calls, "
                              "and with them the collective, alone: the ranks then hang or add up the wrong tensors",
                              _COLLECTIVE_HINT)
                elif reason == "capture-dependent":
                    found.add("capture-dependent-in-region", what, op.line,
                              f"{op.callee} inside {fn.name} makes or reads attention dropout's seed and offset: "
                              "host memory when run outside a graph, device memory inside one. A backward warm-up "
                              "or eager call reading a seed that a graph wrote dereferences a device pointer on the "
                              "host, and the process dies (SIGSEGV: in a notebook, the kernel)",
                              "keep dropout attention and its backward out of graphs (FixedCUDAGraphTransform "
                              "does), or set the attention's dropout to 0")
                else:
                    found.add("cpu-op-in-region", what, op.line,
                              f"{op.callee} ({detail}) inside {fn.name} runs once at capture, never on replay",
                              "keep device transfers and CPU ops out of regions")
    return deleted, uses


def _check_region_inputs(found: _Findings, deleted: dict[str, int], uses: dict[str, int]) -> None:
    """Inputs updated in place behind the runner's back, inputs used for nothing, Python numbers baked in."""
    fn, facts = found.fn, found.facts
    mask = facts.static_masks.get(fn.name, ())
    static = {p for p, m in zip(fn.params, mask) if m}
    kept = facts.written_back(fn.name)
    for op, p in _in_place_updates_of_params(fn):
        if p not in static and p not in kept:
            found.add("region-updates-input", p, op.line,
                      f"{fn.name} updates its input {p} in place: under capture the update lands in the runner's "
                      f"static copy and the caller's {p} keeps its old values",
                      "write the static copy back after replay (FixedCUDAGraphTransform does), or keep the update out of the region")
    handed = facts.handed_over(fn.name)
    for p in fn.params:
        if uses.get(p, 0) == 0:
            found.add("dead-region-input", p, fn.first_line,
                      f"{fn.name} takes {p} but uses it for nothing but a del" if p in deleted
                      else f"{fn.name} takes {p} but never uses it",
                      "pass a region only the values it computes with")
        if facts.types.get(p, UNKNOWN).is_scalar and p not in handed:
            found.add("scalar-region-input", p, fn.first_line,
                      f"{fn.name} takes the Python number {p}: each new value captures a new graph",
                      "hand the number over as a 0-d device tensor")


def _check_never_freed(found: _Findings, returned: set[str]) -> None:
    """Top-level intermediates that hold memory and are never deleted."""
    fn, facts = found.fn, found.facts
    defined: dict[str, int] = {}
    top_dels: set[str] = set()
    for op in fn.ops:
        if op.kind == "del":
            top_dels.update(op.inputs)
        for n in op.outputs:
            defined.setdefault(n, op.line)
    for n, line in defined.items():
        if n in fn.params or n in returned or n in top_dels or n in facts.aliases or n == "_":
            continue  # NOTE: `_` is thunder's placeholder for a None (e.g. a missing cotangent)
        t = facts.types.get(n, UNKNOWN)
        if not (t.kind == "tensor" or (t.kind == "other" and not t.text)):
            continue  # NOTE: numbers, collections and placeholders (`_`, typed None) hold no memory
        found.add("never-freed", n, line, f"{n} is never deleted at top level: it stays alive until the function returns",
                  "delete it right after its last consumer")


def _in_place_updates_of_params(fn: ParsedFunction) -> list[tuple[Op, str]]:
    """In-place statements (``copy_``, `ops.WRITES_ARGUMENT`) that write (through an alias or a view) into a
    parameter."""
    find = alias_root(
        [*op.inputs, *op.outputs] for op in fn.ops if op.callee.rsplit(".", 1)[-1] == "update_aliases"
    )
    found = []
    for op in fn.ops:
        at = WRITES_ARGUMENT.get(base_name(op.callee))
        if at is not None and len(op.inputs) > at:
            group = find(op.inputs[at])
            found += [(op, p) for p in fn.params if find(p) == group]
    return found


def graph_derived(fn: ParsedFunction) -> dict[str, str]:
    """Top-level names that lie in a graph's memory: region outputs, and views of them made outside, with their
    region."""
    owner: dict[str, str] = {}
    for op in fn.ops:
        if op.kind == "region":
            owner.update({n: op.callee for n in op.outputs})
        elif op.kind in ("call", "unpack") and (op.kind == "unpack" or base_name(op.callee) in VIEW_NAMES
                                                 or base_name(op.callee) in IN_PLACE_NAMES):
            src = next((owner[n] for n in op.inputs if n in owner), None)
            if src is not None:
                owner.update({n: src for n in op.outputs})
    return owner


def _memory_of(name: str, owner: dict[str, str], made_in: dict[str, str]) -> str:
    """``the output buffer of CUDAGraph1`` or ``a view of CUDAGraph1's output memory``."""
    return f"the output buffer of {owner[name]}" if name in made_in else f"a view of {owner[name]}'s output memory"


def _check_graph_memory(facts: TraceFacts) -> list[Defect]:
    """What leaves a trace in graph memory and is not handled at its hand-out."""
    out: list[Defect] = []
    top = facts.top
    if top is None:
        return out
    owner = graph_derived(top)
    ret = next((op for op in top.ops if op.kind == "return"), None)
    line = ret.line if ret is not None else None
    made_in = {n: op.callee for op in top.ops if op.kind == "region" for n in op.outputs}
    copies = facts.hand_out is not None and facts.hand_out.copy_outputs
    for n in sorted(facts.returned & owner.keys()):
        if copies:
            continue
        what = _memory_of(n, owner, made_in)
        if facts.kind == "backward":
            # NOTE: thunder's backward runs on autograd's CPU thread (its input is a meta-device placeholder),
            # a CUDA leaf's AccumulateGrad on the device thread: the next backward of the same pass can
            # replay before the gradient is accumulated. torch.autograd.grad and hooks get the buffer itself.
            out.append(Defect("returned-graph-memory", facts.kind, None, n, line,
                              f"{n} is handed to autograd as a gradient in {what}: the backward of another "
                              "forward replays the same graph and overwrites it in place, possibly before "
                              "autograd has accumulated it (and a gradient that torch.autograd.grad or a hook "
                              "hands out changes with it)",
                              "copy gradients out of graph memory (FixedCUDAGraphTransform does)"))
            continue
        out.append(Defect("returned-graph-memory", facts.kind, None, n, line,
                          f"{n} is returned as {what}: the next call's replay overwrites it in place, "
                          "so a result kept from an earlier call changes silently",
                          "copy returned tensors out of graph memory (FixedCUDAGraphTransform does, "
                          "unless copy_outputs=False)"))
    if facts.hand_out is None and facts.kind == "forward":
        for n in sorted(facts.saved & owner.keys()):
            what = _memory_of(n, owner, made_in)
            out.append(Defect("saved-graph-memory", facts.kind, None, n, line,
                              f"{n} is saved for the backward as {what}: a second forward before this "
                              "backward overwrites it, and the gradients come out wrong without an error",
                              "guard saved tensors in graph memory (FixedCUDAGraphTransform replays "
                              "another graph instance while they are held)"))
    return out


def _check_static_inputs(facts: TraceFacts) -> list[Defect]:
    """Static region inputs that a call can fill with another tensor, and those the runner saw rebound.

    thunder's runner keys a static input by its position only: a call that passes another tensor
    there (another layer's parameters) has it copied into the memory of the tensor the graph was
    captured with. Predicted from the traces where the static input is one of the function's
    arguments (the transform's hand-out plan is None: thunder's own transform), and recorded by a
    runner that saw it happen.
    """
    out: list[Defect] = []
    hint = "key static inputs by address (FixedCUDAGraphTransform gives each its own graph)"
    for region in dict.fromkeys([*facts.regions, *facts.stats]):
        fn, stats = facts.regions.get(region), facts.stats.get(region)
        line = fn.first_line if fn else None
        seen = {change.name: change for change in (stats.rebound if stats else ())}
        predicted: set[str] = set()
        if fn is not None and facts.hand_out is None and facts.arguments:
            mask = facts.static_masks.get(region, ())
            for p in (p for p, m in zip(fn.params, mask) if m and p in facts.arguments):
                predicted.add(p)
                done = f" (the runner did so: {seen[p]})" if p in seen else ""
                out.append(Defect("static-input-rebound", facts.kind, region, p, line,
                                  f"{region}: {p} is a static input and an argument of the function: thunder's "
                                  "runner keys static inputs by position, so a call with another tensor here "
                                  f"(another layer's weights) copies it into the tensor {region} was captured "
                                  f"with{done}", hint))
        for name, entry in seen.items():
            if name not in predicted:
                out.append(Defect("static-input-rebound", facts.kind, region, name, line,
                                  f"{region}: {entry}, so the tensor it was captured with is overwritten", hint))
    return out


_COLLECTIVE_HINT = ("keep collectives and their waits out of regions: thunder.distributed.ddp(thunder_nb.jit(model)) "
                    "(or fsdp) launches and waits for each one outside the graphs")


def _where(owner: str | None) -> str:
    return f"in {owner}" if owner else "at top level"


def _check_handles(facts: TraceFacts) -> list[Defect]:
    """Communication handles (what a collective launched asynchronously returns, for its ``wait``) that go into or
    out of a region: the collective and its wait on two sides of a region's boundary, one of them in a graph.

    A wait captured in a graph on work launched outside that capture (at top level, or in another region's graph) is
    a wait on an event the capture did not record, which CUDA refuses; a handle a region returns is the one its
    recording made, handed out again at every replay, so the wait after it waits for the recording's collective."""
    out: list[Defect] = []
    top = facts.top
    if top is None:
        return out
    futures = {n for n, t in facts.types.items() if is_future(t)}

    def owner(op) -> str | None:
        return op.callee if op.kind == "region" else None

    def inner(region: str, name: str, made: bool) -> tuple[str, int | None]:
        """The collective (made) or the reader of ``name`` inside ``region``, with its line."""
        fn = facts.regions.get(region)
        ops = [] if fn is None else [o for o in fn.ops if o.kind == "call"
                                     and name in (o.outputs if made else o.inputs)]
        if not ops:
            return ("a collective" if made else "its reader"), (fn.first_line if fn else None)
        return collective_op(ops[0].callee), ops[0].line

    makers = {n: op for op in top.ops if op.kind in ("call", "region") for n in op.outputs if n in futures}
    for name, maker in makers.items():
        readers = [op for op in top.ops if op.kind in ("call", "region", "return") and name in op.inputs]
        made_in = owner(maker)
        collective = (inner(made_in, name, True)[0] if made_in else collective_op(maker.callee))
        crossings = [r for r in readers if owner(r) != made_in]
        if made_in is None and not any(owner(r) for r in crossings):
            continue  # NOTE: launched and waited for at top level: no region in between
        for reader in crossings or [None]:
            read_in = owner(reader) if reader is not None else None
            if read_in is not None:
                waiter, line = inner(read_in, name, False)
                region = read_in
                message = (f"{read_in} takes {name}, the handle of {collective} launched {_where(made_in)}, and "
                           f"{'waits for it' if waiter == 'wait' else f'reads it ({waiter})'} inside its graph: "
                           "capture refuses a wait on work launched outside it, and a replay would not wait for the "
                           "next call's collective")
            else:
                region, line = made_in, (facts.regions[made_in].first_line if made_in in facts.regions else None)
                then = ("nothing waits for" if reader is None else "is returned" if reader.kind == "return"
                        else f"is read {_where(None)} ({collective_op(reader.callee)})")
                message = (f"{made_in} launches {collective} inside its graph and hands out its handle {name}, which "
                           f"{then}: every replay hands out the handle its recording made, so the wait waits for the "
                           "recording's collective, not the replay's")
            out.append(Defect("handle-crosses-region", facts.kind, region, name, line, message, _COLLECTIVE_HINT))
    return out


def check_trace(facts: TraceFacts) -> list[Defect]:
    cuda = is_cuda(facts.types)
    facts.aliases = _alias_names(([facts.top] if facts.top else []) + list(facts.regions.values()))
    out: list[Defect] = []
    if facts.top is not None:
        out += _check_fn(facts.top, facts, region=False, cuda=cuda)
    for fn in facts.regions.values():
        out += _check_fn(fn, facts, region=True, cuda=cuda)
    return out + _check_graph_memory(facts) + _check_static_inputs(facts) + _check_handles(facts)
