"""bench/rounds.py's run over a script's rows: a sweep cut by ``--time-limit`` names the rows it left, to run next."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("rounds", Path(__file__).resolve().parents[1] / "bench" / "rounds.py")
rounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rounds)


def _bench(seconds):
    def bench(key):
        time.sleep(seconds[key])
        return None if key[1] == "skipped" else f"{key} ran"
    return bench


def _table(results):
    return "\n".join(results.values())


def test_a_time_limit_stops_before_a_row_that_would_not_fit_and_names_the_rest(tmp_path, capsys):
    keys = [("nanogpt", "train"), ("llama2", "train"), ("resnet18", "batchnorm")]
    out = tmp_path / "table.md"
    results = rounds.run_rows(keys, _bench(dict.fromkeys(keys, 0.3)), lambda k: f"{k[0]} {k[1]}", _table, str(out),
                              "Model zoo", time_limit=0.45, rest=("--rows", lambda k: f"{k[0]}:{k[1]}"))
    assert list(results) == keys[:1]
    last = "Not run, for the time limit (0 s; the longest row took 0 s): --rows llama2:train,resnet18:batchnorm"
    assert capsys.readouterr().out.rstrip().endswith(last)
    assert out.read_text().rstrip().endswith(last), "the written table names the rows left too"


def test_without_a_time_limit_every_row_runs_and_a_skipped_one_takes_no_row(capsys):
    keys = [("a", "run"), ("b", "skipped"), ("c", "run")]
    results = rounds.run_rows(keys, _bench(dict.fromkeys(keys, 0.0)), str, _table, None, "t")
    assert list(results) == [("a", "run"), ("c", "run")]
    assert "Not run" not in capsys.readouterr().out


@pytest.mark.parametrize("limit", [0.0, 10.0])
def test_the_first_row_always_runs(limit):
    """No row has run, so none is known to be too long: a limit below any row's time still runs the first one."""
    keys = [("a", "run"), ("b", "run")]
    results = rounds.run_rows(keys, _bench(dict.fromkeys(keys, 0.01)), str, _table, None, "t", time_limit=limit)
    assert ("a", "run") in results
    assert (("b", "run") in results) == (limit == 10.0)


def test_a_gpu_named_with_its_index_is_a_gpu():
    """bench_ddp's ranks name their device "cuda:N": the rounds' synchronisation took it for the CPU and never waited
    for the GPU (the 2026-12-05 H100 table timed the launches alone)."""
    assert rounds.on_gpu("cuda") and rounds.on_gpu("cuda:0") and rounds.on_gpu("cuda:3")
    assert not rounds.on_gpu("cpu")
