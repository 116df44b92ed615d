"""Thunder's prologue with its module lookups made cheap: submodules, parameters and buffers read along their path's dicts.

On every call, thunder's prologue finds each submodule, parameter and buffer of a module the
function uses by its dotted name (``Module.get_submodule``, ``get_parameter``, ``get_buffer``):
two attribute lookups through the Python-level ``Module.__getattr__`` per name in the path, plus
the exceptions ``hasattr`` swallows. That is most of the prologue's host time on a model with a few dozen
parameters (`bench/host_profile.py`; bench/results/README.md, "Figures behind the defaults"), and under CUDA graphs
the host's time is what a step waits for. `FixedCUDAGraphTransform(fast_prologue=True)`, the default, makes the
prologue cheap in three ways, each giving the same objects and passing and failing where thunder's checks do:

- the lookups from one module become one `ModuleWalk` call, which walks the module dicts and, where every reading
  was plain, makes a C guard (torch.compile's guard trees) that proves the next call's answers (`module_walk`);
- thunder's value checks of attributes read from those modules (a ``training`` flag, a size) become checks the walk
  makes, held in its guard where the attribute is a plain instance entry (`module_walk`);
- the other tensor checks and value checks each become one call that compares them all at once and, where that
  differs, checks them one by one as thunder does (`prologue_checks`).

A walk also keeps the members of every module on its paths as its first call found them, and its origin's module
hooks, which thunder's cache does not check: a change makes the prologue fail (`StructureChanged`) and thunder traces
again (`module_walk`, `module_reads.HookCheck`).

`fast_module_lookups` rewrites the lookups into calls that read the dicts ``Module.__getattr__``
reads (``_modules``, ``_parameters``, ``_buffers``), one name at a time, with the dotted name split
once, when the prologue is made. The result is the object the method would return: the fast reading
is taken only where it cannot differ, checked on every call (by the walk or by its guard), and the
method itself runs everywhere else:

- a root whose class or instance has its own ``get_submodule``/``get_parameter``/``get_buffer`` (a
  method set on the instance), or a module on the path whose class looks attributes up its own way
  (``__getattr__``, ``__getattribute__``), is asked through its methods; a `thunder.ThunderModule` (what
  ``thunder.jit(module)`` returns) answers from its own dicts (its module cache, its parameter and buffer
  overrides) and then the wrapped model's methods: the walk reads those dicts where the name is in them;
- a name that an instance attribute, a class attribute (a property, a method, one added after the
  first call too) or an earlier dict of ``Module.__getattr__`` would resolve first is resolved by the
  method;
- anything missing, ``None`` or of the wrong kind goes to the method, which raises its own error.

The modules by job: this one rewrites the prologue's trace (`fast_module_lookups`); `module_walk` is `ModuleWalk`,
over `module_reads` (a module's members read from its dicts, and `StructureChanged`) and beside `walk_guards` (the C
guard of one walk); `prologue_checks` makes the checks at once.

Transforms that look for thunder's lookup and check symbols in the prologue (thunder's quantization,
distributed and check-pruning transforms) must come before the fixed transform in ``transforms=[...]``:
after it, they no longer find them. Where such a transform comes after it (thunder's ``ddp`` and ``fsdp``), the
prologue is left as thunder made it (`thunder_nb.fix.FixedCUDAGraphTransform.transform_traces_pre_prologue`), and so
it is on a thunder or torch other than the versions whose private parts the walks read
(`thunder_nb.internals.supported`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from thunder.core.prims import OpTags, PrimIDs
from thunder.core.proxies import Proxy
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx

from .. import internals
from .module_walk import BUFFER, PARAMETER, SUBMODULE, ModuleWalk, StructureChanged, child, plain_root
from .prologue_checks import check_tensor, tensor_checks, value_checks

__all__ = ["plain_root", "child", "ModuleWalk", "StructureChanged", "check_tensor", "tensor_checks", "value_checks",
           "rewrite_module_lookups", "fast_module_lookups"]

_VALUE_CHECKS = (PrimIDs.CHECK_NUMBER_TYPE_AND_VALUE, PrimIDs.CHECK_STRING_VALUE)


def _is_value_check(b: BoundSymbol) -> bool:
    """A check `value_checks` makes: thunder's check of a number or string against a constant."""
    return b.sym.id in _VALUE_CHECKS and len(b.args) == 2 and not b.kwargs and isinstance(b.args[0], Proxy) and (
        not isinstance(b.args[1], Proxy))


def _is_tensor_check(b: BoundSymbol) -> bool:
    """A check `tensor_checks` makes: thunder's tensor check of a shape of plain ints."""
    return b.sym.id == PrimIDs.CHECK_TENSOR_SHAPE_AND_METADATA and len(b.args) == 5 and not b.kwargs and all(
        type(d) is int for d in b.args[1])  # NOTE: a symbolic size (a NumberProxy) keeps thunder's check


class _Batched(NamedTuple):
    """A kind of thunder's checks that the prologue makes in one call, after the last of them."""

    what: str  # in the call's comment: "thunder's {n} {what} checks at once"
    accepts: Callable[[BoundSymbol], bool]  # the checks of this kind
    make: Callable[[list[BoundSymbol]], Any]  # the checks -> one function that makes them all


# NOTE: the call's name -> its kind. Where two kinds' last checks are at the same place, the later kind's call
# comes first in the prologue
_BATCHED = {
    "thunder_nb_check_values": _Batched("value", _is_value_check, lambda checks: value_checks(
        [b.args[1] for b in checks], [b.sym.id == PrimIDs.CHECK_STRING_VALUE for b in checks])),
    "thunder_nb_check_tensors": _Batched("tensor", _is_tensor_check, lambda checks: tensor_checks(
        [(b.args[1], *b.args[2:]) for b in checks])),
}

_KINDS = {PrimIDs.UNPACK_SUBMODULE: SUBMODULE, PrimIDs.UNPACK_PARAMETER: PARAMETER, PrimIDs.UNPACK_BUFFER: BUFFER}


def _call(name: str, fn: Any, args: tuple, output: Any, header: Any = "", dont_dce: bool = False) -> BoundSymbol:
    sym = Symbol(name, meta=None, python_impl=fn, id=name, tags=[OpTags.DONT_DCE] if dont_dce else None)
    return internals.bound_call(sym, args, output, fn, [], header=header)


def _lookup(b: BoundSymbol) -> str | None:
    """The kind of module lookup ``b`` is that a `ModuleWalk` makes, or None."""
    kind = _KINDS.get(b.sym.id)
    if (kind is None or len(b.args) != 2 or b.kwargs or not isinstance(b.args[0], Proxy)
            or not isinstance(b.args[1], str) or not b.args[1]):
        return None  # NOTE: an empty target is the module itself: nothing to walk
    return kind


def _foldable_attribute_reads(bsyms: Sequence[BoundSymbol]) -> tuple[dict[int, tuple[Proxy, int, BoundSymbol]],
                                                                     set[int]]:
    """The attribute reads a walk makes with their value checks: each ``unpack_attr`` of an origin's walk or of a
    submodule it looks up, whose value only a value check against a constant reads (``training``, a size, a flag),
    by id: (the origin, index of the lookup whose object it reads or -1 for the origin, the check); and the
    checks' ids."""
    modules: dict[str, tuple[Proxy, int]] = {}  # a submodule lookup's output name -> (the origin, lookup index)
    counts: dict[str, int] = {}
    origins: dict[str, Proxy] = {}
    for b in bsyms:
        kind = _lookup(b)
        if kind is not None:
            origin = b.args[0]
            i = counts[origin.name] = counts.get(origin.name, 0) + 1
            origins[origin.name] = origin
            if kind == SUBMODULE and isinstance(b.output, Proxy):
                modules[b.output.name] = (origin, i - 1)
    uses: dict[str, int] = {}
    checks: dict[str, BoundSymbol] = {}
    for b in bsyms:
        for p in b.flat_proxy_args:
            uses[p.name] = uses.get(p.name, 0) + 1
        if _is_value_check(b):
            checks[b.args[0].name] = b
    folded: dict[int, tuple[Proxy, int, BoundSymbol]] = {}
    for b in bsyms:
        if (b.sym.id != PrimIDs.UNPACK_ATTR or len(b.args) != 2 or b.kwargs or not isinstance(b.args[0], Proxy)
                or not isinstance(b.args[1], str) or not isinstance(b.output, Proxy)):
            continue
        obj, out = b.args[0].name, b.output.name
        check = checks.get(out)
        if check is None or uses.get(out) != 1:
            continue  # NOTE: the value is read by more than its check (an op, another read): it stays a read
        if obj in modules:
            folded[id(b)] = (*modules[obj], check)
        elif obj in origins:
            folded[id(b)] = (origins[obj], -1, check)
    return folded, {id(check) for *_, check in folded.values()}


def rewrite_module_lookups(bsyms: Sequence[BoundSymbol]) -> tuple[list[BoundSymbol], int]:
    """The prologue's bound symbols with each origin's module lookups by dotted name made one `ModuleWalk` call; and
    how many lookups and checks were rewritten.

    The call stands where the origin's first lookup stood and returns every lookup's output at once (the prologue
    only reads, so a lookup's answer is the same earlier in the call). Thunder's value and tensor checks of
    constants become one call of each kind (`_BATCHED`), after the last of them.
    """
    out: list[Any] = []
    n = 0
    # origin's name -> [place of its call in ``out``, the origin, [(kind, target, output)], [attribute checks]]
    walks: dict[str, list[Any]] = {}
    # the call's name (`_BATCHED`) -> thunder's checks it makes, each with its place in ``out``
    batched: dict[str, list[tuple[int, BoundSymbol]]] = {name: [] for name in _BATCHED}
    folded, folded_checks = _foldable_attribute_reads(bsyms)

    def walk_of(origin: Proxy) -> list[Any]:
        walk = walks.get(origin.name)
        if walk is None:
            walk = walks[origin.name] = [len(out), origin, [], []]
            out.append(None)  # NOTE: the walk's call, made below once all its lookups and reads are known
        return walk

    for b in bsyms:
        if id(b) in folded_checks:
            continue  # NOTE: made by the walk that reads its attribute
        fold = folded.get(id(b))
        if fold is not None:
            origin, index, check = fold
            walk_of(origin)[3].append((index, b.args[1], check.args[1], check.sym.id == PrimIDs.CHECK_STRING_VALUE))
            n += 2
            continue
        batch = next((name for name, kind in _BATCHED.items() if kind.accepts(b)), None)
        if batch is not None:
            batched[batch].append((len(out), b))
            continue
        kind = _lookup(b)
        if kind is None:
            out.append(b)
            continue
        origin, target = b.args
        walk_of(origin)[2].append((kind, target, b.output))
        n += 1
    for i, (at, origin, lookups, attributes) in enumerate(walks.values()):
        name = "thunder_nb_module_walk" + (f"_{i}" if i else "")
        walk = ModuleWalk([(kind, target) for kind, target, _ in lookups], attributes)
        checked = f" and {len(attributes)} checks of their attributes" if attributes else ""
        out[at] = _call(name, walk, (origin,), tuple(output for *_, output in lookups),
                        f"thunder's {len(lookups)} lookups of modules, parameters and buffers from {origin.name}"
                        f"{checked}, at once", dont_dce=bool(attributes))
    # NOTE: the later place first, so that inserting there leaves the earlier one where it was
    batches = []
    for name, placed in batched.items():
        if placed:
            kind, checks = _BATCHED[name], [b for _, b in placed]
            call = _call(name, kind.make(checks), tuple(b.args[0] for b in checks), None,
                         f"thunder's {len(checks)} {kind.what} checks at once", dont_dce=True)
            batches.append((placed[-1][0], call))  # NOTE: after the last of its checks
            n += len(checks)
    for at, bsym in sorted(batches, key=lambda x: -x[0]):
        out.insert(at, bsym)
    return out, n


def fast_module_lookups(prologue: TraceCtx) -> TraceCtx:
    """`rewrite_module_lookups` over a prologue trace; the same trace where it has no lookups, or where thunder or torch
    is not the version whose private parts the walks read (`thunder_nb.internals.supported`): thunder's prologue."""
    if not internals.supported():
        return prologue
    trace = from_trace(prologue)
    with tracectx(trace):
        bsyms, n = rewrite_module_lookups(prologue.bound_symbols)
    if not n:
        return prologue
    trace.bound_symbols = bsyms
    trace.set_provenance(TraceProvenance(f"thunder-nb module lookups along their paths ({n})"))
    return trace
