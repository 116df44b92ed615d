"""A model whose structure changes during training, for the tests of thunder_nb.jit's structure guard
(tests/cudagraph/test_structure_guard.py) and jit_step's (tests/test_step_structure.py).

`Net` is an embedding and a head; `model_loss` reads members that come and go (``head2``, ``temperature``, the plain
attribute ``halve``) behind ``hasattr``/``getattr``, which thunder's cache does not check. The changes between steps
(``between(i, net, opt)``) attach, delete, freeze and unfreeze them at fixed steps. `train_state` and
`assert_same_training` compare a run with eager's: losses, every parameter the model or optimizer holds and AdamW's
state, by `thunder_nb.judge` within `BOUND`, AdamW's step counts exactly.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from thunder_nb.diagnosis.judge import EXACT, Tolerance, assert_equal

#: AdamW steps each test trains.
STEPS = 12
#: Thunder's trace runs its own decomposition of the loss (cross-entropy, mean), not eager's kernels: the losses differ
#: by float32 rounding (1.2e-7 seen), and the parameters and AdamW's moments after `STEPS` steps as little.
BOUND = Tolerance(rtol=1e-5, atol=1e-6)

Between = Callable[[int, nn.Module, torch.optim.Optimizer], None]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, idx):
        return self.emb(idx).mean(1)


def make_net(cls: type[Net] = Net, with_head2: bool = False) -> Net:
    torch.manual_seed(0)
    net = cls()
    if with_head2:
        net.head2 = nn.Linear(8, 4)
    return net


def model_loss(net: nn.Module, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of ``net``'s features ``h``, reading the members that come and go."""
    loss = F.cross_entropy(net.head(h), y)
    if hasattr(net, "head2"):
        loss = loss + F.cross_entropy(net.head2(h), y)
    if hasattr(net, "temperature"):
        loss = loss * net.temperature
    if getattr(net, "halve", False):  # NOTE: a plain instance attribute, added later
        loss = loss / 2
    return loss


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randint(0, 16, (4, 5), generator=g), torch.randint(0, 4, (4,), generator=g)


def adamw(net: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)


# --- the changes between steps -----------------------------------------------------------------------


def add_head2_at(step: int) -> Between:
    """A head attached before step ``step``, its parameters given to the optimizer."""

    def add_head2(i, net, opt):
        if i == step:
            torch.manual_seed(1)
            net.head2 = nn.Linear(8, 4).to(net.head.weight.device)
            opt.add_param_group({"params": list(net.head2.parameters())})

    return add_head2


def remove_head2(i, net, opt):
    if i == 6:
        del net.head2  # NOTE: its parameters stay in the optimizer, which no gradient reaches any more


def freeze_and_unfreeze(i, net, opt):
    if i == 4:
        net.emb.weight.requires_grad_(False)
    if i == 8:
        net.emb.weight.requires_grad_(True)


def add_and_remove_a_parameter(i, net, opt):
    if i == 4:
        net.temperature = nn.Parameter(torch.tensor(1.5, device=net.head.weight.device))
        opt.add_param_group({"params": [net.temperature]})
    if i == 9:
        del net.temperature


def add_an_attribute(i, net, opt):
    if i == 3:
        net.halve = True


# --- judging a run against eager's -------------------------------------------------------------------


def train_state(net: nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """Every parameter the model or the optimizer holds, with its AdamW state, by name (a removed module's under the
    name it had in the optimizer's group)."""
    names = {id(p): n for n, p in net.named_parameters()}
    state = {}
    for g, group in enumerate(opt.param_groups):
        for k, p in enumerate(group["params"]):
            s = opt.state.get(p, {})
            state[names.get(id(p), f"group{g}.{k}")] = {
                "value": p.detach().clone(), "step": float(s["step"]) if "step" in s else None,
                **{m: s[m].clone() for m in ("exp_avg", "exp_avg_sq") if m in s}}
    return state


def assert_same_training(losses: list, state: dict, eager_losses: list, eager_state: dict) -> None:
    """The run's losses and final state equal eager's (AdamW's step counts exactly)."""
    assert len(losses) == len(eager_losses)
    assert_equal(torch.stack([torch.as_tensor(v).cpu() for v in losses]),
                 torch.stack([torch.as_tensor(v).cpu() for v in eager_losses]), tolerance=BOUND, label="losses",
                 reference="eager's")
    assert state.keys() == eager_state.keys()
    for name, s in eager_state.items():
        assert state[name].keys() == s.keys(), name
        assert_equal(state[name]["step"], s["step"], tolerance=EXACT, label=f"{name}: AdamW's step count",
                     reference="eager's")
        for k in s.keys() - {"step"}:
            assert_equal(state[name][k].cpu(), s[k].cpu(), tolerance=BOUND, label=f"{name}'s {k}",
                         reference="eager's")
