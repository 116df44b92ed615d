"""Weight normalization (``nn.utils.parametrizations.weight_norm``, the older ``nn.utils.weight_norm``) and a call
with ``*`` over a generator trace under thunder and thunder-nb and compute as eager (`thunder_nb.internals.star_args`,
`thunder_nb.internals.weight_norm`): thunder 0.2.6 failed PyTorch's parametrizations' ``self[0](*originals)`` ("object
of type 'generator' has no len()") and had no rule for ``torch._weight_norm``."""

from __future__ import annotations

import pytest
import thunder
import torch

from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.diagnosis.tolerances import EXACT
from thunder_nb.internals import star_args, weight_norm

P = torch.nn.utils.parametrizations

#: (name, a model, its input's shape)
MODELS = {
    "a linear layer": (lambda: torch.nn.Sequential(P.weight_norm(torch.nn.Linear(8, 16)), torch.nn.Tanh(),
                                                   torch.nn.Linear(16, 1)), (4, 8)),
    "a convolution, one norm": (lambda: torch.nn.Sequential(P.weight_norm(torch.nn.Conv1d(2, 4, 3), dim=None),
                                                            torch.nn.Flatten(), torch.nn.Linear(24, 1)), (4, 2, 8)),
    "a convolution, norms along dim 1": (lambda: torch.nn.Sequential(P.weight_norm(torch.nn.Conv1d(2, 4, 3), dim=1),
                                                                     torch.nn.Flatten(), torch.nn.Linear(24, 1)),
                                         (4, 2, 8)),
    "the older forward pre-hook": (lambda: torch.nn.Sequential(torch.nn.utils.weight_norm(torch.nn.Linear(8, 16)),
                                                               torch.nn.Tanh(), torch.nn.Linear(16, 1)), (4, 8)),
}


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated")  # NOTE: PyTorch's, eager's too
@pytest.mark.parametrize("case", MODELS)
def test_a_weight_normalized_model_and_its_gradients_equal_eagers(case):
    assert star_args.installed() and weight_norm.installed()  # NOTE: the session's conftest, as an entry point does
    make, shape = MODELS[case]
    torch.manual_seed(0)
    model = make().double()
    x = torch.randn(*shape, dtype=torch.float64)

    def run(fn):
        model.zero_grad()
        out = fn(x)
        out.sum().backward()
        return out, {name: p.grad.clone() for name, p in model.named_parameters()}

    assert_equal(run(thunder.jit(model)), run(model), label=f"{case}: output and gradients")


def test_a_weight_normalized_layer_trains_under_jit_step_as_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(P.weight_norm(torch.nn.Linear(8, 16)), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    assert_jit_step_trains_as_eager(net, lambda model, x: model(x).square().mean())


def test_a_call_with_star_over_a_generator_traces_as_python_makes_it():
    def stacked(x):
        return torch.cat(tuple(x * i for i in range(3))) + torch.stack(*(pair for pair in [[x, x]])).sum(0).repeat(3)

    x = torch.randn(4)
    assert_equal(thunder.jit(stacked)(x), stacked(x), tolerance=EXACT, label="unpacked generator")
