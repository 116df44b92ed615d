"""Data-parallel training steps, one process per GPU: thunder-nb under DDP and FSDP against torch's and thunder's.

    python bench/bench_ddp.py [--rounds 5] [--steps 30] [--models nanogpt,llama2] [--configs ...] [--out FILE.md]
    torchrun --nproc-per-node 2 bench/bench_ddp.py ...       # several GPUs: one process each, rank 0 prints
    python bench/bench_ddp.py --device cpu --steps 2 --rounds 1  # checks the script (gloo, no inductor)

Run alone it makes a process group of one rank (NCCL on a GPU, gloo on the CPU), so every configuration runs its
collectives for real, over a world of one: what data parallelism costs a step before any second GPU shares the
work. Under ``torchrun`` the same table comes from every rank's steps, rank 0 printing it.

The zoo's 2-layer nanoGPT and llama2 AdamW loops (`thunder_nb.testing.zoo`), each configuration with its own model
and optimizer from the same initial state and each rank on its own batches. Per configuration: 5 checked steps
(the loss read after each, held against eager DDP's), then rounds: in each round every configuration runs
``--steps`` consecutive steps (zero_grad, forward, backward, gradient all-reduce, optimizer step; no sync inside),
synchronised at the round's ends, taking turns. Reported: the median over rounds of ms/step and the ratio to torch
DDP + torch.compile reduce-overhead's (RO DDP), with its spread (min-max of the per-round ratios). "capture by hand":
the expert's peer, DDP's all-reduce, the forward, the backward and a capturable AdamW in one ``torch.cuda.graph`` as
PyTorch's CUDA-graphs documentation writes it (`hand_capture`; torchtitan captures forward and backward with the
collectives inside and leaves the optimizer eager, Megatron records the optimizer as a second graph).

FSDP rows, checked against eager DDP too (the same math on the same batches): torch's FSDP2 (``fully_shard`` on each
transformer block, then on the root, as torchtitan applies it; its defaults: a block frees its gathered parameters after
the forward and gathers them again for the backward, ZeRO-3), eager and under torch.compile reduce-overhead (the whole
loss compiled, as the RO DDP row; dynamo runs FSDP2's hooks eagerly, ``skip_fsdp_hooks``, so the graphs break at each
sharded module); thunder's ``fsdp`` (its default ZeRO-2: parameters gathered in the forward and kept for the backward)
around ``thunder.jit`` and around ``thunder_nb.jit`` (its graphs counted, as the DDP row's; on the CPU its runner
captures emulated graphs, as tests/test_distributed.py's). For the reduce-overhead rows the graphs column counts the
CUDA graphs torch's cudagraph trees recorded over the checked steps and every round (a number that grows with
``--steps`` and ``--rounds`` means graphs recorded again) and the note gives the first message of any graph they
skipped: FSDP2 gathers its parameters into memory it frees and allocates again every step, and the trees take parameters
for static inputs, recording again where an address changed (pytorch/pytorch#183451 measures those re-records with FSDP2
and reduce-overhead). No FSDP capture by hand: FSDP2's hooks allocate the all-gather and reduce-scatter buffers and free
them each step, on FSDP's own streams, so a ``torch.cuda.graph`` of the step needs those buffers kept alive and the
streams joined into the capture; ``make_graphed_callables`` refuses modules with hooks and FSDP2's ``chunk_cat``
allocated pinned host memory during capture (pytorch/pytorch#164264). That is FSDP2 rewritten, not a recipe a user
writes in a few lines, so no honest "by hand" peer exists yet.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from hand_capture import HandCapture  # noqa: E402
from rounds import (add_ratios, add_round_arguments, machine, matches, recover, run_rows, sync,  # noqa: E402
                    time_rounds)

from thunder_nb.testing import zoo  # noqa: E402

CONFIGS = ("eager DDP", "reduce-overhead", "capture by hand", "thunder DDP", "thunder_nb.jit DDP", "jit_step DDP",
           "jit_step ddp+shard", "eager FSDP", "reduce-overhead FSDP", "thunder FSDP", "thunder_nb.jit FSDP")
#: The rows that need CUDA (left out with ``--device cpu``).
CUDA_ONLY = ("reduce-overhead", "capture by hand", "reduce-overhead FSDP")
LABELS = {
    "eager DDP": "torch DistributedDataParallel, eager",
    "reduce-overhead": "torch DDP + torch.compile reduce-overhead (RO DDP)",
    "capture by hand": "torch DDP + the whole step captured by hand (forward, backward, all-reduce, capturable AdamW)",
    "thunder DDP": "thunder.distributed.ddp(thunder.jit(m)), no graphs",
    "thunder_nb.jit DDP": "thunder.distributed.ddp(thunder_nb.jit(m))",
    "jit_step DDP": "thunder_nb.jit_step(m, ..., ddp=True): the all-reduce inside the step's graph",
    "jit_step ddp+shard": "thunder_nb.jit_step(m, ..., shard=True): reduce_scatter + all_gather in the step's graph",
    "eager FSDP": "torch FSDP2 fully_shard (each block, then the root; ZeRO-3), eager",
    "reduce-overhead FSDP": "torch FSDP2 + torch.compile reduce-overhead (FSDP2's hooks run eagerly between graphs)",
    "thunder FSDP": "thunder.distributed.fsdp(thunder.jit(m)) (ZeRO-2), no graphs",
    "thunder_nb.jit FSDP": "thunder.distributed.fsdp(thunder_nb.jit(m)) (ZeRO-2)",
}
CHECKED = 5


class TreeWatch:
    """What torch.compile's cudagraph trees do while a reduce-overhead row runs (``watching()``): the CUDA graphs they
    record and the messages of the graphs they skip (their ``cudagraphs`` log, which torch prints as warnings too)."""

    def __init__(self):
        self.recorded = 0
        self.skipped: list[str] = []

    @contextlib.contextmanager
    def watching(self):
        import logging

        from torch._dynamo.callback import CallbackTrigger, callback_handler
        from torch._inductor.cudagraph_utils import cudagraphs_log

        watch = self

        def started(args) -> None:
            if args.callback_trigger == CallbackTrigger.CUDAGRAPH_RECORDING:
                watch.recorded += 1

        class Skips(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                watch.skipped.append(record.getMessage())

        skips = Skips(logging.WARNING)
        callback_handler.register_start_callback(started)
        cudagraphs_log.addHandler(skips)
        try:
            yield
        finally:
            cudagraphs_log.removeHandler(skips)
            callback_handler.remove_start_callback(started)


def _fully_shard(net: torch.nn.Module, device: str) -> None:
    """torchtitan's FSDP2: ``fully_shard`` on each transformer block (the model's one ``ModuleList``), then on the root
    (the embeddings, the final norm, the head: nanoGPT's tied embedding and head stay in one group), over a 1-D mesh of
    every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    lists = [m for m in net.modules() if isinstance(m, torch.nn.ModuleList)]
    assert len(lists) == 1, f"{type(net).__name__}: {len(lists)} ModuleLists, expected one of transformer blocks"
    for block in lists[0]:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)


class DDPLoop:
    """One configuration's AdamW loop on this rank's copy of a zoo model; ``step(i)`` returns the loss (not read)."""

    def __init__(self, name: str, config: str, device: str):
        import thunder
        from thunder.distributed import ddp, fsdp

        import thunder_nb

        model = zoo.MODELS[name]
        self.config, self.device = config, device
        self.net = model.build(device).train()  # NOTE: seeded: every rank starts from the same weights
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-3)
        rank = dist.get_rank()
        self.batches = [model.batch(rank * 3 + i, device) for i in range(3)]
        self.whole = self.transform = self.trees = None
        capture = True if device.startswith("cuda") else "emulated"
        if config in ("jit_step DDP", "jit_step ddp+shard"):
            self.whole = thunder_nb.jit_step(self.net, model.loss(self.net), self.opt, ddp=True, capture=capture,
                                             shard=config == "jit_step ddp+shard")
            return
        if config == "capture by hand":
            # NOTE: PyTorch's recipe for DDP under a full-step capture: DDP made on a side stream, 11 eager warm-up
            # steps before the capture, NCCL's asynchronous error handling off (`main`, before the process group)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                module = torch.nn.parallel.DistributedDataParallel(self.net, device_ids=[torch.device(device).index])
            torch.cuda.current_stream().wait_stream(side)
            self.whole = HandCapture(self.net, model.loss(module), self.batches[0], contextlib.nullcontext, warmup=11)
            return
        if config in ("eager DDP", "reduce-overhead", "eager FSDP", "reduce-overhead FSDP"):
            if config.endswith("FSDP"):
                _fully_shard(self.net, device)
                module = self.net
                # NOTE: fully_shard replaces the parameters with DTensor shards: the optimizer steps those
                self.opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
            else:
                ids = [torch.device(device).index] if device.startswith("cuda") else None
                module = torch.nn.parallel.DistributedDataParallel(self.net, device_ids=ids)
            fn = model.loss(module)
            if config.startswith("reduce-overhead"):
                self.fn, self.trees = torch.compile(fn, mode="reduce-overhead"), TreeWatch()
            else:
                self.fn = fn
        else:
            if config.startswith("thunder_nb.jit"):
                jitted = thunder_nb.jit(self.net, capture=capture is True)
                # NOTE: on the CPU the runner's capture path on emulated graphs (tests/test_distributed.py's way)
                self.transform = zoo.emulate_runner(jitted._lc_transforms[0], capture)
            else:
                jitted = thunder.jit(self.net)
            module = fsdp(jitted, device=torch.device(device)) if config.endswith("FSDP") else ddp(jitted)
            # NOTE: thunder's ddp and fsdp give the module parameters of their own (fsdp: each rank's shards): an
            # optimizer over the plain model's would step tensors that never get a gradient
            self.opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
            self.fn = model.loss(module)

    def context(self) -> contextlib.AbstractContextManager:
        if self.trees is not None:
            return self.trees.watching()
        if not self.device.startswith("cuda") and self.transform is not None:
            return zoo.capturing("emulated")
        return contextlib.nullcontext()

    def step(self, i: int) -> torch.Tensor:
        (idx,), targets = self.batches[i % 3]
        if self.whole is not None:
            return self.whole(idx, targets)
        self.opt.zero_grad()
        if self.trees is not None:
            torch.compiler.cudagraph_mark_step_begin()  # NOTE: a new step: its earlier outputs may be overwritten
        loss = self.fn(idx, targets)
        loss.backward()
        self.opt.step()
        return loss.detach().clone()


def bench_model(name: str, rounds: int, steps: int, device: str, configs: list[str]) -> dict:
    rows: dict[str, dict] = {}
    loops: dict[str, DDPLoop] = {}
    for config in configs:
        row = rows[config] = {"ms": [], "note": "", "losses": []}
        try:
            started = time.perf_counter()
            loop = DDPLoop(name, config, device)
            with loop.context():
                row["losses"] = [float(loop.step(i)) for i in range(CHECKED)]  # NOTE: compile, warm up, record
            sync(device)
            row["first_s"] = time.perf_counter() - started
            loops[config] = loop
        except Exception as e:
            recover(device)
            row["note"] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    reference = rows["eager DDP"]["losses"]
    for row in rows.values():
        if row["losses"] and reference:
            row["matches"] = matches(row["losses"], reference, autocast=False)
    time_rounds(loops, rows, rounds, steps, device)
    add_ratios(rows)
    for config, loop in loops.items():
        if loop.transform is not None:
            rows[config]["graphs"] = loop.transform.graphs_captured
        if loop.trees is not None:
            rows[config]["graphs"] = loop.trees.recorded
            if loop.trees.skipped:
                first = loop.trees.skipped[0][:120]
                rows[config]["note"] += f"cudagraphs skipped {len(loop.trees.skipped)}x: {first}"
    for config in ("jit_step DDP", "jit_step ddp+shard"):
        whole = loops.get(config)
        if whole is not None:
            rows[config]["graphs"] = whole.whole.graphs_recorded
            ranks = whole.whole.ranks
            if ranks is not None:
                what = "all-reduce" if config == "jit_step DDP" else "reduce_scatter, all_gather"
                rows[config]["note"] += f"{what} captured: {ranks.captured}"
    return {"rows": rows}


def table(results: dict, rounds: int, steps: int) -> str:
    import statistics

    world = dist.get_world_size()
    lines = [f"Machine: {machine()}. World size {world} ({dist.get_backend()}). {rounds} rounds of {steps} consecutive "
             "AdamW steps per configuration, taking turns.", "",
             "| model | configuration | ms/step (median of rounds) | vs RO DDP (min-max) | first 5 losses equal to "
             "eager DDP (max abs diff) | graphs | first 5 steps, s | note |", "|---|---|---:|---:|---|---:|---:|---|"]
    for name, res in results.items():
        for config, row in res["rows"].items():
            ms = f"{statistics.median(row['ms']):.3f}" if row["ms"] else "-"
            r = row.get("ratio")
            rtext = f"{r[0]:.3f}x ({r[1]:.3f}-{r[2]:.3f})" if r else "-"
            first = f"{row['first_s']:.1f}" if row.get("first_s") else "-"
            lines.append(f"| {name} | {LABELS[config]} | {ms} | {rtext} | {row.get('matches', '-')} | "
                         f"{row.get('graphs', '')} | {first} | {row['note']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_round_arguments(parser)
    parser.add_argument("--models", default="nanogpt,llama2")
    parser.add_argument("--configs", default="", help="only these configurations, comma-separated (eager DDP always "
                                                      "runs: the losses are checked against it)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: gloo and the CPU stand-in, without the rows that need CUDA (CUDA_ONLY; checks "
                             "the script only)")
    parser.add_argument("--out", help="also write the table into this Markdown file (rank 0)")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    # NOTE: PyTorch's CUDA-graphs documentation: a captured all-reduce needs NCCL's asynchronous error handling off
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = args.device
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        chosen = set(args.configs.split(",")) | {"eager DDP"} if args.configs else set(CONFIGS)
        configs = [c for c in CONFIGS if c in chosen and not (args.device == "cpu" and c in CUDA_ONLY)]
        if rank:  # NOTE: every rank runs every step; rank 0 prints and writes the table
            sys.stdout = open(os.devnull, "w")
        # NOTE: a time limit is judged by each rank on its own clock: with several ranks, one could stop while another
        # waits for it in a collective, so it holds for a world of one only
        run_rows(args.models.split(","), lambda name: bench_model(name, args.rounds, args.steps, device, configs),
                 str, lambda res: table(res, args.rounds, args.steps), args.out if rank == 0 else None,
                 "Data-parallel training steps", time_limit=args.time_limit if world == 1 else None,
                 rest=("--models", str))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
