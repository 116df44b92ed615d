"""`Comparison`: what `thunder_nb.compare` found on one function, the original and the fixed side, and its words: the
verdict, the run section, text and HTML."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..diagnosis.model import Report
from ..render.common import count_phrases, plural, severity_counts
from .outcome import PEER, Outcome
from .verdict import (
    WRONG_WHEN,
    _by_priority,
    _check_text,
    _defect_phrase,
    _failure_phrase,
    _nothing_captured,
    _run_phrase,
    _speed,
    _us,
    _warnings_phrase,
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
    capture: bool | str = "auto"
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
        parts: list[str] = []
        if out.failure:
            parts.append(_failure_phrase(out.failure))
        errors = _by_priority(d for d in self.original.defects if d.is_error)
        if errors:
            phrase = _defect_phrase(self.original, errors[0])
            if len(errors) > 1:
                phrase += f" ({_more(errors[1:])})"  # NOTE: warnings are not counted here
            if errors[0].rule == "host-sync-in-region" and not out.error and self.graphs.get("original", 0) == 0:
                phrase += " (capture would fail)"
            parts.append(phrase)
        elif self.original.defects:
            parts.append(_warnings_phrase(self.original.defects))
        if not out.error:
            run = _run_phrase(out, self) if self.executed else "not run"
            if self.executed and out.ok and errors and errors[0].rule in WRONG_WHEN:
                # NOTE: the hazard did not show on these inputs: say so, and when it would
                when = WRONG_WHEN[errors[0].rule]
                run = run.replace("matches eager", f"equal to eager in this run (would be wrong {when})", 1)
            parts.append(run)
        return f"original ({self.original_kind}): " + ", ".join(parts)

    def _fixed_phrase(self) -> str:
        rep, out = self.fixed, self.results["fixed"]
        regions = sum(len(t.regions) for t in rep.traces)
        islands = sum(len(t.islands) for t in rep.traces)
        parts = [plural(regions, "region"), plural(islands, "island")]
        nothing = _nothing_captured(rep) if regions == 0 else None
        if nothing:
            parts.append(nothing)
        errors = _by_priority(d for d in rep.defects if d.is_error)
        if errors:
            parts.append(plural(len(errors), "defect") + ": " + _defect_phrase(rep, errors[0]))
        if out.failure:
            parts.append(_failure_phrase(out.failure))
        elif not self.executed:
            parts.append("not run")
        else:
            parts.append(_run_phrase(out, self))
            eager_us, fixed_us = self.timings.get("eager"), self.timings.get("fixed")
            # NOTE: a speed-up is only claimed for captured graphs; eager-mode timings say nothing about them
            if self.graphs.get("fixed", 0) > 0 and eager_us and fixed_us:
                parts.append(_speed(eager_us, fixed_us, "eager"))
                if self.timings.get("peer"):
                    parts.append(_speed(self.timings["peer"], fixed_us, PEER))
        return "fixed: " + ", ".join(parts)

    def _peer_phrase(self) -> str:
        """``torch.compile reduce-overhead: matches eager, 2.1x faster than eager``, or how it failed, in words."""
        out = self.results.get("peer")
        if not self.peers or not self.executed or out is None:
            return ""
        if out.failure:
            return f"{PEER}: fails ({out.failure.error_type}), so no speed compared with it"
        parts = [_run_phrase(out, self)]
        eager_us, peer_us = self.timings.get("eager"), self.timings.get("peer")
        # NOTE: as for the fixed side, a speed only where CUDA graphs are captured (reduce-overhead's own, on CUDA)
        if self.on_cuda and self.capture is not False and eager_us and peer_us:
            parts.append(_speed(eager_us, peer_us, "eager"))
        return f"{PEER}: " + ", ".join(parts)

    def _mode_phrase(self) -> str:
        if not self.executed:
            return ""
        if not self.on_cuda:
            why = "inputs on the CPU" if self.gpu else "no GPU"
            return f"eager mode ({why}): no CUDA graph captured, no speed compared"
        if self.capture is False:
            return "eager mode (capture off): no CUDA graph captured"
        return ""

    # --- views ------------------------------------------------------------------------------------

    def run_rows(self) -> list[tuple[str, str]]:
        """The run section as (label, text) rows: value, check against eager, timings, graphs captured."""
        if not self.executed:
            return [("run", "not run (--no-run): traces only")]
        fixed, orig = self.results["fixed"], self.results["original"]
        rows = [("device", self.device)]
        peer = self.results.get("peer") if self.peers else None
        rows.append(("value", f"eager {self.eager_value}; fixed {fixed.value or '-'}"
                     + (f"; original {orig.value}" if orig.ran else "")
                     + (f"; torch.compile {peer.value}" if peer is not None and peer.ran else "")))
        checks = [("fixed", fixed), (f"original ({self.original_kind})", orig)] + ([(PEER, peer)] if peer else [])
        for label, out in checks:
            rows.append((f"check {label}", _check_text(out, self)))
        if self.training:
            shown = ", ".join(self.trainable[:6]) + (", …" if len(self.trainable) > 6 else "")
            how = f"; an SGD step (lr {self.lr:g}) after each of {self.steps} calls" if self.lr is not None else ""
            rows.append(("gradients of", f"{shown} ({plural(len(self.trainable), 'tensor')}){how}"))
        rows.append(("timings", self._timings_text()))
        graphs = f"fixed {self.graphs.get('fixed', 0)}, original {self.graphs.get('original', 0)}"
        if not self.on_cuda:
            graphs += " (eager mode: inputs on the CPU)" if self.gpu else " (eager mode: no GPU)"
        elif self.capture is False:
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
                times.append(f"{name} {_us(self.timings[key])} ({_us(low, unit=False)}-{_us(high)})")
        if not times:
            return "-"
        how = f"median (10th-90th percentile) of {self.repeats} calls after {self.warmup} warm-up calls"
        if not self.on_cuda:
            # NOTE: on the CPU the regions run as plain Python: these numbers say nothing about CUDA graphs
            how += f", {self.threads} CPU threads; regions ran as plain Python, so these are no CUDA-graph timings"
        elif self.capture is False:
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
        """Return the verdict as one HTML line, each side's phrase in the colour of its worst finding (red: it would
        crash, fails, computes a wrong result or differs from eager; amber: warnings; green: nothing wrong)."""
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
        """"bad", "warn" or "good": the worst of a side's defects and its run (a difference that random ops explain
        is no finding)."""
        if out.failure is not None or any(d.is_error for d in report.defects):
            return "bad"
        if self.executed and out.ran and not out.ok and not self.random_ops:
            return "bad"
        return "warn" if report.defects else "good"

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
        return (f"<Comparison {self.function!r} on {device}: "
                f"{side(self.original_kind, self.original, self.results['original'])}; "
                f"{side('fixed', self.fixed, self.results['fixed'])}>")

    def _repr_mimebundle_(self, include=None, exclude=None):
        makers = {"text/plain": self.to_text, "text/html": self.to_html}
        wanted = [m for m in makers if (not include or m in include) and (not exclude or m not in exclude)]
        return {m: makers[m]() for m in wanted}


def _more(rest: list[Any]) -> str:
    """``+3 more wrong results, +1 more error``: the defects after the first, by severity, as the diagram's key counts
    them (a wrong result is not an error there)."""
    crash, wrong, errors, _ = severity_counts(rest)
    return ", ".join(([f"+{crash} more crashing the process"] if crash else [])
                     + ([f"+{plural(wrong, 'more wrong result')}"] if wrong else [])
                     + ([f"+{plural(errors, 'more error')}"] if errors else []))
