"""Thunder's prologue with its module lookups made cheap: submodules, parameters and buffers read along their path's dicts.

On every call, thunder's prologue finds each submodule, parameter and buffer of a module the
function uses by its dotted name (``Module.get_submodule``, ``get_parameter``, ``get_buffer``):
two attribute lookups through the Python-level ``Module.__getattr__`` per name in the path, plus
the exceptions ``hasattr`` swallows. On the nanoGPT training step (28 parameters, 32 submodules)
that was 70% of the prologue and a third of the whole step's host time (`bench/host_profile.py`).

`fast_module_lookups` rewrites those lookups into calls that read the dicts ``Module.__getattr__``
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

The lookups from one module (the origin: the jitted module, a module the jitted function closes over, or a module
argument) become one call of a `ModuleWalk` where the first of them stood. It walks each module on the paths once
(`child`, one step from its parent, the root's check `plain_root` first), and where every lookup took the plain
reading it makes one C guard of everything those readings relied on; later calls return the same objects after one
check of that guard, and walk anew where it fails. A submodule, parameter or buffer replaced between calls, an
attribute or class attribute that would now shadow one, a class written to: each fails the guard, and the walk finds
what the methods would.

Thunder's cache checks what its trace read (tensors, attribute values, each module's ``training`` flag) but not which
members the modules have: a trace that branched on ``hasattr(model, "head2")`` hit the cache after ``model.head2 =
...``, and ran without the new module (thunder's own prologue has the same gap). A walk keeps, at its first call
(thunder runs a new prologue right after it traced, on the same objects), the members of every module on its paths:
its class, the names of its submodules, parameters and buffers in order, and the names in its instance dict
(`_members`); at every later call where they differ it raises `StructureChanged`, the prologue fails, and thunder
traces anew (a later change back lets the entry hit again). The walk's guard holds them too (`_guard_members`): the
version tags of the three dicts, which any write changes, and the instance dict's length and own names.

Thunder's reads of an attribute of the origin or of a submodule it looks up, whose value only a value check against
a constant reads (a module's ``training`` flag, its sizes: 87 of the 104 value checks of litgpt pythia-14m's decode
step), become checks the walk makes. Its guard holds those of them read plainly from an instance dict (the value's
type and equality), so a call its guard proves reads none of them; the others (a property, a class attribute, NaN)
it reads and checks on every call, and a walk without a guard checks them all.

The prologue's tensor checks (``check_tensor_metadata``: shape, device, dtype, ``requires_grad``)
where the shape is all plain ints (33 on the nanoGPT step) become one call of `tensor_checks`'
function after the last of them, which compares them all at once and, where that differs, checks
each tensor as thunder does (`check_tensor`); once a call passed, later calls are first proved by one C
guard of that call's tensor metadata (torch.compile's, `internals.metadata_guard`). Its checks of numbers and strings
(``check_number_type_and_value``: a module's ``training`` flag, its sizes, a config value, the
cache's flags; ``check_string_value``; 98 on the nanoGPT step) become one call of `value_checks`'
function, the same way. A check that fails raises, as thunder's does, and thunder then traces anew
(under ``python -O`` thunder's own tensor check, made of ``assert`` statements, checks nothing; this
one still does). The checks have no side effects, and any failing check makes the prologue fail, so
where they run in it changes nothing.

Transforms that look for thunder's lookup and check symbols in the prologue (thunder's quantization,
distributed and check-pruning transforms) must come before the fixed transform in ``transforms=[...]``:
after it, they no longer find them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from thunder.core.prims import OpTags, PrimIDs
from thunder.core.proxies import Proxy
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx

from .. import internals

__all__ = ["plain_root", "child", "ModuleWalk", "StructureChanged", "check_tensor", "tensor_checks", "value_checks",
           "rewrite_module_lookups", "fast_module_lookups"]

_Module = torch.nn.Module
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_MISSING = object()
_GETATTR = _Module.__getattr__
_GETATTRIBUTE = _Module.__getattribute__
_METHODS = {name: getattr(_Module, name) for name in ("get_submodule", "get_parameter", "get_buffer")}
_HEAPTYPE = 1 << 9  # NOTE: Py_TPFLAGS_HEAPTYPE: a class made by a class statement (its attributes can be set)
_NONE: dict[str, Any] = {}  # NOTE: read only: what a module without a ``_parameters`` or ``_buffers`` dict has


def _plain(m: Any) -> bool:
    """Whether ``m``'s class looks attributes up as ``nn.Module`` does."""
    cls = type(m)
    return getattr(cls, "__getattr__", None) is _GETATTR and cls.__getattribute__ is _GETATTRIBUTE


def plain_root(root: Any) -> Any:
    """``root`` where its lookups may be read along their paths; None where only its own methods may answer."""
    if not _plain(root):
        return None
    cls, d = type(root), root.__dict__
    for name, method in _METHODS.items():
        if getattr(cls, name, None) is not method or name in d:
            return None
    return root


def child(m: Any, a: str) -> Any:
    """``getattr(m, a)`` for plain ``m`` where it is the plain submodule ``m._modules[a]``; None where it may differ (or ``m`` is None)."""
    if m is None:
        return None
    d = m.__dict__
    modules = d.get("_modules")
    sub = modules.get(a) if modules is not None else None
    # NOTE: Module.__getattr__ reads _parameters, then _buffers, then _modules, and only for names that the
    # instance's and the class's attributes do not have
    if sub is None or a in d or a in d.get("_parameters", _NONE) or a in d.get("_buffers", _NONE) or getattr(
            type(m), a, _MISSING) is not _MISSING:
        return None
    cls = type(sub)  # NOTE: `_plain(sub)`, inlined: this runs once per module on the paths, every call
    if getattr(cls, "__getattr__", None) is not _GETATTR or cls.__getattribute__ is not _GETATTRIBUTE:
        return None
    return sub


def _read_parameter(m: Any, name: str) -> Any:
    """``m``'s parameter ``name`` where ``getattr(m, name)`` is plainly ``m._parameters[name]``; None where it may
    differ."""
    d = m.__dict__
    p = d.get("_parameters", _NONE).get(name)
    if p is not None and name not in d and getattr(type(m), name, _MISSING) is _MISSING and isinstance(p, _Parameter):
        return p
    return None


def _read_buffer(m: Any, name: str) -> Any:
    """``m``'s buffer ``name`` where ``getattr(m, name)`` is plainly ``m._buffers[name]``; None where it may differ."""
    d = m.__dict__
    b = d.get("_buffers", _NONE).get(name)
    if (b is not None and name not in d and name not in d.get("_parameters", _NONE)
            and getattr(type(m), name, _MISSING) is _MISSING):
        return b
    return None


class StructureChanged(AssertionError):
    """A module the trace reached has other members than when it was traced (a submodule, parameter, buffer or
    instance attribute added or removed, or another class): the prologue fails, as a failing check of thunder's does,
    and thunder traces the function again."""


_MEMBERS = ("_modules", "_parameters", "_buffers")
_KINDS_OF = {"_modules": "submodule", "_parameters": "parameter", "_buffers": "buffer"}
_INSTANCE_DICT = object.__getattribute__  # NOTE: ``__dict__`` as ``Module`` reads it, past a class's own lookup


def _members(m: Any) -> tuple:
    """What a trace of code using ``m`` may have branched on besides the values thunder checks: ``m``'s class, the
    names of its submodules, parameters and buffers (in order: a ``Sequential`` runs its submodules in that order), and
    the names in its instance dict (``hasattr`` finds a name there first)."""
    d = _INSTANCE_DICT(m, "__dict__")
    return (type(m), *(tuple(d.get(which, _NONE)) for which in _MEMBERS), frozenset(d))


def _same_members(m: Any, members: tuple) -> bool:
    """Whether ``m`` has ``members`` (`_members`), compared without building them."""
    d = _INSTANCE_DICT(m, "__dict__")
    cls, modules, parameters, buffers, names = members
    return (type(m) is cls and d.keys() == names and tuple(d.get("_modules", _NONE)) == modules
            and tuple(d.get("_parameters", _NONE)) == parameters and tuple(d.get("_buffers", _NONE)) == buffers)


def _members_change(m: Any, path: str, members: tuple) -> str:
    """What differs between ``m``'s members and ``members`` (`_members`), in words."""
    now = _members(m)
    where = f"{type(m).__name__}" + (f" (at {path})" if path else "")
    if now[0] is not members[0]:
        return f"the module at {path or 'the origin'} is now a {type(m).__name__} (was a {members[0].__name__})"
    for which, was, is_ in zip(_MEMBERS, members[1:4], now[1:4]):
        kind = _KINDS_OF[which]
        added = [n for n in is_ if n not in was]
        if added:
            return f"{where} has a new {kind} {added[0]}"
        gone = [n for n in was if n not in is_]
        if gone:
            return f"{kind} {gone[0]} of {where} was removed"
        if was != is_:
            return f"{where}'s {kind}s are in another order"
    added = sorted(now[4] - members[4])
    if added:
        return f"{where} has a new instance attribute {added[0]}"
    return f"instance attribute {sorted(members[4] - now[4])[0]} of {where} was removed"


#: The names every ``Module`` has in its instance dict once ``Module.__init__`` ran (its hooks' dicts, ``training``,
#: ``_parameters``, ...): left out of a guard's names (`_guard_members`), which still counts them.
_MODULE_NAMES = frozenset(vars(_Module()))


def _guard_members(node: Any, m: Any) -> None:
    """Add to a guard (``node``: ``m``'s node) that ``m``'s members are still `_members` (its class is guarded
    elsewhere): its instance dict holds as many names, among them each of its own (those not `_MODULE_NAMES`: a
    ``Module``'s own bookkeeping is deleted by nobody, and each name costs a check on every call), and its
    ``_modules``, ``_parameters`` and ``_buffers`` dicts have not been written to (their version tags: a name added,
    removed or moved, or an entry replaced, which the walk then reads anew)."""
    d = _INSTANCE_DICT(m, "__dict__")
    dict_node = node.instance_dict(d)
    internals.guard_dict_keys(dict_node, d, [name for name in d if name not in _MODULE_NAMES])
    for which in _MEMBERS:
        if which in d:
            dict_node.item(which, d[which]).unchanged(d[which])
        else:
            dict_node.lacks(which)


_SUBMODULE, _PARAMETER, _BUFFER = "submodule", "parameter", "buffer"
_READS = {_PARAMETER: _read_parameter, _BUFFER: _read_buffer}
_METHOD_OF = {_SUBMODULE: "get_submodule", _PARAMETER: "get_parameter", _BUFFER: "get_buffer"}


class ModuleWalk:
    """Every module lookup a prologue makes from one origin, in one call: ``walk(origin)`` returns, in order, what
    ``origin.get_submodule(target)``, ``get_parameter`` or ``get_buffer`` returns for each ``(kind, target)`` of
    ``lookups``.

    A call walks the paths: `plain_root`, then each module on the paths once by `child`, each parameter and buffer
    read from its module's dict where that reading cannot differ from the method's (`_read_parameter`,
    `_read_buffer`), the method everywhere else. Where every lookup of a call took the plain reading, that call also
    makes one C guard (`internals.ObjectGuard`) of everything those readings relied on: each module and parameter on
    the paths is the same object at the same key of its parent's dicts, no instance dict holds a name that would
    shadow it, each object's class is the same, and no class on those classes' MROs has been written to since (their
    dicts' version tags; static types such as ``object`` take no attributes and are left out), which covers the
    class attributes the readings found absent and ``Module``'s own ``__getattr__`` and methods. A guard serves only
    once it passes the objects it was made of. The next calls then return that call's objects after one check of the
    guard (about 4 µs on the CPU for litgpt's pythia-14m, where the walk took 20), and walk again where it fails.
    The objects are held until then. A walk that keeps failing its guard (`_GUARD_REMAKES`) stops making guards.
    For a `thunder.ThunderModule` origin, each lookup reads the dict its method reads first (`_thunder_module_dicts`),
    and the guard holds each answer at its key of that dict (`_thunder_module_guard`; litgpt pythia-14m jitted as a
    module: prologue 28.5 -> 14 µs on the CPU).

    With ``structure`` (the prologue's walks), the first call keeps the members of each module on the paths
    (`_members`: its class, its submodules', parameters' and buffers' names in order, its instance dict's names), and
    every later call that its guard does not prove compares them, raising `StructureChanged` where any differs (the
    prologue fails: thunder traces anew); the guard holds them (`_guard_members`), so a proved call compares nothing.

    ``attributes`` are thunder's value checks of attributes read from the origin or from a submodule a lookup found
    (`attribute_checks`). Every walk reads them by ``getattr`` and checks them, raising as thunder's check does (the
    prologue then fails: a new trace). Its guard also holds each of them found plainly in its module's instance dict
    (there, no attribute of that name on the class, whose MRO the guard keeps unchanged; not NaN, which equals
    nothing): the same type and an equal value. A call the guard proves checks only the others (`_plain_attributes`).
    """

    def __init__(self, lookups: Sequence[tuple[str, str]], attributes: Sequence[tuple[int, str, Any, bool]] = (), *,
                 structure: bool = True):
        #: (kind, target) of each lookup, in order: kind is "submodule", "parameter" or "buffer"
        self.lookup_targets = tuple(lookups)
        #: thunder's value checks of attributes read from the origin or a looked-up module, made by the walk:
        #: (index of the lookup whose object is read, -1 for the origin; attribute; expected value; whether thunder
        #: checks it as a string)
        self.attribute_checks = tuple(attributes)
        # NOTE: each module on the paths once, a parent before its children: (index of the parent, name), the
        # origin's plain root at index 0
        paths: dict[tuple[str, ...], int] = {(): 0}
        steps: list[tuple[int, str]] = []

        def index(path: tuple[str, ...]) -> int:
            i = paths.get(path)
            if i is None:
                parent = index(path[:-1])
                i = paths[path] = len(steps) + 1
                steps.append((parent, path[-1]))
            return i

        plan = []
        for kind, target in self.lookup_targets:
            if kind == _SUBMODULE:
                plan.append((kind, target, index(tuple(target.split("."))), ""))
            else:
                path, _, name = target.rpartition(".")
                plan.append((kind, target, index(tuple(path.split(".")) if path else ()), name))
        self._steps = tuple(steps)
        self._plan = tuple(plan)
        #: the dotted path of each module of ``walked`` (the origin's own: "")
        self.paths = tuple(".".join(path) for path, _ in sorted(paths.items(), key=lambda item: item[1]))
        # NOTE: `_members` of each module on the paths at the first call (thunder runs a new prologue right after it
        # traced, on the same objects), None before it; False where the walk does not check them
        self._structure: list | bool | None = None if structure else False
        # NOTE: per attribute check, the index in ``walked`` of the module it reads (0: the origin), None where its
        # object is a parameter or buffer (never in the guard)
        self._attribute_at = tuple(0 if i < 0 else plan[i][2] if plan[i][0] == _SUBMODULE else None
                                   for i, *_ in self.attribute_checks)
        self._check_attributes = _attribute_checker(self.attribute_checks)
        self._guard: Callable[[Any], bool] | None = None
        self._found: tuple = ()
        self._held: tuple = ()  # NOTE: the guard's objects, kept alive while it compares their ids
        self._unguarded: Callable[[Any, tuple], None] | None = None  # checks of the attributes the guard leaves out
        self._made = 0

    def __call__(self, origin: Any) -> tuple:
        guard = self._guard
        if guard is not None and guard(origin):
            if self._unguarded is not None:
                self._unguarded(origin, self._found)
            return self._found
        self._guard, self._found, self._held, self._unguarded = None, (), (), None
        found, walked, reads = self.walk(origin)
        reached = None if self._structure is False else self._check_structure(origin, walked)
        self._check_attributes(origin, found)
        if reads is not None and self._made < _GUARD_REMAKES:
            self._made += 1
            # NOTE: the object each attribute check reads (a submodule lookup's answer is the module walked to);
            # where the guard has it: the lookup's index for a ThunderModule (`walked` None), else its walked index
            objects = [origin if i < 0 else found[i] if self._plan[i][0] == _SUBMODULE else None
                       for i, *_ in self.attribute_checks]
            places = [i for i, *_ in self.attribute_checks] if walked is None else self._attribute_at
            try:
                guarded, unguarded = self._plain_attributes(objects, places)
                if walked is None:  # NOTE: a ThunderModule's lookups, read from its own dicts
                    made = _thunder_module_guard(origin, self._plan, found, guarded, self.paths, reached)
                else:
                    made = _walk_guard(origin, self._steps, walked, reads, guarded, reached is not None)
            except Exception:  # NOTE: torch's guard refused an object: walked every call from now on
                made, self._made = None, _GUARD_REMAKES
            if made is not None and made[0](origin):
                self._guard, self._held = made
                self._found = found
                self._unguarded = (_attribute_checker([self.attribute_checks[i] for i in unguarded]) if unguarded
                                   else None)
            elif made is not None:  # NOTE: a guard that fails the very objects it was made of would never serve
                self._made = _GUARD_REMAKES
        return found

    def _check_structure(self, origin: Any, walked: list[Any] | None) -> list[Any]:
        """The modules on the paths (`reached`); at the first call their `_members` are kept, at every later call
        compared with them: raises `StructureChanged` where any differs."""
        reached = self.reached(origin, walked)
        kept = self._structure
        if kept is None:
            self._structure = [_members(m) for m in reached]
        else:
            for m, path, members in zip(reached, self.paths, kept):
                if not _same_members(m, members):
                    raise StructureChanged(f"since the function was traced, {_members_change(m, path, members)}: "
                                           "thunder traces it again")
        return reached

    def reached(self, origin: Any, walked: list[Any] | None) -> list[Any]:
        """The module at each of `paths` from ``origin``, as its lookups find it: the module ``walked`` to, else the
        answer of ``get_submodule`` (a `thunder.ThunderModule` origin's: its module cache first)."""
        if walked is None:
            cache = _thunder_module_dicts(origin)
            cache = cache[_SUBMODULE] if cache is not None else _NONE
            return [cache[p] if p in cache else origin.get_submodule(p) for p in self.paths]
        return [m if m is not None else origin.get_submodule(p) for m, p in zip(walked, self.paths)]

    def _plain_attributes(self, objects: Sequence[Any], places: Sequence[Any]) -> tuple[list[tuple[Any, str, Any]],
                                                                                       list[int]]:
        """The attribute checks a guard can make: ``(place, name, value)`` of each attribute read plainly from the
        instance dict of its object (``objects[i]``, None where it is not a module in the guard; ``places[i]`` says
        where the guard has it): there, and not on its class's MRO, which the guard keeps unchanged; its value equal
        to itself (not NaN). And the indices of the other checks (a property, a parameter's attribute, NaN), which
        the walk makes on every call."""
        guarded, unguarded = [], []
        for i, ((_, name, _, _), m, at) in enumerate(zip(self.attribute_checks, objects, places)):
            d = m.__dict__ if m is not None and type(m).__getattribute__ is _GETATTRIBUTE else _NONE
            value = d.get(name, _MISSING)
            if value is not _MISSING and getattr(type(m), name, _MISSING) is _MISSING and value == value:
                guarded.append((at, name, value))
            else:
                unguarded.append(i)
        return guarded, unguarded

    def walk(self, origin: Any) -> tuple[tuple, list[Any], list | None]:
        """The lookups' results; the modules walked to, the origin's plain root first, then one per step (None where
        the method must answer); and each parameter or buffer read from its module's dict, as ``(index of the
        module, name, kind, value)``, or None where any lookup took its method."""
        root = plain_root(origin)
        if root is None:
            dicts = _thunder_module_dicts(origin)
            if dicts is not None:
                return self._walk_thunder_module(origin, dicts)
        walked = [root]
        for parent, a in self._steps:
            walked.append(child(walked[parent], a))
        reads: list | None = [] if root is not None and None not in walked else None
        found = []
        for kind, target, at, name in self._plan:
            m = walked[at]
            if kind == _SUBMODULE:
                value = m if m is not None else origin.get_submodule(target)
            else:
                value = _READS[kind](m, name) if m is not None else None
                if value is None:
                    value = getattr(origin, _METHOD_OF[kind])(target)
                    reads = None
                elif reads is not None:
                    reads.append((at, name, kind, value))
            found.append(value)
        return tuple(found), walked, reads

    def _walk_thunder_module(self, origin: Any, dicts: dict[str, dict]) -> tuple[tuple, None, list | None]:
        """`walk` for a `thunder.ThunderModule` origin: each lookup read from the dict its own method reads first,
        the method where the name is not there (then ``reads`` is None: no guard)."""
        found, plain = [], True
        for kind, target, _, _ in self._plan:
            value = dicts[kind].get(target, _MISSING)
            if value is _MISSING:
                value, plain = getattr(origin, _METHOD_OF[kind])(target), False
            found.append(value)
        return tuple(found), None, [] if plain else None


def _thunder_module_dicts(origin: Any) -> dict[str, dict] | None:
    """The dicts a `thunder.ThunderModule` answers its lookups from first, by kind (its own ``get_submodule``,
    ``get_parameter``, ``get_buffer``: thunder's module cache and overrides, then the wrapped model's methods); None
    where ``origin`` is not thunder's own class, or its instance has a lookup method of its own."""
    if type(origin) is not internals.thunder_module_class():
        return None
    d = origin.__dict__
    if any(name in d for name in _METHODS):
        return None
    dicts = {kind: d.get(name) for kind, name in internals.THUNDER_MODULE_LOOKUPS.items()}
    return dicts if all(type(v) is dict for v in dicts.values()) else None


def _attribute_checker(checks: Sequence[tuple[int, str, Any, bool]]) -> Callable[[Any, tuple], None]:
    """``check(origin, found)``: thunder's value check of each attribute of ``checks`` (see `ModuleWalk`), read by
    ``getattr`` from the origin or the object a lookup found; raises as thunder's check does."""
    # NOTE: per object, one ``operator.attrgetter`` of all its attributes (one C call); the checks in that order
    by_object: dict[int, list[tuple[int, str, Any, bool]]] = {}
    for c in checks:
        by_object.setdefault(c[0], []).append(c)
    ordered = [c for group in by_object.values() for c in group]
    values = value_checks([v for *_, v, _ in ordered], [string for *_, string in ordered])
    getters = []
    for i, group in by_object.items():
        names = [name for _, name, _, _ in group]
        if any("." in name for name in names):  # NOTE: attrgetter would follow a dotted name: read one by one
            getters.append((i, lambda obj, names=tuple(names): tuple(getattr(obj, n) for n in names), False))
        else:
            getters.append((i, operator.attrgetter(*names), len(names) == 1))

    def check(origin: Any, found: tuple) -> None:
        read: list[Any] = []
        for i, get, single in getters:
            v = get(origin if i < 0 else found[i])
            if single:
                read.append(v)
            else:
                read.extend(v)
        if read:
            values(*read)

    return check


class _ClassChecks:
    """A guard's checks that an object's class is the same and no class on its MRO has been written to since (the
    class dicts' version tags; static types such as ``object`` take no attributes and are left out: on Python 3.12
    their dict is not where torch's guard reads it)."""

    def __init__(self) -> None:
        self.mro_checked: set[type] = set()
        self.dict_checked: set[type] = set()

    def same_class(self, node: Any, obj: Any) -> None:
        cls = type(obj)
        node.type_is(cls)
        if cls in self.mro_checked:
            return
        self.mro_checked.add(cls)
        mro = cls.__mro__
        mro_node = node.type(cls).mro(mro)
        mro_node.is_(mro)
        for i, k in enumerate(mro):
            if k not in self.dict_checked and k.__flags__ & _HEAPTYPE:
                self.dict_checked.add(k)
                d = internals.ObjectGuard.type_dict_of(k)
                mro_node.tuple_item(i, k).type_dict(d).unchanged(d)

    def held(self) -> tuple:
        return tuple(self.mro_checked | self.dict_checked)


def _guard_attributes(nodes: Any, objects: Any, attributes: Sequence[tuple[Any, str, Any]]) -> None:
    """Add to a guard that each of ``attributes`` (``(place, name, value)``) is still that value of that type in the
    instance dict of ``objects[place]``, whose node is ``nodes[place]``."""
    for at, name, value in attributes:
        node = nodes[at].instance_dict(objects[at].__dict__).item(name, value)
        node.type_is(type(value))
        node.equals(value)


def _origin_guard(origin: Any) -> tuple[Any, _ClassChecks, Any] | None:
    """A new guard (None where torch has no guard trees) that ``origin``'s class is the same and its instance dict has
    no lookup method of its own; its class checks, and the node of that instance dict."""
    guard = internals.ObjectGuard.make()
    if guard is None:
        return None
    classes = _ClassChecks()
    classes.same_class(guard.root, origin)
    root_dict = guard.root.instance_dict(origin.__dict__)
    for name in _METHODS:
        root_dict.lacks(name)
    return guard, classes, root_dict


def _thunder_module_guard(origin: Any, plan: Sequence[tuple[str, str, int, str]], found: tuple,
                          attributes: Sequence[tuple[int, str, Any]], paths: Sequence[str] = (),
                          reached: Sequence[Any] | None = None) -> tuple[Callable[[Any], bool], tuple] | None:
    """A guard that a `thunder.ThunderModule` origin's lookups (``plan``) answer ``found`` again from its own dicts
    (`_thunder_module_dicts`: the same class and MRO, no lookup method on the instance, each object the same at its
    key), and that each of ``attributes`` (``(index of the lookup, or -1 for the origin, name, value)``) is still
    that value of that type in its module's instance dict, the module's class unchanged; with ``reached`` (the
    modules at ``paths``, each in its module cache), that each is still there with the same members
    (`_guard_members`); and the objects it compares by id. None where torch has no guard trees, or a module of
    ``reached`` is not in the cache."""
    made = _origin_guard(origin)
    if made is None:
        return None
    guard, classes, root_dict = made
    d = origin.__dict__
    nodes: dict[int, Any] = {-1: guard.root}
    objects: dict[int, Any] = {-1: origin}
    for k, ((kind, target, *_), obj) in enumerate(zip(plan, found)):
        which = internals.THUNDER_MODULE_LOOKUPS[kind]
        node = root_dict.item(which, d[which]).item(target, obj)
        node.is_(obj)
        nodes[k], objects[k] = node, obj
    for k in {at for at, *_ in attributes if at >= 0}:
        classes.same_class(nodes[k], objects[k])
    _guard_attributes(nodes, objects, attributes)
    if reached is not None:
        which = internals.THUNDER_MODULE_LOOKUPS[_SUBMODULE]
        cache = d[which]
        for path, m in zip(paths, reached):
            if cache.get(path, _MISSING) is not m:
                return None  # NOTE: found by the wrapped model's method: walked every call
            node = root_dict.item(which, cache).item(path, m)
            node.is_(m)
            node.type_is(type(m))
            _guard_members(node, m)
    return guard.check, (tuple(found), tuple(reached or ()), classes.held())


def _walk_guard(origin: Any, steps: Sequence[tuple[int, str]], walked: list[Any], reads: list,
                attributes: Sequence[tuple[int, str, Any]] = (), members: bool = False
                ) -> tuple[Callable[[Any], bool], tuple] | None:
    """A guard that `ModuleWalk.walk` would find ``walked`` and ``reads`` again (along ``steps``) for an origin that
    passes it, and that each of ``attributes`` (``(index in walked, name, value)``) is still that value of that type
    in its module's instance dict (see `ModuleWalk`); with ``members``, that each module of ``walked`` still has the
    same members (`_guard_members`); and the objects it compares by id. None where torch has no guard trees."""
    made = _origin_guard(origin)
    if made is None:
        return None
    guard, classes, _ = made
    same_class = classes.same_class

    def lacks_in(dict_node: Any, d: dict, which: str, name: str) -> None:
        """``name not in d.get(which, {})``, as the walk reads it."""
        if which in d:
            dict_node.item(which, d[which]).lacks(name)
        else:
            dict_node.lacks(which)

    nodes = [guard.root]  # NOTE: one per module of ``walked``
    for (parent, a), sub in zip(steps, walked[1:]):  # NOTE: a parent comes before its children
        d = walked[parent].__dict__
        dict_node = nodes[parent].instance_dict(d)
        dict_node.lacks(a)
        if not members:  # NOTE: else the dicts' version tags (`_guard_members`)
            lacks_in(dict_node, d, "_parameters", a)
            lacks_in(dict_node, d, "_buffers", a)
        node = dict_node.item("_modules", d["_modules"]).item(a, sub)
        node.is_(sub)
        same_class(node, sub)
        nodes.append(node)
    if members:
        for node, m in zip(nodes, walked):
            _guard_members(node, m)
    for at, name, kind, value in reads:
        d = walked[at].__dict__
        dict_node = nodes[at].instance_dict(d)
        dict_node.lacks(name)
        if members:
            continue  # NOTE: the version tags of its module's dicts hold the very object at its key, and no other
        if kind == _BUFFER:
            lacks_in(dict_node, d, "_parameters", name)
        which = "_parameters" if kind == _PARAMETER else "_buffers"
        dict_node.item(which, d[which]).item(name, value).is_(value)
    _guard_attributes(nodes, walked, attributes)
    held = (tuple(walked), tuple(v for *_, v in reads), classes.held())
    return guard.check, held


def check_tensor(t: Any, shape: tuple[int, ...], device: str, dtype: torch.dtype, requires_grad: bool) -> None:
    """thunder's ``check_tensor_metadata`` for a shape of plain ints: the same test, with the shape compared at once."""
    if not (isinstance(t, _Tensor) and t.shape == shape and t.dtype == dtype and t.requires_grad == requires_grad
            and str(t.device) == device):
        raise AssertionError(f"expected tensor with {shape}, {device}, {dtype}, {requires_grad=}, got "
                             f"{tuple(t.shape) if isinstance(t, _Tensor) else type(t).__name__}"
                             + (f", {t.device}, {t.dtype}, {t.requires_grad}" if isinstance(t, _Tensor) else ""))


#: Calls whose tensors pass thunder's checks but not the C guard of an earlier call's metadata, before `tensor_checks`'
#: function stops making guards (metadata that keeps changing within the checks: strides, a tensor's Python type).
_GUARD_REMAKES = 4


def _metadata_guard(tensors: tuple[Any, ...]) -> Callable[..., bool] | None:
    """A C check that ``ts`` have ``tensors``' metadata (`internals.metadata_guard`), a tensor given twice checked by
    identity; None where torch has none."""
    first: dict[int, int] = {}  # id of a tensor -> its first position
    once, repeats = [], []
    for i, t in enumerate(tensors):
        j = first.setdefault(id(t), i)
        if j == i:
            once.append(i)
        else:
            repeats.append((i, j))
    guard = internals.metadata_guard([tensors[i] for i in once])
    if guard is None or not repeats:
        return guard
    get = operator.itemgetter(*once) if len(once) > 1 else (lambda ts, i=once[0]: (ts[i],))
    repeats = tuple(repeats)

    def check(*ts: Any) -> bool:
        return guard(*get(ts)) and all(ts[i] is ts[j] for i, j in repeats)

    return check


def tensor_checks(specs: Sequence[tuple[tuple[int, ...], str, torch.dtype, bool]]) -> Any:
    """One function for many `check_tensor` calls: ``check(*tensors)`` raises where any tensor differs from its spec.

    ``specs[i]`` is ``(shape, device, dtype, requires_grad)`` of the i-th tensor. Once a call's tensors pass, the
    next calls are first proved by torch.compile's C guard of those tensors' metadata (`_metadata_guard`: Python
    type, dtype, device, ``requires_grad``, sizes and strides, each tensor's dispatch keys: everything the checks
    compare and more), one C call instead of five attribute reads per tensor (122 tensors on resnet18's training
    step); where the guard fails, the tensors are checked as before, and a failing check raises as thunder's does.
    """
    specs = tuple((tuple(shape), device, dtype, requires_grad) for shape, device, dtype, requires_grad in specs)
    expected = [(True, shape, dtype, requires_grad, torch.device(device)) for shape, device, dtype, requires_grad in specs]
    # NOTE: [the guard of the latest passing call's tensors (None: none yet, or given up), guards made so far]
    state: list[Any] = [None, 0]

    def check_tensors(*tensors: Any) -> None:
        guard = state[0]
        if guard is not None:
            try:
                if guard(*tensors):
                    return
            except Exception:  # NOTE: not a tensor where the guard has one: the checks below decide
                pass
        try:
            passed = [(isinstance(t, _Tensor), t.shape, t.dtype, t.requires_grad, t.device) for t in tensors] == expected
        except Exception:  # NOTE: not a tensor: the exact check below raises thunder's kind of error
            passed = False
        if not passed:
            for t, spec in zip(tensors, specs):
                check_tensor(t, *spec)
        if state[1] < _GUARD_REMAKES:
            # NOTE: every tensor passed: a guard of their metadata proves the next call's where nothing changed
            state[1] += 1
            try:
                state[0] = _metadata_guard(tensors) if tensors else None
            except Exception:  # NOTE: a tensor torch's guard does not take: checked as before (a raise would retrace)
                state[0], state[1] = None, _GUARD_REMAKES
        else:
            state[0] = None  # NOTE: the guard keeps failing where the checks pass: checked as before from now on

    return check_tensors


def value_checks(expected: Sequence[Any], strings: Sequence[bool]) -> Any:
    """One function for many of thunder's value checks: ``check(*values)`` raises where any differs.

    ``expected[i]`` is the value of a ``check_number_type_and_value`` (same type, equal, or both NaN) or,
    where ``strings[i]``, of a ``check_string_value`` (equal).
    """
    expected, strings = tuple(expected), tuple(strings)
    types = tuple(map(type, expected))

    def check_values(*values: Any) -> None:
        if values == expected and tuple(map(type, values)) == types:
            return
        for n, v, string in zip(values, expected, strings):  # NOTE: thunder's checks one by one: NaN, str subclasses
            if not (n == v if string else type(n) == type(v) and (n == v or (n != n and v != v))):
                raise AssertionError(f"expected {v!r} of type {type(v).__name__}, got {n!r} of type {type(n).__name__}")

    return check_values


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

_KINDS = {PrimIDs.UNPACK_SUBMODULE: _SUBMODULE, PrimIDs.UNPACK_PARAMETER: _PARAMETER, PrimIDs.UNPACK_BUFFER: _BUFFER}


def _call(name: str, fn: Any, args: tuple, output: Any, header: Any = "", dont_dce: bool = False) -> BoundSymbol:
    sym = Symbol(name, meta=None, python_impl=fn, id=name, tags=[OpTags.DONT_DCE] if dont_dce else None)
    return BoundSymbol(sym, args, {}, output, [], header=header, _call_ctx={name: fn})


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
            if kind == _SUBMODULE and isinstance(b.output, Proxy):
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
    """`rewrite_module_lookups` over a prologue trace; the same trace where it has no lookups."""
    trace = from_trace(prologue)
    with tracectx(trace):
        bsyms, n = rewrite_module_lookups(prologue.bound_symbols)
    if not n:
        return prologue
    trace.bound_symbols = bsyms
    trace.set_provenance(TraceProvenance(f"thunder-nb module lookups along their paths ({n})"))
    return trace
