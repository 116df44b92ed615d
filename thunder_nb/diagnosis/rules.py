"""The words the diagnosis judges with: the checker's rules and their severities, and why an op runs outside every
region (an island, or not)."""

from __future__ import annotations

__all__ = ["RULES", "ERROR_RULES", "CRASH_RULES", "WRONG_RESULT_RULES", "ISLAND_REASONS", "OUTSIDE_REASONS",
           "outside_name"]

#: Every checker rule, with the one-line description shown in legends and help.
RULES: dict[str, str] = {
    "use-after-del": "a name is used after it was deleted",
    "region-deletes-output": "a region deletes one of its own outputs",
    "region-deletes-outside-value": "a region deletes a value produced outside it",
    "dead-region-input": "a region input used by nothing but a del (copied on every replay)",
    "host-sync-in-region": "a data-dependent or host-synchronising op inside a region (capture fails)",
    "cpu-op-in-region": "a device transfer or CPU op inside a region (runs once at capture, never on replay)",
    "host-data-in-region": "a tensor made from host data inside a region (a list index, torch.tensor(list)): "
    "capture fails",
    "capture-dependent-in-region": "dropout attention's seed and offset made or read inside a region: host memory "
    "outside a graph, device memory inside one, so the other side reads the wrong kind (the process dies)",
    "region-updates-input": "a region updates an input in place that the runner copies (the caller never sees it)",
    "scalar-region-input": "a Python number region input (each new value captures a new graph)",
    "never-freed": "a top-level intermediate that is never deleted",
    "double-del": "a name deleted twice",
    "returned-graph-memory": "a returned tensor lives in a graph's memory (the next replay overwrites it)",
    "saved-graph-memory": "a tensor saved for the backward lives in a graph's memory (a second forward overwrites it)",
    "static-input-rebound": "a static region input is an argument, or received another tensor (copied into the "
    "captured one's memory)",
    "collective-in-region": "a collective (all_reduce, all_gather, reduce_scatter) or its wait inside a region: a "
    "graph replays it without its process group, and a rank recording again launches it alone",
    "handle-crosses-region": "a collective's handle goes into or out of a region (its wait in another region than its "
    "collective): capture refuses a wait on work launched outside it, and a replay hands out the recording's handle",
}

#: Rules whose defect makes the function crash or compute a wrong result; the others cost time or memory.
ERROR_RULES: frozenset[str] = frozenset(
    {"use-after-del", "region-deletes-output", "host-sync-in-region", "cpu-op-in-region", "region-updates-input",
     "returned-graph-memory", "saved-graph-memory", "static-input-rebound", "host-data-in-region",
     "capture-dependent-in-region", "collective-in-region", "handle-crosses-region"}
)
#: Error rules whose defect kills the process (a segmentation fault: in a notebook, the kernel and everything in it).
CRASH_RULES: frozenset[str] = frozenset({"capture-dependent-in-region"})
#: Error rules whose defect gives a wrong result without any error raised (severity "wrong result").
WRONG_RESULT_RULES: frozenset[str] = frozenset(
    {"returned-graph-memory", "saved-graph-memory", "static-input-rebound"}
)

#: Why an op is an island: it runs outside every graph because capture cannot take it. Only these are
#: islands, and only these are counted as islands (headers, diagrams, lifetimes, verdicts).
ISLAND_REASONS: dict[str, str] = {
    "host-sync": "data-dependent / host-synchronising",
    "device-transfer": "device transfer",
    "cpu-op": "op on CPU tensors in a CUDA trace",
    "host-data": "makes a tensor from host data (a list index, torch.tensor(list)): capture refuses the copy",
    "capture-dependent": "dropout attention: its seed and offset must be made and read outside graphs",
    "collective": "a collective (all_reduce, all_gather, reduce_scatter) or its wait: run outside the graphs, so that "
    "every rank launches and waits for each one itself, in the same order (a graph would replay it without its "
    "process group, and a rank recording again would launch it alone)",
}

#: What else runs at top level outside every region: never an island, drawn apart and not counted.
OUTSIDE_REASONS: dict[str, str] = {
    "hand-out": "hand-out: what leaves the trace, checked by storage (copied out, guarded or lent)",
    "bookkeeping": "trace bookkeeping (unpack, return)",
    "collection": "collection clearing (bookkeeping)",
    "unfused": "unfused op: capturable, but no region took it (a one-op stretch), so it runs eagerly",
}


def outside_name(reason: str, position: int) -> str:
    """The name of a top-level statement outside every region: ``island3``, ``hand_out5``, ``step2``, ``op4``."""
    if reason in ISLAND_REASONS:
        return f"island{position}"
    return {"hand-out": "hand_out", "unfused": "op"}.get(reason, "step") + str(position)
