"""torch.compile's C guards, as thunder-nb's fast paths prove their readings: a tensor's metadata (`metadata_guard`)
and objects reached from a root (`ObjectGuard`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .version import supported

__all__ = ["metadata_guard", "ObjectGuard", "guard_dict_keys"]


def metadata_guard(tensors: Sequence[Any]) -> Callable[..., bool] | None:
    """A C function ``check(*ts)``: whether each ``ts[i]`` has ``tensors[i]``'s Python type, dtype, device index,
    ``requires_grad``, dispatch keys, sizes and strides (torch.compile's guard on its tensor inputs).

    Made and called under the same grad-independent dispatch state (a region's call site); None where torch has none,
    or is not the version thunder-nb supports (`supported`): the caller then makes its check the long way.
    """
    if not supported():
        return None
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:  # pragma: no cover - a torch without dynamo's C guards
        return None
    return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.size()) for t in tensors],
                        dynamic_dims_strides=[list(t.stride()) for t in tensors]).check


class ObjectGuard:
    """A C check over objects reached from one root (torch.compile's guard trees, ``RootGuardManager``).

    Build it with `ObjectGuard.make`, then describe what must still hold through `Node` s: ``node.item(key)``
    reads an item of the dict the node is, ``node.instance_dict()`` its object's ``__dict__``, ``node.type()`` its
    type, ``node.mro()`` a type's ``__mro__``, ``node.tuple_item(i)``, ``node.type_dict()`` a type's own dict;
    ``is_(obj)``, ``type_is(cls)``, ``equals(value)``, ``lacks(key)`` and ``unchanged(d)`` (no write to the dict
    since: its version tag) check the node's value. ``check(root)`` is then one C call, False where a read fails.
    Each node is made once per path (``name``), so its reads are made once per check.
    """

    class Node:
        __slots__ = ("_manager", "_name", "_children")

        def __init__(self, manager: Any, name: str):
            self._manager, self._name, self._children = manager, name, {}

        def _child(self, kind: str, key: Any, example: Any, make: Callable[..., Any]) -> ObjectGuard.Node:
            node = self._children.get((kind, key))
            if node is None:
                from torch._dynamo.guards import GuardManagerType

                name = f"{self._name}{kind}{key!r}"
                manager = make(source=name, example_value=example, guard_manager_enum=GuardManagerType.GUARD_MANAGER)
                node = self._children[(kind, key)] = ObjectGuard.Node(manager, name)
            return node

        def item(self, key: Any, example: Any) -> ObjectGuard.Node:
            return self._child("[]", key, example, lambda **kw: self._manager.dict_getitem_manager(key=key, **kw))

        def instance_dict(self, example: dict) -> ObjectGuard.Node:
            return self._child(".__dict__", "", example, self._manager.get_generic_dict_manager)

        def type(self, example: type) -> ObjectGuard.Node:
            return self._child(".__class__", "", example, self._manager.type_manager)

        def mro(self, example: tuple) -> ObjectGuard.Node:
            return self._child(".__mro__", "", example, self._manager.type_mro_manager)

        def tuple_item(self, i: int, example: Any) -> ObjectGuard.Node:
            return self._child("()", i, example, lambda **kw: self._manager.tuple_getitem_manager(key=i, **kw))

        def type_dict(self, example: dict) -> ObjectGuard.Node:
            return self._child(".tp_dict", "", example, self._manager.type_dict_manager)

        def is_(self, obj: Any) -> None:
            self._manager.add_id_match_guard(id(obj), [f"{self._name} is the same object"], None)

        def type_is(self, cls: type) -> None:
            self._manager.add_type_match_guard(id(cls), [f"type({self._name}) is {cls.__qualname__}"], None)

        def lacks(self, key: Any) -> None:
            self._manager.add_dict_contains_guard(False, key, [f"{key!r} not in {self._name}"], None)

        def unchanged(self, d: dict) -> None:
            self._manager.add_dict_version_guard(d, [f"{self._name} unchanged"], None)

        def equals(self, value: Any) -> None:
            self._manager.add_equals_match_guard(value, [f"{self._name} == {value!r}"], None)

    def __init__(self, manager: Any):
        self.root = ObjectGuard.Node(manager, "root")
        self.check: Callable[[Any], bool] = manager.check

    @staticmethod
    def make() -> ObjectGuard | None:
        """An empty guard (every check passes until nodes add reads); None where torch has no guard trees, or is not the
        version thunder-nb supports (`supported`)."""
        if not supported():
            return None
        try:
            from torch._C._dynamo.guards import RootGuardManager
            from torch._dynamo.guards import GuardManagerType  # noqa: F401
        except ImportError:  # pragma: no cover - a torch without dynamo's C guards
            return None
        return ObjectGuard(RootGuardManager())

    @staticmethod
    def type_dict_of(cls: type) -> dict:
        """The dict behind ``cls.__dict__`` (a read-only proxy of it)."""
        import gc

        (d,) = [r for r in gc.get_referents(cls.__dict__) if type(r) is dict]
        return d


def guard_dict_keys(node: ObjectGuard.Node, d: dict, keys: Any) -> None:
    """Add to ``node``, a guard's node of the dict ``d``, that the dict still has ``len(d)`` keys and each of ``keys``
    (torch.compile's dict length and dict-contains guards)."""
    manager = node._manager
    manager.add_dict_length_check_guard(len(d), [f"len({node._name}) == {len(d)}"], None)
    for key in keys:
        manager.add_dict_contains_guard(True, key, [f"{key!r} in {node._name}"], None)

