"""Which torch-level ops thunder's default executors turn into more kernels than eager PyTorch (issue 55, point 2).

    python bench/step_ops.py [--models nanogpt,llama2] [--device cpu|cuda] [--jit thunder|thunder_nb] [--reps 3]

For the zoo's nanoGPT and llama2 (`thunder_nb.testing.zoo`: 2 layers, width 64) the training step without the
optimizer (forward + cross-entropy loss + backward) runs under torch.profiler, eagerly and through thunder
(``thunder.jit(loss_fn)``: thunder's default executors; ``--jit thunder_nb``: ``thunder_nb.jit(loss_fn,
capture=False)``). What is counted as a kernel:

- ``--device cpu``: the leaf aten ops (an ``aten::`` event with no ``aten::`` event inside it), less those that launch
  no work: views and metadata (``NO_KERNEL``: view, reshape of a contiguous tensor is a view too but is counted when
  it copies, as_strided, permute, expand, ...) and allocations (empty, empty_strided). A proxy for GPU launches and
  memory passes, not for GPU time.
- ``--device cuda``: the CUDA kernels in the profiler's trace (``ProfilerActivity.CUDA``) and their GPU time.

Attribution: thunder's first computation trace (``thunder.last_traces(jfn)[0]``) holds the torch-level calls
(``layer_norm``, ``gelu``, ``scaled_dot_product_attention``, ``cross_entropy``, ``linear``, ...), each with its
decomposition in ``bsym.subsymbols``. The final execution traces are flat (prims and torch-executor calls; the
backward's symbols carry no source), so each torch-level call is rerun alone, with tensors of its arguments' shapes,
forward + backward (seeded with ones), eagerly and through the same thunder jit, and counted the same way; the
executors that ran it are read from that jitted call's final forward and backward traces. Per op: calls in the step
times kernels per call. Alone, every floating input requires grad and every output is seeded with ones (a fill and
a gradient accumulation each, the same eagerly and through thunder: they cancel in "extra", not in the columns). On
the CPU thunder's sdpa executor claims nothing: scaled_dot_product_attention runs as thunder's decomposition, which
on the GPU the sdpa executor replaces. The whole-step rows below the table say what the per-op sum leaves out (ops thunder's
passes dropped or merged across calls, the autograd engine's own work).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from thunder_nb.testing import zoo  # noqa: E402

NO_KERNEL = frozenset(
    "aten::" + n for n in (
        "view", "_unsafe_view", "as_strided", "permute", "expand", "transpose", "t", "unsqueeze", "squeeze",
        "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "narrow", "alias", "detach", "detach_",
        "lift_fresh", "empty", "empty_like", "empty_strided", "resize_", "set_", "view_as_real", "view_as_complex",
        "_reshape_alias", "numpy_T", "diagonal", "unfold", "expand_as", "view_as", "result_type", "is_nonzero",
        "_local_scalar_dense", "item", "resolve_conj", "resolve_neg", "to", "contiguous", "reshape", "size", "stride", "requires_grad_", "_has_compatible_shallow_copy_type",
    ))

SKIP_SYMBOLS = frozenset(("unpack_trivial", "python_return", "shape", "python_del", "size"))

CAVEAT = ("Caveat: on the CPU a kernel count is a proxy for the GPU's kernel launches and memory passes, not for GPU "
          "time (small elementwise kernels cost launches and a pass over memory each; a matmul costs what it "
          "costs): `python bench/step_ops.py --device cuda` gives GPU time "
          "(bench/results/2026-12-05-ddp-step-ops-h100.md).")


# ---------------------------------------------------------------------------------------------------- counting


def profiled(fn: Callable[[], Any], device: str, reps: int) -> tuple[float, float, collections.Counter]:
    """Kernels per call, GPU µs per call (0 on the CPU) and the kernels by name (per call) of ``fn``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm-up: thunder compiles here
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    events = prof.events()
    if device == "cuda":
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        gpu_us = sum(e.time_range.elapsed_us() for e in kernels) / reps
    else:
        kernels = [e for e in events if counted(e)]
        gpu_us = 0.0
    names = collections.Counter(e.name for e in kernels)
    return len(kernels) / reps, gpu_us, collections.Counter({k: v / reps for k, v in names.items()})


def counted(event: Any) -> bool:
    """An aten op that launches work itself: not a view or allocation, and no such op inside it."""
    return event.name.startswith("aten::") and event.name not in NO_KERNEL and not has_kernel_inside(event)


def has_kernel_inside(event: Any) -> bool:
    return any(counted(c) or has_kernel_inside(c) for c in event.cpu_children)


def make_jit(fn: Callable, how: str) -> Callable:
    if how == "thunder_nb":
        import thunder_nb

        return thunder_nb.jit(fn, capture=False)
    import thunder

    return thunder.jit(fn)


def executors_of(jfn: Callable) -> set[str]:
    import thunder

    traces = [thunder.last_traces(jfn)[-1]]
    backward = thunder.last_backward_traces(jfn)
    if backward:
        traces.append(backward[-1])
    names = set()
    bsyms = [b for trace in traces for b in trace.bound_symbols]
    while bsyms:
        bsym = bsyms.pop()
        if bsym.sym.name.startswith("CUDAGraph"):  # NOTE: thunder_nb.jit's regions: the executors of the ops inside
            bsyms += bsym.subsymbols
            continue
        name = getattr(getattr(bsym.sym, "executor", None), "name", None)  # NOTE: the fixed transform's have none
        if name is not None and bsym.sym.name not in SKIP_SYMBOLS:
            names.add(name)
    return names


# ---------------------------------------------------------------------------------------------------- attribution


def torch_functions() -> dict[Any, Any]:
    """thunder symbol id -> a torch callable that thunder maps to it (torch.nn.functional and torch first)."""
    import thunder.torch as ltorch

    order = {"torch.nn.functional": 0, "torch": 1}
    best: dict[Any, tuple[int, Any]] = {}
    for fn, sym in ltorch._torch_to_thunder_function_map.items():
        if not hasattr(sym, "id"):
            continue
        rank = order.get(getattr(fn, "__module__", None) or "", 2)
        if sym.id not in best or rank < best[sym.id][0]:
            best[sym.id] = (rank, fn)
    return {k: v[1] for k, v in best.items()}


def resolve(sym: Any) -> Callable | None:
    """The torch callable a symbol's id names (``torch.nn.functional.linear``), else torch's or F's ``sym.name``."""
    import functools
    import importlib

    parts = str(sym.id).split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            return functools.reduce(getattr, parts[cut:], importlib.import_module(".".join(parts[:cut])))
        except (ImportError, AttributeError):
            continue
    for space in (torch.nn.functional, torch, torch.Tensor):
        if hasattr(space, sym.name):
            return getattr(space, sym.name)
    return None


def materialise(x: Any, device: str, seed: list[int]) -> Any:
    """A tensor like the proxy ``x`` (indices small enough for any embedding or class count), anything else as is."""
    from thunder.core.proxies import NumberProxy, TensorProxy
    from thunder.core import devices, dtypes
    from thunder.core.pytree import tree_map

    def one(p):
        if isinstance(p, TensorProxy):
            seed[0] += 1
            g = torch.Generator().manual_seed(seed[0])
            dtype = dtypes.to_torch_dtype(p.dtype)
            if dtype.is_floating_point or dtype.is_complex:
                t = torch.randn(tuple(p.shape), dtype=dtype, generator=g)
                return t.to(device).requires_grad_(True)
            if dtype == torch.bool:
                return (torch.rand(tuple(p.shape), generator=g) > 0.5).to(device)
            return torch.randint(0, 16, tuple(p.shape), dtype=dtype, generator=g).to(device)
        if isinstance(p, NumberProxy):
            return p.value
        if isinstance(p, dtypes.dtype):
            return dtypes.to_torch_dtype(p)
        if isinstance(p, devices.Device):
            return torch.device(device)
        return p

    return tree_map(one, x)


def alone(torch_fn: Callable, args: Any, kwargs: Any, device: str, how: str, reps: int) -> dict:
    """Kernels of one torch-level call, forward + backward, eagerly and through thunder."""
    seed = [0]
    args, kwargs = materialise(args, device, seed), materialise(kwargs, device, seed)
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    positions = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]
    flat = [leaves[i] for i in positions]

    def call(*tensors):
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        a, k = torch.utils._pytree.tree_unflatten(filled, spec)
        return torch_fn(*a, **k)

    def step(f):
        def run():
            out = f(*flat)
            outs = [o for o in torch.utils._pytree.tree_leaves(out)
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            for t in flat:
                t.grad = None
        return run

    jfn = make_jit(call, how)
    e_n, e_us, _ = profiled(step(call), device, reps)
    t_n, t_us, _ = profiled(step(jfn), device, reps)
    return {"eager": e_n, "thunder": t_n, "eager_us": e_us, "thunder_us": t_us, "executors": executors_of(jfn)}


def op_table(model_name: str, device: str, how: str, reps: int) -> list[str]:
    import thunder

    zoo_model = zoo.MODELS[model_name]
    model = zoo_model.build(device)
    loss_fn = zoo_model.loss(model)
    (idx,), targets = zoo_model.batch(0, device)

    def step(f):
        def run():
            f(idx, targets).backward()
            for p in model.parameters():
                p.grad = None
        return run

    jfn = make_jit(loss_fn, how)
    e_n, e_us, e_names = profiled(step(loss_fn), device, reps)
    t_n, t_us, t_names = profiled(step(jfn), device, reps)

    fns = torch_functions()
    groups: dict[str, dict] = {}
    signatures: dict[tuple, dict] = {}
    for bsym in thunder.last_traces(jfn)[0].bound_symbols:
        if bsym.sym.name in SKIP_SYMBOLS or not any(
                isinstance(o, thunder.core.proxies.TensorProxy) for o in bsym.flat_proxy_outs):
            continue
        name = bsym.sym.name
        torch_fn = fns.get(bsym.sym.id) or resolve(bsym.sym)
        key = (name, repr(bsym.args), repr(bsym.kwargs))
        if key not in signatures:
            try:
                signatures[key] = alone(torch_fn, bsym.args, bsym.kwargs, device, how, reps) if torch_fn else None
            except Exception as e:  # a call that will not rerun alone is reported, not fatal
                signatures[key] = {"error": f"{type(e).__name__}: {str(e)[:80]}"}
        r = signatures[key]
        gr = groups.setdefault(name, {"calls": 0, "eager": 0.0, "thunder": 0.0, "eager_us": 0.0, "thunder_us": 0.0,
                                      "executors": set(), "errors": set()})
        gr["calls"] += 1
        if r is None or "error" in r:
            gr["errors"].add("no torch function" if r is None else r["error"])
            continue
        for k in ("eager", "thunder", "eager_us", "thunder_us"):
            gr[k] += r[k]
        gr["executors"] |= r["executors"]

    rows = sorted(groups.items(), key=lambda kv: (-(kv[1]["thunder"] - kv[1]["eager"]), kv[0]))
    cuda = device == "cuda"
    head = "| op | calls | eager kernels | thunder kernels | extra |" + (" eager µs | thunder µs |" if cuda else "") \
        + " thunder's executors |"
    lines = [f"### {model_name}: kernels per training step (forward + loss + backward), {device}", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    sum_e = sum_t = 0.0
    for name, gr in rows:
        sum_e += gr["eager"]
        sum_t += gr["thunder"]
        us = f" {gr['eager_us']:.0f} | {gr['thunder_us']:.0f} |" if cuda else ""
        note = ", ".join(sorted(gr["executors"])) or "-"
        if gr["errors"]:
            note += " (not rerun alone: " + "; ".join(sorted(gr["errors"])) + ")"
        lines.append(f"| {name} | {gr['calls']} | {gr['eager']:g} | {gr['thunder']:g} | "
                     f"{gr['thunder'] - gr['eager']:+g} |{us} {note} |")
    blank = " | |" if cuda else ""
    lines.append(f"| **sum of the ops alone** | | {sum_e:g} | {sum_t:g} | {sum_t - sum_e:+g} |{blank} |")
    us = f" {e_us:.0f} | {t_us:.0f} |" if cuda else ""
    lines.append(f"| **whole step (measured)** | | {e_n:g} | {t_n:g} | {t_n - e_n:+g} |{us} "
                 f"{', '.join(sorted(executors_of(jfn)))} |")
    lines += ["", "Whole step by kernel name (per step; the 12 largest differences, thunder - eager):", "",
              "| kernel | eager | thunder | extra |", "|---|---|---|---|"]
    diff = sorted(set(e_names) | set(t_names), key=lambda k: (-abs(t_names[k] - e_names[k]), k))
    for k in diff[:12]:
        lines.append(f"| {k} | {e_names[k]:g} | {t_names[k]:g} | {t_names[k] - e_names[k]:+g} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="nanogpt,llama2")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--jit", default="thunder", choices=("thunder", "thunder_nb"))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    import thunder

    print(f"# Kernels per training step by torch-level op, eager PyTorch against thunder ({args.device})\n")
    print(f"{datetime.date.today()}, {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"lightning-thunder {thunder.__version__}, jit: "
          f"{'thunder.jit(loss_fn)' if args.jit == 'thunder' else 'thunder_nb.jit(loss_fn, capture=False)'}, "
          f"default executors {[e.name for e in thunder.get_default_executors()]} + always "
          f"{[e.name for e in thunder.get_always_executors()]}, {args.reps} profiled steps.\n")
    if args.device == "cpu":
        print(CAVEAT + " On the CPU thunder's sdpa executor claims no attention (its row is thunder's decomposition; "
              "on the GPU sdpa runs it).\n")
    for name in args.models.split(","):
        print("\n".join(op_table(name, args.device, args.jit, args.reps)))


if __name__ == "__main__":
    main()
