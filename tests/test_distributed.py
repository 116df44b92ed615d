"""thunder's data parallelism around ``thunder_nb.jit`` (issue 50, point 2): real thunder, torch.distributed on gloo,
two processes (`torch.multiprocessing.spawn`), CUDA-graph capture emulated on the CPU or regions run eagerly.

Before the fix, ``thunder.distributed.ddp(thunder_nb.jit(model))`` trained each rank alone: the fixed transform had
rewritten the prologue's parameter lookups before ``ddp``'s transform looked for them, so no ``synchronize`` was
put before a parameter and the backward had no ``all_reduce`` (`thunder_nb.cudagraph.distributed`). Here each
configuration trains a few steps and is held against ``ddp(thunder.jit(model))`` and against one process training
on the two ranks' batches together; the orders that cannot work raise one TypeError naming what to write.

Both processes run every configuration in one spawn (the ``ranks`` fixture), since each process's start (importing
thunder) and thunder's compilations are most of the time; the tests read what the ranks wrote. The GPU test runs
``ddp`` and ``fsdp`` on NCCL with real capture, one process per GPU.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import traceback
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

WORLD = 2
STEPS = 3
BATCH = 6  # per rank
IN, HIDDEN, OUT = 4, 8, 2  # NOTE: fsdp shards each parameter's first dimension: every one is even


class Config(NamedTuple):
    compiler: str  # "thunder" or "thunder_nb"
    wrapper: str  # thunder's "ddp" or "fsdp", torch's DistributedDataParallel ("torch-ddp") or FSDP ("torch-fsdp")
    capture: bool | str  # True (a GPU), False (regions run eagerly) or "emulated"
    optimizer: str  # "adamw" or "sgd"
    keep_grads: bool = False  # zero_grad(set_to_none=False): the lent gradients stay held from step to step


CONFIGS = {
    "thunder-ddp": Config("thunder", "ddp", False, "adamw"),
    "nb-ddp-eager": Config("thunder_nb", "ddp", False, "adamw"),
    "nb-ddp-emulated": Config("thunder_nb", "ddp", "emulated", "adamw"),
    "nb-ddp-emulated-sgd": Config("thunder_nb", "ddp", "emulated", "sgd", keep_grads=True),
    "nb-torch-ddp-emulated": Config("thunder_nb", "torch-ddp", "emulated", "sgd", keep_grads=True),
    "nb-fsdp-emulated": Config("thunder_nb", "fsdp", "emulated", "adamw"),
    "nb-torch-fsdp-emulated": Config("thunder_nb", "torch-fsdp", "emulated", "sgd"),
    "nb-ddp-gpu": Config("thunder_nb", "ddp", True, "adamw"),
    "nb-fsdp-gpu": Config("thunder_nb", "fsdp", True, "adamw"),
}
CPU_CONFIGS = [name for name, config in CONFIGS.items() if config.capture is not True]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batches(world: int, device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole batch of each step, every rank's part together (rank r trains on rows r*BATCH to (r+1)*BATCH)."""
    g = torch.Generator().manual_seed(1)
    return [tuple(torch.randn(world * BATCH, n, generator=g).to(device) for n in (IN, OUT)) for _ in range(STEPS)]


def optimizer(kind: str, params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.05) if kind == "adamw" else torch.optim.SGD(params, lr=0.1)


def single_process(kind: str, world: int) -> dict:
    """Eager training in one process on the ranks' batches together: what data parallelism must reproduce."""
    model = make_model()
    opt = optimizer(kind, model.parameters())
    losses = []
    for x, y in batches(world):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()]}


def _names(trace) -> tuple[list[str], list[str]]:
    """The names of a trace's top-level symbols and of the symbols inside its regions (fusions)."""
    top, inside = [], []
    for b in trace.bound_symbols:
        top.append(b.sym.name)
        if getattr(b.sym, "is_fusion", False):
            inside += [s.sym.name for s in b.subsymbols]
    return top, inside


def _train(name: str, rank: int, world: int, device: str) -> dict:
    import contextlib

    import thunder
    from thunder.distributed import ddp, fsdp

    import thunder_nb
    from thunder_nb.testing import emulated_capture

    compiler, wrapper, capture, kind, keep_grads = CONFIGS[name]
    model = make_model().to(device)
    if compiler == "thunder":
        jfn, transform = thunder.jit(model), None
    else:
        jfn = thunder_nb.jit(model, capture=capture is True)
        transform = jfn._lc_transforms[0]
        if capture == "emulated":
            transform.cuda_graph_runner.capture = True  # NOTE: the runner's capture path, on emulated graphs
    if wrapper == "ddp":
        module = ddp(jfn)
    elif wrapper == "fsdp":
        module = fsdp(jfn, device=torch.device(device))
    elif wrapper == "torch-ddp":
        module = torch.nn.parallel.DistributedDataParallel(jfn)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel

        module = FullyShardedDataParallel(jfn, device_id=torch.device(device))
    opt = optimizer(kind, module.parameters())
    losses, grads = [], []
    rows = slice(rank * BATCH, (rank + 1) * BATCH)
    with emulated_capture() if capture == "emulated" else contextlib.nullcontext():
        for x, y in batches(world, device):
            opt.zero_grad(set_to_none=not keep_grads)
            loss = torch.nn.functional.mse_loss(module(x[rows]), y[rows])
            loss.backward()
            grads = [p.grad.detach().clone().cpu() for p in module.parameters() if p.grad is not None]
            opt.step()
            losses.append(loss.item())
    params = [p.detach().clone() for p in module.parameters()]
    if wrapper == "torch-fsdp":  # NOTE: its flat parameter's shards; the model's own parameters, gathered
        with type(module).summon_full_params(module):
            params = [p.detach().clone() for p in model.parameters()]
    if wrapper == "fsdp":  # NOTE: each rank holds the first dimension's rank-th part of every parameter
        full = []
        for p in params:
            parts = [torch.empty_like(p) for _ in range(world)]
            torch.distributed.all_gather(parts, p.contiguous())
            full.append(torch.cat(parts))
        params = full
    compiled = jfn if wrapper.startswith("torch") else module  # NOTE: what thunder compiled: torch's wrapper holds it
    backward = thunder.last_backward_traces(compiled)[-1]
    forward = thunder.last_traces(compiled)[-1]
    return {
        "losses": losses, "grads": grads, "params": [p.cpu() for p in params],
        "backward": _names(backward), "forward": _names(forward),
        "graphs": transform.graphs_captured if transform is not None else None,
    }


def _refusals() -> dict:
    """The message of each order that cannot work, or None where it did not raise."""
    import thunder
    from thunder.distributed import ddp

    import thunder_nb

    from torch.distributed.fsdp import fully_shard

    def fully_shard_around():
        jfn = thunder_nb.jit(make_model(), capture=False)
        fully_shard(jfn)
        return jfn(torch.randn(BATCH, IN))  # NOTE: refused when thunder compiles it, at its first call

    attempts = {
        "thunder_nb.jit(ddp(thunder.jit(m)))": lambda: thunder_nb.jit(ddp(thunder.jit(make_model()))),
        "thunder_nb.jit(DistributedDataParallel(m))":
            lambda: thunder_nb.jit(torch.nn.parallel.DistributedDataParallel(make_model())),
        "thunder_nb.jit(fully_shard(m))": lambda: thunder_nb.jit(fully_shard(make_model())),
        "fully_shard(thunder_nb.jit(m))": fully_shard_around,
    }
    found = {}
    for what, attempt in attempts.items():
        try:
            attempt()
        except TypeError as e:
            found[what] = str(e)
        else:
            found[what] = None
    return found


def _worker(rank: int, world: int, init: str, out: str, configs: list[str], device: str, backend: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    # NOTE: a rank whose configuration raised leaves the other waiting in a collective: the timeout ends it
    torch.distributed.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                         timeout=datetime.timedelta(seconds=120))
    try:
        results = {}
        for name in configs:
            try:
                results[name] = _train(name, rank, world, device)
            except Exception:  # NOTE: the test of that configuration fails with it; the others still run
                results[name] = {"error": traceback.format_exc()}
        results["refusals"] = _refusals()
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def run_ranks(configs: list[str], world: int, device: str, backend: str) -> list[dict]:
    """Spawn ``world`` processes that run ``configs``; what each rank wrote."""
    with tempfile.TemporaryDirectory() as out:
        init = "file://" + os.path.join(out, "init")
        torch.multiprocessing.spawn(_worker, args=(world, init, out, configs, device, backend), nprocs=world)
        return [torch.load(Path(out) / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """Each rank's results of every CPU configuration and of the refusals, from one spawn of two processes on gloo."""
    return run_ranks(CPU_CONFIGS, WORLD, "cpu", "gloo")


def trained(results: list[dict], name: str) -> list[dict]:
    """Each rank's result of configuration ``name``; the traceback of the first rank where it raised fails the test."""
    for r in results:
        assert "error" not in r[name], r[name]["error"]
    return [r[name] for r in results]


#: How close a rank's figures are to one process's: the sums over the batch run in another order.
CPU_TOLERANCE = dict(rtol=1e-5, atol=1e-6)
#: On the GPU, against one process's training on the CPU: other kernels too.
GPU_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def close(a, b, tolerance: dict = CPU_TOLERANCE) -> None:
    from thunder_nb.diagnosis.judge import Tolerance, assert_equal

    assert_equal(a, b, tolerance=Tolerance(**tolerance))  # NOTE: the one judge of "equal"


def check_against_one_process(results: list[dict], name: str, tolerance: dict = CPU_TOLERANCE) -> None:
    """The ranks' mean loss at each step and the parameters at the end are one process's on all the ranks' batches."""
    ranks = trained(results, name)
    reference = single_process(CONFIGS[name].optimizer, len(ranks))
    mean_losses = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(STEPS)]
    close(torch.tensor(mean_losses), torch.tensor(reference["losses"]), tolerance)
    for r in ranks:
        for p, q in zip(r["params"], reference["params"]):
            close(p, q, tolerance)


def check_ranks_agree(results: list[dict], name: str, tolerance: dict = CPU_TOLERANCE) -> None:
    """Every rank ends the last step with the same gradients."""
    ranks = trained(results, name)
    for r in ranks[1:]:
        for g, g0 in zip(r["grads"], ranks[0]["grads"]):
            close(g, g0, tolerance)


def check_collectives_outside_regions(result: dict, collective: str, trace: str = "backward") -> None:
    """``trace`` launches ``collective`` and waits for it at the top level, neither inside a region."""
    top, inside = result[trace]
    assert f"torch_{collective}_prim_impl" in top and "torch_wait_prim_impl" in top, top
    assert not {n for n in inside if collective in n or "wait" in n}, inside


@pytest.mark.slow
def test_thunder_ddp_is_the_oracle(ranks):
    """``ddp(thunder.jit(model))`` itself: the backward all-reduces, the ranks agree, one process's training."""
    assert "torch_all_reduce_prim_impl" in trained(ranks, "thunder-ddp")[0]["backward"][0]
    check_ranks_agree(ranks, "thunder-ddp")
    check_against_one_process(ranks, "thunder-ddp")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nb-ddp-eager", "nb-ddp-emulated", "nb-ddp-emulated-sgd"])
def test_ddp_around_thunder_nb_jit_all_reduces(ranks, name):
    """``thunder.distributed.ddp(thunder_nb.jit(model))``: the all-reduce and its wait in the backward, outside every
    region and after the one that divides the gradients by the world size; both ranks end with the same gradients; the losses and parameters are one process's on both batches and
    ``ddp(thunder.jit(model))``'s. Before the fix the ranks' gradients differed (the backward had no collective)."""
    check_ranks_agree(ranks, name)
    check_against_one_process(ranks, name)
    rank0 = trained(ranks, name)[0]
    check_collectives_outside_regions(rank0, "all_reduce")
    # NOTE: the division of each gradient by the world size stays in the region, the launches after it
    assert "true_divide" not in rank0["backward"][0]
    if CONFIGS[name].optimizer == CONFIGS["thunder-ddp"].optimizer:
        for r, oracle in zip(trained(ranks, name), trained(ranks, "thunder-ddp")):
            close(torch.tensor(r["losses"]), torch.tensor(oracle["losses"]))
            for p, q in zip(r["params"], oracle["params"]):
                close(p, q)
    if CONFIGS[name].capture == "emulated":
        assert rank0["graphs"] > 0  # NOTE: the regions took the capture path


@pytest.mark.slow
def test_torch_ddp_around_thunder_nb_jit(ranks):
    """torch's ``DistributedDataParallel(thunder_nb.jit(model))``: its reducer averages the gradients the backward's
    graph lent (emulated capture), as around ``thunder.jit(model)``; with ``zero_grad(set_to_none=False)`` they stay
    the parameters' ``.grad`` from step to step."""
    name = "nb-torch-ddp-emulated"
    check_ranks_agree(ranks, name)
    check_against_one_process(ranks, name)
    # NOTE: the forward's graph and two of the backward's: the reducer averaged the first step's lent gradients in
    # place, and ``.grad`` (zeroed, not dropped) still held them at the next backward, which replayed another instance
    assert trained(ranks, name)[0]["graphs"] == 3


@pytest.mark.slow
def test_fsdp_around_thunder_nb_jit(ranks):
    """``thunder.distributed.fsdp(thunder_nb.jit(model), device=cpu)``: the forward all-gathers each parameter's
    shards, the backward reduce-scatters its gradient, each outside every region; the gathered parameters are one
    process's on both batches. Before the fix the first call failed on the prologue's unsharded shape checks."""
    name = "nb-fsdp-emulated"
    check_against_one_process(ranks, name)
    rank0 = trained(ranks, name)[0]
    check_collectives_outside_regions(rank0, "all_gather", "forward")
    check_collectives_outside_regions(rank0, "reduce_scatter")
    assert rank0["graphs"] > 0


@pytest.mark.slow
def test_torch_fsdp_around_thunder_nb_jit(ranks):
    """torch's ``FullyShardedDataParallel(thunder_nb.jit(model))`` (emulated capture): its hooks gather the flat
    parameter before the forward and reduce-scatter its gradient after the backward, around thunder's computation;
    the parameters it gathers at the end are one process's on both batches."""
    name = "nb-torch-fsdp-emulated"
    check_against_one_process(ranks, name)
    assert trained(ranks, name)[0]["graphs"] > 0


@pytest.mark.slow
def test_orders_that_cannot_work_are_refused_naming_the_one_to_write(ranks):
    """Compiling what thunder already compiled or what torch wrapped for data parallelism raises one TypeError that
    names ``ddp(thunder_nb.jit(model))`` (or torch's wrapper around it); so does the first call of a module given to
    torch's ``fully_shard`` after ``thunder_nb.jit``, which trains each rank apart around ``thunder.jit`` too."""
    for what, message in ranks[0]["refusals"].items():
        assert message is not None, f"{what} did not raise"
        assert "(thunder_nb.jit(model))" in message, message


def test_a_transform_after_the_fixed_one_finds_thunders_prologue():
    """The mechanism alone, in one process: a transform after the fixed one in ``transforms=`` (where ``ddp`` and
    ``fsdp`` put theirs) finds thunder's own lookups and checks in the prologue. thunder's ``PrunePrologueChecks``
    here: after the fixed transform it prunes the parameters' checks; before the fix the fixed transform had already
    made them module walks and batched checks, and it pruned nothing, silently. In front of it, the walks stay."""
    import thunder
    from thunder.transforms.prune_prologue_checks import PrunePrologueChecks

    from thunder_nb.fix import FixedCUDAGraphTransform

    def prologue_of(transforms):
        jfn = thunder.jit(torch.nn.Linear(4, 2), transforms=transforms)
        jfn(torch.randn(3, 4))
        return [b.sym.name for b in thunder.last_prologue_traces(jfn)[-1].bound_symbols]

    fixed = FixedCUDAGraphTransform(capture=False)
    after = prologue_of([fixed, PrunePrologueChecks()])
    assert after.count("unpack_parameter") == 2 and after.count("check_tensor_metadata") == 1  # NOTE: the input's
    assert any("PrunePrologueChecks" in note for note in fixed.notes)
    before = prologue_of([PrunePrologueChecks(), FixedCUDAGraphTransform(capture=False)])
    assert "thunder_nb_module_walk" in before and "unpack_parameter" not in before


def test_compiling_what_thunder_compiled_is_refused():
    """In one process (no process group): ``thunder_nb.jit`` of ``thunder.jit``'s or its own result raises, naming
    the order to write."""
    import thunder

    import thunder_nb

    for compiled in (thunder.jit(make_model()), thunder_nb.jit(make_model()), thunder_nb.jit(lambda x: x * 2)):
        with pytest.raises(TypeError, match=r"thunder_nb\.jit\(model\)"):
            thunder_nb.jit(compiled)


@pytest.mark.gpu
@pytest.mark.slow
def test_ddp_and_fsdp_on_nccl_with_real_capture():
    """NCCL, one process per GPU (one at least, two at most), real CUDA-graph capture: ``ddp`` and ``fsdp`` around
    ``thunder_nb.jit(model)`` train as one process on all the ranks' batches, with every collective and wait
    outside the graphs."""
    configs = ["nb-ddp-gpu", "nb-fsdp-gpu"]
    results = run_ranks(configs, min(torch.cuda.device_count(), 2), "cuda", "nccl")
    for name in configs:
        check_against_one_process(results, name, GPU_TOLERANCE)
        assert trained(results, name)[0]["graphs"] > 0
    check_ranks_agree(results, "nb-ddp-gpu", GPU_TOLERANCE)
    check_collectives_outside_regions(trained(results, "nb-ddp-gpu")[0], "all_reduce")
    check_collectives_outside_regions(trained(results, "nb-fsdp-gpu")[0], "all_gather", "forward")
