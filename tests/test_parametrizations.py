"""PyTorch's parametrizations (weight norm, spectral norm, orthogonal; the older ``nn.utils.weight_norm`` and
``spectral_norm`` hooks) and a call with ``*`` over a generator trace under thunder and thunder-nb and compute as eager
(`thunder_nb.internals.star_args`, `thunder_nb.internals.weight_norm`, `thunder_nb.internals.tensor_api`): thunder
0.2.6 failed their ``self[0](*originals)`` ("object of type 'generator' has no len()"), had no rule for
``torch._weight_norm``, and lacked ``x.H``, ``clone(memory_format=torch.contiguous_format)`` and
``F.normalize(out=...)``, which spectral norm's power iteration uses."""

from __future__ import annotations

import pytest
import thunder
import torch

from programs import assert_jit_step_trains_as_eager
from thunder_nb.diagnosis.judge import assert_equal
from thunder_nb.diagnosis.tolerances import EXACT
from thunder_nb.internals import star_args, tensor_api, weight_norm

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
    "spectral norm": (lambda: torch.nn.Sequential(P.spectral_norm(torch.nn.Linear(8, 16)), torch.nn.Tanh(),
                                                  torch.nn.Linear(16, 1)), (4, 8)),
    "spectral norm of a convolution": (lambda: torch.nn.Sequential(P.spectral_norm(torch.nn.Conv1d(2, 4, 3)),
                                                                   torch.nn.Flatten(), torch.nn.Linear(24, 1)),
                                       (4, 2, 8)),
    "the older spectral norm hook": (lambda: torch.nn.Sequential(torch.nn.utils.spectral_norm(torch.nn.Linear(8, 16)),
                                                                 torch.nn.Tanh(), torch.nn.Linear(16, 1)), (4, 8)),
    "orthogonal": (lambda: torch.nn.Sequential(P.orthogonal(torch.nn.Linear(8, 8)), torch.nn.Tanh(),
                                               torch.nn.Linear(8, 1)), (4, 8)),
}


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated")  # NOTE: PyTorch's, eager's too
@pytest.mark.parametrize("case", MODELS)
def test_a_parametrized_model_its_gradients_and_buffers_equal_eagers(case):
    """Two calls (spectral norm's power iteration updates its vectors, buffers, at each): the outputs, the gradients
    and the buffers after them."""
    assert star_args.installed() and weight_norm.installed() and tensor_api.installed()  # NOTE: the conftest's
    make, shape = MODELS[case]

    def seeded():  # NOTE: made twice, not deep-copied: the older weight_norm hook's weight is no leaf
        torch.manual_seed(0)
        return make().double()

    model, eager_model = seeded(), seeded()
    x = torch.randn(*shape, dtype=torch.float64)

    def run(module, fn):
        outs = []
        for _ in range(2):
            module.zero_grad()
            outs.append(fn(x))
            outs[-1].sum().backward()
        return outs, {n: p.grad.clone() for n, p in module.named_parameters()}, dict(module.named_buffers())

    assert_equal(run(model, thunder.jit(model)), run(eager_model, eager_model),
                 label=f"{case}: outputs, gradients, buffers")


def test_a_weight_normalized_layer_trains_under_jit_step_as_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(P.weight_norm(torch.nn.Linear(8, 16)), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    assert_jit_step_trains_as_eager(net, lambda model, x: model(x).square().mean())


def test_a_call_with_star_over_a_generator_traces_as_python_makes_it():
    def stacked(x):
        return torch.cat(tuple(x * i for i in range(3))) + torch.stack(*(pair for pair in [[x, x]])).sum(0).repeat(3)

    x = torch.randn(4)
    assert_equal(thunder.jit(stacked)(x), stacked(x), tolerance=EXACT, label="unpacked generator")
