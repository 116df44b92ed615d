"""A region's ops grouped by the module they run in, repeated blocks folded (``h.0 … h.5 ×6``), as nested HTML.

The module of an op comes from the parameters and buffers it reads (`TraceReport.parameters`, the paths the
prologue fetches them by); an op that reads none belongs to the innermost module around its neighbours. The ops a
fusion executor fused (inductor's ``TorchCompile0``) are placed so too, each group's gathered by module (`_placed`).
Each level opens with a click (``<details>``), so the view works in JupyterLab and in an exported page alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..diagnosis.model import Op, Region, TraceReport
from .common import esc, plural, state_fill

__all__ = ["TREE_MIN_OPS", "Group", "fused_owners", "has_tree", "op_scopes", "module_tree",
           "module_tree_html"]

#: Regions with at least this many ops get a module tree in the default view.
TREE_MIN_OPS = 30

_OP_TEXT = 110  # NOTE: characters of an op's statement shown in a leaf
# NOTE: ops listed under one group; the rest are counted (the region's code lists them all). Notebook 05's 6-layer
# step, fused, listed 1,069 ops across its trees at 60, and made the notebook 1.14 MB (H200, 2026-12-03)
_LEAF_OPS = 24


@dataclass(slots=True)
class Group:
    """A module (or the region itself, ``name`` ""): its ops and submodules in program order."""

    name: str  # "transformer", "attn", "h.0"; "h.0 … h.5" once folded
    items: list[Group | Op] = field(default_factory=list)
    base: str = ""  # the name without a block's number: "h" for "h.0"
    repeat: int = 1  # consecutive blocks of the same ops folded into this one (its items are the first block's)

    def ops(self) -> list[Op]:
        """Every op under this group (one block's when folded)."""
        return [o for item in self.items for o in (item.ops() if isinstance(item, Group) else [item])]

    def signature(self) -> tuple:
        """What makes two blocks the same: their ops' callees and their submodules' shapes, in order."""
        return tuple(
            (item.base or item.name, item.repeat, item.signature()) if isinstance(item, Group) else item.callee
            for item in self.items
        )


def fused_owners(region: Region) -> dict[Op, str]:
    """The fused group (its name) of each fused op whose statement is known."""
    return {op: group.name for group in region.fusions for op in group.statements}


def has_tree(region: Region) -> bool:
    """Whether the region gets a module tree in the default view: `TREE_MIN_OPS` ops or more, fused ones counted."""
    return len(region.every_op) >= TREE_MIN_OPS


def _module(path: str) -> tuple[str, ...]:
    """``("transformer", "h", "0", "ln_1")`` for the parameter ``transformer.h.0.ln_1.weight``."""
    return tuple(path.split(".")[:-1])


def _common(paths: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    first = paths[0]
    k = 0
    while k < len(first) and all(len(p) > k and p[k] == first[k] for p in paths):
        k += 1
    return first[:k]


def op_scopes(trace: TraceReport, ops: Sequence[Op]) -> list[tuple[str, ...]]:
    """The module path of each op: the common module of the parameters it reads, else that of its neighbours.

    An op between two ops of different blocks of a sequence (``h.0`` … ``h.1``) belongs to the earlier block
    (a residual add ends its block); ops before the first or after the last op that reads a parameter belong to
    the top.
    """
    params = dict(trace.parameters)
    known: list[tuple[str, ...] | None] = []
    for op in ops:
        mods = [_module(params[n]) for n in op.inputs if n in params]
        known.append(_common(mods) if mods else None)
    scopes: list[tuple[str, ...]] = []
    prev: tuple[str, ...] | None = None
    nxt: list[tuple[str, ...] | None] = [None] * len(ops)
    after = None
    for i in range(len(ops) - 1, -1, -1):
        nxt[i] = after
        if known[i] is not None:
            after = known[i]
    for i, k in enumerate(known):
        if k is not None:
            scopes.append(k)
            prev = k
            continue
        n = nxt[i]
        if prev is None or n is None:
            scopes.append(())
            continue
        c = _common([prev, n])
        # NOTE: h.0.mlp … h.1.ln_1 share (transformer, h), h.5.mlp … ln_f (transformer): what lies between them
        # closes the block (h.0, h.5) of the earlier op
        k = len(c)
        if k < len(prev) and prev[k].isdigit():
            k += 1
        elif k + 1 < len(prev) and prev[k + 1].isdigit():
            k += 2
        scopes.append(prev[:k])
    return scopes


def _placed(trace: TraceReport, region: Region) -> list[tuple[Op, tuple[str, ...]]]:
    """Each op of `Region.every_op` with its module path (`op_scopes`); the ops of one fused group gathered by module,
    each module where it first appears among them.

    The order of a fused group's ops is not the order they run in (inductor schedules its kernels itself), and
    thunder's fusion pass moves some (a backward's weight-gradient sums) after the ops of other modules: in program
    order they would split a module into several boxes.
    """
    ops = region.every_op
    scopes = op_scopes(trace, ops)
    owners = fused_owners(region)
    placed: list[tuple[Op, tuple[str, ...]]] = []
    i = 0
    while i < len(ops):
        j = i + 1
        if ops[i] in owners:
            while j < len(ops) and owners.get(ops[j]) == owners[ops[i]]:
                j += 1
            first: dict[tuple[str, ...], int] = {}
            for k in range(i, j):
                for d in range(1, len(scopes[k]) + 1):
                    first.setdefault(scopes[k][:d], k)
            # NOTE: by the first appearance of each enclosing module, then in order: an op of a module itself stays
            # between its submodules, where it was
            span = sorted(range(i, j), key=lambda k: (*(first[scopes[k][:d]] for d in range(1, len(scopes[k]) + 1)),
                                                     k))
            placed += [(ops[k], scopes[k]) for k in span]
        else:
            placed.append((ops[i], scopes[i]))
        i = j
    return placed


def module_tree(trace: TraceReport, region: Region) -> Group:
    """The region's ops (`Region.every_op`: fused ones too) as a tree of modules, numbered blocks named ``h.0`` and runs
    of equal blocks folded."""
    root = Group("")
    for op, scope in _placed(trace, region):
        node = root
        for name in scope:
            last = node.items[-1] if node.items else None
            if isinstance(last, Group) and last.name == name:
                node = last
            else:
                child = Group(name)
                node.items.append(child)
                node = child
        node.items.append(op)
    _tidy(root)
    return root


def _tidy(g: Group) -> None:
    """Name numbered blocks after their sequence (``h`` holding ``0``, ``1``: ``h.0``, ``h.1``), fold equal runs."""
    items: list[Group | Op] = []
    for item in g.items:
        if isinstance(item, Group):
            _tidy(item)
            blocks = [c for c in item.items if isinstance(c, Group)]
            if blocks and len(blocks) == len(item.items) and all(c.name.split(" ")[0].isdigit() for c in blocks):
                for c in blocks:
                    c.name, c.base = f"{item.name}.{c.name}", item.name
                items.extend(blocks)
                continue
        items.append(item)
    folded: list[Group | Op] = []
    for item in items:
        last = folded[-1] if folded else None
        if (isinstance(item, Group) and isinstance(last, Group) and item.base and item.base == last.base
                and item.signature() == last.signature()):
            first = last.name.split(" … ")[0]
            last.repeat += 1
            last.name = f"{first} … {item.name}"
            continue
        folded.append(item)
    g.items = folded


def _op_line(op: Op, names: dict[str, str]) -> str:
    """The op's statement, a parameter or buffer named by its path in the model (``h.0.ln_1.weight``, where the
    trace says ``t___globals___model_transformer_h_0_ln_1_weight``)."""
    head = f"{', '.join(op.outputs)} = {op.callee}" if op.outputs else op.callee
    text = f"{head}({', '.join(names.get(n, n) for n in op.inputs)})"
    return text if len(text) <= _OP_TEXT else text[: _OP_TEXT - 1] + "…"


def _ops_summary(ops: Sequence[Op]) -> str:
    counts = Counter(o.callee.rsplit(".", 1)[-1] for o in ops)
    top = [f"{c} ×{n}" if n > 1 else c for c, n in counts.most_common(3)]
    return ", ".join(top) + (", …" if len(counts) > 3 else "")


@dataclass(slots=True, frozen=True)
class _Marks:
    """What a leaf writes after each op, and the parameters' display names. Several fused groups: each fused op its
    group's name, the others "not fused". One group, which the tree's heading names: only the fewer side is marked,
    the ops left out of it ("not fused") where it holds most, else its own ("in TorchCompile0"): a mark on every op
    made notebook 05's trees a quarter of its size."""

    owners: dict[Op, str]
    names: dict[str, str]
    groups: int
    most_fused: bool  # the one group holds at least half of the region's ops

    def of(self, op: Op) -> str:
        if not self.owners:
            return ""
        if op in self.owners and (self.groups > 1 or not self.most_fused):
            return f" <small>(in {esc(self.owners[op])})</small>"
        if op not in self.owners and (self.groups > 1 or self.most_fused):
            return " <small>(not fused)</small>"
        return ""


def _ops_html(ops: Sequence[Op], marks: _Marks) -> str:
    rows = "".join(f"<li><code>{esc(_op_line(o, marks.names))}</code>{marks.of(o)}</li>" for o in ops[:_LEAF_OPS])
    if len(ops) > _LEAF_OPS:
        rows += f"<li>… {esc(plural(len(ops) - _LEAF_OPS, 'more op'))} (the region's code lists them all)</li>"
    return rows


def _items_html(items: Sequence[Group | Op], marks: _Marks) -> str:
    out: list[str] = []
    run: list[Op] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(_ops_html(run, marks))
        elif run:
            out.append(f'<li><details><summary><span class="tnb-box tnb-ops">{esc(plural(len(run), "op"))}</span> '
                       f'{esc(_ops_summary(run))}</summary><ol class="tnb-level">{_ops_html(run, marks)}</ol>'
                       "</details></li>")
        run.clear()

    for item in items:
        if isinstance(item, Group):
            flush()
            out.append(_group_html(item, marks))
        else:
            run.append(item)
    flush()
    return "".join(out)


def _group_html(g: Group, marks: _Marks) -> str:
    n = len(g.ops())
    count = plural(n, "op") + (" each" if g.repeat > 1 else "")
    name = g.name + (f", ×{g.repeat}" if g.repeat > 1 else "")
    return (f'<li><details><summary><span class="tnb-box">{esc(name)}</span> {esc(count)}</summary>'
            f'<ol class="tnb-level">{_items_html(g.items, marks)}</ol></details></li>')


def module_tree_html(trace: TraceReport, region: Region) -> str:
    """The region's module tree: its top level shown, each module a box that opens one level per click."""
    root = module_tree(trace, region)
    owners = fused_owners(region)
    fill = state_fill(region)
    groups = list(dict.fromkeys(owners.values()))
    n = len(region.every_op)
    fused = (f", {'all' if len(owners) == n else f'{len(owners)} of them'} fused in {', '.join(groups)}" if owners
             else "")
    head = (f"{region.name} by module: {plural(n, 'op')}{fused}"
            + (" (one block of each folded run shown: ×N)" if _folded(root) else ""))
    marks = _Marks(owners, dict(trace.parameters), len(groups), 2 * len(owners) >= n)
    return (f'<div class="tnb-tree" style="border-color:{fill}"><div class="tnb-h">{esc(head)}</div>'
            f'<ol class="tnb-level">{_items_html(root.items, marks)}</ol></div>')


def _folded(g: Group) -> bool:
    return any(isinstance(i, Group) and (i.repeat > 1 or _folded(i)) for i in g.items)
