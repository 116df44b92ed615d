"""The prologue's module lookups along their paths (`thunder_nb.cudagraph.prologue`): the same objects as ``Module.get_*``."""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
from torch import nn
from torch.nn.utils import parametrize

from thunder_nb.fix import FixedCUDAGraphTransform
from thunder_nb.cudagraph.prologue import (
    ModuleWalk,
    StructureChanged,
    check_tensor,
    tensor_checks,
    value_checks,
)
from thunder_nb.testing.emulate import emulated_capture
from thunder_nb.testing.models import model_case
from thunder_nb.testing.modes import make_transform
from thunder_nb.diagnosis.judge import assert_equal


class _Shadowed(nn.Module):
    """A module whose class has a property named like a submodule it registers (getattr finds the property)."""

    def __init__(self):
        super().__init__()
        self._modules["inner"] = nn.Linear(2, 2)

    @property
    def inner(self):
        return "the property"


class _OwnGetattr(nn.Module):
    """A module that looks attributes up its own way."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def __getattr__(self, name):
        if name == "lin":
            return self._modules["other"]
        return super().__getattr__(name)


class _Square(nn.Module):
    def forward(self, w):
        return w * w


def _tree() -> nn.Module:
    root = nn.Module()
    root.block = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    root.block.register_buffer("steps", torch.zeros(()))
    root.block.register_buffer("empty", None)
    root.add_module("gone", None)
    root.shadowed = _Shadowed()
    root.own = _OwnGetattr()
    root.own.other = nn.Linear(2, 2)
    root.param_named_like_module = nn.Linear(2, 2)
    object.__setattr__(root.param_named_like_module, "weight", torch.ones(2, 2))  # NOTE: the instance dict first
    root.para = nn.Linear(2, 2)
    parametrize.register_parametrization(root.para, "weight", _Square())
    return root


class _Holder(nn.Module):
    """A module that never ran ``nn.Module.__init__``: ``_modules`` only (``Module.__getattr__`` skips the rest)."""

    def __init__(self, lin):
        object.__setattr__(self, "_modules", {"lin": lin})


def _same(fast, method):
    """``fast()`` is the very object ``method()`` returns, or both raise AttributeError."""
    try:
        expected = method()
    except AttributeError:
        with pytest.raises(AttributeError):
            fast()
        return "raises"
    assert fast() is expected
    return "found"


def _lookup(root, kind: str, target: str):
    """``root.get_<kind>(target)`` as a prologue's first call finds it: a `ModuleWalk` of that one lookup."""
    return ModuleWalk([(kind, target)])(root)[0]


def _check_every_lookup(root):
    outcomes = []
    modules = [n for n, _ in root.named_modules() if n] + ["gone", "shadowed.inner", "own.lin", "missing", "block.0.x",
                                                            "block.steps", "block.0.weight"]
    for t in modules:
        outcomes.append(_same(lambda: _lookup(root, "submodule", t), lambda: root.get_submodule(t)))
    params = [n for n, _ in root.named_parameters()] + [
        "para.weight", "param_named_like_module.weight", "own.lin.weight", "block.steps", "block.0.missing", "nowhere.w",
        "block.0"]
    for t in params:
        outcomes.append(_same(lambda: _lookup(root, "parameter", t), lambda: root.get_parameter(t)))
    buffers = [n for n, _ in root.named_buffers()] + ["block.empty", "block.0.weight", "block.none", "para.x", "block.0"]
    for t in buffers:
        outcomes.append(_same(lambda: _lookup(root, "buffer", t), lambda: root.get_buffer(t)))
    return outcomes


def test_each_lookup_returns_what_the_module_method_returns():
    root = _tree()
    outcomes = _check_every_lookup(root)
    # NOTE: both kinds of case were met (a test whose every case raised would prove little)
    assert outcomes.count("found") >= 10 and outcomes.count("raises") >= 6


def test_lookups_follow_changes_to_classes_and_instances_made_after_the_first_call():
    root = _tree()
    _check_every_lookup(root)
    # NOTE: a fresh walk finds what the methods find after: a class that gains a property named like a submodule, a
    # root whose instance gets its own get_parameter, a module swapped for one that looks attributes up its own way
    _Shadowed.block_like = property(lambda self: "the property")
    try:
        root.shadowed._modules["block_like"] = nn.Linear(2, 2)
        nn.LayerNorm.weight = property(lambda self: "shadowed")
        seen = []
        root.get_parameter = lambda target: seen.append(target) or nn.Module.get_parameter(root, target)
        assert _lookup(root, "parameter", "block.0.weight") is root.block[0].weight
        assert seen == ["block.0.weight"]
        del root.get_parameter
        with pytest.raises(AttributeError):
            _lookup(root, "parameter", "block.1.weight")  # NOTE: the property wins now
        root.block[0] = _OwnGetattr()
        root.block[0].other = nn.Linear(2, 2)
        outcomes = _check_every_lookup(root)
        assert _lookup(root, "submodule", "block.0.lin") is root.block[0].other
        assert outcomes.count("found") >= 10
    finally:
        del _Shadowed.block_like
        del nn.LayerNorm.weight


def test_shadowing_and_own_lookups_go_to_the_method():
    root = _tree()
    assert _lookup(root, "submodule", "own.lin") is root.own.other  # NOTE: its own __getattr__
    with pytest.raises(AttributeError):
        _lookup(root, "submodule", "shadowed.inner")  # NOTE: the property wins, not _modules
    with pytest.raises(AttributeError):
        _lookup(root, "parameter", "param_named_like_module.weight")
    assert _lookup(root, "buffer", "block.empty") is None
    other = nn.Module()
    other.holder = _Holder(nn.Linear(2, 2))  # NOTE: no _parameters in its __dict__: the walk must not stumble on it
    assert _lookup(other, "parameter", "holder.lin.weight") is other.get_parameter("holder.lin.weight")


_LOOKUPS = [("submodule", "block"), ("submodule", "block.1"), ("parameter", "block.0.weight"),
            ("parameter", "block.1.bias"), ("buffer", "block.steps"), ("parameter", "head.weight")]


def _plain_tree() -> nn.Module:
    root = nn.Module()
    root.block = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    root.block.register_buffer("steps", torch.zeros(()))
    root.head = nn.Linear(4, 2)
    return root


def _walk_is_the_methods(walk: ModuleWalk, root: nn.Module) -> tuple | None:
    """``walk(root)`` returns the very objects the methods return, or both raise AttributeError (then None)."""
    try:
        expected = [getattr(root, f"get_{kind}")(target) for kind, target in _LOOKUPS]
    except AttributeError:
        with pytest.raises(AttributeError):
            walk(root)
        return None
    found = walk(root)
    assert len(found) == len(expected) and all(a is b for a, b in zip(found, expected))
    return found


class _LooksUpItsOwnWay(nn.Sequential):
    def __getattr__(self, name):
        return super().__getattr__("0" if name == "1" else name)


def _change_class_of_block(root):
    root.block.__class__ = _LooksUpItsOwnWay


@pytest.mark.parametrize("structure", [False, True], ids=["lookups", "with-structure"])
@pytest.mark.parametrize("change, structural", [
    pytest.param(lambda root: setattr(root.head, "weight", nn.Parameter(torch.ones(2, 4))), False,
                 id="parameter-replaced"),
    pytest.param(lambda root: root.block.__setitem__(1, nn.LayerNorm(4)), False, id="submodule-replaced"),
    pytest.param(lambda root: setattr(root.block, "steps", torch.ones(())), False, id="buffer-replaced"),
    pytest.param(lambda root: object.__setattr__(root.block[0], "weight", torch.ones(4, 3)), True,
                 id="instance-attribute"),
    pytest.param(lambda root: setattr(nn.LayerNorm, "bias", property(lambda self: "shadowed")), False,
                 id="class-attribute"),
    pytest.param(lambda root: setattr(nn.Module, "head", property(lambda self: "shadowed")), False,
                 id="base-class-attribute"),
    pytest.param(_change_class_of_block, True, id="class-swapped"),
    pytest.param(lambda root, w=nn.Parameter(torch.ones(1)): setattr(root, "get_parameter", lambda t: w), True,
                 id="own-method"),
])
def test_the_walk_returns_the_last_calls_objects_only_while_nothing_they_rest_on_changed(change, structural, structure):
    """After a plain walk, the next call is proved by the walk's guard (the very tuple comes back); any change that
    could make a method answer otherwise fails it, and the walk finds what the methods find. Where the walk checks
    the modules' members (the prologue's walks do), a change of them (an instance attribute added, a class swapped)
    raises `StructureChanged` instead, at every later call: the trace may have branched on them."""
    root = _plain_tree()
    walk = ModuleWalk(_LOOKUPS, structure=structure)
    first = _walk_is_the_methods(walk, root)
    assert first is not None and walk(root) is first  # NOTE: the guard passed: the last call's objects
    saved = {c: dict(vars(c)) for c in (nn.LayerNorm, nn.Module)}
    try:
        change(root)
        if structure and structural:
            for _ in range(2):
                # NOTE: or the method's own AttributeError, where a lookup that the change broke comes first
                with pytest.raises((StructureChanged, AttributeError)):
                    walk(root)
            return
        after = _walk_is_the_methods(walk, root)
        assert after is None or after is not first
        _walk_is_the_methods(walk, root)  # NOTE: again, through the guard remade where the walk was plain
    finally:
        for c, attrs in saved.items():
            for name in set(vars(c)) - set(attrs):
                delattr(c, name)
            for name in ("bias",):
                if name in attrs and vars(c).get(name) is not attrs[name]:
                    setattr(c, name, attrs[name])


def test_a_walk_that_asked_a_method_makes_no_guard_and_follows_every_change():
    root = _plain_tree()
    root.block[1].bias = nn.Parameter(torch.zeros(4))
    object.__setattr__(root.block[1], "bias", root.block[1]._parameters["bias"])  # NOTE: the instance dict first
    walk = ModuleWalk(_LOOKUPS)
    first = _walk_is_the_methods(walk, root)
    assert first is not None and walk(root) is not first  # NOTE: walked again: no guard stood for the method's answer
    object.__setattr__(root.block[1], "bias", nn.Parameter(torch.ones(4)))
    # NOTE: the method returns the instance attribute, not the registered parameter; so must the walk
    assert _walk_is_the_methods(walk, root)[3] is vars(root.block[1])["bias"]


def test_the_walk_reads_each_origin_it_is_given():
    walk = ModuleWalk(_LOOKUPS)
    a, b = _plain_tree(), _plain_tree()
    for root in (a, b, a, a, b):
        _walk_is_the_methods(walk, root)
    shared = nn.Module()
    shared.block, shared.head = a.block, a.head  # NOTE: another origin holding the same objects: the same answers
    assert _walk_is_the_methods(walk, shared) is not None


def test_the_tensor_check_passes_and_fails_where_thunders_does():
    from thunder.executors.pythonex import _check_tensor_shape_and_metadata_impl as thunders

    class LooksLikeATensor:  # NOTE: every attribute the checks read, but no tensor: thunder's check fails it
        shape, dtype, requires_grad, device = torch.Size((2, 3)), torch.float32, False, torch.device("cpu")

    values = [torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(2, 3, dtype=torch.float64), torch.zeros(6),
              nn.Parameter(torch.zeros(2, 3)), torch.zeros(2, 3).as_strided((2, 3), (1, 2)), torch.zeros(()), 2.0,
              LooksLikeATensor()]
    expectations = [((2, 3), "cpu", torch.float32, False), ((2, 3), "cpu", torch.float32, True), ((3, 2), "cpu",
                    torch.float32, False), ((2, 3), "cuda:0", torch.float32, False), ((2, 3), "cpu", torch.float64, False),
                    ((), "cpu", torch.float32, False), ((2, 3, 1), "cpu", torch.float32, False)]
    outcomes = set()
    for v in values:
        for e in expectations:
            try:
                thunders(v, *e)
                expected = "passes"
            except AssertionError:
                expected = "fails"
            got = []
            for check in (lambda: check_tensor(v, *e), lambda: tensor_checks([e, e])(v, v),
                          lambda: tensor_checks([((2, 3), "cpu", torch.float32, False), e])(torch.zeros(2, 3), v)):
                try:
                    check()
                    got.append("passes")
                except AssertionError:
                    got.append("fails")
            assert got == [expected] * 3, (v, e)
            outcomes.add(expected)
    assert outcomes == {"passes", "fails"}


def test_the_batched_value_check_passes_and_fails_where_thunders_do():
    """Numbers of another type (True against 1, 1.0 against 1), NaN, -0.0 and str subclasses, as thunder's checks judge them."""
    from thunder.executors.pythonex import _check_number_type_and_value_impl as number
    from thunder.executors.pythonex import _check_string_value_impl as string

    class Name(str):
        pass

    numbers = [1, True, 1.0, 0, False, -0.0, 0.0, float("nan"), 2, 1 + 0j]
    strings = ["tanh", Name("tanh"), "none"]
    outcomes = set()
    for values, check in ((numbers, number), (strings, string)):
        for v in values:
            for e in values:
                try:
                    check(v, e)
                    expected = "passes"
                except RuntimeError:
                    expected = "fails"
                try:
                    # NOTE: with a passing value on each side of it, batched with the other kind
                    value_checks([3, e, "x"], [False, check is string, True])(3, v, "x")
                    got = "passes"
                except AssertionError:
                    got = "fails"
                assert got == expected, (v, e)
                outcomes.add(got)
    assert outcomes == {"passes", "fails"}


def _emulated(**options) -> FixedCUDAGraphTransform:
    return make_transform(FixedCUDAGraphTransform, "emulated", **options)


def _prologue_text(jfn) -> str:
    return str(thunder.last_prologue_traces(jfn)[-1])


def _replace_nanogpt(model, new):
    model.transformer.h[0].mlp.c_fc.weight = nn.Parameter(new["weight"].clone())
    model.transformer.h[0].ln_2 = nn.LayerNorm(128)
    with torch.no_grad():
        model.transformer.h[0].ln_2.weight.mul_(1.5)


def _replace_llama2(model, new):
    model.layers[0].feed_forward.w1.weight = nn.Parameter(new["weight"].clone())
    model.freqs_cos = model.freqs_cos * 0.5  # NOTE: a buffer's name: Module.__setattr__ registers the new tensor


@pytest.mark.parametrize("name, replace, shape_of", [
    ("nanoGPT", _replace_nanogpt, lambda m: m.transformer.h[0].mlp.c_fc.weight.shape),
    ("llama2", _replace_llama2, lambda m: m.layers[0].feed_forward.w1.weight.shape),
])
@pytest.mark.slow
def test_a_training_step_walks_paths_and_follows_replaced_parameters_buffers_and_modules(name, replace, shape_of):
    case = model_case(name, "cpu", layers=1)  # NOTE: one block: what is replaced is in it, and each call traces it
    ref = model_case(name, "cpu", model=copy.deepcopy(case.model))
    j = thunder.jit(case.step, transforms=[_emulated()])

    def step(i):
        batch = case.make_batch(i)
        loss = j(*batch)
        loss.backward()
        expected = ref.step(*batch)
        expected.backward()
        assert_equal(loss, expected)
        for (pname, p), q in zip(case.model.named_parameters(), ref.model.parameters()):
            assert_equal(p.grad, q.grad, label=pname)
            p.grad = q.grad = None

    with emulated_capture():
        step(0)
        text = _prologue_text(j)
        assert "thunder_nb_module_walk(" in text and ".get_parameter(" not in text
        assert ".get_submodule(" not in text and ".get_buffer(" not in text
        assert "thunder_nb_check_tensors(" in text and "check_tensor_metadata(" not in text
        assert "thunder_nb_check_values(" in text and "check_number_type_and_value(" not in text
        # NOTE: replaced between calls, in both models: the next call must read the new objects
        new = {"weight": torch.randn(shape_of(case.model), generator=torch.Generator().manual_seed(5)) * 0.02}
        replace(case.model, new)
        replace(ref.model, new)
        step(1)
        step(2)


@pytest.mark.slow
def test_fast_prologue_false_keeps_thunders_lookups():
    case = model_case("nanoGPT", "cpu", layers=1)
    j = thunder.jit(case.step, transforms=[_emulated(fast_prologue=False)])
    with emulated_capture():
        j(*case.make_batch(0)).backward()
    assert ".get_parameter(" in _prologue_text(j)


def test_a_jitted_module_keeps_its_own_lookups_and_equals_eager():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    jm = thunder.jit(model, transforms=[_emulated()])
    x = torch.randn(4, 8)
    with emulated_capture():
        for _ in range(2):
            assert_equal(jm(x), ref(x))


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(8, 8)

    def forward(self, x):
        return nn.functional.dropout(self.c_attn(x), 0.0, self.training)  # NOTE: reads its training flag, as nanoGPT's


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attention()
        self.mlp = nn.Sequential()
        self.mlp.c_fc, self.mlp.gelu, self.mlp.c_proj = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class _TinyGPT(nn.Module):
    """nanoGPT's nesting at a tenth of its trace: ``transformer.h[0].attn`` and ``transformer.h[0].mlp.c_fc`` are
    reached through a ModuleDict and a ModuleList, as in nanoGPT (whose own training steps
    `test_a_training_step_walks_paths_and_follows_replaced_parameters_buffers_and_modules` runs)."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(16, 8), "h": nn.ModuleList([_Block()])})
        self.lm_head = nn.Linear(8, 16)

    def forward(self, idx, targets):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(x)
        return nn.functional.cross_entropy(logits.view(-1, 16), targets.view(-1))


@pytest.mark.slow
def test_a_failed_check_still_means_a_new_trace():
    """A batch of another shape, a frozen parameter and a module in eval mode fail the rewritten checks: thunder
    traces anew, equal to eager."""
    torch.manual_seed(0)
    model = _TinyGPT()
    ref = copy.deepcopy(model)

    def step(idx, targets):  # NOTE: a function of the model, as a training step is
        return model(idx, targets)

    j = thunder.jit(step, transforms=[_emulated()])
    g = torch.Generator().manual_seed(0)
    with emulated_capture():
        for i, change in enumerate((None, "batch", "freeze", "eval")):
            if change == "freeze":
                for m in (model, ref):
                    m.transformer.h[0].mlp.c_fc.weight.requires_grad_(False)
            if change == "eval":
                for m in (model, ref):
                    m.transformer.h[0].attn.eval()  # NOTE: one module's training flag: a value check
            idx, targets = torch.randint(0, 16, (8, 6), generator=g), torch.randint(0, 16, (8, 6), generator=g)
            if change in ("batch", "freeze", "eval"):
                idx, targets = idx[:4], targets[:4]
            loss = j(idx, targets)
            loss.backward()
            expected = ref(idx, targets)
            expected.backward()
            assert_equal(loss, expected)
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                assert (p.grad is None) == (q.grad is None), name
                if p.grad is not None:
                    assert_equal(p.grad, q.grad, label=name)
                p.grad = q.grad = None
    assert thunder.cache_misses(j) == 4


def test_a_module_passed_as_an_argument_is_read_from_that_argument():
    def f(model, x):
        return model(x)

    a, b = nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    j = thunder.jit(f, transforms=[_emulated()])
    x = torch.randn(2, 4)
    with emulated_capture():
        for model in (a, b, a):
            assert_equal(j(model, x), model(x))
    assert "thunder_nb_module_walk(" in _prologue_text(j)


def test_a_symbolic_size_keeps_thunders_check():
    j = thunder.jit(lambda x: x * 2, cache="symbolic values", transforms=[_emulated()])
    with emulated_capture():
        for n in (3, 5):
            x = torch.randn(n)
            assert_equal(j(x), x * 2)
    text = _prologue_text(j)
    assert "check_tensor_metadata(" in text and "thunder_nb_check_tensors(" not in text


def test_the_batched_tensor_check_with_its_guard_passes_and_fails_where_thunders_does():
    """One check function called again and again (its C guard of a passing call's metadata in use): each call passes
    or fails as thunder's check does, a tensor given twice included."""
    from thunder.executors.pythonex import _check_tensor_shape_and_metadata_impl as thunders

    def outcome(fn) -> str:
        try:
            fn()
            return "passes"
        except AssertionError:
            return "fails"

    a = torch.zeros(2, 3)
    values = [a, torch.zeros(2, 3), torch.zeros(3, 2), torch.zeros(2, 3, dtype=torch.float64), nn.Parameter(torch.zeros(2, 3)),
              torch.zeros(2, 3).as_strided((2, 3), (1, 2)), torch.zeros(2, 3).requires_grad_(), 2.0, None]
    expectations = [((2, 3), "cpu", torch.float32, False), ((2, 3), "cpu", torch.float32, True),
                    ((2, 3), "cpu", torch.float64, False)]
    seen = set()
    for e in expectations:
        check = tensor_checks([e, e])
        for _ in range(2):
            for v in values:
                for w in (v, a):  # NOTE: the same tensor twice, then two tensors
                    expected = "passes" if all(outcome(lambda x=x: thunders(x, *e)) == "passes" for x in (v, w)) else "fails"
                    assert outcome(lambda: check(v, w)) == expected, (v, w, e)
                    seen.add(expected)
    assert seen == {"passes", "fails"}


class _Flagged(nn.Module):
    """A module whose forward reads attributes thunder checks as values: two in its instance dict, one on its class
    (read on every call, outside the walk's guard), one through a property."""

    offset = 1.0

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.scale = 2.0
        self.flag = True
        self._power = 2

    @property
    def power(self):
        return self._power

    def forward(self, x):
        y = self.inner(x) * self.scale
        if self.flag:
            y = y + self.offset
        return y ** self.power


def _flagged_changes():
    """(what, change of one module) in order; each is made to the fast, the oracle and the eager module."""
    return [
        ("nothing", lambda m: None),
        ("nothing again (the guard)", lambda m: None),
        ("a new value", lambda m: setattr(m, "scale", 3.0)),
        ("an equal value of another type", lambda m: setattr(m, "scale", 3)),
        ("back to a float", lambda m: setattr(m, "scale", 3.0)),
        ("a submodule's training flag", lambda m: m.inner.eval()),
        ("a flag", lambda m: setattr(m, "flag", False)),
        ("through a property", lambda m: setattr(m, "_power", 3)),
        ("NaN", lambda m: setattr(m, "scale", float("nan"))),
        ("NaN again", lambda m: None),
        ("a shadowing class attribute", lambda m: (delattr(m, "flag"), setattr(type(m), "flag", True))),
        ("the class attribute changed", lambda m: setattr(type(m), "offset", 5.0)),
    ]


@pytest.mark.slow  # NOTE: twelve changes, each traced anew by two jits (about 5 s)
@pytest.mark.parametrize("form", ["a function of the module", "the jitted module"])
def test_attribute_checks_moved_into_the_walk_retrace_where_thunders_prologue_does(form):
    """The checks of attributes the walk makes (in its guard, or on every call) pass and fail as thunder's prologue's:
    the same cache misses, call for call, and eager's results. A jitted module is its own origin, a
    `thunder.ThunderModule`, whose lookups read its own dicts."""
    torch.manual_seed(0)
    fast_m = _Flagged()
    oracle_m, eager_m = copy.deepcopy(fast_m), copy.deepcopy(fast_m)
    if form == "the jitted module":
        fast = thunder.jit(fast_m, transforms=[_emulated()])
        oracle = thunder.jit(oracle_m, transforms=[_emulated(fast_prologue=False)])
    else:
        fast = thunder.jit(lambda x: fast_m(x), transforms=[_emulated()])
        oracle = thunder.jit(lambda x: oracle_m(x), transforms=[_emulated(fast_prologue=False)])
    x = torch.randn(3, 4)
    try:
        with emulated_capture():
            for i, (what, change) in enumerate(_flagged_changes()):
                if what == "a shadowing class attribute":
                    delattr(fast_m, "flag"), delattr(oracle_m, "flag"), delattr(eager_m, "flag")
                    _Flagged.flag = True
                elif what == "the class attribute changed":
                    _Flagged.offset = 5.0
                else:
                    for m in (fast_m, oracle_m, eager_m):
                        change(m)
                expected = eager_m(x)
                assert_equal(fast(x), expected, label=what)
                assert_equal(oracle(x), expected, label=what)
                assert thunder.cache_misses(fast) == thunder.cache_misses(oracle), what
                if i == 1:
                    walk = next(v for k, v in thunder.last_prologue_traces(fast)[-1].python_ctx().items()
                                if k.startswith("thunder_nb_module_walk"))
                    names = {name for _, name, *_ in walk.attribute_checks}
                    assert {"scale", "flag", "_power", "training"} <= names, names
                    assert walk._guard is not None  # NOTE: the second call was proved by the guard
                    assert "check_number_type_and_value(" not in _prologue_text(fast)
        assert thunder.cache_misses(fast) >= 7
    finally:
        _Flagged.offset = 1.0
        if "flag" in vars(_Flagged):
            del _Flagged.flag


def test_a_thunder_modules_walk_reads_its_dicts_and_its_guard_follows_them():
    """A `thunder.ThunderModule` answers lookups from its module cache and overrides, then the wrapped model's
    methods: the walk returns what its methods return, the guard proves a repeat, and a changed override, a missing
    name, or a lookup method set on the instance is followed."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    jm = thunder.jit(model)
    lookups = [("submodule", "0"), ("parameter", "0.weight"), ("buffer", "1.running_mean"), ("submodule", "1")]
    walk = ModuleWalk(lookups)

    def methods():
        return tuple(getattr(jm, f"get_{kind}")(target) for kind, target in lookups)

    first = walk(jm)
    assert all(a is b for a, b in zip(first, methods()))
    assert walk(jm) is first and walk._guard is not None  # NOTE: proved by the guard: the same tuple
    new = nn.Parameter(torch.randn(4, 4))
    jm._overrides_parameters["0.weight"] = new  # NOTE: what thunder's transforms do to override a parameter
    assert walk(jm)[1] is new
    jm.set_buffer("1.running_mean", torch.ones(4))
    assert all(a is b for a, b in zip(walk(jm), methods()))
    del jm._module_cache["1"]  # NOTE: then the wrapped model's get_submodule answers
    assert all(a is b for a, b in zip(walk(jm), methods()))
    jm.get_parameter = lambda target: "the instance's own"
    assert walk(jm)[1] == "the instance's own"
