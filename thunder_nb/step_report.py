"""What stops a training iteration from being one CUDA graph: frozen records, their text and HTML (no thunder)."""

from __future__ import annotations

import html
from dataclasses import dataclass

__all__ = ["Blocker", "Capturability", "BLOCKER_KINDS"]

#: `Blocker.kind`, in the order a report lists them.
BLOCKER_KINDS = ("thunder", "host sync", "device transfer", "cpu op", "host data", "capture-dependent", "optimizer",
                 "loss", "capture")


_PLACES = {"forward": "thunder's forward trace", "backward": "thunder's backward trace",
           "optimizer": "optimizer.step()", "loss_fn": "the loss function"}


def _percent(part: int, whole: int) -> str:
    """``part / whole`` as a percentage that reads 100% only when nothing is left out (99.9% otherwise)."""
    if not whole:
        return "0%"
    if part == whole:
        return "100%"
    return f"{min(part / whole * 100, 99.9):.1f}%"


@dataclass(frozen=True, slots=True)
class Blocker:
    """One thing that keeps part of the iteration out of the graph: what it is, the user's line, and the fix."""

    kind: str  # a `BLOCKER_KINDS` entry
    op: str  # the op or object: "item", "LBFGS"
    where: str | None  # the user's line: "train.py:12: `return loss, loss.item()`"; None where no line is known
    fix: str
    trace: str = "forward"  # "forward", "backward", "optimizer", "loss_fn"

    @property
    def place(self) -> str:
        """The user's line, or the part of the iteration it is in when no line is known."""
        return self.where or _PLACES.get(self.trace, self.trace)

    def __str__(self) -> str:
        return f"{self.kind}: {self.op} at {self.place}. Fix: {self.fix}"


@dataclass(frozen=True, slots=True)
class Capturability:
    """How much of one training iteration (forward, loss, backward, optimizer step) one CUDA graph can hold.

    ``ops`` counts the top-level ops of thunder's forward and backward execution traces, plus one for the
    optimizer's step; ``in_graph`` is the longest run of them with no blocker in it (all of them when nothing
    blocks: the whole iteration is one graph). `thunder_nb.step.jit_step` records the iteration only when
    ``blockers`` is empty; otherwise it refuses and names the first one.
    """

    function: str  # the loss function's name
    ops: int
    in_graph: int
    blockers: tuple[Blocker, ...]
    optimizer: str  # "AdamW (capturable, lr read from a device tensor)"
    notes: tuple[str, ...] = ()

    @property
    def fraction(self) -> float:
        """The share of the iteration's ops in one graph (0.0 to 1.0)."""
        return self.in_graph / self.ops if self.ops else 0.0

    @property
    def whole_step(self) -> bool:
        """Whether `jit_step` records the whole iteration as one graph."""
        return not self.blockers

    def to_text(self) -> str:
        """The report as plain text: the figure, then each blocker with its line and fix."""
        head = (f"{self.function}: {_percent(self.in_graph, self.ops)} of the iteration in one graph "
                f"({self.in_graph} of {self.ops} ops; optimizer: {self.optimizer})")
        lines = [head]
        if self.whole_step:
            lines.append("  whole step: forward, loss, backward and optimizer step record as one CUDA graph")
        for i, b in enumerate(self.blockers, 1):
            lines.append(f"  {i}. {b.kind}: {b.op} at {b.place}")
            lines.append(f"     fix: {b.fix}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        share = _percent(self.in_graph, self.ops)
        return (f"Capturability({self.function!r}, {share} in one graph, {self.in_graph}/{self.ops} ops, "
                f"{len(self.blockers)} blockers)")

    def _repr_html_(self) -> str:
        e = html.escape
        colour = "#1a7f37" if self.whole_step else "#cf222e"
        parts = [f'<div class="thunder-nb-capturability"><b>{e(self.function)}</b>: '
                 f'<span style="color:{colour}"><b>{_percent(self.in_graph, self.ops)}</b> of the iteration in one '
                 f"graph</span> "
                 f"({self.in_graph} of {self.ops} ops; optimizer: {e(self.optimizer)})"]
        if self.blockers:
            parts.append("<table><tr><th>what stops it</th><th>op</th><th>where</th><th>fix</th></tr>")
            for b in self.blockers:
                where = f"<code>{e(b.where)}</code>" if b.where else e(b.place)
                parts.append(f"<tr><td>{e(b.kind)}</td><td><code>{e(b.op)}</code></td><td>{where}</td>"
                             f"<td>{e(b.fix)}</td></tr>")
            parts.append("</table>")
        else:
            parts.append("<p>whole step: forward, loss, backward and optimizer step record as one CUDA graph</p>")
        if self.notes:
            parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in self.notes) + "</ul>")
        parts.append("</div>")
        return "".join(parts)
