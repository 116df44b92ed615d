"""The memory model of each region in words: what is read in place, copied in, handed out, and why."""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnosis.model import Outside, Region, TraceReport
from ..diagnosis.plans import INPUT_ROLES, HandOutAction, rotates
from .common import plural

__all__ = ["ROLE_LABELS", "ACTION_LABELS", "ROLE_SHORT", "ACTION_SHORT", "Entry", "known", "input_roles",
           "output_actions", "hand_out_actions", "region_memory", "inputs_summary", "outputs_summary", "hand_outs",
           "hand_out_line"]

#: How each `INPUT_ROLES` key is named in reports and diagrams.
ROLE_LABELS = {"static": "read in place", "copied": "copied in", "number": "number"}
#: How each hand-out action is named in reports and diagrams (`HandOutAction.label`).
ACTION_LABELS = {a.value: a.label for a in HandOutAction}

# NOTE: thunder's own runner has no hand-out: what a region returns leaves as the graph's buffer
_STOCK_RETURNED = "the graph's own buffer, no hand-out: the next replay overwrites it"
_STOCK_SAVED = "the graph's own buffer, no hand-out: a second forward before the backward overwrites it"
_STOCK_INPUTS = {"static": "marked static by thunder: read where it lies, assumed to stay the same tensor",
                 "copied": "copied into the graph's static buffer before each replay",
                 "number": INPUT_ROLES["number"]}
_GRAPH_MEMORY_RULES = ("returned-graph-memory", "saved-graph-memory")
_WRITE_BACK = "updated in place: copied back to the caller's tensor after each replay"
_UPDATED_WHERE_IT_LIES = "updated in place where it lies, by the graph: nothing to copy back"


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of a region's memory plan: a label, the names it applies to, and why."""

    label: str  # "read in place", "copied in", "copied out", "instances", ...
    names: tuple[str, ...]
    reason: str = ""
    flagged: bool = False  # a danger (a rebound static input, a tensor handed out as the graph's buffer)

    def __str__(self) -> str:
        names = ", ".join(self.names)
        if not self.reason:
            return f"{self.label}: {names}"
        return f"{self.label}: {names} ({self.reason})" if names else f"{self.label}: {self.reason}"


def known(trace: TraceReport, region: Region) -> bool:
    """True when the region's memory plan is known: a thunder-nb plan, or thunder's own runner (a real trace)."""
    # NOTE: generated source alone says nothing of static inputs or of the runner
    return region.plan is not None or bool(trace.provenance)


def input_roles(trace: TraceReport, region: Region) -> dict[str, str]:
    """Each input's `INPUT_ROLES` key: the transform's plan, else thunder's static mask and the value types."""
    if region.plan is not None:
        return {i.name: i.role for i in region.plan.inputs}
    mask, by_name = region.static_mask, {v.name: v for v in trace.values}
    roles = {}
    for k, n in enumerate(region.inputs):
        v = by_name.get(n)
        roles[n] = "number" if v is not None and v.is_scalar else ("static" if k < len(mask) and mask[k] else "copied")
    return roles


def output_actions(trace: TraceReport, region: Region) -> dict[str, tuple[HandOutAction, str]]:
    """The region outputs that leave the trace: name -> (`HandOutAction`: ROTATE for a copy the runner leaves where it
    lies while instances take turns, `_rotates`; what leaves: "returned"/"saved")."""
    out: dict[str, tuple[HandOutAction, str]] = {}
    if trace.hand_out is not None:
        plans = {o.name: o for o in region.plan.outputs} if region.plan is not None else {}
        rotating = _rotates(trace, region)
        for name in region.outputs:
            action = trace.hand_out.action(name)
            if action is None:
                continue
            if action is HandOutAction.COPY and rotating:
                action = HandOutAction.ROTATE
            plan = plans.get(name)
            fate = plan.fate if plan is not None else ("saved" if action is HandOutAction.GUARD else "returned")
            out[name] = (action, fate)
        return out
    wrong = {d.value: d.rule for d in trace.defects if d.rule in _GRAPH_MEMORY_RULES}
    returned = {v.name for v in trace.values if v.returned and v.type.kind == "tensor"}
    for name in region.outputs:
        if name in wrong:
            out[name] = (HandOutAction.AS_IS, "saved" if wrong[name] == "saved-graph-memory" else "returned")
        elif name in returned:
            out[name] = (HandOutAction.AS_IS, "returned")
    return out


def _rotates(trace: TraceReport, region: Region) -> bool:
    """Whether the region's returned tensors take turns in its instances: the runner's decision (`rotates`), read
    from the forward's hand-out statistics, for a region whose plan is known."""
    stats = trace.hand_out_stats
    return region.plan is not None and rotates(region.name, region.plan, stats.rotation, stats.rotation_stopped)


def region_memory(trace: TraceReport, region: Region) -> list[Entry]:
    """The region's memory plan, line by line: inputs by role, write-backs, what leaves and how, runner stats."""
    entries: list[Entry] = []
    roles = input_roles(trace, region)
    reasons = {i.name: i.reason for i in region.plan.inputs} if region.plan is not None else _STOCK_INPUTS
    for role in INPUT_ROLES:
        groups: dict[str, list[str]] = {}
        for name in region.inputs:
            if roles.get(name) == role:
                groups.setdefault(reasons.get(name, reasons.get(role, "")), []).append(name)
        for k, (reason, names) in enumerate(groups.items()):
            if role == "static" and region.stats.address_keys and k == 0:  # NOTE: the region's count, said once
                keyed = f"keyed by address: {plural(region.stats.address_keys, 'address', 'addresses')}"
                reason = f"{reason}; {keyed}" if reason else keyed
            entries.append(Entry(ROLE_LABELS[role], tuple(names), reason))
    if region.plan is not None and region.plan.write_back:
        # NOTE: an input read in place is the caller's own tensor: the graph updates it; a copied one is copied back
        where_it_lies = tuple(n for n in region.plan.write_back if roles.get(n) == "static")
        copied = tuple(n for n in region.plan.write_back if n not in where_it_lies)
        if where_it_lies:
            entries.append(Entry("updated in place", where_it_lies, _UPDATED_WHERE_IT_LIES))
        if copied:
            entries.append(Entry("written back", copied, _WRITE_BACK))
    by_action: dict[tuple[HandOutAction, str], list[str]] = {}
    for name, (action, fate) in output_actions(trace, region).items():
        by_action.setdefault((action, fate), []).append(name)
    flagged = {d.value for d in trace.defects if d.rule in _GRAPH_MEMORY_RULES}
    for (action, fate), names in by_action.items():
        if trace.hand_out is not None:
            label, why = action.label, action.meaning_for(trace.hand_out_stats.rotation)
        elif fate == "saved":
            label, why = "saved as-is", _STOCK_SAVED
        else:
            label, why = "returned as-is", _STOCK_RETURNED
        entries.append(Entry(label, tuple(names), why, any(n in flagged for n in names)))
    views = [o for o in region.plan.outputs if o.view_of] if region.plan is not None else []
    for o in views:
        entries.append(Entry("view of an input", (o.name,), f"handed out as that view of the caller's {o.view_of}"))
    stats = region.stats
    if stats.instances > 1:
        held = ("returned tensors the caller kept (rotation)" if _rotates(trace, region) else
                "tensors saved for a backward not run yet, gradients not reset")
        entries.append(Entry("instances", (), f"{stats.instances} graph instances (a call came while what the "
                                              f"previous one handed out was held: {held})"))
    if stats.demoted:
        entries.append(Entry("demoted", (), "; ".join(map(str, stats.demoted))))
    if stats.rebound:
        entries.append(Entry("rebound", (), "; ".join(map(str, stats.rebound)), flagged=True))
    # NOTE: what the last replay copied besides the inputs planned as "copied in" (listed once, above): inputs read in
    # place where a graph wrote them, which lay elsewhere that time
    elsewhere = tuple(n for n in stats.copied if roles.get(n) != "copied")
    if elsewhere and stats.replays:
        entries.append(Entry("copied at the last replay", elsewhere, "planned to be read in place, they lay in no "
                                                                     "graph's memory and were no parameter or module "
                                                                     "buffer that time"))
    if stats.eager_reason:
        entries.append(Entry("without a graph", (), stats.eager_reason, flagged=True))
    return entries


def hand_outs(trace: TraceReport) -> tuple[Outside, ...]:
    """The trace's hand-out calls (`thunder_nb_hand_out`): not islands, drawn small."""
    return tuple(i for i in trace.outside if i.reason == "hand-out")


def hand_out_actions(trace: TraceReport) -> dict[str, HandOutAction]:
    """What the trace's hand-out does with each tensor that may lie in graph memory: name -> `HandOutAction` (ROTATE
    as `output_actions` says); empty without a hand-out."""
    plan = trace.hand_out
    if plan is None:
        return {}
    rotated = {name for r in trace.regions for name, (action, _) in output_actions(trace, r).items()
               if action is HandOutAction.ROTATE}
    return {n: HandOutAction.ROTATE if n in rotated else a for n in plan.graph_memory
            if (a := plan.action(n)) is not None}


def hand_out_line(trace: TraceReport) -> str | None:
    """One line on the trace's hand-out: what it checks and what it did so far; None without one."""
    plan, stats = trace.hand_out, trace.hand_out_stats
    if plan is None:
        return None
    actions = hand_out_actions(trace)
    copy = [n for n, a in actions.items() if a in (HandOutAction.COPY, HandOutAction.AS_IS)]
    rotate = [n for n, a in actions.items() if a is HandOutAction.ROTATE]
    guard = [n for n, a in actions.items() if a is HandOutAction.GUARD]
    lend = [n for n, a in actions.items() if a is HandOutAction.LEND]
    parts = []
    if rotate:
        parts.append("hands out where they lie (rotation) " + ", ".join(rotate))
    if copy:
        parts.append(("copies out " if plan.copy_outputs else "returns as-is ") + ", ".join(copy))
    if guard:
        parts.append("guards " + ", ".join(guard))
    if lend:
        parts.append("lends " + ", ".join(lend))
    what = "; ".join(parts) or "nothing in graph memory"
    lent = f", {stats.lent} lent" if lend or stats.lent else ""
    if stats.lending_stopped:
        lent += "; lending stopped: a lent gradient was still held at the next backward, copied out since"
    if stats.rotated:
        lent += f", {stats.rotated} rotated (left in graph memory while instances take turns)"
    if stats.rotation_stopped:
        lent += (f"; rotation stopped for {', '.join(stats.rotation_stopped)}: the caller kept the results of every "
                 "instance, copied out since")
    done = (f"{plural(stats.calls, 'call')}: {stats.copied} copied out, {stats.guarded} guarded{lent}"
            if stats.calls else "not called yet")
    return f"{what} ({done})"


#: Short words for the diagram's input nodes (the default, "copied", goes unsaid).
ROLE_SHORT = {"static": "in place", "copied": "", "number": "Python number"}
#: Short words for the diagram's output nodes (`HandOutAction.short`).
ACTION_SHORT = {a.value: a.short for a in HandOutAction}


def inputs_summary(trace: TraceReport, region: Region) -> str:
    """``in 5: 3 copied, 2 in place (1 address)``; ``in 5`` when the plan is unknown."""
    head = f"in {len(region.inputs)}"
    if not known(trace, region) or not region.inputs:
        return head
    counts = {role: 0 for role in INPUT_ROLES}
    for role in input_roles(trace, region).values():
        counts[role] = counts.get(role, 0) + 1
    words = {"static": "in place", "copied": "copied", "number": "number"}
    parts = []
    for role, n in counts.items():
        if not n:
            continue
        part = f"{n} {words.get(role, role)}"
        if role == "static" and region.stats.address_keys:
            part += f" ({plural(region.stats.address_keys, 'address', 'addresses')})"
        parts.append(part)
    return f"{head}: {', '.join(parts)}"


def outputs_summary(trace: TraceReport, region: Region) -> str:
    """``out 3: 1 copied out, 2 guarded``; ``out 3`` when nothing leaves the trace or the plan is unknown."""
    head = f"out {len(region.outputs)}"
    if not known(trace, region):
        return head
    counts: dict[str, int] = {}
    for action, fate in output_actions(trace, region).values():
        word = (ACTION_SHORT[action] if action is not HandOutAction.AS_IS
                else ("saved as-is" if fate == "saved" else "returned as-is"))
        counts[word] = counts.get(word, 0) + 1
    return f"{head}: {', '.join(f'{n} {w}' for w, n in counts.items())}" if counts else head
