"""What a recorded training step depends on besides its batch, and the words for what changed (`jit_step`'s guards)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .. import internals
from ..cudagraph.module_reads import HookState
from .optimizer import LIVE, why_fixed

__all__ = ["Snapshot", "Change", "batch_key", "key_difference", "autocast_key", "trained_parameters", "key_shapes",
           "not_recorded_words"]


def key_shapes(key: tuple) -> str:
    """A batch key's tensor shapes, in words: ``shape (10, 8), (10,)``."""
    shapes = [tuple(b[0]) for b in key[0] if isinstance(b[0], torch.Size)]
    return "shape " + ", ".join(str(s) for s in shapes) if shapes else "no tensor"


def not_recorded_words(old: tuple, new: tuple, ran: int, warmup: int) -> str:
    """Why a batch key left before its recording is not recorded yet, and what to do, in words."""
    return (f"jit_step: the batch of {key_shapes(old)} is not recorded yet: it ran {ran} of its warmup={warmup} "
            f"uncaptured steps before a batch of {key_shapes(new)} came; each batch shape records after its own "
            "warm-up, so a shape seen once an epoch (a ragged last batch) runs uncaptured for its first epochs: "
            "drop_last=True in the DataLoader, or pad the last batch to the full size")


def trained_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters of ``model`` that require grad, each once."""
    return [p for p in model.parameters() if p.requires_grad]


def _ptr(t: Any) -> int | None:
    return t.data_ptr() if isinstance(t, torch.Tensor) else None


def _meta(t: Any) -> Any:
    return (t.shape, t.dtype, t.device) if isinstance(t, torch.Tensor) else type(t)


class Change(NamedTuple):
    """What `Snapshot.change` found, and what it means for thunder's trace of the loss function."""

    words: str  # what changed, in words
    retrace: bool  # thunder's trace changes with it: warm-up steps again before a recording
    # thunder's cache cannot see it (a module's members, which module stands at a name): a cache hit would run the
    # old trace, so the loss function needs a new thunder.jit
    unseen: bool = False
    cause: str | None = None  # what changed without its values (a hyperparameter's name), for saying it once


class Snapshot:
    """The model and optimizer as one step saw them: every module (its training flag, its own submodules, parameters
    and buffers: the objects, their memory and each parameter's ``requires_grad``; the names in its instance dict, which
    ``hasattr`` finds first: as many, and each of its own, `_MODULE_NAMES` left out; its hooks, `HookState`) and the
    optimizer (its state and param groups, the objects, and each group's size and hyperparameters; `LIVE`'s left out
    when ``lr_live``).

    `change` compares the live objects with it by identity, and words a difference only when it finds one. Thunder's
    own cache checks each module's training flag and each tensor's metadata (``requires_grad`` among them), but not
    which members a module has or which module stands at a name: a trace that branched on ``hasattr(model, "head2")``
    hits its cache after ``model.head2 = ...``. `change` says which changes those are (`Change.unseen`).
    """

    __slots__ = ("model", "optimizer", "modules", "params", "_entries", "_state", "_groups", "_sizes", "_hyper",
                 "_hooks")

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, lr_live: bool):
        self.model, self.optimizer = model, optimizer
        self.modules = list(model.modules())
        self.params = trained_parameters(model)
        self._entries = []
        for m in self.modules:
            members = []
            for kind, live in (("submodule", internals.own_modules(m)), ("parameter", internals.own_parameters(m)),
                               ("buffer", internals.own_buffers(m))):
                items = tuple((n, t, _ptr(t), t.requires_grad if kind == "parameter" and t is not None else None)
                              for n, t in live.items())
                members.append((kind, live, items))
            d = vars(m)
            self._entries.append((m, m.training, tuple(members), d, len(d),
                                  frozenset(name for name in d if name not in _MODULE_NAMES)))
        self._state, self._groups = optimizer.state, optimizer.param_groups
        self._sizes = tuple(len(g["params"]) for g in optimizer.param_groups)
        self._hyper = tuple(tuple((k, v) for k, v in g.items() if k != "params" and not (k in LIVE and lr_live))
                            for g in optimizer.param_groups)
        modules = self.modules
        self._hooks = HookState(lambda: modules)  # NOTE: not ``self``: no reference cycle through the snapshot

    def change(self) -> Change | None:
        """What changed since the snapshot (`Change`: in words, whether thunder's trace changes with it, whether
        thunder's cache can see it); None when nothing did."""
        for m, training, members, d, n, own in self._entries:
            if m.training != training:
                mode = "training" if m.training else "eval"
                return Change(f"{type(m).__name__} is now in {mode} mode (model.train() / model.eval())", True)
            if len(d) != n or not d.keys() >= own:
                return Change(_attributes_change(m, d, own), True, True)
            for kind, live, items in members:
                if len(live) != len(items):
                    return Change(_members_change(m, kind, live, items), True, True)
                for name, was, ptr, requires_grad in items:
                    now = live.get(name, _GONE)
                    if now is _GONE:  # NOTE: as many, but another name
                        return Change(_members_change(m, kind, live, items), True, True)
                    if now is not was:
                        return _replaced(m, kind, name, was, now)
                    if ptr is not None and now.data_ptr() != ptr:
                        return Change(f"{kind} {type(m).__name__}.{name} now lives in other memory (its .data was "
                                      "set)", False)
                    if requires_grad is not None and now.requires_grad != requires_grad:
                        return Change(f"parameter {type(m).__name__}.{name} now has "
                                      f"requires_grad={now.requires_grad}", True)
        hooks = self._hooks.changed()
        if hooks is not None:
            return Change(hooks, True, True)
        return self._optimizer_change()

    def _optimizer_change(self) -> Change | None:
        opt = self.optimizer
        if opt.state is not self._state or opt.param_groups is not self._groups:
            return Change("the optimizer's state was replaced (load_state_dict)", False)
        groups = self._groups
        if len(groups) != len(self._sizes) or any(len(g["params"]) != n for g, n in zip(groups, self._sizes)):
            return Change("the optimizer's param groups changed", False)
        for i, (g, items) in enumerate(zip(groups, self._hyper)):
            changed = [(k, v, g.get(k)) for k, v in items if _differs(v, g.get(k))]
            if changed:
                # NOTE: every hyperparameter that changed, each with its reason: a one-cycle schedule changes lr and
                # momentum at once, and a warning said once must name both
                words = "; ".join(f"param group {i}'s {k!r} changed from {v!r} to {now!r}{why_fixed(opt, k)}"
                                  for k, v, now in changed)
                return Change(words, False, cause=f"param group {i}'s {', '.join(repr(k) for k, _, _ in changed)}")
        return None


def _differs(was: Any, now: Any) -> bool:
    return now is not was and (isinstance(now, torch.Tensor) or isinstance(was, torch.Tensor) or now != was)


def _replaced(m: torch.nn.Module, kind: str, name: str, was: Any, now: Any) -> Change:
    subject = f"{kind} {type(m).__name__}.{name}"
    if kind == "submodule" or now is None or was is None:
        # NOTE: thunder's prologue finds a submodule by its name and checks some of its attributes, never its class,
        # nor whether a None stands where the trace had a tensor: a new trace
        return Change(f"{subject} was replaced by {'None' if now is None else 'a ' + type(now).__name__}", True, True)
    # NOTE: a tensor of the same shape, dtype and device: thunder's trace stays, the graph must read the new one;
    # another one is seen by thunder's tensor checks
    return Change(f"{subject} was replaced by another tensor", _meta(now) != _meta(was))


_GONE = object()

#: The names every ``Module`` has in its instance dict once ``Module.__init__`` ran (its hooks' dicts, ``training``,
#: ``_parameters``, ...), which nobody deletes: a `Snapshot` counts them and compares the others one by one.
_MODULE_NAMES = frozenset(vars(torch.nn.Module()))


def _attributes_change(m: torch.nn.Module, d: dict[str, Any], own: frozenset) -> str:
    added = sorted(name for name in d if name not in own and name not in _MODULE_NAMES)
    if added:
        return f"{type(m).__name__} has a new attribute {added[0]}"
    gone = sorted((own | _MODULE_NAMES) - d.keys())
    return f"attribute {type(m).__name__}.{gone[0]} was removed" if gone else f"{type(m).__name__}'s attributes changed"


def _members_change(m: torch.nn.Module, kind: str, live: dict[str, Any], items: tuple) -> str:
    names = [n for n, *_ in items]
    added = [n for n in live if n not in names]
    if added:
        return f"{type(m).__name__} has a new {kind} {added[0]}"
    gone = next(n for n in names if n not in live)
    return f"{kind} {type(m).__name__}.{gone} was removed"


def batch_key(batch: Sequence[Any]) -> tuple:
    """The batch's shapes, dtypes and devices, and its other values: what thunder's trace depends on."""
    return tuple((b.shape, b.dtype, b.device) if isinstance(b, torch.Tensor) else (type(b), b) for b in batch)


def key_difference(old: tuple | None, new: tuple) -> str:
    """What differs between two keys ``(batch_key, autocast_key)``, in words."""
    (batch, autocast), (was_batch, was_autocast) = new, old
    if batch != was_batch:
        return _batch_difference(was_batch, batch)
    return f"autocast changed: {was_autocast} -> {autocast}"


def _batch_difference(old: tuple, new: tuple) -> str:
    if len(old) != len(new):
        return f"the step now takes {len(new)} arguments (was {len(old)})"
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            if isinstance(a[0], torch.Size) and isinstance(b[0], torch.Size):
                what = [f"{name} {x} (was {y})" for name, x, y in zip(("shape", "dtype", "device"), b, a) if x != y]
                what = [w.replace("torch.Size(", "(").replace("])", ")").replace("([", "(") for w in what]
                return f"the batch's argument {i} has {', '.join(what)}"
            return f"the batch's argument {i} is {b[1]!r} (was {a[1]!r})"
    return "the batch changed"


def autocast_key(device: torch.device) -> tuple:
    """Whether autocast is on for ``device``'s type, and its dtype."""
    kind = device.type
    if not torch.is_autocast_enabled(kind):
        return (False,)
    return (True, torch.get_autocast_dtype(kind))
