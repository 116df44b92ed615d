"""``torch.eye``, ``F.normalize`` and in-place tensor methods in traced code (`thunder_nb.internals.tensor_api`):
thunder 0.2.6 has no rule for ``torch.eye`` ("Trying to call function torch.eye, but it is not yet supported"), none
for 66 in-place methods whose op it has (``x.sigmoid_()``: "Unknown attribute sigmoid_") nor ``x.fill_(v)``, and its
``F.normalize`` gave a zero vector a NaN gradient where eager's is 0. An orthogonality penalty, a masked diagonal,
normalized features with an all-zero row and the in-place methods now train as eager, through thunder and through
`jit_step`. The same kernels run: exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from programs import assert_jit_step_trains_as_eager, assert_thunder_as_eager
from thunder_nb.diagnosis.tolerances import dtype_tolerance
from thunder_nb.internals import tensor_api

EYES = {
    "an orthogonality penalty": lambda w: ((w[:, :4] @ w[:, :4].T - torch.eye(4)) ** 2).sum(),
    "rectangular, times a weight": lambda w: (w[:, :3] * torch.eye(4, 3)).sum() + w.square().sum(),
    "float64": lambda w: (torch.eye(4, dtype=torch.float64) @ w.double()).square().sum(),
    "a boolean mask": lambda w: w.masked_fill(torch.eye(4, 6, dtype=torch.bool), 0).square().sum(),
    "into out=": lambda w: (w[:, :4] + torch.eye(4, out=torch.empty(4, 4))).square().sum(),
    "int32, promoted": lambda w: (w[:, :2] * torch.eye(4, 2, dtype=torch.int32)).square().sum(),
}


@pytest.mark.parametrize("name", list(EYES))
def test_eye_in_a_differentiated_function_is_eagers(name):
    assert tensor_api.installed()  # NOTE: the conftest's check_versions
    assert_thunder_as_eager(EYES[name], torch.randn(4, 6, generator=torch.Generator().manual_seed(0)))


def _zero_first_row(w):
    return w * (torch.arange(w.shape[0]) > 0)[:, None]


NORMALIZED = {
    "p=2, a zero row": lambda w: F.normalize(_zero_first_row(w), dim=1),
    "p=1, a zero row": lambda w: F.normalize(_zero_first_row(w), p=1.0, dim=1),
    "p=3, over two dims": lambda w: F.normalize(_zero_first_row(w).view(2, 2, 6), p=3.0, dim=(1, 2)),
    "ReLU features": lambda w: F.normalize(F.relu(w - 1), dim=1),
    "no zero, dim 0": lambda w: F.normalize(w, dim=0),
}


@pytest.mark.parametrize("name", list(NORMALIZED))
def test_normalize_has_eagers_gradient_at_a_zero_vector(name):
    g = torch.Generator().manual_seed(0)
    w, weights = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    assert_thunder_as_eager(NORMALIZED[name], w, loss=lambda y: (y.reshape(4, 6) * weights).sum())


IN_PLACE = {
    "sigmoid_": lambda w: (w * 2).sigmoid_(),
    "clamp_min_ and clamp_max_": lambda w: (w * 2).clamp_min_(-0.5).clamp_max_(0.5),
    "nan_to_num_": lambda w: (w.log()).nan_to_num_(0.0, 3.0, -3.0),
    "index_fill_ of a row": lambda w: (w * 1).index_fill_(0, torch.tensor([1, 3]), -1.0),
    "masked_scatter_": lambda w: (w * 1).masked_scatter_(w > 0, w.flip(0) * 3),
    "multiply_, divide_ and subtract_": lambda w: (w * 1).multiply_(w).divide_(w.abs() + 1).subtract_(w, alpha=2),
    "fill_ with a number, through a slice": lambda w: _filled(w * 1, 0.25),
    "fill_ with a 0-dim tensor": lambda w: (w * 1).fill_(w.sum()),
    "addmm_": lambda w: (w[:, :4] * 1).addmm_(w[:, :3], w[:3, :4], beta=0.5),
}


def _filled(t, value):
    t[1:3].fill_(value)
    return t


@pytest.mark.parametrize("name", list(IN_PLACE))
def test_an_in_place_method_thunder_lacks_has_eagers_value_and_gradient(name):
    g = torch.Generator().manual_seed(0)
    w, weights = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    assert_thunder_as_eager(IN_PLACE[name], w, loss=lambda y: (y * weights[:, :y.shape[1]]).sum())


def test_nn_softmin_has_eagers_value_and_gradient():
    """``nn.Softmin`` passes ``_stacklevel=5`` to ``F.softmin``, which thunder 0.2.6 maps to a symbol without it. The
    value is eager's kernel's (exact); the gradient thunder's own softmax rule (float32's tolerance)."""
    g = torch.Generator().manual_seed(0)
    w, weights = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    assert_thunder_as_eager(torch.nn.Softmin(1), w, loss=lambda y: (y * weights).sum(),
                            gradient=dtype_tolerance(torch.float32))


UNFOLDED = {
    "frames without overlap": lambda w: w.unfold(1, 2, 2) * 2,
    "overlapping windows, summed": lambda w: w.unfold(1, 3, 1).sum(-1),
    "image patches, both dims": lambda w: w.view(1, 1, 4, 6).unfold(2, 2, 2).unfold(3, 3, 3).reshape(-1, 6),
    "torch.Tensor.unfold, a negative dim": lambda w: torch.Tensor.unfold(w, -1, 4, 2),
}


@pytest.mark.parametrize("name", list(UNFOLDED))
def test_tensor_unfold_has_eagers_value_and_gradient(name):
    """thunder 0.2.6 traced ``x.unfold(dim, size, step)`` as ``F.unfold`` (im2col), which failed, and had no gradient
    rule for its own ``prims.unfold``. The windows are eager's (exact); their gradient, added back with ``index_add``,
    within float32's tolerance (overlaps summed in another order)."""
    assert_thunder_as_eager(UNFOLDED[name], torch.randn(4, 6, generator=torch.Generator().manual_seed(0)),
                            loss=lambda y: (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(1))).sum(),
                            gradient=dtype_tolerance(torch.float32))


def test_every_in_place_method_whose_op_thunder_has_is_made():
    from thunder.torch.langctx import _method_name_to_fn_map as methods

    assert not tensor_api._missing_in_place(methods) and "fill_" in methods and "sigmoid_" in methods
    assert "unsqueeze_" not in methods  # NOTE: the in-place view ops change no value: not made from their op


@pytest.mark.parametrize("padding_idx", [-1, -3, 2, None])
def test_embeddings_padding_row_counted_from_the_end_gets_eagers_gradient(padding_idx):
    """thunder 0.2.6 read ``padding_idx=-1`` as "no padding row" (`thunder_nb.internals.embedding`): the last row
    trained on its gradient, where eager's is zero there."""
    from thunder_nb.internals import embedding

    assert embedding.installed()
    ids = torch.tensor([[0, 5, 2, 5], [3, 0, 3, 2]])
    weights = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(1))
    assert_thunder_as_eager(lambda w: F.embedding(ids, w, padding_idx=padding_idx),
                            torch.randn(6, 5, generator=torch.Generator().manual_seed(0)),
                            loss=lambda y: (y * weights).sum())


def test_an_orthogonality_penalty_trains_under_jit_step_as_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def loss(model, x):
        w = model[0].weight
        return model(x).square().mean() + 0.1 * (w @ w.T - torch.eye(8)).square().sum()

    assert_jit_step_trains_as_eager(net, loss)
