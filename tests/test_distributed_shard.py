"""``jit_step(..., shard=True)`` (issue 52): the gradients reduce-scattered and the updated parameters all-gathered
inside the step, each rank's optimizer keeping state for the parameters it owns only (ZeRO-2). Real thunder,
torch.distributed on gloo, two processes (`torch.multiprocessing.spawn`), emulated capture: one uncaptured step,
the recording and its replay, then replays.

Every configuration runs in one spawn (the ``shard_ranks`` fixture), sharded and unsharded (``ddp=True``) side by
side; the tests read what the ranks wrote and judge it with the one judge of "equal", at the tolerance of
``tests/test_distributed.py``.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from test_distributed import (BATCH, GPU_TOLERANCE, IN, OUT, WORLD, close, make_model, mse_of, optimizer,
                              rank_group)

STEPS = 4  # NOTE: with warmup=1: uncaptured, recorded (and replayed), replayed, replayed


class ShardConfig(NamedTuple):
    optimizer: str  # "adamw" or "sgd-momentum"
    clip: float | None = None  # max_grad_norm
    accumulate: int = 1


CONFIGS = {
    "adamw": ShardConfig("adamw"),
    "adamw-clip": ShardConfig("adamw", clip=0.05),
    "sgd-momentum": ShardConfig("sgd-momentum"),
    "sgd-momentum-clip-accumulate": ShardConfig("sgd-momentum", clip=0.05, accumulate=2),
}


def batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole batch of each step (rank r trains on rows r*BATCH to (r+1)*BATCH)."""
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(world * BATCH, IN, generator=g), torch.randn(world * BATCH, OUT, generator=g))
            for _ in range(STEPS)]


def state_of(opt: torch.optim.Optimizer, params) -> list[dict]:
    """Each parameter's optimizer state ({} where it has none), on the CPU."""
    return [{k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
            if p in opt.state else {} for p in params]


def single_process(config: ShardConfig, world: int) -> dict:
    """Eager training in one process on the ranks' batches together, with the configuration's clipping."""
    model = make_model()
    opt = optimizer(config.optimizer, model.parameters())
    losses, norms = [], []
    for x, y in batches(world):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if config.clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip))
        opt.step()
        losses.append(loss.item())
    params = list(model.parameters())
    return {"losses": losses, "norms": norms, "params": [p.detach().clone() for p in params],
            "grads": [p.grad.detach().clone() for p in params], "state": state_of(opt, params)}


def _train(name: str, shard: bool, rank: int, world: int, device: str = "cpu",
           capture: bool | str = "emulated") -> dict:
    import thunder_nb

    config = CONFIGS[name]
    model = make_model().to(device)
    opt = optimizer(config.optimizer, model.parameters())
    rows = slice(rank * BATCH, (rank + 1) * BATCH)
    data = [(x[rows].to(device), y[rows].to(device)) for x, y in batches(world)]
    options = {"shard": True} if shard else {"ddp": True}
    report = thunder_nb.capturability(model, mse_of(model), opt, *data[0], accumulate=config.accumulate, **options)
    step = thunder_nb.jit_step(model, mse_of(model), opt, capture=capture, warmup=1, max_grad_norm=config.clip,
                               accumulate=config.accumulate, **options)
    losses, norms = [], []
    for x, y in data:
        losses.append(step(x, y).item())
        if config.clip is not None:
            norms.append(step.last_grad_norm.cpu())
    params = list(model.parameters())
    return {"losses": losses, "norms": norms, "params": [p.detach().cpu().clone() for p in params],
            "grads": [None if p.grad is None else p.grad.detach().cpu().clone() for p in params],
            "state": state_of(opt, params), "state_dict_params": len(opt.state_dict()["state"]),
            "owned": [step.ranks.owns(p) for p in params] if shard else [True] * len(params),
            "repr": repr(step), "notes": list(step.notes), "graphs": step.graphs_recorded,
            "launches": step.ranks.launches, "captured": step.ranks.captured, "report": report.to_text(),
            "report_counts": (report.ops, report.in_graph, report.all_reduces, report.reduce_scatters, report.ranks,
                              report.whole_step)}


def _refusals() -> dict:
    """What ``jit_step(..., shard=True)`` says of a model wrapped for data parallelism: the message, or None."""
    import thunder
    from thunder.distributed import fsdp
    from torch.distributed.fsdp import fully_shard

    import thunder_nb

    def refused(model) -> str | None:
        try:
            thunder_nb.jit_step(model, mse_of(model), optimizer("sgd", make_model().parameters()),
                                capture="emulated", shard=True)
        except TypeError as e:
            return str(e)
        return None

    return {"DistributedDataParallel": refused(torch.nn.parallel.DistributedDataParallel(make_model())),
            "fully_shard": refused(fully_shard(make_model())),
            "thunder fsdp": refused(fsdp(thunder.jit(make_model()), device=torch.device("cpu")))}


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with rank_group("gloo", init, rank, world):
        results: dict = {}
        for name in CONFIGS:
            for shard in (True, False):
                try:
                    results[name, shard] = _train(name, shard, rank, world)
                except Exception:  # NOTE: the test of that configuration fails with it; the others still run
                    results[name, shard] = {"error": traceback.format_exc()}
        try:
            results["refusals"] = _refusals()
        except Exception:
            results["refusals"] = {"error": traceback.format_exc()}
        torch.save(results, Path(out) / f"rank{rank}.pt")


def spawn_ranks(worker, world: int) -> list[dict]:
    """``worker(rank, world, init, out)`` in ``world`` processes; what each rank saved."""
    with tempfile.TemporaryDirectory() as out:
        init = "file://" + os.path.join(out, "init")
        torch.multiprocessing.spawn(worker, args=(world, init, out), nprocs=world)
        return [torch.load(Path(out) / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def shard_ranks() -> list[dict]:
    """Each rank's results of every configuration, sharded and not, and of the refusals: one spawn of two processes."""
    return spawn_ranks(_worker, WORLD)


def trained(results: list[dict], name: str, shard: bool = True) -> list[dict]:
    """Each rank's result; the traceback of the first rank where it raised fails the test."""
    for r in results:
        assert "error" not in r[name, shard], r[name, shard]["error"]
    return [r[name, shard] for r in results]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_sharded_step_is_one_process_training(shard_ranks, name):
    """``jit_step(shard=True)`` on two ranks: the mean loss at each step, every rank's parameters, each owned
    parameter's gradient and optimizer state, and the global gradient norm are one process's training on both ranks'
    rows together (AdamW and SGD with momentum, with and without clipping, with two micro-batches a step); every
    rank ends with the same parameters, bit for bit (each one its owner's, gathered)."""
    from thunder_nb.diagnosis.judge import EXACT, assert_equal

    ranks = trained(shard_ranks, name)
    reference = single_process(CONFIGS[name], WORLD)
    close(torch.tensor([sum(r["losses"][i] for r in ranks) / WORLD for i in range(STEPS)]),
          torch.tensor(reference["losses"]))
    for r in ranks:
        close(r["params"], reference["params"])
        for owned, grad, state, ref_grad, ref_state in zip(r["owned"], r["grads"], r["state"], reference["grads"],
                                                           reference["state"]):
            if owned:
                close(grad, ref_grad)
                close(state, ref_state)
        if CONFIGS[name].clip is not None:
            close(torch.stack(r["norms"]), torch.stack(reference["norms"]))  # NOTE: the global norm, every step
        assert_equal(r["params"], ranks[0]["params"], tolerance=EXACT, label="rank's params", reference="rank 0's")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_sharded_step_equals_the_unsharded_one(shard_ranks, name):
    """Rank by rank, ``shard=True`` trains as ``ddp=True`` (every gradient all-reduced, every parameter stepped on
    every rank): the same losses, parameters, gradient norms, and owned gradients and optimizer state."""
    for sharded, whole in zip(trained(shard_ranks, name), trained(shard_ranks, name, shard=False)):
        close(torch.tensor(sharded["losses"]), torch.tensor(whole["losses"]))
        close(sharded["params"], whole["params"])
        if sharded["norms"]:
            close(torch.stack(sharded["norms"]), torch.stack(whole["norms"]))
        for owned, grad, state, whole_grad, whole_state in zip(sharded["owned"], sharded["grads"], sharded["state"],
                                                               whole["grads"], whole["state"]):
            if owned:
                close(grad, whole_grad)
                close(state, whole_state)


@pytest.mark.slow
def test_each_rank_keeps_optimizer_state_for_its_own_parameters_only(shard_ranks):
    """The memory claim: the parameters are split among the ranks (each owned by exactly one, both ranks owning
    some), each rank's optimizer holds state for its owned parameters and no other (AdamW's moments: fewer elements
    than the unsharded step's, which holds all), its ``state_dict`` only those, and ``.grad`` of another rank's
    parameter is None after a step."""
    for name in CONFIGS:
        ranks, whole = trained(shard_ranks, name), trained(shard_ranks, name, shard=False)
        owners = [[r["owned"][i] for r in ranks] for i in range(len(ranks[0]["owned"]))]
        assert all(sum(o) == 1 for o in owners), owners
        assert all(any(r["owned"]) for r in ranks)
        for r, w in zip(ranks, whole):
            assert [bool(s) for s in r["state"]] == r["owned"], (name, r["owned"])
            assert [g is not None for g in r["grads"]] == r["owned"]
            assert r["state_dict_params"] == sum(r["owned"]) < w["state_dict_params"] == len(r["owned"])
            if CONFIGS[name].optimizer == "adamw":
                moments = sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in r["state"] if s)
                assert moments < sum(s["exp_avg"].numel() + s["exp_avg_sq"].numel() for s in w["state"])


@pytest.mark.slow
def test_sharded_step_records_once_and_says_what_it_does(shard_ranks):
    """One recording after the one warm-up step (the parameters other ranks own, never given state here, do not
    hold it back); each step launches one reduce_scatter and one all_gather (and clipping's all_reduce), which the
    repr, the notes and `capturability` say."""
    for name, config in CONFIGS.items():
        for r, w in zip(trained(shard_ranks, name), trained(shard_ranks, name, shard=False)):
            assert r["graphs"] == 1
            assert (r["launches"], r["captured"]) == (STEPS * (2 + (config.clip is not None)), 0)
            assert "sharded across 2 ranks: 1 reduce_scatter + 1 all_gather a step>" in r["repr"], r["repr"]
            assert any("sharded across 2 ranks: reduce_scatter + all_gather per step" in n for n in r["notes"])
            assert any(".grad of a parameter another rank owns is None" in n for n in r["notes"]), r["notes"]
            assert "sharded across 2 ranks: reduce_scatter + all_gather per step (1 of each" in r["report"]
            ops, in_graph, all_reduces, reduce_scatters, world, whole_step = r["report_counts"]
            assert (all_reduces, reduce_scatters, world, whole_step) == (0, 1, WORLD, True)
            assert ops == in_graph == w["report_counts"][0] + 1  # NOTE: two collectives where ddp has one


@pytest.mark.slow
def test_sharding_a_wrapped_model_is_refused(shard_ranks):
    """A model wrapped by torch's DDP or ``fully_shard`` or by thunder's ``fsdp`` is refused with ``shard=True`` as
    without it, the message saying that jit_step shards gradients and optimizer state, never parameters."""
    # NOTE: every rank's error: a rank that fails first closes its connections, and the other then fails in the next
    # collective ("Connection closed by peer", seen once under a full suite's load on 2026-12-05), which hides the cause
    errors = [f"rank {r}: {ranks['refusals']['error']}" for r, ranks in enumerate(shard_ranks)
              if "error" in ranks["refusals"]]
    assert not errors, "\n".join(errors)
    refusals = shard_ranks[0]["refusals"]
    for what, message in refusals.items():
        assert message is not None, f"{what} did not raise"
        assert message.startswith("jit_step was given the model wrapped by"), message
        assert "FSDP's FULL_SHARD is not supported by jit_step" in message, message


def test_shard_needs_torch_distributed_and_ddp():
    """In one process without torch.distributed: ``shard=True`` raises ValueError saying to initialize it (in
    jit_step and capturability); ``shard=True`` with ``ddp=False`` raises, naming the contradiction."""
    import thunder_nb

    model = make_model()
    opt = optimizer("sgd", model.parameters())
    x, y = batches(1)[0]
    with pytest.raises(ValueError, match="needs torch.distributed initialized first"):
        thunder_nb.jit_step(model, mse_of(model), opt, capture="emulated", shard=True)
    with pytest.raises(ValueError, match="needs torch.distributed initialized first"):
        thunder_nb.capturability(model, mse_of(model), opt, x, y, shard=True)
    with pytest.raises(ValueError, match=r"shard=True .* ddp=False trains each rank alone"):
        thunder_nb.jit_step(model, mse_of(model), opt, capture="emulated", shard=True, ddp=False)


def test_partition_is_whole_parameters_balanced_by_size():
    """Largest first, each to the rank with the fewest elements of its dtype so far (ties: the lowest rank); each
    dtype balanced on its own; a later call places new tensors beside the earlier ones."""
    from thunder_nb.step.shard import partition

    sizes = [torch.zeros(n) for n in (32, 8, 16, 2)]
    assert partition(sizes, 2) == [0, 1, 1, 1]
    assert partition(sizes, 4) == [0, 2, 1, 3]
    assert partition(sizes, 1) == [0, 0, 0, 0]
    bf16 = torch.bfloat16
    mixed = [torch.zeros(10), torch.zeros(10, dtype=bf16), torch.zeros(4), torch.zeros(4, dtype=bf16)]
    assert partition(mixed, 2) == [0, 0, 1, 1]
    loads: dict = {}
    assert partition([torch.zeros(6)], 2, loads) == [0]
    assert partition([torch.zeros(5), torch.zeros(1)], 2, loads) == [1, 1]


def _gpu_worker(rank: int, world: int, init: str, out: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    torch.cuda.set_device(rank)
    with rank_group("nccl", init, rank, world):
        results: dict = {}
        for name in ("adamw", "adamw-clip"):
            try:
                results[name, True] = _train(name, True, rank, world, device=f"cuda:{rank}", capture=True)
            except Exception:
                results[name, True] = {"error": traceback.format_exc()}
        torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.mark.gpu
@pytest.mark.slow
def test_sharded_step_on_nccl_with_real_capture():
    """NCCL, one process per GPU (one at least, two at most), real capture, ``shard=True``: the reduce_scatter, the
    clipping's all_reduce and the all_gather recorded into the step's one CUDA graph (made uncaptured by the warm-up
    step, recorded by the capture, launched by the replays), and the training is one process's on all the ranks' rows;
    every rank ends with the same parameters."""
    from thunder_nb.diagnosis.judge import EXACT, assert_equal

    world = min(torch.cuda.device_count(), 2)
    results = spawn_ranks(_gpu_worker, world)
    for name in ("adamw", "adamw-clip"):
        ranks = trained(results, name)
        reference = single_process(CONFIGS[name], world)
        close(torch.tensor([sum(r["losses"][i] for r in ranks) / world for i in range(STEPS)]),
              torch.tensor(reference["losses"]), GPU_TOLERANCE)
        for r in ranks:
            assert r["graphs"] == 1 and r["captured"] > 0, (r["graphs"], r["captured"], r["repr"])
            close(r["params"], reference["params"], GPU_TOLERANCE)
            if CONFIGS[name].clip is not None:
                close(torch.stack(r["norms"]), torch.stack(reference["norms"]), GPU_TOLERANCE)
            assert_equal(r["params"], ranks[0]["params"], tolerance=EXACT, label="rank's params", reference="rank 0's")
