"""Where the host time of one training step goes: thunder's prologue and glue, the runner, replays, hand-outs, autograd.

    python bench/host_profile.py [--steps 200] [--models nanoGPT,llama2] [--log-loss] [--config SUBSTRING] [--cprofile]
    python bench/host_profile.py --emulated --skip-replay --cpu-time [...]      # on a CPU
    python bench/host_profile.py --zoo resnet18:batchnorm,litgpt-pythia-14m:decode [--emulated ...]

Runs thunder's bundled nanoGPT and llama2 training steps (`thunder_nb.testing.models`: 2 layers,
width 128, batch 8x64; forward and cross-entropy jitted, backward through autograd, gradients
reset) under plain thunder (no graphs: thunder's own per-call work, its trace running every op), thunder's
CUDAGraphTransform, thunder-nb's FixedCUDAGraphTransform (as `thunder_nb.jit` makes it:
one autograd Function per call; and with thunder.jit's default pair, ``split_autograd=True``), and the fixed
transform's trace run by thunder's own runner code (its regions' static inputs as thunder's
static mask, no hand-out: thunder's call path at its best on the same trace, unsafe, for
comparison only). Prints host microseconds per step and phase (median over ``--steps`` steps
after a warm-up). On a GPU (real capture) each case runs in a process of its own.

``--emulated`` runs on the CPU with emulated capture (`thunder_nb.testing.emulated_capture`);
``--skip-replay`` then makes replays do nothing (re-running a region would drown the host work
around it; values go stale, timing only), and ``--cpu-time`` times by the thread's CPU time with
one torch thread (steadier on a CPU shared with other work). A CPU copies memory where a GPU
launches a kernel, so copies weigh more there.

Columns: ``step`` = ``fw`` + ``bw``. Within the forward call (``fw``): ``prologue`` (thunder's input
checks), ``fw runner`` (the runner's own work per region call: ``call_cuda_graph`` minus the
replay), ``fw replay``, ``fw hand-out``, ``fw trace`` (the rest of the computation function: ops
outside regions, an island's sync) and ``fw glue`` (cache lookup, autograd connection, epilogue).
Within ``loss.backward()`` (``bw``): ``bw runner``, ``bw replay``, ``bw hand-out``, ``bw trace``
(the rest of thunder's backward function) and ``bw autograd`` (torch's engine around it,
gradient accumulation included).

``--zoo MODEL:PROTOCOL,...`` profiles the zoo's loops instead (`thunder_nb.testing.zoo`): ``batchnorm`` (a
training step, forward and backward timed, SGD's step outside and untimed) and ``decode`` (KV-cache decoding,
one token per call under ``no_grad``, after a prefill), each under plain ``thunder.jit`` (also without its sdpa
executor, which refuses the decode step on CUDA; no graphs: its
``fw trace`` and ``bw trace`` run the model's ops, the rest is thunder's own per-call work) and
``thunder_nb.jit``, the same phases. With ``--skip-replay`` the ops thunder_nb.jit runs outside its regions
still run, so its host columns compare with thunder's glue and prologue, not its trace; the optimizer's step is
then left out too (see `profile_zoo`). On a CPU, autograd's ``AccumulateGrad`` clones the conv weights' gradients
(oneDNN's weight gradients have other strides than the weights), so ``bw autograd`` there is mostly copies.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import gc
import json
import pstats
import statistics
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import thunder
import torch
from thunder.transforms.cudagraph import CUDAGraphRunner, CUDAGraphTransform

from thunder_nb.cudagraph.executors import executor_list
from thunder_nb.fix import ONE_AUTOGRAD_FUNCTION, FixedCUDAGraphTransform
from thunder_nb.testing import EmulatedGraph, emulated_capture
from thunder_nb.testing.models import model_case

warnings.filterwarnings("ignore")

COLUMNS = ("step", "fw", "prologue", "fw runner", "fw replay", "fw hand-out", "fw trace", "fw glue",
           "bw", "bw runner", "bw replay", "bw hand-out", "bw trace", "bw autograd")


class Clock:
    """Per-phase host time of the current step; ``now`` is wall time, or the thread's CPU time on a busy CPU."""

    def __init__(self, now=time.perf_counter):
        self.now = now
        self.step: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.side = "fw"  # "bw" inside loss.backward()
        self.replay = 0.0  # replay time inside the current region call

    def add(self, phase: str, seconds: float, calls: int = 0) -> None:
        self.step[phase] += seconds
        self.calls[phase] += calls

    def timed(self, phase: str, fn):
        """``fn``, its time added to ``phase``."""

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            t0 = self.now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(phase, self.now() - t0, 1)

        return wrapped


def _skip(graph) -> None:
    """A replay that does nothing (``--skip-replay``): the host work around it stays, the region's values go stale."""


def instrument(clock: Clock, runner: CUDAGraphRunner, thunder_path: bool = False) -> None:
    """Time ``runner``'s region calls (replay apart) and hand-outs; ``thunder_path``: call thunder's own runner code."""
    call = functools.partial(CUDAGraphRunner.call_cuda_graph, runner) if thunder_path else runner.call_cuda_graph
    masked: set[str] = set()
    if thunder_path:
        # NOTE: thunder's code reads an input in place when its mask says so and the caller passes the very tensor
        # it captured with; the fixed trace's static inputs (its plan) as the mask, and no hand-out (no fresh
        # aliases), give thunder's code its best case on this trace: no copies but those of real inputs
        runner.hand_out = lambda kind, actions, *tensors: list(tensors)

    def call_cuda_graph(fn_name, *args):
        if thunder_path and fn_name not in masked:
            masked.add(fn_name)
            mask = tuple(p.role == "static" for p in runner.plans[fn_name].inputs)
            runner.python_callables[fn_name] = (runner.python_callables[fn_name][0], mask)
        clock.replay = 0.0
        t0 = clock.now()
        out = call(fn_name, *args)
        dt = clock.now() - t0
        clock.add(f"{clock.side} runner", dt - clock.replay, 1)
        clock.add(f"{clock.side} replay", clock.replay)
        return out

    runner.call_cuda_graph = call_cuda_graph
    if hasattr(runner, "hand_out"):  # NOTE: before the first call: the transform binds it into the trace then
        hand_out = runner.hand_out
        runner.hand_out = lambda kind, actions, *tensors: clock.timed("fw hand-out" if kind == "forward" else "bw hand-out", hand_out)(
            kind, actions, *tensors)


def instrument_entries(clock: Clock, jfn) -> None:
    """Time the prologue, computation and backward functions of ``jfn``'s cache entries."""
    cache = thunder.compile_stats(jfn).interpreter_cache
    for i, entry in enumerate(cache):
        cache[i] = entry._replace(
            prologue_fn=clock.timed("prologue", entry.prologue_fn),
            computation_fn=clock.timed("fw computation", entry.computation_fn),
            backward_fn=clock.timed("bw computation", entry.backward_fn) if entry.backward_fn else None,
        )


def configs(emulated: bool):
    """(name, make) for thunder's transform, the fixed one (also with inductor's fusions), and the fixed trace on thunder's runner code."""

    def fixed(options=ONE_AUTOGRAD_FUNCTION):
        t = FixedCUDAGraphTransform(capture=not emulated)
        t.cuda_graph_runner.capture = True  # NOTE: the capture path, on emulated graphs on the CPU
        return t, t.cuda_graph_runner, False, options

    def fixed_split():
        return fixed({})

    def fused():
        # NOTE: the executors `thunder_nb.jit(step, executors=["torchcompile"])` uses (bench_cudagraphs' row of this
        # name): thunder-nb's island-aware inductor executor, not thunder's own torch_compile_ex
        return fixed({**ONE_AUTOGRAD_FUNCTION, "executors": executor_list(["torchcompile"])})

    def fixed_thunder_path():
        t, runner, _, options = fixed()
        return t, runner, True, options

    def stock():
        t = CUDAGraphTransform()
        return t, t.cuda_graph_runner, False, {}

    def plain():
        return None, None, False, {}

    return [
        ("thunder, no CUDA graphs", plain),  # NOTE: thunder's own per-call work; its trace runs every op
        ("thunder CUDAGraphTransform", stock),
        ("thunder-nb FixedCUDAGraphTransform", fixed),
        ("thunder-nb Fixed, split_autograd=True", fixed_split),
        ("thunder-nb Fixed + torchcompile", fused),  # NOTE: on the CPU, inductor compiles C++ (a minute or so)
        ("fixed trace, thunder's runner code", fixed_thunder_path),
    ]


def profile(name: str, make, device: str, steps: int, warmup: int, log_loss: bool, *,
            cprofile: bool = False, skip_replay: bool = False, cpu_time: bool = False, layers: int = 2):
    """Median microseconds per step and phase (and the region calls per step) of ``name``'s training step."""
    case = model_case(name, device, log_loss=log_loss, layers=layers)
    transform, runner, thunder_path, options = make()
    clock = Clock(time.thread_time if cpu_time else time.perf_counter)
    if runner is not None:
        instrument(clock, runner, thunder_path)
    with _timed_replays(clock, device, skip_replay):
        return _profile(case, transform, options, clock, device, steps, warmup, cprofile)


@contextlib.contextmanager
def _timed_replays(clock: Clock, device: str, skip_replay: bool):
    """Every graph replay inside is timed into ``clock.replay`` (with ``skip_replay``: does nothing, timed)."""
    graph_class = EmulatedGraph if device == "cpu" else torch.cuda.CUDAGraph
    replay = graph_class.replay

    def timed_replay(graph):
        t0 = clock.now()
        try:
            return (_skip if skip_replay else replay)(graph)
        finally:
            clock.replay += clock.now() - t0

    graph_class.replay = timed_replay
    try:
        yield
    finally:
        graph_class.replay = replay


def _phase_row(clock: Clock, t0: float, t1: float, t2: float) -> dict[str, float]:
    """One call's µs per phase, from the clock's per-step times and the call's forward (t0-t1) and backward (t1-t2)."""
    t = {k: v * 1e6 for k, v in clock.step.items()}
    row = {c: t.get(c, 0.0) for c in COLUMNS}
    row["fw"], row["bw"] = (t1 - t0) * 1e6, (t2 - t1) * 1e6
    row["step"] = row["fw"] + row["bw"]
    row["fw trace"] = t.get("fw computation", 0.0) - row["fw runner"] - row["fw replay"] - row["fw hand-out"]
    row["fw glue"] = row["fw"] - row["prologue"] - t.get("fw computation", 0.0)
    row["bw trace"] = t.get("bw computation", 0.0) - row["bw runner"] - row["bw replay"] - row["bw hand-out"]
    row["bw autograd"] = row["bw"] - t.get("bw computation", 0.0)
    return row


def _medians(one: Callable[[int], dict[str, float]], clock: Clock, jfn: Any, steps: int, warmup: int,
             prof: cProfile.Profile | None) -> tuple[dict[str, float], tuple[int, int]]:
    """Warm up (the entries instrumented after the first call), then the median row of ``steps`` calls of ``one``
    and the region calls per call."""
    one(0)
    instrument_entries(clock, jfn)
    for i in range(1, warmup):
        one(i)
    clock.calls.clear()
    gc.collect()
    if prof:
        prof.enable()
    rows = [one(i) for i in range(steps)]
    if prof:
        prof.disable()
    row = {c: statistics.median(r[c] for r in rows) for c in COLUMNS}
    return row, (clock.calls["fw runner"] // steps, clock.calls["bw runner"] // steps)


def _profile(case, transform, options: dict, clock: Clock, device: str, steps: int, warmup: int, cprofile: bool):
    jfn = thunder.jit(case.step, transforms=[transform] if transform is not None else [], **options)
    batches = [case.make_batch(seed) for seed in range(16)]
    prof = cProfile.Profile() if cprofile else None

    def one(i: int) -> dict[str, float]:
        idx, targets = batches[i % len(batches)]
        clock.step.clear()
        clock.side = "fw"
        t0 = clock.now()
        out = jfn(idx, targets)
        t1 = clock.now()
        loss = out[0] if isinstance(out, tuple) else out
        clock.side = "bw"
        loss.backward()
        t2 = clock.now()
        clock.side = "fw"
        for p in case.model.parameters():
            p.grad = None
        if device == "cuda":
            torch.cuda.synchronize()
        return _phase_row(clock, t0, t1, t2)

    row, regions = _medians(one, clock, jfn, steps, warmup, prof)
    return row, regions, prof


#: `thunder_nb.testing.zoo.compile_with`'s names; on CUDA plain thunder's sdpa executor refuses the decode step, which
#: "thunder no-sdpa" runs (thunder's defaults without it)
ZOO_CONFIGS = ("thunder", "thunder no-sdpa", "thunder_nb.jit", "fused")


def profile_zoo(model_name: str, protocol: str, config: str, device: str, steps: int, warmup: int, *,
                cprofile: bool = False, skip_replay: bool = False, cpu_time: bool = False):
    """Median microseconds per call and phase of a zoo loop (``batchnorm``: forward and backward; ``decode``: one
    token per call), and the region calls per call."""
    from thunder_nb.testing.zoo import MODELS, compile_with

    model = MODELS[model_name]
    net = model.build(device)
    decode = protocol == "decode"
    fn = model.infer(net) if decode else model.loss(net)
    net.train(not decode)
    if decode:
        net.set_kv_cache(batch_size=1, device=torch.device(device))
    jfn, transform = compile_with(config, fn, "emulated" if device == "cpu" else True)
    clock = Clock(time.thread_time if cpu_time else time.perf_counter)
    if transform is not None:
        instrument(clock, transform.cuda_graph_runner)
    params = list(net.parameters())
    opt = None if decode else torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if decode:
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, 128, (1, 8), generator=g).to(device)
        token = torch.randint(0, 128, (1, 1), generator=g).to(device)
        positions = [torch.tensor([t], device=device) for t in range(8, 40)]  # NOTE: the cache holds 64
        batches = []
    else:
        batches = [model.batch(seed, device) for seed in range(4)]

    def one(i: int) -> dict[str, float]:
        clock.step.clear()
        clock.side = "fw"
        if decode:
            t0 = clock.now()
            jfn(token, positions[i % len(positions)])
            t1 = t2 = clock.now()
        else:
            args, targets = batches[i % len(batches)]
            opt.zero_grad(set_to_none=True)
            t0 = clock.now()
            loss = jfn(*args, targets)
            t1 = clock.now()
            clock.side = "bw"
            loss.backward()
            t2 = clock.now()
            clock.side = "fw"
            if not skip_replay:
                # NOTE: with replays skipped, on a CPU: the step computes there (11M parameters on resnet18), and its
                # memory traffic evicts the host's caches, which a GPU's kernel launches do not
                opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return _phase_row(clock, t0, t1, t2)  # NOTE: decoding has no backward: its bw columns stay 0

    prof = cProfile.Profile() if cprofile else None
    with _timed_replays(clock, device, skip_replay), torch.no_grad() if decode else contextlib.nullcontext():
        if decode:
            jfn(prompt, torch.arange(8, device=device))
        row, regions = _medians(one, clock, jfn, steps, warmup, prof)
    return row, regions, prof


def run_zoo_case(a: argparse.Namespace, model: str, protocol: str, config: str) -> dict | None:
    """One zoo loop under one configuration, in this process: its row, or None when it fails (printed)."""
    device = "cpu" if a.emulated else "cuda"
    program = f"{model} {protocol}"
    with emulated_capture() if a.emulated else contextlib.nullcontext():
        try:
            row, regions, prof = profile_zoo(model, protocol, config, device, a.steps, a.warmup, cprofile=a.cprofile,
                                             skip_replay=a.skip_replay and a.emulated, cpu_time=a.cpu_time)
        except Exception as e:
            print(f"{program} / {config}: fails: {type(e).__name__}: {str(e).strip()[:100]}", file=sys.stderr)
            return None
    print(f"{program} / {config}: step {row['step']:.0f} us", file=sys.stderr)
    if prof:
        print(f"\n## cProfile: {program} / {config} ({a.steps} steps)", file=sys.stderr)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {"program": program, "config": config, "row": row, "regions": regions}


def table(rows: list[tuple[str, str, dict, tuple[int, int]]]) -> str:
    head = ["program", "configuration", "regions fw/bw"] + list(COLUMNS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * len(COLUMNS)]
    for program, config, row, regions in rows:
        cells = [program, config, f"{regions[0]}/{regions[1]}"] + [f"{row[c]:.0f}" for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_case(a: argparse.Namespace, name: str, log: bool, config: str) -> dict | None:
    """One program under one configuration, in this process: its row, or None when it fails (printed)."""
    device = "cpu" if a.emulated else "cuda"
    program = f"{name} training step" + (f", {a.layers} layers" if a.layers != 2 else "") + (
        ", loss.item() logged" if log else "")
    make = dict(configs(a.emulated))[config]
    with emulated_capture() if a.emulated else contextlib.nullcontext():
        try:
            row, regions, prof = profile(name, make, device, a.steps, a.warmup, log, cprofile=a.cprofile,
                                         skip_replay=a.skip_replay and a.emulated, cpu_time=a.cpu_time,
                                         layers=a.layers)
        except Exception as e:  # NOTE: thunder's own transform fails at capture where loss.item() is inside
            print(f"{program} / {config}: fails: {type(e).__name__}: {str(e).strip()[:100]}", file=sys.stderr)
            return None
    print(f"{program} / {config}: step {row['step']:.0f} us", file=sys.stderr)
    if prof:
        print(f"\n## cProfile: {program} / {config} ({a.steps} steps)", file=sys.stderr)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {"program": program, "config": config, "row": row, "regions": regions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulated", action="store_true", help="CPU, emulated capture (no GPU needed)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--models", default="nanoGPT,llama2")
    ap.add_argument("--layers", type=int, default=2,
                    help="the models' depth (the benchmark's steps: 2; notebook 05's nanoGPT: 6): host work grows with it")
    ap.add_argument("--log-loss", action="store_true", help="also the steps that take loss.item() inside")
    ap.add_argument("--config", default="", help="only configurations whose name contains this")
    ap.add_argument("--skip-replay", action="store_true",
                    help="with --emulated: replays do nothing (the region's re-run would drown the host work around it)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the thread's CPU time (a CPU shared with other work; one torch thread)")
    ap.add_argument("--cprofile", action="store_true", help="print cProfile's top functions per run (to stderr)")
    ap.add_argument("--zoo", default="", help="zoo loops MODEL:PROTOCOL,... (resnet18:batchnorm, "
                    "litgpt-pythia-14m:decode) under plain thunder and thunder_nb.jit, instead of the training steps")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # NOTE: "model|log|config": one case, its row as JSON
    a = ap.parse_args()
    if not a.emulated and not torch.cuda.is_available():
        print("host_profile: needs a CUDA GPU (torch sees none); --emulated runs on the CPU", file=sys.stderr)
        return 2
    if a.cpu_time:
        torch.set_num_threads(1)  # NOTE: the thread's CPU time then covers every op's work
    if a.case:
        name, log, config = a.case.split("|")
        if a.zoo:
            print(json.dumps(run_zoo_case(a, name, log, config)))
        else:
            print(json.dumps(run_case(a, name, log == "1", config)))
        return 0
    def one_case(case: str, inline) -> dict | None:
        """The case's row: here on the CPU; on a GPU in a process of its own (``--case``), since a failed capture can
        leave CUDA unusable."""
        if a.emulated:
            return inline()
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--case", case], stdout=subprocess.PIPE,
                              text=True, timeout=900)
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if done.returncode == 0 and lines else None

    results = []
    for row_name in a.zoo.split(",") if a.zoo else ():
        model, protocol = row_name.split(":")
        for config in ZOO_CONFIGS:
            if a.config in config:
                results.append(one_case(f"{model}|{protocol}|{config}",
                                        lambda: run_zoo_case(a, model, protocol, config)))
    for name in a.models.split(",") if not a.zoo else ():
        for log in (False, True) if a.log_loss else (False,):
            for config, _ in configs(a.emulated):
                if a.config in config:
                    results.append(one_case(f"{name}|{int(log)}|{config}", lambda: run_case(a, name, log, config)))
    rows = [(r["program"], r["config"], r["row"], r["regions"]) for r in results if r]
    where = torch.cuda.get_device_name() if not a.emulated else "CPU, emulated capture, " + (
        "replays skipped" if a.skip_replay else "replay = re-running the region")
    clock = "the thread's CPU time" if a.cpu_time else "wall time"
    print(f"\nHost microseconds per step ({clock}), median of {a.steps} steps after {a.warmup} warm-up steps; {where}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
