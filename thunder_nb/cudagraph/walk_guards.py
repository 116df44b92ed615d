"""The C guards a `module_walk.ModuleWalk` makes of one call's walk: every object and reading the walk relied on, so
that a later call proved by the guard returns the same objects.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from .. import internals
from .module_reads import BUFFER, HEAPTYPE, METHODS, MISSING, PARAMETER, SUBMODULE, guard_members
from .prologue_checks import value_checks


def thunder_module_dicts(origin: Any) -> dict[str, dict] | None:
    """The dicts a `thunder.ThunderModule` answers its lookups from first, by kind (its own ``get_submodule``,
    ``get_parameter``, ``get_buffer``: thunder's module cache and overrides, then the wrapped model's methods); None
    where ``origin`` is not thunder's own class (`internals.is_thunder_module`), or its instance has a lookup method of
    its own."""
    if not internals.is_thunder_module(origin):
        return None
    d = origin.__dict__
    if any(name in d for name in METHODS):
        return None
    dicts = {kind: d.get(name) for kind, name in internals.THUNDER_MODULE_LOOKUPS.items()}
    return dicts if all(type(v) is dict for v in dicts.values()) else None


def attribute_checker(checks: Sequence[tuple[int, str, Any, bool]]) -> Callable[[Any, tuple], None]:
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
            if k not in self.dict_checked and k.__flags__ & HEAPTYPE:
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
    for name in METHODS:
        root_dict.lacks(name)
    return guard, classes, root_dict


def thunder_module_guard(origin: Any, plan: Sequence[tuple[str, str, int, str]], found: tuple,
                          attributes: Sequence[tuple[int, str, Any]], paths: Sequence[str] = (),
                          reached: Sequence[Any] | None = None) -> tuple[Callable[[Any], bool], tuple] | None:
    """A guard that a `thunder.ThunderModule` origin's lookups (``plan``) answer ``found`` again from its own dicts
    (`thunder_module_dicts`: the same class and MRO, no lookup method on the instance, each object the same at its
    key), and that each of ``attributes`` (``(index of the lookup, or -1 for the origin, name, value)``) is still
    that value of that type in its module's instance dict, the module's class unchanged; with ``reached`` (the
    modules at ``paths``, each in its module cache), that each is still there with the same members
    (`guard_members`); and the objects it compares by id. None where torch has no guard trees, or a module of
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
        which = internals.THUNDER_MODULE_LOOKUPS[SUBMODULE]
        cache = d[which]
        for path, m in zip(paths, reached):
            if cache.get(path, MISSING) is not m:
                return None  # NOTE: found by the wrapped model's method: walked every call
            node = root_dict.item(which, cache).item(path, m)
            node.is_(m)
            node.type_is(type(m))
            guard_members(node, m)
    return guard.check, (tuple(found), tuple(reached or ()), classes.held())


def walk_guard(origin: Any, steps: Sequence[tuple[int, str]], walked: list[Any], reads: list,
                attributes: Sequence[tuple[int, str, Any]] = (), members: bool = False
                ) -> tuple[Callable[[Any], bool], tuple] | None:
    """A guard that `ModuleWalk.walk` would find ``walked`` and ``reads`` again (along ``steps``) for an origin that
    passes it, and that each of ``attributes`` (``(index in walked, name, value)``) is still that value of that type
    in its module's instance dict (see `ModuleWalk`); with ``members``, that each module of ``walked`` still has the
    same members (`guard_members`); and the objects it compares by id. None where torch has no guard trees."""
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
        if not members:  # NOTE: else the dicts' version tags (`guard_members`)
            lacks_in(dict_node, d, "_parameters", a)
            lacks_in(dict_node, d, "_buffers", a)
        node = dict_node.item("_modules", d["_modules"]).item(a, sub)
        node.is_(sub)
        same_class(node, sub)
        nodes.append(node)
    if members:
        for node, m in zip(nodes, walked):
            guard_members(node, m)
    for at, name, kind, value in reads:
        d = walked[at].__dict__
        dict_node = nodes[at].instance_dict(d)
        dict_node.lacks(name)
        if members:
            continue  # NOTE: the version tags of its module's dicts hold the very object at its key, and no other
        if kind == BUFFER:
            lacks_in(dict_node, d, "_parameters", name)
        which = "_parameters" if kind == PARAMETER else "_buffers"
        dict_node.item(which, d[which]).item(name, value).is_(value)
    _guard_attributes(nodes, walked, attributes)
    held = (tuple(walked), tuple(v for *_, v in reads), classes.held())
    return guard.check, held
