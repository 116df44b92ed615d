"""`Comparison`: what `thunder_nb.compare` found on one function, the original and the fixed side, and its words: the
verdict, the run section, text and HTML."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..cudagraph.capture import Capture
from ..diagnosis.model import Report
from ..render.common import count_phrases, plural
from .outcome import PEER, Outcome
from .verdict import (  # NOTE: _failure_phrase keeps its name while tests/notebook/test_comparison.py reads it
    _failure_phrase,
    by_priority,
    check_text,
    defect_phrase,
    format_us,
    hazard_phrase,
    nothing_captured,
    run_phrase,
    speed_phrase,
    tally_phrase,
    warnings_phrase,
)

__all__ = ["Comparison"]


@dataclass(frozen=True, slots=True)
class Comparison:
    """The original and the fixed transform on one function and its inputs, checked against eager."""

    function: str
    original_kind: str  # "stock" | "legacy"
    original: Report
    fixed: Report
    results: Mapping[str, Outcome]  # "original", "fixed"
    timings: Mapping[str, float]  # median microseconds per call: "eager", "fixed", "original" (those that ran)
    graphs: Mapping[str, int]  # CUDA graphs captured: "original", "fixed"
    device: str  # "cuda" or `EAGER_DEVICE`
    gpu: bool = False  # torch saw a CUDA device
    capture: Capture = Capture.AUTO  # as `compare` parsed it
    training: bool = False
    executed: bool = True
    eager_value: str = ""
    repeats: int = 0
    notes: tuple[str, ...] = ()  # what else went wrong, e.g. a later call failing while timing
    #: the jitted functions, "original" and "fixed" (to call again, or to inspect with thunder)
    functions: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    spread: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # 10th and 90th percentile, µs
    warmup: int = 0  # untimed calls before the timed ones
    threads: int = 0  # torch's CPU threads while timing
    lr: float | None = None  # the SGD learning rate of each training step (None: no step taken)
    steps: int = 0  # training steps each run took (the checked call, warm-up and timed calls)
    trainable: tuple[str, ...] = ()  # the tensors whose gradients are compared, e.g. "model.0.weight", "w1"
    peers: bool = False  # torch.compile reduce-overhead ran too: results["peer"], timings["peer"]
    #: the fusion executors both sides ran with, by name (`thunder_nb.cudagraph.executors.EXECUTOR_NAMES`), as
    #: `compare` resolved them (`thunder_nb.notebook.options.resolve_executors`); empty: thunder's defaults
    executors: tuple[str, ...] = ()

    @property
    def on_cuda(self) -> bool:
        """True when the inputs are on a CUDA device."""
        return self.device == "cuda"

    @property
    def random_ops(self) -> tuple[str, ...]:
        """The random ops the fixed side's traces run (``uniform`` for dropout): their draws are not eager's."""
        from ..diagnosis.ops import CAPTURE_DEPENDENT, RANDOM_NAMES

        found = {base for t in self.fixed.traces for op in (*t.ops, *(o for r in t.regions for o in r.ops))
                 if (base := op.callee.rsplit(".", 1)[-1]) in RANDOM_NAMES or base in CAPTURE_DEPENDENT}
        return tuple(sorted(found))

    def verdict(self) -> str:
        """Return the one-line verdict, e.g. ``original (stock): capture fails, item inside CUDAGraph1; fixed: ...``."""
        phrases = (self._original_phrase(), self._fixed_phrase(), self._peer_phrase(), self._mode_phrase())
        return "; ".join(p for p in phrases if p)

    def _original_phrase(self) -> str:
        out = self.results["original"]
        return f"original ({self.original_kind}): " + ", ".join(self._findings(self.original, out, "original"))

    def _findings(self, report: Report, out: Outcome, key: str) -> list[str]:
        """A side's findings, worst first: what went wrong in this run (its failure, its error defects, a wrong
        number), or the error defects this run did not show as hazards (what they would do, and when), or its
        warnings; then how the run went."""
        parts: list[str] = []
        went_wrong = self._went_wrong(out)
        if out.failure:
            parts.append(_failure_phrase(out.failure))
        errors = by_priority(d for d in report.defects if d.is_error)
        run = (run_phrase(out, self) if self.executed else "not run") if not out.error else ""
        if errors and not went_wrong:
            # NOTE: a hazard these inputs did not show is amber: say what it would do, and when
            hazard = hazard_phrase(report, errors, captured=self.graphs.get(key, 0) > 0)
            return parts + [hazard + (f", in this run: {run}" if self.executed and run else ", not run")]
        if errors:
            tally = tally_phrase(errors)
            parts.append(defect_phrase(report, errors[0]) + (f" ({tally})" if tally else ""))
        elif report.defects and key == "original":
            parts.append(warnings_phrase(report.defects))
        return parts + ([run] if run else [])

    def _went_wrong(self, out: Outcome) -> bool:
        """Whether something went wrong in this run: a crash, a failed capture or compile, a run not made because it
        would kill the process, or a number that differs from eager's (unless random ops explain it)."""
        if out.failure is not None and out.failure.kind != "no-gpu":
            return True
        return self.executed and out.ran and not out.ok and not self.random_ops

    def _fixed_phrase(self) -> str:
        rep, out = self.fixed, self.results["fixed"]
        regions = sum(len(t.regions) for t in rep.traces)
        islands = sum(len(t.islands) for t in rep.traces)
        parts = [plural(regions, "region"), plural(islands, "island")]
        nothing = nothing_captured(rep) if regions == 0 else None
        if nothing:
            parts.append(nothing)
        parts += self._findings(rep, out, "fixed")
        if self.executed and not out.failure:
            eager_us, fixed_us = self.timings.get("eager"), self.timings.get("fixed")
            # NOTE: a speed-up is only claimed for captured graphs; eager-mode timings say nothing about them
            if self.graphs.get("fixed", 0) > 0 and eager_us and fixed_us:
                parts.append(speed_phrase(eager_us, fixed_us, "eager"))
                if self.timings.get("peer"):
                    parts.append(speed_phrase(self.timings["peer"], fixed_us, PEER))
        return "fixed: " + ", ".join(parts)

    def _peer_phrase(self) -> str:
        """``torch.compile reduce-overhead: matches eager, 2.1x faster than eager``, or how it failed, in words."""
        out = self.results.get("peer")
        if not self.peers or not self.executed or out is None:
            return ""
        if out.failure:
            return f"{PEER}: fails ({out.failure.error_type}), so no speed compared with it"
        parts = [run_phrase(out, self)]
        eager_us, peer_us = self.timings.get("eager"), self.timings.get("peer")
        # NOTE: as for the fixed side, a speed only where CUDA graphs are captured (reduce-overhead's own, on CUDA)
        if self.on_cuda and self.capture is not Capture.OFF and eager_us and peer_us:
            parts.append(speed_phrase(eager_us, peer_us, "eager"))
        return f"{PEER}: " + ", ".join(parts)

    def _mode_phrase(self) -> str:
        if not self.executed:
            return ""
        if not self.on_cuda:
            why = "inputs on the CPU" if self.gpu else "no GPU"
            return f"eager mode ({why}): no CUDA graph captured, no speed compared"
        if self.capture is Capture.OFF:
            return "eager mode (capture off): no CUDA graph captured"
        return ""

    def next_step(self, call: str | None = None, model: str | None = None, optimizer: str | None = None,
                  executors: tuple[str, ...] | None = None, lr: float | None = None) -> str:
        """Return what to do after this verdict: a line, then runnable code in the caller's names.

        Args:
            call: the call as the user wrote it, e.g. ``"step(xb)"`` (default: ``function(*args)``).
            model, optimizer: with ``training``: the names of the module the function trains and of an optimizer of
                its parameters; with ``model``, the code trains with `thunder_nb.jit_step` (an SGD optimizer with
                ``lr`` is made where ``optimizer`` is None).
            executors: the fusion executors to pass on to `thunder_nb.jit` (default: those the sides ran with,
                `executors`).
        """
        import ast

        executors = self.executors if executors is None else executors
        call = call or f"{self.function}(*args)"
        node = ast.parse(call, mode="eval").body
        callee = ast.unparse(node.func) if isinstance(node, ast.Call) else self.function
        arguments = call[call.index("(") + 1: call.rindex(")")] if "(" in call else "*args"
        base = callee.rsplit(".", 1)[-1]
        base = base if base.isidentifier() else "fn"
        fixed = self.results["fixed"]
        if self._went_wrong(fixed):
            return (f"next: the fixed transform went wrong on {callee} too: keep it eager, or compile it without "
                    "CUDA graphs, and report this output to thunder-nb:\n"
                    f"    import thunder\n    {base}_thunder = thunder.jit({callee})\n    "
                    f"out = {base}_thunder({arguments})")
        islands = sum(len(t.islands) for t in self.fixed.traces)
        if self.training and model is not None and islands == 0:
            lines = ["import thunder_nb"]
            if optimizer is None:
                optimizer = "opt"
                lines = ["import torch, thunder_nb",
                         f"opt = torch.optim.SGD({model}.parameters(), lr={lr if lr is not None else 0.01:g})"]
            extra = f", executors={list(executors)!r}" if executors else ""
            lines += [f"train_step = thunder_nb.jit_step({model}, {callee}, {optimizer}{extra})",
                      f"loss = train_step({arguments})",
                      f"# check it against eager first: %%thunder_cudagraph --whole-step {model},{optimizer} "
                      f"{callee}({arguments})"]
            head = (f"next: train with the whole iteration as one CUDA graph: each call of train_step is "
                    f"{optimizer}.zero_grad(), {callee}, backward and {optimizer}.step():")
            return head + "".join(f"\n    {line}" for line in lines)
        extra = f", executors={list(executors)!r}" if executors else ""
        lines = ["import thunder_nb",
                 f"{base}_jit = thunder_nb.jit({callee}{extra})"
                 + ("" if executors else
                    f"  # or thunder.jit({callee}, transforms=[thunder_nb.FixedCUDAGraphTransform()])")]
        if self.training:
            lines += [f"loss = {base}_jit({arguments})", "loss.backward()"]
            head = f"next: compile {callee} with the fixed transform, and call backward on its result as before:"
        else:
            lines += [f"out = {base}_jit({arguments})"]
            head = f"next: compile {callee} with the fixed transform, and call it as before:"
        return head + "".join(f"\n    {line}" for line in lines)

    def next_html(self, **names: Any) -> str:
        """Return `next_step` as HTML: its line, then its code."""
        import html

        head, _, code = self.next_step(**names).partition("\n")
        return (f'<div class="tnb-next"><b>{html.escape(head)}</b><pre style="margin:2px 0 0 0">'
                f"<code>{html.escape(textwrap.dedent(code))}</code></pre></div>")

    # --- views ------------------------------------------------------------------------------------

    def run_rows(self) -> list[tuple[str, str]]:
        """The run section as (label, text) rows: device, the executors (when chosen), value, check against eager,
        timings, graphs captured."""
        used = [("executors", f"{', '.join(self.executors)}, on both sides")] if self.executors else []
        if not self.executed:
            return [("run", "not run (--no-run): traces only"), *used]
        fixed, orig = self.results["fixed"], self.results["original"]
        rows = [("device", self.device), *used]
        peer = self.results.get("peer") if self.peers else None
        rows.append(("value", f"eager {self.eager_value}; fixed {fixed.value or '-'}"
                     + (f"; original {orig.value}" if orig.ran else "")
                     + (f"; torch.compile {peer.value}" if peer is not None and peer.ran else "")))
        checks = [("fixed", fixed), (f"original ({self.original_kind})", orig)] + ([(PEER, peer)] if peer else [])
        for label, out in checks:
            rows.append((f"check {label}", check_text(out, self)))
        if self.training:
            shown = ", ".join(self.trainable[:6]) + (", …" if len(self.trainable) > 6 else "")
            how = f"; an SGD step (lr {self.lr:g}) after each of {self.steps} calls" if self.lr is not None else ""
            rows.append(("gradients of", f"{shown} ({plural(len(self.trainable), 'tensor')}){how}"))
        rows.append(("timings", self._timings_text()))
        graphs = f"fixed {self.graphs.get('fixed', 0)}, original {self.graphs.get('original', 0)}"
        if not self.on_cuda:
            graphs += " (eager mode: inputs on the CPU)" if self.gpu else " (eager mode: no GPU)"
        elif self.capture is Capture.OFF:
            graphs += " (capture off)"
        rows.append(("graphs captured", graphs))
        rows += [("note", n) for n in self.notes]
        return rows

    def _timings_text(self) -> str:
        order = [("eager", "eager"), ("fixed", "fixed"), ("original", f"original ({self.original_kind})"),
                 ("peer", PEER)]
        times = []
        for key, name in order:
            if key in self.timings:
                low, high = self.spread.get(key, (self.timings[key], self.timings[key]))
                times.append(f"{name} {format_us(self.timings[key])} ({format_us(low, unit=False)}-{format_us(high)})")
        if not times:
            return "-"
        how = f"median (10th-90th percentile) of {self.repeats} calls after {self.warmup} warm-up calls"
        if not self.on_cuda:
            # NOTE: on the CPU the regions run as plain Python: these numbers say nothing about CUDA graphs
            how += (f", {self.threads} CPU threads; on the CPU these mean little: regions ran as plain Python, so "
                    "they say nothing of CUDA graphs' speed")
        elif self.capture is Capture.OFF:
            how += "; capture off, so these are no CUDA-graph timings"
        return ", ".join(times) + f": {how}"

    def run_text(self) -> str:
        """Return the run section as text."""
        rows = self.run_rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def run_html(self) -> str:
        """Return the run section as an HTML table."""
        from ..render.html import rows_table

        return rows_table(self.run_rows())

    def verdict_html(self) -> str:
        """Return the verdict as one HTML line, each side's phrase in the colour of its worst finding (red: something went
        wrong in this run: a crash, a failed capture, a number that differs from eager; amber: hazards this run did not
        show, and warnings; green: nothing found)."""
        from ..render.html import verdict_spans

        phrases = [(self._original_phrase(), self._level(self.original, self.results["original"])),
                   (self._fixed_phrase(), self._level(self.fixed, self.results["fixed"]))]
        peer = self._peer_phrase()
        if peer:
            peer_out = self.results["peer"]
            phrases.append((peer, "good" if peer_out.ok else "bad"))
        mode = self._mode_phrase()
        if mode:
            phrases.append((mode, "note"))
        return verdict_spans(phrases)

    def _level(self, report: Report, out: Outcome) -> str:
        """"bad", "warn" or "good": red only for what went wrong in this run (`_went_wrong`); amber for hazards it did
        not show (error defects), warnings, or a side that needs a GPU; green for clean."""
        if self._went_wrong(out):
            return "bad"
        return "warn" if report.defects or out.failure is not None else "good"

    def to_text(self) -> str:
        """Return the whole comparison as text: verdict, both reports, the run section."""
        from .. import render

        return "\n\n".join(
            [
                self.verdict(),
                f"== original ({self.original_kind}) ==\n{render.report_text(self.original)}",
                f"== fixed ==\n{render.report_text(self.fixed)}",
                f"== run ==\n{self.run_text()}",
            ]
        )

    def to_html(self) -> str:
        """Return the whole comparison as static HTML: verdict, both reports side by side, the run section."""
        from .. import render

        return self.verdict_html() + render.side_by_side_html(self.original, self.fixed) + self.run_html()

    def __repr__(self) -> str:
        """One line at the Python prompt, each side named as `Report`'s repr names it (``stock``, ``legacy``,
        ``fixed``): its regions, islands and defects (counted as the text report counts them) and how its run went;
        `verdict` and `to_text` have the words. The dataclass's own repr dumped both reports, every field of them."""
        def side(label: str, report: Report, out: Outcome) -> str:
            regions = sum(len(t.regions) for t in report.traces)
            islands = sum(len(t.islands) for t in report.traces)
            if out.failure:
                run = _failure_phrase(out.failure)
            elif not out.ran:
                run = "not run"
            else:
                run = "matches eager" if out.ok else "differs from eager"
            return (f"{label}: {plural(regions, 'region')}, {plural(islands, 'island')}, "
                    f"{', '.join(count_phrases(report.defects))}, {run}")

        device = "cuda" if self.on_cuda else "cpu"
        if self.executors:
            device += f" with {', '.join(self.executors)}"
        return (f"<Comparison {self.function!r} on {device}: "
                f"{side(self.original_kind, self.original, self.results['original'])}; "
                f"{side('fixed', self.fixed, self.results['fixed'])}>")

    def _repr_mimebundle_(self, include=None, exclude=None):
        makers = {"text/plain": self.to_text, "text/html": self.to_html}
        wanted = [m for m in makers if (not include or m in include) and (not exclude or m not in exclude)]
        return {m: makers[m]() for m in wanted}
