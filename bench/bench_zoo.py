"""The model zoo's table: packaged models in the loops users run, every configuration side by side, on the GPU.

    python bench/bench_zoo.py [--rounds 5] [--steps 30] [--rows nanogpt:train,...|all] [--configs ...] [--out FILE.md]
                              [--baseline DIR]  # adds the configuration "baseline": thunder_nb.jit of an older commit
                              [--time-limit S]  # a sweep in parts: rows that would not end in S seconds are named

Headline: throughput as a user's loop runs. Each configuration first runs the zoo protocol's checked steps from the
same initial state as eager (its values compared with eager's; a dropout run's losses follow its random masks, so it
is judged by the dropout checks instead: `thunder_nb.testing.zoo.dropout_problem`), then takes turns with the others
in rounds: in each round, ``--steps`` consecutive steps with no sync inside but the loop's own (a training step is zero_grad, forward,
backward and the optimizer's step, as the zoo protocol runs it: the loss logged by ``.item()``, autocast around the
call, gradients kept by ``zero_grad``; the kept protocol three forwards, then their backwards; inference one call
under no_grad with the output kept), synchronised only at the round's ends. Reported: the median over rounds of
milliseconds per step, and each configuration's ratio to torch.compile reduce-overhead's and to thunder without
graphs' (without its sdpa executor where that executor refuses the case: decoding, and a case whose plain thunder
fails with the limit that names the choice, such as autocast's backward, which then adds the configurations without
it), each with its spread (the lowest and highest of the per-round ratios), and after the rounds torch.profiler's GPU kernel time per step (a step far above it waits for the host). A
configuration the checker predicts would kill the process (thunder's transform on dropout attention) is not run; one
that fails says how.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from rounds import add_ratios, add_round_arguments, kernel_us, machine, recover, run_rows, sync, time_rounds  # noqa: E402

from thunder_nb.testing import zoo  # noqa: E402

#: (model, protocol) rows of the table, in order.
ROWS = [
    ("nanogpt", "train"),
    ("llama2", "train"),
    ("litgpt-llama2-like", "train"),
    ("litgpt-falcon-7b-like", "kept"),
    ("resnet18", "batchnorm"),
    ("resnet18", "inference"),
    ("llama2", "inference"),
    ("litgpt-pythia-14m", "decode"),
]
CONFIGS = ("eager", "thunder", "stock", "thunder_nb.jit", "fused", "reduce-overhead", "thunder no-sdpa",
           "thunder_nb.jit no-sdpa")
LABELS = {"eager": "eager", "thunder": "thunder (no graphs)", "stock": "thunder's CUDAGraphTransform",
          "thunder_nb.jit": "thunder_nb.jit", "fused": "thunder_nb.jit + torchcompile",
          "reduce-overhead": "torch.compile reduce-overhead", "thunder no-sdpa": "thunder without sdpa (no graphs)",
          "thunder_nb.jit no-sdpa": "thunder_nb.jit without sdpa", "baseline": "thunder_nb.jit at the baseline",
          "thunder fused": "thunder with inductor's fusions (no graphs)",
          "thunder nb-executors": "thunder with thunder_nb.jit's executors (no graphs)"}
#: The older thunder_nb that the configuration "baseline" runs (``--baseline DIR``; see baseline.py), or None.
BASELINE = None


class Loop:
    """One configuration's loop: its own model and optimizer from the zoo's initial state, stepped on demand."""

    def __init__(self, model: zoo.ZooModel, protocol: str, config: str, device: str, capture: zoo.CaptureMode):
        self.model, self.protocol, self.config, self.device = model, protocol, config, device
        self.net = model.build(device)
        self.net.train(protocol not in ("inference", "decode"))
        if protocol == "decode":
            self.net.set_kv_cache(batch_size=1, device=torch.device(device))
        fn = model.infer(self.net) if protocol in ("inference", "decode") else model.loss(self.net)
        if config == "baseline":  # NOTE: real capture only: the older code's own defaults
            self.fn = BASELINE.jit(fn)
            self.transform = self.fn._lc_transforms[0]
        else:
            self.fn, self.transform = zoo.compile_with(config, fn, capture)
        # NOTE: the zoo protocol's own loop (zoo_protocols): its optimizer (AdamW where it trains none: dropout);
        # the logged protocol reads loss.item() every step, autocast wraps the call
        self.opt = zoo.training_optimizer(zoo.TRAINING_OPTIMIZERS.get(protocol, "adamw"), self.net.parameters())
        self.batches = [model.batch(i, device) for i in range(3)]
        self.kept: list = []
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.positions = [torch.tensor([p], device=device) for p in range(8, 56)]

    def context(self) -> contextlib.AbstractContextManager:
        """Emulated capture on the CPU."""
        return zoo.capturing("emulated") if self.device == "cpu" else contextlib.nullcontext()

    def step(self, i: int) -> None:
        args, targets = self.batches[i % 3]
        if self.protocol == "decode":  # NOTE: one token at a position that advances (and wraps inside the cache)
            with torch.no_grad():
                self.kept = [self.fn(self.token, self.positions[i % len(self.positions)])]
        elif self.protocol == "inference":
            with torch.no_grad():
                self.kept = [self.fn(*args)]
        elif self.protocol == "kept":
            losses = [self.fn(*a, t) for a, t in self.batches]
            for loss in losses:
                loss.backward()
            self.net.zero_grad()
        else:
            self.opt.zero_grad(set_to_none=self.protocol != "zero-grad")
            with (torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16) if self.protocol == "autocast"
                  else contextlib.nullcontext()):
                loss = self.fn(*args, targets)
            loss.backward()
            self.opt.step()
            if self.protocol in ("logged", "dropout"):
                loss.item()  # NOTE: the number a user's loop logs (a host sync every step)


def _predicted_crash(model: zoo.ZooModel, protocol: str) -> str | None:
    """The checker's word on thunder's transform for this case, built from the traces alone (nothing runs)."""
    import thunder
    from thunder.transforms.cudagraph import CUDAGraphTransform

    import thunder_nb

    net = model.build("cuda").train(protocol not in ("inference", "decode"))
    if protocol == "decode":
        return None  # NOTE: no backward, no dropout: nothing that kills the process
    fn = model.infer(net) if protocol == "inference" else model.loss(net)
    jfn = thunder.jit(fn, transforms=[CUDAGraphTransform()])
    args, targets = model.batch(0, "cuda")
    try:
        if protocol == "inference":
            with torch.no_grad():
                thunder.compile_data(jfn)._get_computation_and_inputs(*args)
        else:
            thunder.compile_data(jfn)._get_computation_and_inputs(*args, targets)
    except Exception:
        return None
    crash = next((d for d in thunder_nb.analyze(jfn).defects if d.severity == "crashes the process"), None)
    return crash.rule if crash else None


def bench_row(model_name: str, protocol: str, rounds: int, steps: int, device: str = "cuda",
              configs: tuple[str, ...] = CONFIGS) -> list[dict]:
    model = zoo.MODELS[model_name]
    capture = True if device == "cuda" else "emulated"

    def run(config: str) -> zoo.ZooRun:
        return zoo.run_protocol(model_name, protocol, config, device=device, capture=capture, steps=3)

    reference = run("eager")
    out = []
    loops: dict[str, Loop] = {}
    # NOTE: without sdpa only where thunder's sdpa executor refuses the case: decoding, and any case whose plain thunder
    # fails with the limit that names that choice (autocast's backward), which then adds them below
    queue = [c for c in configs if not c.endswith("no-sdpa") or protocol == "decode"]
    for config in queue:
        if device == "cpu" and config in ("fused", "reduce-overhead"):
            continue  # NOTE: inductor compiles C++ on the CPU for minutes; the CPU run only checks the script works
        row = {"config": config, "ms": [], "note": ""}
        out.append(row)
        if config == "stock" and device == "cuda" and _predicted_crash(model, protocol):
            row["note"] = "not run: the checker predicts it kills the process"
            continue
        if config == "baseline":
            row["matches"] = "not checked (the baseline's own commit)"
        else:
            checked = run(config)
            if checked.error is not None:
                component = f" ({checked.limit.split(': ')[0]})" if checked.limit else ""  # NOTE: which component refuses
                row["note"] = f"fails: {checked.error[:110]}{component}"
                if config == "thunder" and checked.limit and "no-sdpa" in checked.limit:
                    # NOTE: the choice the limit's words offer: thunder without it, and each graph configuration too
                    queue += [c for c in dict.fromkeys(("thunder no-sdpa", *(f"{c} no-sdpa" for c in configs)))
                              if c in LABELS and c not in queue]
                continue
            try:
                verdict = zoo.judge(checked, reference, lambda: run(zoo.plain_config(config)))
            except Exception as e:  # NOTE: reading its values failed (reduce-overhead: an output a later replay overwrote)
                row["note"] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:110]}"
                continue
            if verdict.matches:
                plain = zoo.plain_config(config)
                if verdict.against == "eager":
                    row["matches"] = "yes"
                elif verdict.against == zoo.DROPOUT_CHECKS:  # NOTE: random masks: no values to compare with eager's
                    row["matches"] = (f"{zoo.DROPOUT_CHECKS} pass (keep rate {checked.values['keep rate']:.3f}; "
                                      "masks and losses change every call)")
                else:
                    row["matches"] = f"as {LABELS.get(plain, plain)}, which differs from eager"
            else:
                row["matches"] = f"no: {verdict.difference}"
        try:
            start = time.perf_counter()
            loop = Loop(model, protocol, config, device, capture)
            with loop.context():
                for i in range(3):  # NOTE: compile, record, warm up
                    loop.step(i)
            sync(device)
            row["first_s"] = time.perf_counter() - start
            loops[config] = loop
        except Exception as e:
            recover(device)
            row["note"] = f"fails in the loop: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    for row in out:  # NOTE: progress on stderr, so that a run cut short by a time limit still says how far it got
        print(f"  {model_name} {protocol} {row['config']}: equal to eager {row.get('matches', '-')}, first steps "
              f"{row.get('first_s', 0):.1f} s {row['note']}", file=sys.stderr, flush=True)
    by_config = {row["config"]: row for row in out}
    time_rounds(loops, by_config, rounds, steps, device)
    for row in out:
        transform = getattr(loops.get(row["config"]), "transform", None)
        if transform is not None:  # NOTE: the timed loop's own graphs and regions, after every round
            row["graphs"], row["regions"] = zoo.count_graphs(transform)
    add_ratios(by_config)
    add_ratios(by_config, "thunder", key="vs_thunder")
    if not by_config.get("thunder", {}).get("ms"):  # NOTE: where thunder's sdpa executor refused it: thunder without
        add_ratios(by_config, "thunder no-sdpa", key="vs_thunder")
    for config, loop in loops.items():  # NOTE: after the rounds, so that the profiler's cost never lands in them
        by_config[config]["kernel_us"] = kernel_us(loop, steps, device)
    return out


def table(results: dict, rounds: int, steps: int) -> str:
    lines = [f"Machine: {machine()}. {rounds} rounds of {steps} consecutive steps per configuration, taking turns.",
             "", "| model, protocol | configuration | ms/step (median of rounds) | vs reduce-overhead (min-max) "
             "| vs thunder without graphs (min-max) | GPU kernel µs/step | equal to eager "
             "| graphs (regions) after the rounds | first 3 steps, s | note |",
             "|---|---|---:|---:|---:|---:|---|---|---:|---|"]
    for (model, protocol), rows in results.items():
        for row in rows:
            ms = f"{statistics.median(row['ms']):.3f}" if row["ms"] else "-"
            ratio = row.get("ratio")
            rtext = f"{ratio[0]:.3f}x ({ratio[1]:.3f}-{ratio[2]:.3f})" if ratio else "-"
            vs = row.get("vs_thunder")
            vtext = f"{vs[0]:.3f}x ({vs[1]:.3f}-{vs[2]:.3f})" if vs else "-"
            graphs = f"{row['graphs']} ({row['regions']})" if row.get("graphs") is not None else ""
            first = f"{row['first_s']:.1f}" if row.get("first_s") else "-"
            kernels = f"{row['kernel_us']:.0f}" if row.get("kernel_us") else "-"
            lines.append(f"| {model}, {protocol} | {LABELS[row['config']]} | {ms} | {rtext} | {vtext} | {kernels} "
                         f"| {row.get('matches', '-')} "
                         f"| {graphs} | {first} | {row['note']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser)
    parser.add_argument("--rows", default="", help="model:protocol,... (default: every row of ROWS); all: every "
                        "case of the zoo (each model with each of its protocols)")
    parser.add_argument("--configs", default="", help="configuration,... (default: every one of CONFIGS; "
                        "reduce-overhead is the ratios' reference)")
    parser.add_argument("--out", help="also write the table into this Markdown file")
    parser.add_argument("--baseline", metavar="DIR", help="an older commit's thunder_nb/ extracted under DIR (git "
                        "archive COMMIT thunder_nb | tar -x -C DIR): adds the configuration baseline, its "
                        "thunder_nb.jit, taking turns with the others in the same process")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: emulated capture, without inductor's configurations (checks the script, times "
                             "nothing about CUDA graphs)")
    args = parser.parse_args()
    if args.rows == "all":
        rows = [(name, protocol) for name, model in zoo.MODELS.items() for protocol in model.protocols]
    else:
        rows = [tuple(r.split(":")) for r in args.rows.split(",")] if args.rows else ROWS
    configs = tuple(c.strip() for c in args.configs.split(",")) if args.configs else CONFIGS
    if args.baseline:
        global BASELINE
        import baseline

        BASELINE = baseline.load(args.baseline)
        LABELS["baseline"] = f"thunder_nb.jit at {Path(args.baseline).name}"
        configs = configs if "baseline" in configs else (*configs, "baseline")
    elif "baseline" in configs:
        parser.error("the configuration baseline needs --baseline DIR")

    def bench(key: tuple[str, str]) -> list[dict] | None:
        model, protocol = key
        if zoo.missing_package(zoo.MODELS[model]):
            print(f"skipped {model}: needs {zoo.missing_package(zoo.MODELS[model])}", flush=True)
            return None
        return bench_row(model, protocol, args.rounds, args.steps, args.device, configs)

    run_rows(rows, bench, lambda key: f"{key[0]} {key[1]}", lambda res: table(res, args.rounds, args.steps),
             args.out, "Model zoo", time_limit=args.time_limit, rest=("--rows", lambda key: f"{key[0]}:{key[1]}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
