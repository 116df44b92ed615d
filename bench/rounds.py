"""What bench_zoo.py, bench_step.py and bench_ddp.py share: configurations taking turns in rounds of consecutive
steps, their ratios to torch.compile reduce-overhead's, their first losses judged against eager's, the machine line,
and the run over a script's rows with its tables."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

__all__ = ["Loop", "add_round_arguments", "on_gpu", "sync", "recover", "machine", "time_rounds", "add_ratios",
           "kernel_us", "profiled_steps", "matches", "run_rows", "write_markdown"]


class Loop(Protocol):
    """One configuration's loop: ``step(i)`` runs its i-th step, inside ``context()``."""

    def context(self) -> contextlib.AbstractContextManager: ...

    def step(self, i: int) -> Any: ...


def add_round_arguments(parser: argparse.ArgumentParser) -> None:
    """``--rounds``, ``--steps`` and ``--time-limit``, with the scripts' defaults."""
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="start no row after the first that would not end within S seconds of the start "
                             "(judged by the longest row so far); the table holds the rows that ran, and the last "
                             "line names the rest, to run next (a GPU machine that lends a command ten minutes)")


def on_gpu(device: str) -> bool:
    """Whether ``device`` ("cuda", "cuda:1", "cpu") names a CUDA device. bench_ddp's ranks name theirs "cuda:N", which
    ``device == "cuda"`` took for the CPU: its rounds never waited for the GPU (its 2026-12-05 H100 table timed the
    host's launches alone: jit_step at 0.03x RO DDP)."""
    return torch.device(device).type == "cuda"


def sync(device: str) -> None:
    """Wait for the GPU (nothing on the CPU)."""
    if on_gpu(device):
        torch.cuda.synchronize(device)


def recover(device: str) -> None:
    """After a configuration failed: CUDA usable as before for the next one (a failed capture leaves the generators
    capturing and its own stream current: `thunder_nb.recover_from_failed_capture`)."""
    if on_gpu(device):
        import thunder_nb

        thunder_nb.recover_from_failed_capture()


def machine() -> str:
    """The GPU, its driver, the CPU cores, torch and Python, in one line."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip().splitlines()[0]
    except Exception:
        driver = "?"
    return (f"{name} (driver {driver}, {os.cpu_count()} CPU cores), torch {torch.__version__}, Python "
            f"{platform.python_version()}")


def time_rounds(loops: dict[str, Loop], rows: Mapping[str, dict], rounds: int, steps: int, device: str) -> None:
    """Time ``rounds`` rounds: in each, every loop in turn runs ``steps`` consecutive steps, synchronised only at the
    round's ends; its ms/step goes into ``rows[config]["ms"]``. A loop that fails leaves ``loops``, its row says how
    and keeps no timings."""
    for _ in range(rounds):
        for config, loop in list(loops.items()):
            try:
                sync(device)
                start = time.perf_counter()
                with loop.context():
                    for i in range(steps):
                        loop.step(i)
                sync(device)
                rows[config]["ms"].append((time.perf_counter() - start) * 1e3 / steps)
            except Exception as e:
                recover(device)
                first = str(e).splitlines()[0][:100] if str(e) else ""
                rows[config]["note"] = f"fails after warm-up: {type(e).__name__}: {first}"
                rows[config]["ms"] = []
                loops.pop(config)


def profiled_steps(loop: Loop, steps: int, device: str) -> Any:
    """torch.profiler's record of ``steps`` consecutive steps of ``loop`` (in its context, synchronised at both ends):
    the GPU's kernels on a GPU, the CPU's ops on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA if on_gpu(device) else ProfilerActivity.CPU]) as prof, \
            loop.context():
        for i in range(steps):
            loop.step(i)
        sync(device)
    return prof


def kernel_us(loop: Loop, steps: int, device: str) -> float | None:
    """torch.profiler's GPU kernel time per step of ``loop`` (the sum of every kernel's own device time), in µs; None
    on the CPU. A step whose time is far above it waits for the host (launches, Python), not for the GPU."""
    if not on_gpu(device):
        return None
    total = sum(e.self_device_time_total for e in profiled_steps(loop, steps, device).key_averages())
    return total / steps if total else None


def matches(losses: list[float], eager: list[float], autocast: bool) -> str:
    """The first losses against eager's, by the one judge (`thunder_nb.judge`) with the zoo's base tolerance of the
    protocol (`zoo.TOLERANCES`: bfloat16's under autocast, AdamW-trained float32's otherwise): ``yes (largest
    difference)`` or ``no (largest difference: the judge's words)``."""
    from thunder_nb import judge
    from thunder_nb.testing import zoo

    judged = judge(losses, eager, tolerance=zoo.TOLERANCES["autocast" if autocast else "train"], label="loss")
    worst = max(abs(a - b) for a, b in zip(losses, eager))
    return f"yes ({worst:.1e})" if judged.equal else f"no ({worst:.1e}: {judged.difference})"


def add_ratios(rows: Mapping[str, dict], reference: str = "reduce-overhead", key: str = "ratio") -> None:
    """Each row's ratio to ``reference``'s ms/step, round by round: ``row[key]`` = (median, lowest, highest)."""
    ref = rows.get(reference, {"ms": []})["ms"]
    for row in rows.values():
        if row["ms"] and len(ref) == len(row["ms"]):
            ratios = [a / b for a, b in zip(row["ms"], ref)]
            row[key] = (statistics.median(ratios), min(ratios), max(ratios))


def run_rows(keys: Iterable[Any], bench: Callable[[Any], Any], label: Callable[[Any], str],
             table: Callable[[dict], str], out: str | None, title: str, *, time_limit: float | None = None,
             rest: tuple[str, Callable[[Any], str]] | None = None) -> dict:
    """Bench each key (``bench`` returns None to skip it), printing its seconds and its table as it goes; then print
    the whole table and write it to ``out`` under ``# title, date``.

    ``time_limit``: start no key after the first that would not end within that many seconds of the start, judged by
    the longest key so far; the keys left are printed last, as ``rest[0]`` followed by ``rest[1]`` of each, joined by
    commas (the argument that runs them next).
    """
    keys = list(keys)
    results = {}
    start, longest = time.perf_counter(), 0.0
    left: list[Any] = []
    for n, key in enumerate(keys):
        if time_limit is not None and n and time.perf_counter() - start + longest > time_limit:
            left = keys[n:]
            break
        started = time.perf_counter()
        result = bench(key)
        longest = max(longest, time.perf_counter() - started)
        if result is None:
            continue
        results[key] = result
        print(f"{label(key)}: {time.perf_counter() - started:.0f} s", flush=True)
        print(table({key: result}), flush=True)
    text = table(results)
    if left:
        option, spell = rest or ("rows", label)
        text += (f"\n\nNot run, for the time limit ({time_limit:.0f} s; the longest row took {longest:.0f} s): "
                 f"{option} {','.join(spell(k) for k in left)}")
    print(text)
    write_markdown(out, title, text)
    return results


def write_markdown(out: str | None, title: str, text: str) -> None:
    """Write ``text`` into the Markdown file ``out`` (when given) under ``# title, date``."""
    if out:
        Path(out).write_text(f"# {title}, {datetime.date.today()}\n\n{text}\n")
