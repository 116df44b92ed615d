"""Time analysis and rendering of real thunder traces of about 100, 1,000 and 5,000 bound symbols.

Each trace comes from ``thunder.jit`` of a chain of elementwise ops with a few ``.item()`` host syncs
in between, fused by a `CUDAGraphTransform` that keeps host syncs out of regions (so the trace has
several regions and islands). Capture fails without a GPU, but the traces are kept, which is all
this needs. Prints a markdown table; ``--out FILE`` also writes it.

    .venv/bin/python bench/bench_render.py --out bench/results/DATE-render-cpu.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

warnings.filterwarnings("ignore", message=".*transformer_engine.*")

import torch  # noqa: E402
import thunder  # noqa: E402
from thunder.transforms.cudagraph import CUDAGraphTransform  # noqa: E402

from thunder_nb import render
from thunder_nb.diagnosis import analysis  # noqa: E402

#: (name, elementwise ops, host syncs): each op is one bound symbol plus about one ``del``
CASES = (("~100", 48, 2), ("~1,000", 500, 4), ("~5,000", 2500, 8))
REPEAT = 3


class SplitAtHostSync(CUDAGraphTransform):
    """The stock transform, but host-synchronising ops stay outside regions (islands)."""

    def can_fuse(self, bsym: Any) -> bool:
        return super().can_fuse(bsym) and analysis.classify_bsym(bsym) is None


def chain(n_ops: int, n_syncs: int) -> Callable:
    """Return a function of ``n_ops`` elementwise ops with ``n_syncs`` ``.item()`` calls spread between them."""
    blocks = n_ops // 4
    every = max(blocks // (n_syncs + 1), 1)

    def fn(x):
        for i in range(blocks):
            x = torch.cos(torch.sin(x * 1.001) + 0.5)
            if i % every == every - 1 and i < blocks - 1:
                x = x + x.sum().item()
        return x

    return fn


def build_trace(n_ops: int, n_syncs: int) -> tuple[Any, float]:
    """Trace ``chain(n_ops, n_syncs)`` with thunder; return its last forward trace and the time it took."""
    start = time.perf_counter()
    jfn = thunder.jit(chain(n_ops, n_syncs), transforms=[SplitAtHostSync()])
    try:
        jfn(torch.randn(8, 8))
    except Exception:  # NOTE: no GPU: capture fails, the traces stay
        pass
    return thunder.last_traces(jfn)[-1], time.perf_counter() - start


def best(fn: Callable[[], Any], repeat: int = REPEAT) -> tuple[float, Any]:
    """Return the median wall time of ``repeat`` calls and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(name: str, n_ops: int, n_syncs: int) -> dict[str, Any]:
    trace, build_s = build_trace(n_ops, n_syncs)
    analyze_s, rep = best(lambda: analysis.analyze_trace(trace))
    dot_s, graph = best(lambda: render.region_diagram(rep))
    svg_s, image = best(lambda: render.svg(graph))
    life_s, _ = best(lambda: render.lifetime_svg(rep))
    text_s, _ = best(lambda: render.lifetime_text(rep))
    full_s, _ = best(lambda: render.svg(render.region_diagram(rep, collapse=False)), repeat=1)
    return {
        "case": name,
        "bound symbols": len(rep.ops) + sum(len(r.ops) for r in rep.regions),
        "regions": len(rep.regions),
        "islands": len(rep.user_islands),
        "values": len(rep.values),
        "diagram": "full" if "subgraph cluster_" in graph.source else "collapsed",
        "trace (jit)": build_s,
        "analyze_trace": analyze_s,
        "diagram DOT": dot_s,
        "dot SVG": svg_s,
        "lifetime SVG": life_s,
        "lifetime text": text_s,
        "render total": dot_s + svg_s + life_s,
        "full diagram (DOT+SVG)": full_s,
        "svg bytes": len(image or ""),
        "default diagram px": "{:.0f} × {:.0f}".format(*render.backend.svg_size(image or "")),
        "lifetime SVG px wide": render.lifetimes.SVG_WIDTH,
    }


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f} s"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(rows: list[dict[str, Any]]) -> str:
    heads = list(rows[0])
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(v) for v in row.values()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--machine", default=f"{platform.machine()}, {os.cpu_count()} CPU cores",
                        help="machine description for the header")
    args = parser.parse_args()
    rows = [measure(*case) for case in CASES]
    header = (
        f"# thunder-nb render benchmark\n\n"
        f"- date: {time.strftime('%Y-%m-%d')}\n- machine: {args.machine}\n"
        f"- thunder {thunder.__version__}, torch {torch.__version__}, Python {platform.python_version()}\n"
        f"- times: median of {REPEAT} runs (full diagram: one run); the default diagram collapses regions "
        f"above {render.COLLAPSE_THRESHOLD} ops; render total = diagram DOT + dot SVG + lifetime SVG\n"
        f"- trace: `thunder.jit` of a chain of elementwise ops with `.item()` islands, fused by a "
        f"CUDAGraphTransform that keeps host syncs out of regions; bound symbols = top-level statements plus "
        f"region statements (dels included); islands = user islands (host syncs)\n\n"
    )
    text = header + table(rows) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
