"""What stops a training iteration from being one CUDA graph: frozen records, their text and HTML (no thunder)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from ..cudagraph.capture import Capture

__all__ = ["Blocker", "Capturability", "StepComparison", "BLOCKER_KINDS"]

#: `Blocker.kind`, in the order a report lists them.
BLOCKER_KINDS = ("thunder", "dynamic shape", "host sync", "device transfer", "cpu op", "host data", "capture-dependent",
                 "python-side state", "optimizer", "loss", "capture", "grad mode", "autocast")


#: A thunder proxy's class in an error message: ``FloatProxy``, ``IntegerProxy``.
_PROXY = re.compile(r"\b(Float|Integer|Int|Complex|Bool|Number|String|)Proxy\b")

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
    filename: str | None = None  # the file (or notebook cell) of ``where``, for a caller that words it its own way
    line: int | None = None

    @property
    def place(self) -> str:
        """The user's line, or the part of the iteration it is in when no line is known."""
        return self.where or _PLACES.get(self.trace, self.trace)

    def __str__(self) -> str:
        return f"{self.kind}: {self.op} at {self.place}. Fix: {self.fix}"

    def words(self) -> tuple[str, str]:
        """The op and the fix as the report shows them: a thunder proxy named in an error (``unsupported format
        string passed to FloatProxy.__format__``) as the placeholder it is, never by its class."""
        if _PROXY.search(self.op) and "__format__" in self.op:
            return ("a format spec on a number thunder traces (an f-string such as f'{loss.item():.3f}')",
                    "thunder runs the loss function's Python once, with placeholders for values, and a placeholder "
                    "cannot be formatted: return the loss and format loss.item() after the step")
        return _PROXY.sub(lambda m: f"a traced {m.group(1).lower() or 'value'}", self.op), self.fix


@dataclass(frozen=True, slots=True)
class Capturability:
    """How much of one training iteration (forward, loss, backward, optimizer step) one CUDA graph can hold.

    ``ops`` counts the top-level ops of thunder's forward and backward execution traces, the gradients' all-reduces
    across ``ranks`` ranks (``all_reduces``, one per static bucket; 0 in one process; sharded, ``reduce_scatters``
    and as many all_gathers instead), plus one for the optimizer's
    step; ``in_graph`` is the longest run of them with no blocker in it (all of them when nothing
    blocks: the whole iteration is one graph). `thunder_nb.step.jit_step` records the iteration only when
    ``blockers`` is empty; otherwise it refuses and names the first one.
    """

    function: str  # the loss function's name
    ops: int
    in_graph: int
    blockers: tuple[Blocker, ...]
    optimizer: str  # "AdamW (capturable, lr read from a device tensor)"
    notes: tuple[str, ...] = ()
    all_reduces: int = 0  # the gradients' all_reduce calls a step makes, inside its graph
    ranks: int = 0  # the ranks they average over (0: one process, no averaging)
    reduce_scatters: int = 0  # sharded (jit_step's shard=True): reduce_scatter calls a step, as many all_gathers

    def ranks_text(self) -> str:
        """The collectives in words ("" in one process)."""
        if not self.ranks:
            return ""
        if self.reduce_scatters:
            n = self.reduce_scatters
            return (f"sharded across {self.ranks} ranks: reduce_scatter + all_gather per step ({n} of each, one per "
                    "dtype and device), inside the graph: the gradients' mean reduce-scattered after the backward, "
                    "each rank's updated parameters all-gathered after the optimizer's step")
        return (f"all-reduce: {self.all_reduces} all_reduce a step across {self.ranks} ranks (the gradients' mean, one "
                "per static bucket), inside the graph, after the backward and before the optimizer's step")

    @property
    def fraction(self) -> float:
        """The share of the iteration's ops in one graph (0.0 to 1.0)."""
        return self.in_graph / self.ops if self.ops else 0.0

    @property
    def whole_step(self) -> bool:
        """Whether `jit_step` records the whole iteration as one graph."""
        return not self.blockers

    @property
    def traced(self) -> bool:
        """Whether thunder traced the step (without a trace nothing is known of its ops)."""
        return not any(b.kind in ("thunder", "dynamic shape") for b in self.blockers)

    def share_text(self) -> str:
        """``100% of the iteration in one graph (41 of 41 ops; optimizer: ...)``; where the loss is not one element,
        that first (no share of the iteration is one graph until it is)."""
        count = f"{self.in_graph} of {self.ops} ops" if self.traced else "thunder cannot trace it"
        share = _percent(self.in_graph, self.ops)
        loss = next((b for b in self.blockers if b.kind == "loss"), None)
        if loss is not None and self.in_graph == 0:
            what = loss.op.removeprefix("loss_fn returns ")
            return (f"{share} of the iteration in one graph: the whole step needs a loss of one element, and "
                    f"{self.function} returns {what} ({count}; optimizer: {self.optimizer})")
        return f"{share} of the iteration in one graph ({count}; optimizer: {self.optimizer})"

    def to_text(self) -> str:
        """The report as plain text: the figure, then each blocker with its line and fix."""
        head = f"{self.function}: {self.share_text()}"
        lines = [head]
        if self.whole_step:
            lines.append("  whole step: forward, loss, backward and optimizer step record as one CUDA graph")
        if self.ranks:
            lines.append(f"  {self.ranks_text()}")
        for i, b in enumerate(self.blockers, 1):
            op, fix = b.words()
            lines.append(f"  {i}. {b.kind}: {op} at {b.place}")
            lines.append(f"     fix: {fix}")
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
                 f"graph</span> {e(self.share_text().partition(' graph ')[2])}"]
        if self.blockers:
            parts.append("<table><tr><th>what stops it</th><th>op</th><th>where</th><th>fix</th></tr>")
            for b in self.blockers:
                where = f"<code>{e(b.where)}</code>" if b.where else e(b.place)
                op, fix = b.words()
                parts.append(f"<tr><td>{e(b.kind)}</td><td><code>{e(op)}</code></td><td>{where}</td>"
                             f"<td>{e(fix)}</td></tr>")
            parts.append("</table>")
        else:
            parts.append("<p>whole step: forward, loss, backward and optimizer step record as one CUDA graph</p>")
        if self.ranks:
            parts.append(f"<p>{e(self.ranks_text())}</p>")
        if self.notes:
            parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in self.notes) + "</ul>")
        parts.append("</div>")
        return "".join(parts)


@dataclass(frozen=True, slots=True)
class StepComparison:
    """The whole step against eager PyTorch (`thunder_nb.step.compare_step`): the report, the check and the timings.

    ``losses`` holds eager's loss at each checked step, then the whole step's (``None`` for a side that did not
    run); ``max_loss_error`` and ``max_param_error`` are the largest absolute differences, over the steps' losses
    and over the parameters after the last step. ``timings`` is milliseconds per step for ``"eager"`` and
    ``"whole step"``, from ``repeats`` consecutive steps each (empty where nothing was timed).
    """

    report: Capturability
    device: str  # "cpu", "cuda:0 (NVIDIA H200)"
    capture: Capture | None  # CUDA: a real CUDA graph; EMULATED: the CPU stand-in; None: not run
    steps: int  # steps checked against eager
    losses: tuple[tuple[float, ...] | None, tuple[float, ...] | None] = (None, None)
    params: int = 0  # parameter tensors compared after the last step
    max_loss_error: float | None = None
    max_param_error: float | None = None
    tolerance: tuple[float, float] = (1e-4, 1e-5)  # (rtol, atol)
    matches: bool | None = None  # None: not checked
    graphs: int = 0  # CUDA graphs (or stand-in recordings) the whole step made
    timings: tuple[tuple[str, float], ...] = ()  # (configuration, ms per step)
    repeats: int = 0
    error: str | None = None  # why the whole step did not run to the end
    notes: tuple[str, ...] = ()

    @property
    def function(self) -> str:
        return self.report.function

    @property
    def ran(self) -> bool:
        """Whether the whole step ran and was checked against eager."""
        return self.matches is not None

    @property
    def speedup(self) -> float | None:
        """Eager's time per step over the whole step's (None when not timed)."""
        t = dict(self.timings)
        return t["eager"] / t["whole step"] if "eager" in t and t.get("whole step") else None

    def verdict(self) -> str:
        """One line: the share in one graph, and how the run went."""
        head = f"{self.function}: {_percent(self.report.in_graph, self.report.ops)} of the iteration in one graph"
        return f"{head}; {self._outcome()}"

    def _outcome(self) -> str:
        r = self.report
        if r.blockers:
            n = len(r.blockers)
            return f"not run: {n} blocker{'s' if n > 1 else ''} stop{'' if n > 1 else 's'} the whole step (above)"
        if self.error is not None:
            return f"the whole step failed: {self.error}"
        if not self.ran:
            return "not run (--no-run)"
        what = f"over {self.steps} steps (losses, and {self.params} parameters after the last)"
        check = f"matches eager {what}" if self.matches else f"DIFFERS from eager {what}"
        if self.capture is Capture.EMULATED:
            return (f"{check}; emulated on the CPU (no GPU): recorded by capture's CPU stand-in instead of a CUDA "
                    "graph, not timed")
        speed = self.speedup
        return check + (f"; {speed:.2f}x eager's speed" if speed is not None else "")

    def run_lines(self) -> list[tuple[str, str]]:
        """The run as (label, text) rows: the outcome, device, capture, check, timings, graphs, notes."""
        rows = [("whole step", self._outcome()), ("device", self.device)]
        if not self.ran and self.error is None:
            rows.extend(("note", n) for n in self.notes)
            return rows
        capture = {Capture.CUDA: "one CUDA graph per step, replayed",
                   Capture.EMULATED: "emulated on the CPU: no GPU, so no CUDA graph; each replay runs the recorded "
                                     "step eagerly and writes its results into the recording's memory, as a graph's "
                                     "replay does"}
        rows.append(("capture", capture.get(self.capture, str(self.capture))))
        if self.error is not None:
            rows.append(("error", self.error))
        if self.ran:
            rtol, atol = self.tolerance
            verdict = "matches eager" if self.matches else "DIFFERS from eager"
            rows.append(("check", f"{verdict} (rtol {rtol:g}, atol {atol:g}): losses of {self.steps} steps, max abs "
                                  f"diff {self.max_loss_error:.1e}; {self.params} parameters after the last step, max "
                                  f"abs diff {self.max_param_error:.1e}"))
            eager, whole = self.losses
            if eager is not None and whole is not None:
                rows.append(("losses, eager", ", ".join(f"{v:.6g}" for v in eager)))
                rows.append(("losses, whole step", ", ".join(f"{v:.6g}" for v in whole)))
        if self.timings:
            t = ", ".join(f"{name} {ms:.3f} ms" for name, ms in self.timings)
            speed = self.speedup
            rows.append(("time per step", f"{t} ({self.repeats} consecutive steps each)"
                                          + (f": {speed:.2f}x eager's speed" if speed is not None else "")))
        elif self.ran:
            rows.append(("time per step", "not timed: the CPU stand-in says nothing about a CUDA graph's speed"))
        if self.capture is Capture.EMULATED:
            # NOTE: the stand-in's recordings are no CUDA graphs: "graphs recorded 1" contradicted "no CUDA graph"
            rows.append(("recordings", f"{self.graphs} by capture's CPU stand-in (CUDA graphs: none, no GPU)"))
        else:
            rows.append(("graphs recorded", str(self.graphs)))
        rows.extend(("note", n) for n in self.notes)
        return rows

    def next_step(self, model: str = "model", optimizer: str = "opt", call: str | None = None,
                  executors: tuple[str, ...] = ()) -> str:
        """What to do after this report: a line, then runnable code in the caller's names (the model's and the
        optimizer's, and the call of the loss function as the user wrote it, e.g. ``"loss_fn(xb, yb)"``)."""
        call = call or f"{self.function}(*batch)"
        callee, _, rest = call.partition("(")
        arguments = rest[: rest.rindex(")")] if ")" in rest else "*batch"
        extra = f", executors={list(executors)!r}" if executors else ""
        base = callee.rsplit(".", 1)[-1] if callee.rsplit(".", 1)[-1].isidentifier() else "loss_fn"
        per_call = ["import thunder_nb", f"{base}_jit = thunder_nb.jit({callee}{extra})", f"{optimizer}.zero_grad()",
                    f"loss = {base}_jit({arguments})", "loss.backward()", f"{optimizer}.step()"]
        whole = ["import thunder_nb", f"train_step = thunder_nb.jit_step({model}, {callee}, {optimizer}{extra})",
                 f"loss = train_step({arguments})"]
        blockers = self.report.blockers
        if blockers:
            if all(b.kind in _PER_CALL_KINDS for b in blockers):
                head = (f"next: fix what stops it (above) and run this cell again; until then, thunder_nb.jit runs "
                        f"{callee} with CUDA graphs around what stops the whole step:")
                return _code(head, per_call)
            magic = f"%%thunder_cudagraph --whole-step {model},{optimizer} {call}"
            return _code("next: fix what stops it (above) in the cell, then run it again:", [magic])
        if self.error is not None or self.matches is False:
            head = ("next: the whole step went wrong here: train with thunder_nb.jit per call (CUDA graphs inside "
                    "the forward and the backward) and report this output to thunder-nb:")
            return _code(head, per_call)
        if not self.ran:
            return _code(f"next: run it against eager PyTorch (without --no-run), or train with it: each call of "
                         f"train_step is {optimizer}.zero_grad(), {callee}, backward and {optimizer}.step():", whole)
        where = " on a GPU (capture's CPU stand-in here)" if self.capture is Capture.EMULATED else ""
        return _code(f"next: train with it: each call of train_step is {optimizer}.zero_grad(), {callee}, backward "
                     f"and {optimizer}.step(), one CUDA graph{where}:", whole)

    def next_html(self, **names: str) -> str:
        """`next_step` as HTML: its line, then its code."""
        head, _, code = self.next_step(**names).partition("\n")
        return (f'<div class="tnb-next"><b>{html.escape(head)}</b><pre style="margin:2px 0 0 0">'
                f"<code>{html.escape(code.replace(chr(10) + '    ', chr(10)).removeprefix('    '))}</code></pre></div>")

    def to_text(self) -> str:
        """The capturability report, then the run, as plain text."""
        rows = self.run_lines()
        width = max(len(k) for k, _ in rows)
        return "\n".join([self.report.to_text(), *(f"{k.ljust(width)}  {v}" for k, v in rows)])

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<StepComparison of {self.function}: {self._outcome()}>"

    def _repr_html_(self) -> str:
        e = html.escape
        colour = "#1a7f37" if self.matches else ("#cf222e" if self.matches is False or self.error else "#9a6700")
        rows = "".join(f"<tr><th style='text-align:left'>{e(k)}</th><td style='text-align:left'>{e(v)}</td></tr>"
                       for k, v in self.run_lines())
        return (f'<div class="thunder-nb-step">{self.report._repr_html_()}'
                f'<p style="color:{colour}"><b>whole step: {e(self._outcome())}</b></p><table>{rows}</table></div>')


#: Blocker kinds that keep the iteration from one graph but not a function from `thunder_nb.jit`'s graphs around them.
_PER_CALL_KINDS = ("host sync", "device transfer", "cpu op", "host data", "capture-dependent", "optimizer", "capture")


def _code(head: str, lines: list[str]) -> str:
    return head + "".join(f"\n    {line}" for line in lines)
