"""`thunder_nb.notebook.reach.bind`: each run gets its own copy of the modules and trainable tensors a function reaches."""

from __future__ import annotations

import functools

import torch
from torch import nn

from thunder_nb.diagnosis.failures import is_user_file
from thunder_nb.notebook.reach import bind

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
SCALE = torch.ones(1, requires_grad=True)
X = torch.randn(3, 4)


def _loss(out):
    return (out * SCALE).pow(2).mean()


def step(x):
    """Reaches MODEL and SCALE only through globals (one of them inside a helper)."""
    return _loss(MODEL(x))


def _ping(n):
    return MODEL(X).sum() if n == 0 else _pong(n - 1)


def _pong(n):
    return _ping(n)


def _train(bound, steps=1, lr=0.1):
    for _ in range(steps):
        args, kwargs = bound.inputs()
        bound.fn(*args, **kwargs).backward()
        bound.sgd_step(lr)


def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_globals_and_helpers_are_followed_and_copied():
    before = [p.detach().clone() for p in MODEL.parameters()]
    b = bind(step, (X,))
    assert list(b.trainable) == ["MODEL.0.weight", "MODEL.0.bias", "MODEL.2.weight", "MODEL.2.bias", "SCALE"]
    assert b.copied == ("MODEL", "SCALE") and b.fn is not step and b.fn.__code__ is step.__code__
    _train(b)
    assert all(p.grad is None for p in MODEL.parameters()) and SCALE.grad is None  # the user's own: untouched
    assert all(torch.equal(p, q) for p, q in zip(before, MODEL.parameters()))
    assert not torch.equal(b.trainable["MODEL.0.weight"], MODEL[0].weight)  # the copy took the step


def test_two_binds_never_see_each_other():
    a, b = bind(step, (X,)), bind(step, (X,))
    _train(a, steps=3)
    _train(b, steps=1)
    assert not torch.equal(a.trainable["SCALE"], b.trainable["SCALE"])
    c = bind(step, (X,))
    _train(c, steps=1)
    assert all(torch.equal(b.trainable[k], c.trainable[k]) for k in b.trainable)  # same steps, same values


def test_closures_methods_partials_and_defaults():
    def make(net):
        def inner(x, bias=SCALE):
            return net(x).sum() + bias.sum()
        return inner

    b = bind(make(MODEL), (X,))
    assert list(b.trainable) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "inner default"]
    bound_method = bind(MODEL.forward, (X,))
    assert list(bound_method.trainable)[0] == "0.weight" and bound_method.fn.__self__ is not MODEL
    partial = bind(functools.partial(lambda w, x: (x @ w).sum(), torch.randn(4, 2, requires_grad=True)), (X,))
    assert len(partial.trainable) == 1


def test_shared_parameters_stay_shared_in_the_copy():
    lin = nn.Linear(4, 4)
    tied = nn.Sequential(lin, nn.Tanh(), lin)
    b = bind(lambda x: tied(x).sum() + lin.weight.sum(), (X,))
    lin_copy, tied_copy = sorted(b.modules, key=lambda m: isinstance(m, nn.Sequential))
    assert tied_copy[0] is tied_copy[2] is lin_copy and lin_copy is not lin
    assert len(b.trainable) == 2  # lin's weight and bias, once each, whichever name found them first


def test_arguments_weights_persist_and_data_is_fresh_each_call():
    w = torch.randn(4, 2, requires_grad=True)
    b = bind(lambda x, w: x.add_(1).matmul(w).sum(), (X.clone(), w))
    assert list(b.trainable) == ["w"] and b.trainable["w"] is not w
    (x1, w1), _ = b.inputs()
    (x2, w2), _ = b.inputs()
    assert w1 is w2 is b.trainable["w"]  # the run's own weight, every call
    assert x1 is not x2 and torch.equal(x1, x2)  # data cloned per call, so in-place updates do not pile up
    b.fn(x1, w1)
    assert not torch.equal(x1, x2)


def test_mutual_recursion_ends_on_the_copies():
    b = bind(_ping, (3,))
    assert list(b.trainable)[:1] == ["MODEL.0.weight"]
    new_pong = b.fn.__globals__["_pong"]
    assert new_pong is not _pong and new_pong.__globals__["_ping"] is b.fn  # the cycle points at the copies
    b.fn(3).backward()
    assert MODEL[0].weight.grad is None and b.trainable["MODEL.0.weight"].grad is not None


def test_nothing_to_copy_keeps_the_function():
    def pure(x, n=2):
        return x.sin() * n

    cyclic = []
    cyclic.append(cyclic)
    b = bind(pure, (X, cyclic))
    assert b.fn is pure and b.trainable == {} and b.copied == ()


def test_user_code_is_told_from_libraries():
    assert is_user_file(__file__) and is_user_file("<ipython-input-3-abc>") and is_user_file("/tmp/ipykernel_1/2.py")
    assert not is_user_file(torch.__file__) and not is_user_file(functools.__file__)
    assert not is_user_file("<frozen importlib._bootstrap>")


def test_grads_are_copies_so_a_record_of_them_holds_no_graph_memory():
    """`Bound.grads` copies: a comparison keeps them, and a kept gradient lent by a graph would hold that graph."""
    b = bind(step, (X,))
    args, kwargs = b.inputs()
    b.fn(*args, **kwargs).backward()
    grads = b.grads()
    assert set(grads) == set(b.trainable) and all(g is not None for g in grads.values())
    for name, t in b.trainable.items():
        assert grads[name] is not t.grad and torch.equal(grads[name], t.grad)
        assert grads[name].untyped_storage().data_ptr() != t.grad.untyped_storage().data_ptr()
    b.zero_grad()
    assert all(g is not None for g in grads.values())
