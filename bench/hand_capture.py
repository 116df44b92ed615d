"""PyTorch's whole-network capture, written by hand as its CUDA-graphs documentation writes it: the peer an expert
builds without a compiler's help (`bench_step.py`, and `bench_ddp.py` with DistributedDataParallel's all-reduce
inside the graph)."""

from __future__ import annotations

import torch

__all__ = ["HandCapture"]


class HandCapture:
    """PyTorch's whole-network capture as its CUDA-graphs documentation writes it: warm-up steps on a side stream, then
    one ``torch.cuda.graph`` of forward, backward and a capturable AdamW step over static inputs; a call copies the
    batch in and replays. ``fn`` as it is (eager's kernels) or compiled by torch.compile (inductor's kernels, no
    graphs of its own), captured the same way. The warm-up trains: the parameters and the optimizer's state are put
    back afterwards, so that the first replay is the first step from the initial weights (the bench checks its loss
    against eager's)."""

    def __init__(self, net: torch.nn.Module, fn, batch, around, warmup: int = 3):
        """``fn(idx, targets) -> loss`` over ``net``'s parameters (``net`` itself, or a wrapper such as DDP around
        it), ``batch`` the static inputs' first values, ``around()`` the context of the forward (autocast or none),
        ``warmup`` eager steps on the side stream first (DistributedDataParallel wants 11)."""
        self.opt = torch.optim.AdamW(net.parameters(), lr=1e-3, capturable=True)
        (idx,), targets = batch
        self.idx, self.targets = idx.clone(), targets.clone()
        initial = [p.detach().clone() for p in net.parameters()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.opt.zero_grad(set_to_none=True)
                with around():
                    loss = fn(self.idx, self.targets)
                loss.backward()
                self.opt.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            with around():
                self.loss = fn(self.idx, self.targets)
            self.loss.backward()
            self.opt.step()
        with torch.no_grad():
            for p, p0 in zip(net.parameters(), initial):
                p.copy_(p0)
            for state in self.opt.state.values():
                for value in state.values():
                    value.zero_()  # NOTE: exp_avg, exp_avg_sq and (capturable) the step count, in place
        self.graphs_recorded = 1

    def __call__(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.idx.copy_(idx)
        self.targets.copy_(targets)
        self.graph.replay()
        return self.loss
