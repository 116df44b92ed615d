"""thunder's dataflow ordering made to keep an in-place write after the reads of the memory it writes: one change to
``thunder.executors.data_dependent_partition`` (lightning-thunder 0.2.6), installed once per process by `install`
where `thunder_nb.internals.supported` (from `thunder_nb.internals.check_versions`).

With ``fusion_type="dataflow"``, thunder's fusion pass rebuilds a trace's order from a graph of producers and
consumers by name. A write into memory that an earlier op reads under another name (thunder's alias updates give
each version of a tensor its own) has no edge to that read, and may move before it: ``t2 = abs(s) - x1;
x1.relu_(); return t2`` returned ``abs(s) - relu(x1)`` (the CPU fuzzer's program 696; eager order under the default
``"consecutive"``). `install` makes the graph add, for each write, an edge from every earlier op that reads memory it
may share (`thunder_nb.internals.storage.storage_of`, over-approximated): the writes keep the program's order with the
reads, and the fusions merge only what that order allows.
"""

from __future__ import annotations

from typing import Any

from .patches import ProcessPatch

__all__ = ["install", "uninstall", "installed", "keep_writes_after_reads"]


def keep_writes_after_reads(graph: Any, trace: Any) -> None:
    """Add to ``graph`` (thunder's `data_dependent_partition.Graph` of ``trace``, a node per bound symbol in order) an
    edge from each op to every later in-place write into memory the op reads."""
    from .storage import storage_of

    bsyms = trace.bound_symbols
    find, writes = storage_of(bsyms)
    if not any(writes):
        return
    nodes: dict[int, Any] = {}
    for root in [graph.return_node, *graph.roots]:
        stack = [root] if root is not None else []
        while stack:
            node = stack.pop()
            if node.ID not in nodes:
                nodes[node.ID] = node
                stack.extend(node.children)
    readers: dict[str, list[int]] = {}  # NOTE: storage -> the ops that read it so far
    for i, bsym in enumerate(bsyms):
        for written in writes[i]:
            node = nodes.get(i)
            for j in readers.get(find(written), ()):
                if node is not None and j in nodes and j != i and nodes[j] not in node.parents:
                    node.parents.add(nodes[j])
                    nodes[j].children.add(node)
                    if node in graph.roots:
                        graph.roots.remove(node)
        for p in bsym.flat_proxy_args:
            if hasattr(p, "name"):
                readers.setdefault(find(p.name), []).append(i)


def _ordered_graph(graph_class: Any) -> Any:
    class Graph(graph_class):
        def __init__(self, trace: Any):
            super().__init__(trace)
            keep_writes_after_reads(self, trace)

    return Graph


def _apply() -> dict[str, Any] | None:
    from thunder.executors import data_dependent_partition as partition

    graph = getattr(partition, "Graph", None)
    if not isinstance(graph, type):
        return None
    partition.Graph = _ordered_graph(graph)
    return {"Graph": graph}


def _restore(originals: dict[str, Any]) -> None:
    from thunder.executors import data_dependent_partition as partition

    partition.Graph = originals["Graph"]


#: thunder's dataflow ordering changed as this module's docstring says, once per process
_patch = ProcessPatch(_apply, _restore)
installed, install, uninstall = _patch.installed, _patch.install, _patch.uninstall
