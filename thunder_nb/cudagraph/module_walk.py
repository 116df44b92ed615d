"""The module walk of thunder-nb's prologue (`prologue.fast_module_lookups`): a module's lookups read along their
path's dicts, and the guards that prove a later call reads the same.

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
(`module_members`); at every later call where they differ it raises `StructureChanged`, the prologue fails, and thunder
traces anew (a later change back lets the entry hit again). The walk's guard holds them too (`guard_members`): the
version tags of the three dicts, which any write changes, and the instance dict's length and own names. The origin's
module hooks are kept and compared the same way on every call, guard or not (`HookCheck`): thunder's cache does not
check them either, and a hook registered after the first call never ran.

Thunder's reads of an attribute of the origin or of a submodule it looks up, whose value only a value check against
a constant reads (a module's ``training`` flag, its sizes: most of a transformer's value checks), become checks the
walk makes. Its guard holds those of them read plainly from an instance dict (the value's
type and equality), so a call its guard proves reads none of them; the others (a property, a class attribute, NaN)
it reads and checks on every call, and a walk without a guard checks them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .module_reads import (BUFFER, GETATTRIBUTE, METHOD_OF, MISSING, NONE, PARAMETER, READS, SUBMODULE, HookCheck,
                           StructureChanged, child, members_change, module_members, plain_root, same_members)
from .prologue_checks import GUARD_REMAKES
from .walk_guards import attribute_checker, thunder_module_dicts, thunder_module_guard, walk_guard

__all__ = ["ModuleWalk", "plain_root", "child", "StructureChanged", "SUBMODULE", "PARAMETER", "BUFFER"]


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
    guard, a fraction of the walk's time, and walk again where it fails.
    The objects are held until then. A walk that keeps failing its guard (`GUARD_REMAKES`) stops making guards.
    For a `thunder.ThunderModule` origin, each lookup reads the dict its method reads first (`thunder_module_dicts`),
    and the guard holds each answer at its key of that dict (`thunder_module_guard`), where asking its methods on every
    call would cost what the walk saves.

    With ``structure`` (the prologue's walks), the first call keeps the members of each module on the paths
    (`module_members`: its class, its submodules', parameters' and buffers' names in order, its instance dict's names), and
    every later call that its guard does not prove compares them, raising `StructureChanged` where any differs (the
    prologue fails: thunder traces anew); the guard holds them (`guard_members`), so a proved call compares nothing.

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
            if kind == SUBMODULE:
                plan.append((kind, target, index(tuple(target.split("."))), ""))
            else:
                path, _, name = target.rpartition(".")
                plan.append((kind, target, index(tuple(path.split(".")) if path else ()), name))
        self._steps = tuple(steps)
        self._plan = tuple(plan)
        #: the dotted path of each module of ``walked`` (the origin's own: "")
        self.paths = tuple(".".join(path) for path, _ in sorted(paths.items(), key=lambda item: item[1]))
        # NOTE: `module_members` of each module on the paths at the first call (thunder runs a new prologue right after it
        # traced, on the same objects), None before it; False where the walk does not check them
        self._structure: list | bool | None = None if structure else False
        # NOTE: per attribute check, the index in ``walked`` of the module it reads (0: the origin), None where its
        # object is a parameter or buffer (never in the guard)
        self._attribute_at = tuple(0 if i < 0 else plan[i][2] if plan[i][0] == SUBMODULE else None
                                   for i, *_ in self.attribute_checks)
        self._check_attributes = attribute_checker(self.attribute_checks)
        self._guard: Callable[[Any], bool] | None = None
        self._found: tuple = ()
        self._held: tuple = ()  # NOTE: the guard's objects, kept alive while it compares their ids
        self._unguarded: Callable[[Any, tuple], None] | None = None  # checks of the attributes the guard leaves out
        self._made = 0
        self._hooks = HookCheck() if structure else None

    def __call__(self, origin: Any) -> tuple:
        if self._hooks is not None:
            self._hooks(origin)
        guard = self._guard
        if guard is not None and guard(origin):
            if self._unguarded is not None:
                self._unguarded(origin, self._found)
            return self._found
        self._guard, self._found, self._held, self._unguarded = None, (), (), None
        found, walked, reads = self.walk(origin)
        reached = None if self._structure is False else self._check_structure(origin, walked)
        self._check_attributes(origin, found)
        if reads is not None and self._made < GUARD_REMAKES:
            self._made += 1
            # NOTE: the object each attribute check reads (a submodule lookup's answer is the module walked to);
            # where the guard has it: the lookup's index for a ThunderModule (`walked` None), else its walked index
            objects = [origin if i < 0 else found[i] if self._plan[i][0] == SUBMODULE else None
                       for i, *_ in self.attribute_checks]
            places = [i for i, *_ in self.attribute_checks] if walked is None else self._attribute_at
            try:
                guarded, unguarded = self._plain_attributes(objects, places)
                if walked is None:  # NOTE: a ThunderModule's lookups, read from its own dicts
                    made = thunder_module_guard(origin, self._plan, found, guarded, self.paths, reached)
                else:
                    made = walk_guard(origin, self._steps, walked, reads, guarded, reached is not None)
            except Exception:  # NOTE: torch's guard refused an object: walked every call from now on
                made, self._made = None, GUARD_REMAKES
            if made is not None and made[0](origin):
                self._guard, self._held = made
                self._found = found
                self._unguarded = (attribute_checker([self.attribute_checks[i] for i in unguarded]) if unguarded
                                   else None)
            elif made is not None:  # NOTE: a guard that fails the very objects it was made of would never serve
                self._made = GUARD_REMAKES
        return found

    def _check_structure(self, origin: Any, walked: list[Any] | None) -> list[Any]:
        """The modules on the paths (`reached`); at the first call their `module_members` are kept, at every later call
        compared with them: raises `StructureChanged` where any differs."""
        reached = self.reached(origin, walked)
        kept = self._structure
        if kept is None:
            self._structure = [module_members(m) for m in reached]
        else:
            for m, path, members in zip(reached, self.paths, kept):
                if not same_members(m, members):
                    raise StructureChanged(f"since the function was traced, {members_change(m, path, members)}: "
                                           "thunder traces it again")
        return reached

    def reached(self, origin: Any, walked: list[Any] | None) -> list[Any]:
        """The module at each of `paths` from ``origin``, as its lookups find it: the module ``walked`` to, else the
        answer of ``get_submodule`` (a `thunder.ThunderModule` origin's: its module cache first)."""
        if walked is None:
            cache = thunder_module_dicts(origin)
            cache = cache[SUBMODULE] if cache is not None else NONE
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
            d = m.__dict__ if m is not None and type(m).__getattribute__ is GETATTRIBUTE else NONE
            value = d.get(name, MISSING)
            if value is not MISSING and getattr(type(m), name, MISSING) is MISSING and value == value:
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
            dicts = thunder_module_dicts(origin)
            if dicts is not None:
                return self._walk_thunder_module(origin, dicts)
        walked = [root]
        for parent, a in self._steps:
            walked.append(child(walked[parent], a))
        reads: list | None = [] if root is not None and None not in walked else None
        found = []
        for kind, target, at, name in self._plan:
            m = walked[at]
            if kind == SUBMODULE:
                value = m if m is not None else origin.get_submodule(target)
            else:
                value = READS[kind](m, name) if m is not None else None
                if value is None:
                    value = getattr(origin, METHOD_OF[kind])(target)
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
            value = dicts[kind].get(target, MISSING)
            if value is MISSING:
                value, plain = getattr(origin, METHOD_OF[kind])(target), False
            found.append(value)
        return tuple(found), None, [] if plain else None
