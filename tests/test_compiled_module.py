"""What `thunder_nb.jit(model)` returns is written to as the model is: an attribute set or deleted on it is the model's,
as with torch.compile's module (`thunder_nb.internals.write_through`). thunder's own module kept such an attribute on
itself, where the traced forward never read it: a head set on it was never trained, without an error."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F
from torch import nn

import thunder_nb
from thunder_nb.diagnosis.judge import MODEL, assert_equal
from thunder_nb.testing.modes import capturing


class Net(nn.Module):
    """A model whose forward reads what a loop may set on it: a second head, a scale."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 4)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x)) * self.scale
        out = self.head(h)
        if hasattr(self, "head2"):
            out = out + self.head2(h)
        return out


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)


def _train(compile_model, *, on_the_model: bool = False) -> dict:
    """Six SGD steps; before step 2 a head is set on what the loop holds (``on_the_model``: on the model under it),
    before step 4 the scale; (the losses, the model's state, the names the loop's handle lists as parameters)."""
    torch.manual_seed(0)
    model = Net()
    handle = compile_model(model)
    opt = torch.optim.SGD(handle.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i in range(6):
        if i == 2:
            torch.manual_seed(1)
            head = nn.Linear(16, 4)
            setattr(model if on_the_model else handle, "head2", head)
            opt.add_param_group({"params": list(head.parameters())})
        if i == 4:
            setattr(model if on_the_model else handle, "scale", 0.5)
        x, y = _batch(i)
        opt.zero_grad()
        loss = F.cross_entropy(handle(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return {"losses": torch.stack(losses), "state": {k: v.clone() for k, v in model.state_dict().items()},
            "parameters": sorted(n for n, _ in handle.named_parameters())}


@pytest.mark.parametrize("capture", [pytest.param(False, marks=pytest.mark.slow), "emulated"])
def test_a_head_and_a_flag_set_on_the_compiled_module_are_the_models_and_train_as_in_eager(capture):
    eager = _train(lambda m: m)
    # NOTE: the yardstick: thunder without graphs, given the same writes where its module reads them
    plain = _train(thunder.jit, on_the_model=True)
    with capturing(capture):
        got = _train(thunder_nb.jit)
    assert got["parameters"] == eager["parameters"]
    assert_equal(got, eager, without_graphs=plain, tolerance=MODEL)


def test_a_write_reaches_the_model_and_thunders_own_attributes_stay_on_its_module():
    model = Net()
    compiled = thunder_nb.jit(model)
    x, _ = _batch(0)
    compiled.head2 = nn.Linear(16, 4)
    compiled.scale = 2.0
    assert "head2" in dict(model.named_children()) and model.scale == 2.0 and "scale" not in vars(compiled)
    assert_equal(compiled(x), model(x), tolerance=MODEL)
    del compiled.head2
    assert not hasattr(model, "head2")
    assert_equal(compiled(x), model(x), tolerance=MODEL)
    compiled.eval()  # NOTE: nn.Module.train sets `training` on the module and each child, the model among them
    assert not compiled.training and not model.training
    forward = compiled._forward_fn
    compiled._forward_fn = forward  # NOTE: a private name (thunder's) stays on its module
    assert vars(compiled)["_forward_fn"] is forward and "_forward_fn" not in vars(model)
    assert type(compiled).__name__ == "ThunderModule" and isinstance(compiled, thunder.ThunderModule)


def test_the_compiled_modules_lookups_are_still_proved_by_the_walks_guard():
    """The write-through module looks its members up as thunder's own (`internals.is_thunder_module`): its prologue's
    walk reads its dicts and makes its guard, as for ``thunder.jit(model)``, rather than asking its methods on every
    call."""
    compiled = thunder_nb.jit(Net())
    x, _ = _batch(0)
    for _ in range(3):
        compiled(x)
    walk = next(v for k, v in thunder.last_prologue_traces(compiled)[-1].python_ctx().items()
                if k.startswith("thunder_nb_module_walk"))
    assert walk._guard is not None  # NOTE: the later calls were proved by the guard


def test_thunders_jit_with_the_fixed_transform_writes_through_too():
    """The fixed transform makes the module write through where thunder makes it (`transform_module`): with
    ``thunder.jit(model, transforms=[FixedCUDAGraphTransform()])`` as with `thunder_nb.jit`, and after
    ``thunder.distributed.ddp`` or ``fsdp``, which jit the model again with the same transforms."""
    model = Net()
    compiled = thunder.jit(model, transforms=[thunder_nb.FixedCUDAGraphTransform(capture=False)])
    compiled.scale = 3.0
    assert model.scale == 3.0 and "scale" not in vars(compiled)
    other = Net()
    plain = thunder.jit(other)  # NOTE: thunder's own module, left as thunder makes it
    plain.scale = 3.0
    assert "scale" in vars(plain) and other.scale == 1.0
