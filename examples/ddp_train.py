"""Data-parallel training with thunder-nb: ``thunder.distributed.ddp`` around ``thunder_nb.jit``, one process a rank.

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py

Every rank builds the same small model and trains it with AdamW on its own rows of each batch; ``ddp`` all-reduces the
gradients, outside the CUDA graphs, so the ranks take the same steps. Each prints the loss of the whole batch (its own
loss averaged with the other ranks'): the same numbers on every rank, and the ones a single process training on the
whole batches prints. NCCL and one GPU a rank (``LOCAL_RANK``) where CUDA is available; gloo on the CPU otherwise,
where the regions run as plain Python instead of graphs.
"""

from __future__ import annotations

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
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = thunder.distributed.ddp(thunder_nb.jit(make_model().to(device)))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    for step, (x, y) in enumerate(batches(world)):
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
