"""Data-parallel training with thunder-nb: ``thunder.distributed.ddp`` around ``thunder_nb.jit``, one process a rank;
with ``--step``, ``thunder_nb.jit_step``: one CUDA graph a step, the gradients' all-reduce inside it; with ``--step
--shard``, ``jit_step(..., shard=True)``: ZeRO-2 in the graph (each rank keeps the optimizer state of its share of the
parameters: reduce_scatter of the gradients, all_gather of the updated parameters).

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --step
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --step --shard

Every rank builds the same small model and trains it with AdamW on its own rows of each batch; ``ddp`` all-reduces the
gradients, outside the CUDA graphs, so the ranks take the same steps. Each prints the loss of the whole batch (its own
loss averaged with the other ranks'): the same numbers on every rank, and the ones a single process training on the
whole batches prints. NCCL and one GPU a rank (``LOCAL_RANK``) where CUDA is available; gloo on the CPU otherwise,
where the regions run as plain Python instead of graphs. With ``--step`` the plain model goes to ``jit_step``, which
averages the gradients across the ranks itself (torch.distributed is initialized with more than one rank), after the
backward and before the optimizer's step; on the CPU its graph is capture's stand-in.
"""

from __future__ import annotations

import argparse
import os
import sys

import thunder.distributed
import torch
import torch.distributed as dist

import thunder_nb

STEPS = 5
ROWS = 8  # NOTE: each rank's rows of a batch
LR = 0.01


def make_model() -> torch.nn.Module:
    """The same model on every rank (``ddp`` also broadcasts rank 0's parameters to the others)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's whole batch, every rank's rows together: rank r trains on rows r * ROWS to (r + 1) * ROWS."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        x = torch.randn(world * ROWS, 16, generator=g)
        out.append((x, x.sum(1, keepdim=True).sin()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--step", action="store_true", help="train through thunder_nb.jit_step (one graph a step)")
    parser.add_argument("--shard", action="store_true", help="with --step: shard=True (ZeRO-2 inside the graph)")
    args = parser.parse_args()
    if args.shard and not args.step:
        parser.error("--shard goes with --step (jit_step's shard=True)")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    if args.step:
        plain = make_model().to(device)
        opt = torch.optim.AdamW(plain.parameters(), lr=LR)
        train_step = thunder_nb.jit_step(plain, lambda x, y: torch.nn.functional.mse_loss(plain(x), y), opt,
                                         shard=args.shard)
    else:
        model = thunder.distributed.ddp(thunder_nb.jit(make_model().to(device)))
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for step, (x, y) in enumerate(batches(world)):
        if args.step:
            loss = train_step(x[rows].to(device), y[rows].to(device))  # NOTE: zero_grad, backward, all-reduce, step
        else:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[rows].to(device)), y[rows].to(device))
            loss.backward()
            opt.step()
        whole = loss.detach().clone()
        dist.all_reduce(whole)  # NOTE: the sum of the ranks' losses, each over as many rows
        # NOTE: one write of the whole line: print() writes the text and its newline apart, and the ranks share stdout
        sys.stdout.write(f"rank {rank} step {step} loss {whole.item() / world:.6f}\n")
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
