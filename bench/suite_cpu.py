"""CPU seconds per test of a pytest run, the processes a test starts and waits for included (kernels, subprocesses).

The suite's wall time on 2 cores is bound by its CPU time (`bash dev.sh test` keeps both cores busy), and pytest's
``--durations`` gives wall time, which under three workers on two cores and with tests waiting on kernels, browsers and
subprocesses says little of what a test costs. Load this file as a pytest plugin, then summarize:

    PYTHONPATH=bench THUNDER_NB_CPU_LOG=/tmp/cpu .venv/bin/python -m pytest -n 3 --dist loadfile -p suite_cpu ...
    python bench/suite_cpu.py /tmp/cpu          # the files and the tests that cost most CPU

Each test's figure is the CPU its pytest process and the children it waited for used between the test's start and end
(``os.times``): a module fixture's server is counted in the test whose teardown stops it, and CPU that a process spends
outside any test (collection, imports) is not counted.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from pathlib import Path

import pytest


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ.get("THUNDER_NB_CPU_LOG")
    start = _cpu()
    yield
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(Path(folder) / f"{worker}.tsv", "a", encoding="utf-8") as f:
            f.write(f"{_cpu() - start:.2f}\t{item.nodeid}\t{time.time():.1f}\n")


def summarize(folder: Path, top: int = 25) -> str:
    per_file: collections.Counter[str] = collections.Counter()
    tests = []
    workers = {}  # worker: (its CPU seconds in tests, the wall time its last test ended)
    for path in sorted(folder.glob("*.tsv")):
        cpu, end = 0.0, 0.0
        for line in path.read_text(encoding="utf-8").splitlines():
            seconds, nodeid, *ended = line.split("\t")
            per_file[nodeid.split("::")[0]] += float(seconds)
            tests.append((float(seconds), nodeid))
            cpu, end = cpu + float(seconds), max([end, *map(float, ended)])
        workers[path.stem] = (cpu, end)
    lines = [f"CPU seconds in tests: {sum(per_file.values()):.0f}", ""]
    last = max((end for _, end in workers.values()), default=0.0)
    # NOTE: how balanced the workers were: a worker that ends long before the last leaves a core idle
    lines += ["by worker (CPU seconds in tests; ended, seconds before the last):"]
    lines += [f"{w:>8}  {cpu:7.1f}  {last - end:6.1f}" + ("" if end else " (no end times)")
              for w, (cpu, end) in sorted(workers.items())]
    lines += ["", "by file:"]
    lines += [f"{s:8.1f}  {name}" for name, s in per_file.most_common(top)]
    lines += ["", "by test:"]
    lines += [f"{s:8.1f}  {name}" for s, name in sorted(tests, reverse=True)[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/suite_cpu.py FOLDER (THUNDER_NB_CPU_LOG of a run with -p suite_cpu)")
    print(summarize(Path(sys.argv[1])))
