"""How long thunder takes to trace, with thunder's own interpreter and with thunder-nb's change of it
(`thunder_nb.internals.tracing`): the same traces, in less CPU time.

    python bench/tracing.py [--rounds 3] [--models nanoGPT,llama2,pythia,resnet18] [--out FILE.md]

Each row is one first call as a user makes it: ``thunder.jit`` of a training step (forward and loss, then the
backward) or of a decode step, traced and run once, timed by the process's CPU time (one torch thread: steady on a
shared machine). The two interpreters take turns, round after round, in one process: a round traces every model once
with thunder's own interpreter (`tracing.uninstall`) and once with the change (`tracing.install`). Prints the median
round of each and the ratio, with the range of the round-by-round ratios. The traces are checked equal too
(`tests/test_tracing.py` checks them in the suite).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _cases(names: list[str]) -> dict[str, Callable[[], tuple[Callable[..., Any], tuple, bool]]]:
    """Each model by name: a function that builds it afresh and returns (the function to jit, its arguments, whether
    to run the backward)."""
    import torch
    from thunder_nb.testing import zoo
    from thunder_nb.testing.models import model_case

    def nanogpt():
        case = model_case("nanoGPT", "cpu", layers=2, width=128, heads=4, vocab=512, batch=8, seq=64)
        return case.step, case.make_batch(0), True

    def zoo_training(name):
        def build():
            model = zoo.MODELS[name]
            net = model.build("cpu").train()
            inputs, targets = model.batch(0, "cpu")
            return model.loss(net), (*inputs, targets), True

        return build

    def pythia():
        model = zoo.MODELS["litgpt-pythia-14m"]
        net = model.build("cpu").eval()
        net.set_kv_cache(batch_size=1, device=torch.device("cpu"))
        return model.infer(net), (torch.zeros(1, 1, dtype=torch.long), torch.tensor([4])), False

    every = {"nanoGPT": nanogpt, "llama2": zoo_training("litgpt-llama2-like"), "pythia": pythia,
             "resnet18": zoo_training("resnet18")}
    return {name: every[name] for name in names}


def _first_call(build: Callable[[], tuple[Callable[..., Any], tuple, bool]]) -> tuple[float, str]:
    """(CPU seconds of ``thunder.jit`` and its first call, the backward too where it trains; the text of the traces:
    prologue, computation, backward)."""
    import thunder
    import torch

    fn, args, backward = build()
    start = time.process_time()
    jfn = thunder.jit(fn)
    with torch.set_grad_enabled(backward):
        out = jfn(*args)
    if backward:
        out.backward()
    seconds = time.process_time() - start
    traces = [thunder.last_prologue_traces(jfn)[-1], thunder.last_traces(jfn)[-1]]
    traces += thunder.last_backward_traces(jfn)[-1:] if backward else []
    return seconds, re.sub(r"\(took \d+ millisec\w*\)", "", "".join(str(t) for t in traces))


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="nanoGPT,llama2,pythia,resnet18")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    from thunder_nb import internals
    from thunder_nb.internals import tracing

    if not internals.supported():
        sys.exit("thunder-nb changes thunder's interpreter only where internals.supported(): nothing to compare")
    torch.set_num_threads(1)
    cases = _cases(args.models.split(","))
    seconds: dict[tuple[str, bool], list[float]] = {(name, on): [] for name in cases for on in (False, True)}
    for name, build in cases.items():  # NOTE: a first trace of each, untimed: imports and first-use caches
        _first_call(build)
    for _ in range(args.rounds):
        for name, build in cases.items():
            texts = {}
            for on in (False, True):
                tracing.install() if on else tracing.uninstall()
                s, texts[on] = _first_call(build)
                seconds[(name, on)].append(s)
            if texts[False] != texts[True]:
                sys.exit(f"{name}: the traces differ with thunder-nb's change: it must not change them")
    thunder_version = internals.found_versions()["lightning-thunder"]
    lines = [f"CPU seconds of one first call (thunder.jit, traced and run once, backward included where it trains), "
             f"{args.rounds} rounds taking turns, the median round; one torch thread; Python "
             f"{sys.version.split()[0]}, torch {torch.__version__}, lightning-thunder {thunder_version}",
             "", "| model | thunder's interpreter, s | with thunder-nb's change, s | change / thunder's (rounds) | "
             "traces equal |", "|---|---:|---:|---:|---|"]
    for name in cases:
        own, changed = seconds[(name, False)], seconds[(name, True)]
        ratios = [c / o for o, c in zip(own, changed)]
        lines.append(f"| {name} | {statistics.median(own):.2f} | {statistics.median(changed):.2f} | "
                     f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | yes |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    return table


if __name__ == "__main__":
    main()
