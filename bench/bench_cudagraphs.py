"""Time thunder-nb's FixedCUDAGraphTransform against its peers on a GPU, and print one table.

    python bench/bench_cudagraphs.py [--calls 200] [--out bench/results/DATE-h200.md]

For each program and configuration, in a process of its own: after a warm-up (0.5 s of calls on
one input), median microseconds per call (a fresh random input on every call, synchronised around
each call), CUDA graphs captured after all calls, and the peak memory the calls allocated beyond
their inputs. A configuration that fails is a row saying how it failed. Then tables of configurations
taking turns in one process, for a fair comparison: the island program's, and thunder's transform
against the fixed one (plain and logging loss.item()) on each training step.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import platform
import re
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

import programs  # noqa: E402


@dataclass
class Row:
    program: str
    config: str
    median_us: float | None = None
    graphs: str = ""
    peak_mib: float | None = None
    matches: str = ""
    note: str = ""
    first_s: float | None = None  # the first call: tracing, compiling (inductor where asked) and capture


def _inductor_graphs() -> int | None:
    try:
        from torch._inductor import cudagraph_trees

        mgr = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
        if mgr is None:
            return 0
        m = re.search(r"count\((\d+)\)", repr(mgr.graph_counter))  # repr does not advance the counter
        return int(m.group(1)) if m else None
    except Exception:
        return None


#: thunder-nb's recommended configuration for speed: inductor's fused kernels inside the fixed transform's regions
FUSED = "thunder-nb Fixed + torchcompile"
NO_COPY = "thunder-nb Fixed, copy_outputs=False"
COPY = "thunder-nb Fixed, rotation=0"  # NOTE: every returned output copied out of the graph, no second instance
SLOW_PROLOGUE = "thunder-nb Fixed, fast_prologue=False"  # NOTE: thunder's own module lookups: what thunder_nb.cudagraph.prologue saves
SPLIT_AUTOGRAD = "thunder-nb Fixed, split_autograd=True"  # NOTE: thunder.jit's two autograd Functions: what thunder_nb.jit's one saves
COMPILED = 'torch.compile(mode="reduce-overhead")'


def configs(fn):
    """Yield (name, factory) where factory() -> (callable, graphs_counter)."""
    import thunder
    from thunder.transforms.cudagraph import CUDAGraphTransform

    if isinstance(fn, TrainingStep):
        # NOTE: the compiled part is the forward and loss; backward runs through autograd as in a training loop
        inner = fn.case.step

        def wrap(make):
            def factory():
                f, graphs = make(inner)
                return TrainingStep(fn.case, f), graphs
            return factory

        def plain(step):
            return step, lambda: "-"

        def jit_plain(step):
            return thunder.jit(step), lambda: "-"

        def stock(step):
            t = CUDAGraphTransform()
            return thunder.jit(step, transforms=[t]), lambda: str(len(t.cuda_graph_runner.cuda_graph_cache))

        def compiled_t(step):
            torch._dynamo.reset()
            before = _inductor_graphs() or 0
            return torch.compile(step, mode="reduce-overhead"), lambda: str((_inductor_graphs() or 0) - before)

        yield "eager PyTorch", wrap(plain)
        yield "thunder (no graphs)", wrap(jit_plain)
        yield "thunder CUDAGraphTransform", wrap(stock)
        yield "thunder-nb FixedCUDAGraphTransform", wrap(_nb)
        yield SLOW_PROLOGUE, wrap(functools.partial(_nb, fast_prologue=False))
        yield SPLIT_AUTOGRAD, wrap(functools.partial(_nb, split_autograd=True))
        yield FUSED, wrap(functools.partial(_nb, executors=["torchcompile"]))
        yield COMPILED, wrap(compiled_t)
        return

    def eager():
        return fn, lambda: "-"

    def thunder_plain():
        return thunder.jit(fn), lambda: "-"

    def thunder_stock():
        t = CUDAGraphTransform()
        return thunder.jit(fn, transforms=[t]), lambda: str(len(t.cuda_graph_runner.cuda_graph_cache))

    def compiled():
        torch._dynamo.reset()
        before = _inductor_graphs() or 0
        c = torch.compile(fn, mode="reduce-overhead")

        def graphs():
            n = _inductor_graphs()
            return "?" if n is None else str(n - before)

        return c, graphs

    yield "eager PyTorch", eager
    yield "thunder (no graphs)", thunder_plain
    yield "thunder CUDAGraphTransform", thunder_stock
    yield "thunder-nb FixedCUDAGraphTransform", _fixed(fn)
    yield FUSED, _fixed(fn, executors=["torchcompile"])
    yield COMPILED, compiled


def _same(a, b) -> bool:
    from thunder_nb.notebook.values import compare_values

    # NOTE: looser than assert_close's float32 defaults: graphs, fusions and eager may order sums differently
    return compare_values(a, b, rtol=1e-4, atol=1e-5).matches


def warm_up(f, args, seconds: float = 0.5, at_least: int = 20) -> None:
    """Call ``f(*args)`` for ``seconds`` (and ``at_least`` times) so clocks and caches settle.

    One input only: a configuration that captures a graph per new value captures nothing here.
    """
    end = time.perf_counter() + seconds
    n = 0
    while n < at_least or time.perf_counter() < end:
        f(*args)
        n += 1
    torch.cuda.synchronize()


def measure(program: str, fn, make_inputs, calls: int, cfg: str, factory) -> Row:
    row = Row(program, cfg)
    inputs = [make_inputs(i) for i in range(calls)]
    torch.cuda.synchronize()
    try:
        f, graphs = factory()
        ref = fn(*inputs[0])
        t0 = time.perf_counter()
        first = f(*inputs[0])
        torch.cuda.synchronize()
        row.first_s = time.perf_counter() - t0
        row.matches = "yes" if _same(first, ref) else "NO"
        del first
        warm_up(f, inputs[0])
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for args in inputs:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = f(*args)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            del out
        row.median_us = statistics.median(times) * 1e6
        row.peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
        row.graphs = graphs()
    except Exception as e:  # a failing configuration is a finding, not a crash
        from thunder_nb.diagnosis.failures import error_line

        row.note = f"fails: {error_line(e)[:120]}"
        traceback.print_exc(limit=2, file=sys.stderr)
        torch.cuda.synchronize()
    return row


class TrainingStep:
    """``f(idx, targets)`` of a model's training step as one call: forward, loss, backward, grads reset."""

    def __init__(self, case, f=None):
        self.case, self.f = case, f or case.step
        self.__name__ = case.step.__name__

    def __call__(self, idx, targets):
        out = self.f(idx, targets)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()
        for p in self.case.model.parameters():
            p.grad = None  # NOTE: as optimizer.zero_grad() does by default
        return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in out) if isinstance(out, tuple) else loss.detach()


DEEP = "nanoGPT training step, 6 layers"


def training_programs(device: str):
    """nanoGPT and llama2 (thunder's bundled test models: 2 layers, width 128, batch 8x64), plain and logging
    loss.item(); and nanoGPT at 6 layers (`DEEP`), plain."""
    from thunder_nb.testing.models import model_case

    for name in ("nanoGPT", "llama2"):
        for log in (False, True):
            label = f"{name} training step" + (", loss.item() logged" if log else "")
            case = model_case(name, device, log_loss=log)
            yield label, TrainingStep(case), case.make_batch
    # NOTE: notebook 05's depth (76 parameters): thunder-nb's host work grows per parameter faster than torch.compile's
    case = model_case("nanoGPT", device, layers=6)
    yield DEEP, TrainingStep(case), case.make_batch


def benchmarks(device: str):
    n = 4096

    def vec(i):
        return (torch.randn(n, device=device),)

    def mm(i):
        g = torch.Generator(device=device).manual_seed(1)
        w = torch.randn(2048, 2048, device=device, generator=g) / 2048**0.5
        return (torch.randn(2048, 2048, device=device), w)

    def mat(i):
        g = torch.Generator(device=device).manual_seed(1)
        return (torch.randn(256, 256, device=device), torch.randn(256, 256, device=device, generator=g) / 16)

    yield "island: 16 steps, item, 16 steps", programs.island, vec
    yield "chain: 32 steps, no island", programs.chain, vec
    yield from training_programs(device)
    yield "norm chain: x / (x.norm().item() + 1)", programs.norm_chain, vec
    yield "full_like(x, x.sum().item())", programs.fill_from_item, vec
    yield "h / (h.mean().item() + 1e-3) between matmuls", programs.normalise_between_matmuls, mat
    yield "seed: x.sum().item()", programs.seed, vec
    yield "matmul chain: 12 x 2048^2", programs.matmul_chain, mm


PROGRAM_FILTER: str | None = None  # --programs: a regular expression the program name must match
CONFIG_FILTER: str | None = None  # --configs: a regular expression the configuration name must match
NO_INTERLEAVED = False
ONLY_INTERLEAVED = False  # --only-interleaved


def _cases():
    """Every (program, function, input maker, configuration name, factory), in table order."""
    import thunder
    from thunder.transforms.cudagraph import CUDAGraphTransform

    for program, fn, make in benchmarks("cuda"):
        if PROGRAM_FILTER and not re.search(PROGRAM_FILTER, program):
            continue
        for cfg, factory in configs(fn):
            if not CONFIG_FILTER or re.search(CONFIG_FILTER, cfg):
                yield program, fn, make, cfg, factory
        if fn is programs.chain and (not CONFIG_FILTER or re.search(CONFIG_FILTER, NO_COPY)):
            # NOTE: thunder's semantics (the next call overwrites what the caller holds): what the safe copy costs
            yield program, fn, make, NO_COPY, _fixed(fn, copy_outputs=False)
        if fn is programs.chain and (not CONFIG_FILTER or re.search(CONFIG_FILTER, COPY)):
            # NOTE: #31.4: rotation (the default) against copying every output out, on the program rotation is for
            yield program, fn, make, COPY, _fixed(fn, rotation=0)
        if fn is programs.island:

            def handwritten():
                t = CUDAGraphTransform()
                jfn = thunder.jit(programs.island_device_scalar, transforms=[t])
                return jfn, lambda: str(len(t.cuda_graph_runner.cuda_graph_cache))

            extras = (
                ("hand-written device scalar, thunder CUDAGraphTransform", programs.island_device_scalar, handwritten),
                (NO_COPY, programs.island, _fixed(programs.island, copy_outputs=False)),
                ("thunder-nb Fixed, scalar_handoff=False", programs.island, _fixed(programs.island, scalar_handoff=False)),
            )
            for cfg, f, factory in extras:
                if not CONFIG_FILTER or re.search(CONFIG_FILTER, cfg):
                    yield program, f, make, cfg, factory


def _nb(fn, **options):
    """``thunder_nb.jit(fn, **options)`` capturing, and its graph counter."""
    import thunder_nb

    jfn = thunder_nb.jit(fn, capture=True, **options)
    return jfn, lambda: str(jfn._lc_transforms[0].graphs_captured)


def _fixed(fn, **options):
    """`_nb` on ``fn``: a factory of `configs`' kind."""
    return functools.partial(_nb, fn, **options)


def run_one(index: int, calls: int) -> Row:
    """Measure case ``index`` in this process."""
    program, fn, make, cfg, factory = list(_cases())[index]
    few = "matmul" in program or "training" in program
    return measure(program, fn, make, calls if not few else min(calls, 50), cfg, factory)


#: Configurations timed in turns within one process: (title, calls, [(program, configuration)], reference).
INTERLEAVED = (
    ("Island program", 1000, [("island: 16 steps, item, 16 steps", cfg) for cfg in (
        "hand-written device scalar, thunder CUDAGraphTransform",  # NOTE: before torch.compile, as above
        COMPILED,  # NOTE: before the fused one: it resets dynamo
        "eager PyTorch",
        "thunder-nb FixedCUDAGraphTransform",
        NO_COPY,
        FUSED,
    )], ("island: 16 steps, item, 16 steps", "hand-written device scalar, thunder CUDAGraphTransform")),
    ("Chain", 1000, [("chain: 32 steps, no island", cfg) for cfg in (
        "thunder CUDAGraphTransform",  # NOTE: before torch.compile, as in the training steps' groups
        COMPILED,  # NOTE: before the fused one: it resets dynamo
        "thunder-nb FixedCUDAGraphTransform",
        COPY,
        NO_COPY,
        FUSED,
    )], ("chain: 32 steps, no island", "thunder CUDAGraphTransform")),
) + tuple(
    (f"{model} training step", 200, [
        # NOTE: thunder's transform before torch.compile, the order that ran on the H200: with torch.compile
        # first, a backward hit an illegal memory access in the warm-up (2026-11-30); thunder's transform's
        # cuBLAS-workspace hazard after a reduce-overhead capture is the suspect (bench/repro_replay_after_compile.py)
        (f"{model} training step", "thunder CUDAGraphTransform"),
        (f"{model} training step", COMPILED),  # NOTE: before the fused ones: it resets dynamo
        (f"{model} training step", "thunder-nb FixedCUDAGraphTransform"),
        (f"{model} training step, loss.item() logged", "thunder-nb FixedCUDAGraphTransform"),
        (f"{model} training step", SPLIT_AUTOGRAD),
        (f"{model} training step", FUSED),
        (f"{model} training step, loss.item() logged", FUSED),
        # NOTE: the baselines too, so that one group answers "never slower than thunder without graphs"
        (f"{model} training step", "eager PyTorch"),
        (f"{model} training step", "thunder (no graphs)"),
    ], (f"{model} training step", "thunder CUDAGraphTransform"))
    for model in ("nanoGPT", "llama2")
) + tuple(
    # NOTE: #13's "never more than 1.1x slower than thunder without graphs", asked where it is closest: programs of
    # a few small ops around an island, where the host's work is all there is; rows of separate processes differed by
    # 1.8x between runs on the same host (2026-12-01), so only configurations taking turns answer it
    (title, 1000, [(program, cfg) for cfg in (
        COMPILED,  # NOTE: before the fused one: it resets dynamo
        "eager PyTorch",
        "thunder (no graphs)",
        "thunder-nb FixedCUDAGraphTransform",
        FUSED,
    )], (program, "thunder (no graphs)"))
    for title, program in (
        ("norm chain", "norm chain: x / (x.norm().item() + 1)"),
        ("full_like", "full_like(x, x.sum().item())"),
        ("Normalising between matmuls", "h / (h.mean().item() + 1e-3) between matmuls"),
    )
) + (
    # NOTE: #14 at notebook 05's depth, taking turns (the notebook times one configuration after the other)
    (DEEP, 200, [(DEEP, cfg) for cfg in (COMPILED, "thunder-nb FixedCUDAGraphTransform", FUSED)], (DEEP, COMPILED)),
)


def run_interleaved(group: int) -> dict:
    """Time one group of `INTERLEAVED` in this one process, the configurations taking turns call by call.

    Separate processes differ by 10-20% on the same machine, and so do stretches of one process;
    calling each configuration in turn on the same input (the order rotating from input to input)
    exposes all of them to the same drift, which is the fair way to compare two of them.
    """
    title, calls, wanted, ref = INTERLEAVED[group]
    by_key = {(c[0], c[3]): c for c in _cases()}
    cases = [by_key[k] for k in dict.fromkeys(wanted) if k in by_key]  # NOTE: a configuration listed twice is one
    make = cases[0][2]
    few = "training" in title
    built = []
    first, matches = {}, {}
    for program, fn, _, cfg, factory in cases:
        f, graphs = factory()
        x = make(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = f(*x)
        torch.cuda.synchronize()
        first[(program, cfg)] = time.perf_counter() - t0
        matches[(program, cfg)] = "yes" if _same(out, fn(*x)) else "NO"
        del out
        built.append(((program, cfg), f, graphs))
    for _, f, _ in built:
        warm_up(f, make(0))
    wall = {key: [] for key, _, _ in built}
    host = {key: [] for key, _, _ in built}
    for i in range(calls):
        args = make(i % 50 if few else i)
        k = i % len(built)
        for key, f, _ in built[k:] + built[:k]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = f(*args)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            wall[key].append(t2 - t0)
            host[key].append(t1 - t0)
            del out
    results = []
    for key, _, graphs in built:
        q = statistics.quantiles(wall[key], n=4)
        ratio = statistics.median(a / b for a, b in zip(wall[key], wall[ref])) if ref in wall else None
        # NOTE: #14's question asked directly, input by input: this call's time over torch.compile's on the same program
        peer = (key[0], COMPILED)
        vs_compile = statistics.median(a / b for a, b in zip(wall[key], wall[peer])) if peer in wall else None
        results.append({
            "program": key[0], "config": key[1], "median_us": statistics.median(wall[key]) * 1e6,
            "iqr_us": [q[0] * 1e6, q[2] * 1e6], "cpu_us": statistics.median(host[key]) * 1e6, "ratio": ratio,
            "vs_compile": vs_compile, "graphs": graphs(), "first_s": first[key], "matches": matches[key],
        })
    return {"title": title, "calls": calls, "ref": " / ".join(ref), "results": results}


def interleaved_table(group: dict) -> str:
    peers = any(r.get("vs_compile") is not None for r in group["results"])
    lines = [
        "",
        f"## {group['title']}: one process, configurations taking turns on each of {group['calls']} inputs",
        "",
        "Median and quartiles of the time per call (synchronised), median time until the call returns "
        "(before the synchronise: the host's share), and the median over inputs of this call's time "
        f"over the time of {group['ref']} on the same input; first call: its seconds (tracing, compiling, capture), "
        "and whether its result matches eager PyTorch's." + (
            " vs torch.compile: the median over inputs of this call's time over torch.compile(mode=\"reduce-overhead\")'s "
            "on the same program and input." if peers else ""),
        "",
        "| program | configuration | median µs/call | quartiles µs | until return µs | vs reference "
        + ("| vs torch.compile " if peers else "") + "| graphs | first call s | matches eager |",
        "|---|---|---:|---|---:|---:|" + ("---:|" if peers else "") + "---:|---:|---|",
    ]
    for r in group["results"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        lo, hi = r["iqr_us"]
        first = f"{r['first_s']:.1f}" if r.get("first_s") is not None else "-"
        peer = (f"| {r['vs_compile']:.3f}x " if r.get("vs_compile") is not None else "| - ") if peers else ""
        lines.append(
            f"| {r['program']} | {r['config']} | {r['median_us']:.1f} | {lo:.0f}-{hi:.0f} | {r['cpu_us']:.1f} "
            f"| {ratio} {peer}| {r['graphs']} | {first} | {r.get('matches', '-')} |"
        )
    return "\n".join(lines) + "\n"


def run(calls: int, out: Path | None = None) -> tuple[list[Row], str]:
    """Measure every case, each in a fresh process (a failed capture can leave CUDA state unusable).

    With ``out``, the table is rewritten after every row, so a run cut short keeps what it measured.
    """
    import json
    import subprocess

    rows = []
    n = 0 if ONLY_INTERLEAVED else len(list(_cases()))
    for i in range(n):
        proc = subprocess.run(
            [sys.executable, __file__, "--one", str(i), "--calls", str(calls)]
            + (["--programs", PROGRAM_FILTER] if PROGRAM_FILTER else [])
            + (["--configs", CONFIG_FILTER] if CONFIG_FILTER else []),
            capture_output=True, text=True, timeout=600,
        )
        sys.stderr.write(proc.stderr[-2000:])
        last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
        try:
            rows.append(Row(**json.loads(last[0])))
        except (IndexError, ValueError, TypeError):
            program, _, _, cfg, _ = list(_cases())[i]
            rows.append(Row(program, cfg, note=f"fails: the process exited with {proc.returncode}"))
        r = rows[-1]
        print(f"  {r.program} / {r.config}: {r.median_us} us {r.note}", file=sys.stderr, flush=True)
        if out is not None:
            out.write_text(table(rows, calls))
    text = table(rows, calls) if rows else ""
    if NO_INTERLEAVED:
        return rows, text
    for g, (title, _, wanted, _) in enumerate(INTERLEAVED):
        if PROGRAM_FILTER and not any(re.search(PROGRAM_FILTER, program) for program, _ in wanted):
            continue
        proc = subprocess.run(
            [sys.executable, __file__, "--interleaved", str(g)], capture_output=True, text=True, timeout=900
        )
        sys.stderr.write(proc.stderr[-2000:])
        try:
            text += interleaved_table(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (IndexError, ValueError, KeyError):
            text += f"\n## {title}, interleaved: failed (the process exited with {proc.returncode})\n"
        if out is not None:
            out.write_text(text)
    return rows, text


def table(rows: list[Row], calls: int) -> str:
    dev = torch.cuda.get_device_name()
    lines = [
        f"# CUDA-graph benchmark, {datetime.date.today().isoformat()}",
        "",
        f"Machine: {dev}, torch {torch.__version__}, Python {platform.python_version()}. "
        f"Each row in its own process: a 0.5 s warm-up on one input, then {calls} calls (50 for the matmul chain) "
        "with a fresh random input on every call; "
        "median time per call with a device synchronise around each call; graphs captured after all calls; "
        "peak memory allocated during the calls beyond the inputs; first call: its seconds (tracing, compiling "
        "with inductor where the configuration fuses, capture), the compile time a user waits once. "
        "Command: `python bench/bench_cudagraphs.py`.",
        "",
        "| program | configuration | median µs/call | graphs | peak MiB | matches eager | first call s | note |",
        "|---|---|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        us = f"{r.median_us:.1f}" if r.median_us is not None else "-"
        mib = f"{r.peak_mib:.1f}" if r.peak_mib is not None else "-"
        first = f"{r.first_s:.1f}" if r.first_s is not None else "-"
        lines.append(f"| {r.program} | {r.config} | {us} | {r.graphs or '-'} | {mib} | {r.matches or '-'} | {first} "
                     f"| {r.note} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    ap.add_argument("--programs", metavar="REGEX", help="only the programs whose name matches")
    ap.add_argument("--configs", metavar="REGEX", help="only the configurations whose name matches")
    ap.add_argument("--no-interleaved", action="store_true", help="skip the tables of configurations taking turns")
    ap.add_argument("--only-interleaved", action="store_true",
                    help="only the tables of configurations taking turns (of the programs --programs selects)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: measure one case, print JSON
    ap.add_argument("--interleaved", type=int, help=argparse.SUPPRESS)  # internal: time group N, print JSON
    a = ap.parse_args()
    global PROGRAM_FILTER, CONFIG_FILTER, NO_INTERLEAVED, ONLY_INTERLEAVED
    PROGRAM_FILTER, CONFIG_FILTER, NO_INTERLEAVED = a.programs, a.configs, a.no_interleaved
    ONLY_INTERLEAVED = a.only_interleaved
    if not torch.cuda.is_available():
        print("bench_cudagraphs: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    if a.one is not None:
        import dataclasses
        import json

        print(json.dumps(dataclasses.asdict(run_one(a.one, a.calls))))
        return 0
    if a.interleaved is not None:
        import json

        print(json.dumps(run_interleaved(a.interleaved)))
        return 0
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
    rows, text = run(a.calls, a.out)
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
