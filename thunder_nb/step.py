"""One CUDA graph per training iteration: forward, loss, backward and the optimizer's step, recorded and replayed."""

from __future__ import annotations

import inspect
import linecache
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import internals
from .cudagraph.executors import executor_list
from .step_report import Blocker, Capturability, StepComparison

__all__ = ["jit_step", "Step", "StepRefused", "RecordAgainWarning", "capturability", "Capturability", "Blocker",
           "compare_step", "StepComparison"]

#: Optimizers whose capturable step reads ``lr`` from a device tensor (torch 2.11: Adam's and AdamW's foreach and
#: fused paths): a schedule that changes it on the host needs no new recording.
_TENSOR_LR = (torch.optim.Adam, torch.optim.AdamW)

#: What to do about each kind of op that cannot be in a graph (`thunder_nb.diagnosis.ops.classify_bsym`'s reasons).
_FIXES = {
    "host-sync": ("host sync", "return the tensor and read it after the step (the step returns the loss: "
                               "`loss.item()` after the call reads the graph's result, with eager's value)"),
    "device-transfer": ("device transfer", "make the tensor on the model's device outside the step (device=...), "
                                           "and pass it in with the batch"),
    "cpu-op": ("cpu op", "make the tensor on the model's device (device=...): an op on host memory runs once at "
                         "recording and never again"),
    "host-data": ("host data", "replace the Python list or number array by a slice (x[:, -1:]) or a device tensor "
                               "made once outside the step; CUDA refuses a copy from pageable host memory while "
                               "recording"),
    "capture-dependent": ("capture-dependent", "set the attention's dropout to 0, or leave thunder's sdpa executor "
                                               "out: jit_step(..., executors=['no-sdpa'])"),
}


class StepRefused(RuntimeError):
    """The iteration cannot be recorded as one CUDA graph: the message names the op, the user's line and the fix."""

    def __init__(self, blockers: Sequence[Blocker], reason: str = "cannot record this step as one CUDA graph"):
        self.blockers = tuple(blockers)
        first = self.blockers[0]
        n = len(self.blockers) - 1
        more = f" (and {n} more: see thunder_nb.step.capturability)" if n else ""
        super().__init__(f"jit_step {reason}: {first}{more}")


class RecordAgainWarning(UserWarning):
    """The step was recorded again; the message says what changed since the last recording."""


def jit_step(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *,
             accumulate: int = 1, max_grad_norm: float | None = None, capture: bool | str = "auto", warmup: int = 3,
             copy_loss: bool = True, executors: Sequence[Any] = ()) -> Step:
    """Compile one training iteration of ``model`` into one CUDA graph: ``step(*batch) -> loss``.

    Each call is ``zero_grad``, ``loss = loss_fn(*batch)`` (run as thunder's trace of the function: the model and
    the loss), ``loss.backward()``, optional clipping, ``optimizer.step()``. The first ``warmup`` calls run it
    uncaptured on a side stream (real steps, as PyTorch's whole-network capture recipe asks); the next call
    records it as one ``torch.cuda.CUDAGraph`` (gradients set to None first, so they are allocated in the graph's
    own memory) and every later call copies the batch into the graph's static input buffers and replays it.

    Replay is guarded on the host: the batch's shapes, dtypes and devices (and its non-tensor values), the
    model's parameters (the same objects, the same storage), every module's training flag, grad and autocast
    mode, and the optimizer's state and hyperparameters. Anything else records again, after ``warmup`` more
    uncaptured steps where thunder's trace changes, with a `RecordAgainWarning` that states the cause.

    Args:
        model: the module trained; its parameters are the ones the graph updates.
        loss_fn: ``loss_fn(*batch) -> loss``: calls ``model`` and returns the loss, one tensor of one element
            (the function you would give ``thunder.jit``).
        optimizer: a ``torch.optim`` optimizer. On CUDA, one with a ``capturable`` option (Adam, AdamW, ...) gets
            ``capturable=True`` set in every param group; Adam and AdamW also get ``lr`` as a 0-d float32 device
            tensor, so a learning-rate scheduler (or ``group["lr"] = x``) changes it without a new recording.
            SGD needs no option; its lr is a number in the graph, and a change records again.
        accumulate: gradient accumulation: each batch tensor is split in ``accumulate`` micro-batches along dim 0,
            and the graph runs forward and backward on each (loss divided by ``accumulate``) before one step.
        max_grad_norm: clip the gradients' total norm to this, inside the graph
            (``torch.nn.utils.clip_grad_norm_``, which never reads the norm on the host); `Step.last_grad_norm`.
        capture: ``"auto"``: a real CUDA graph when the model is on CUDA, else the CPU stand-in; ``True``: CUDA
            required; ``"emulated"``: the CPU stand-in (every replay runs the iteration eagerly and writes its
            loss and gradients into the recorded memory, as a replay does); ``False``: never record (every call
            is an uncaptured step; no refusals).
        warmup: uncaptured steps before each recording.
        copy_loss: return a copy of the graph's loss (one small copy per step). With False the returned tensor is
            the graph's own loss buffer, overwritten by the next replay.
        executors: thunder executors, or names as `thunder_nb.jit` takes them (``"no-sdpa"``, ``"torchcompile"``).

    Returns:
        a `Step`. What it returns is the loss as a tensor on the model's device (a copy: a logged ``loss.item()``
        after the call gives eager's number). Between steps each parameter's ``.grad`` holds the last step's
        gradients (clipped when ``max_grad_norm`` is set), in the graph's memory: the next replay overwrites them
        in place. The step never accumulates into them across calls; ``zero_grad`` between calls changes nothing
        the next step computes (with ``set_to_none=True`` the next call puts the graph's gradients back).
        Optimizer step hooks do not run on replays.

    Raises:
        StepRefused: at the first call with a batch (before anything runs), when the iteration cannot be one
            graph: a host sync (``.item()``), a device transfer or a host-memory op inside ``loss_fn``, an
            optimizer with no capturable step, a loss that is not one tensor; the message names the op, the
            user's line and the fix. `capturability` lists them all.
    """
    return Step(model, loss_fn, optimizer, accumulate=accumulate, max_grad_norm=max_grad_norm, capture=capture,
                warmup=warmup, copy_loss=copy_loss, executors=executors)


class _CudaRecording:
    """One recorded iteration: the graph, its static batch, and the loss and gradients it writes."""

    def __init__(self, graph: Any, static: list[Any], loss: torch.Tensor, grads: list[Any]):
        self.graph, self.static, self.loss, self.grads = graph, static, loss, grads
        self.replay = graph.replay


class _EmulatedRecording:
    """The CPU stand-in: a replay runs the iteration eagerly on the static batch, then writes its loss and gradients
    into the memory the first replay made, as a graph's replay writes its own memory."""

    def __init__(self, run: Callable[[list[Any]], torch.Tensor], static: list[Any], params: list[torch.Tensor]):
        self._run, self.static, self._params = run, static, params
        self.loss: torch.Tensor | None = None
        self.grads: list[Any] = []

    def replay(self) -> None:
        for p in self._params:
            p.grad = None
        loss = self._run(self.static)
        if self.loss is None:
            self.loss, self.grads = loss, [p.grad for p in self._params]
            return
        with torch.no_grad():
            self.loss.copy_(loss)
            for p, g in zip(self._params, self.grads):
                if g is not None and p.grad is not None:
                    g.copy_(p.grad)
                p.grad = g


class Step:
    """A training iteration recorded as one CUDA graph (see `jit_step`); call it with a batch."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *,
                 accumulate: int = 1, max_grad_norm: float | None = None, capture: bool | str = "auto",
                 warmup: int = 3, copy_loss: bool = True, executors: Sequence[Any] = ()):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if accumulate < 1 or warmup < 0:
            raise ValueError(f"accumulate must be >= 1 and warmup >= 0 (got {accumulate} and {warmup})")
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.accumulate, self.max_grad_norm, self.warmup, self.copy_loss = accumulate, max_grad_norm, warmup, copy_loss
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("the model has no parameter that requires grad: nothing to train")
        self.device = self._params[0].device
        self._mode = _capture_mode(capture, self.device)
        self._jfn = _thunder_jit(loss_fn, executors)
        self.notes: list[str] = []  # what jit_step changed or decided, in words
        self.optimizer_text, blocker = _optimizer_plan(optimizer)
        self._optimizer_blocker = blocker
        # NOTE: Adam's and AdamW's lr is read at every step (a device tensor in the graph; the optimizer itself in the
        # CPU stand-in), so it stays out of the guards; other optimizers' lr is a number recorded in the graph
        self._lr_live = blocker is None and isinstance(optimizer, _TENSOR_LR)
        self._tensor_lr = self._mode == "cuda" and self._lr_live
        if self._mode == "cuda" and blocker is None:
            self.notes.extend(_make_capturable(optimizer, self.device, tensor_lr=self._tensor_lr))
        self._lrs = [g["lr"] for g in optimizer.param_groups] if self._tensor_lr else []  # the tensors the graph reads
        self._stream = torch.cuda.Stream(self.device) if self._mode == "cuda" else None
        self._slots = [(m, n, p) for m in model.modules() for n, p in m._parameters.items() if p is not None]
        self._modules = list(model.modules())
        self._recording: _CudaRecording | _EmulatedRecording | None = None
        self._key: tuple | None = None  # `_key_of` the recording's batch, or of the warm-up steps
        self._checked: tuple | None = None  # the batch key whose traces were checked for blockers
        self._state: tuple | None = None  # `_state_now()` at the recording
        self._warm = 0  # uncaptured steps since the key last changed
        self._grad_norm: torch.Tensor | None = None
        self.graphs_recorded = 0
        self.recordings: list[str] = []  # why each recording was made
        self._why = "first recording"  # why the next one will be

    # --- the call ---------------------------------------------------------------------------------

    def __call__(self, *batch: Any) -> torch.Tensor:
        """Run one training iteration on ``batch``; returns the loss (see `jit_step` for what it and ``.grad`` hold)."""
        rec = self._recording
        if rec is not None and self._key == self._key_of(batch) and self._state_unchanged():
            return self._replay(rec, batch)
        return self._slow(batch)

    def _replay(self, rec: Any, batch: Sequence[Any]) -> torch.Tensor:
        if self._tensor_lr:
            self._lr_to_tensor()
        pairs = [(s, b) for s, b in zip(rec.static, batch) if isinstance(b, torch.Tensor) and b is not s]
        if pairs:
            internals.copy_into([s for s, _ in pairs], [b for _, b in pairs])
        rec.replay()
        for p, g in zip(self._params, rec.grads):
            if p.grad is not g:
                p.grad = g
        return rec.loss.clone() if self.copy_loss else rec.loss

    def _slow(self, batch: Sequence[Any]) -> torch.Tensor:
        if not torch.is_grad_enabled():
            raise RuntimeError("a training step needs grad mode: call the step outside torch.no_grad()")
        key = self._key_of(batch)
        micro = self._micro(batch)
        if self._mode is not False and self._checked != key:
            self._refuse_blockers(micro[0])  # NOTE: before anything runs: a refusal leaves the model as it was
            self._checked = key
        if self._recording is not None:
            why, retrace = self._why_again(key)
            warnings.warn(RecordAgainWarning(f"jit_step: recording the step again: {why}"), stacklevel=3)
            self._drop()
            self._why = why
            if not retrace:
                return self._record(batch)
        if self._key != key:
            self._warm = 0  # NOTE: thunder traces again: its first call, and any compilation, stay out of the graph
        self._key = key
        if self._mode is False or self._warm < self.warmup:
            self._warm += 1
            return self._uncaptured(batch)
        return self._record(batch)

    # --- what runs --------------------------------------------------------------------------------

    def _micro(self, batch: Sequence[Any]) -> list[list[Any]]:
        return _split(batch, self.accumulate)

    def _iteration(self, batch: Sequence[Any]) -> torch.Tensor:
        """Forward, loss, backward (per micro-batch), clipping, optimizer step; the loss, detached."""
        k = self.accumulate
        total = None
        for part in self._micro(batch):
            loss = self._jfn(*part)
            if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
                raise StepRefused([_loss_blocker(self.loss_fn, loss)], "needs the loss")
            if k > 1:
                loss = loss / k
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.max_grad_norm is not None:
            self._grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        self.optimizer.step()
        return total

    def _uncaptured(self, batch: Sequence[Any]) -> torch.Tensor:
        for p in self._params:
            p.grad = None
        if self._stream is None:
            return self._iteration(batch)
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            loss = self._iteration(batch)
        current.wait_stream(self._stream)
        loss.record_stream(current)
        return loss

    def _record(self, batch: Sequence[Any]) -> torch.Tensor:
        static = [b.clone() if isinstance(b, torch.Tensor) else b for b in batch]  # NOTE: the graph's input buffers
        for p in self._params:
            p.grad = None  # NOTE: the recipe's zero_grad(set_to_none=True): gradients allocated in the graph's pool
        if self._tensor_lr:
            self._lr_to_tensor()
        if self._mode == "cuda":
            graph = torch.cuda.CUDAGraph()
            internals.clear_cublas_workspaces()
            try:
                with torch.cuda.graph(graph, stream=self._stream):
                    loss = self._iteration(static)
            except StepRefused:
                raise
            except Exception as e:
                internals.recover_generators()
                for p in self._params:
                    p.grad = None
                raise StepRefused([Blocker("capture", type(e).__name__ + ": " + (str(e).splitlines() or [""])[0][:200],
                                           fix="see thunder_nb.step.capturability; run with capture=False to "
                                           "train uncaptured", **_where_from_traceback(e))],
                                  "failed while recording the graph") from e
            finally:
                internals.clear_cublas_workspaces()
            rec: Any = _CudaRecording(graph, static, loss, [p.grad for p in self._params])
        else:
            rec = _EmulatedRecording(self._iteration, static, self._params)
        self._recording = rec
        self._state = self._state_now()
        self.graphs_recorded += 1
        self.recordings.append(self._why)
        return self._replay(rec, batch)

    def _drop(self) -> None:
        self._recording = None
        for p in self._params:
            p.grad = None  # NOTE: the old graph's gradients go with its memory

    # --- guards -----------------------------------------------------------------------------------

    def _key_of(self, batch: Sequence[Any]) -> tuple:
        """What thunder's trace depends on: the batch's shapes, dtypes, devices and values, modules' training flags,
        autocast. Another key means another trace: warm-up steps before the next recording."""
        return _batch_key(batch), tuple(m.training for m in self._modules), _autocast_key(self.device)

    def _state_now(self) -> tuple:
        opt = self.optimizer
        groups = tuple(
            tuple((k, v) for k, v in g.items() if k != "params" and not (k == "lr" and self._lr_live))
            for g in opt.param_groups)
        return (tuple(p.data_ptr() for _, _, p in self._slots), opt.state, opt.param_groups,
                tuple(len(g["params"]) for g in opt.param_groups), groups)

    def _state_unchanged(self) -> bool:
        ptrs, state, groups, sizes, hyper = self._state
        for m, n, p in self._slots:
            if m._parameters.get(n) is not p:
                return False
        if tuple(p.data_ptr() for _, _, p in self._slots) != ptrs:
            return False
        opt = self.optimizer
        if opt.state is not state or opt.param_groups is not groups:
            return False
        for g, items in zip(groups, hyper):
            for k, v in items:
                now = g.get(k)
                if now is not v and (isinstance(now, torch.Tensor) or isinstance(v, torch.Tensor) or now != v):
                    return False
        return tuple(len(g["params"]) for g in groups) == sizes

    def _why_again(self, key: tuple) -> tuple[str, bool]:
        """What changed since the recording, and whether thunder's trace changes with it (then warm up again)."""
        (batch, training, autocast), (was_batch, was_training, was_autocast) = key, self._key
        if batch != was_batch:
            return _key_difference(was_batch, batch), True
        for m, now, was in zip(self._modules, training, was_training):
            if now != was:
                mode = "training" if now else "eval"
                return f"{type(m).__name__} is now in {mode} mode (model.train() / model.eval())", True
        if autocast != was_autocast:
            return f"autocast changed: {was_autocast} -> {autocast}", True
        ptrs, state, groups, sizes, hyper = self._state
        names = {id(p): f"{type(m).__name__}.{n}" for m, n, p in self._slots}
        for m, n, p in self._slots:
            if m._parameters.get(n) is not p:
                return f"parameter {n} of {type(m).__name__} was replaced by another tensor", False
        for (m, n, p), ptr in zip(self._slots, ptrs):
            if p.data_ptr() != ptr:
                return f"parameter {names[id(p)]} now lives in other memory (its .data was set)", False
        opt = self.optimizer
        if opt.state is not state or opt.param_groups is not groups:
            return "the optimizer's state was replaced (load_state_dict)", False
        if tuple(len(g["params"]) for g in groups) != sizes:
            return "the optimizer's param groups changed", False
        for i, (g, items) in enumerate(zip(groups, hyper)):
            for k, v in items:
                now = g.get(k)
                if now is not v and (isinstance(now, torch.Tensor) or isinstance(v, torch.Tensor) or now != v):
                    extra = (f" ({type(opt).__name__}'s step reads it as a Python number, fixed in the graph; "
                             f"Adam and AdamW read lr from a device tensor and need no new recording)"
                             if k == "lr" else "")
                    return f"param group {i}'s {k!r} changed from {v!r} to {now!r}{extra}", False
        return "the step's state changed", True

    def _lr_to_tensor(self) -> None:
        """Keep each group's ``lr`` the device tensor the graph reads: a number set on the host is written into it."""
        for g, t in zip(self.optimizer.param_groups, self._lrs):
            if g["lr"] is not t:
                t.fill_(float(g["lr"]))
                g["lr"] = t

    def _refuse_blockers(self, first: Sequence[Any]) -> None:
        internals.build_traces(self._jfn, *first)
        blockers, _, _ = trace_blockers(self._jfn, self.loss_fn, cuda=self.device.type == "cuda")
        if self._optimizer_blocker is not None:
            blockers.append(self._optimizer_blocker)
        if blockers:
            raise StepRefused(blockers)

    # --- what a user reads ------------------------------------------------------------------------

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """The gradients' total norm before clipping at the last step (a copy; None without ``max_grad_norm``)."""
        return None if self._grad_norm is None else self._grad_norm.clone()

    @property
    def captured(self) -> bool:
        """Whether the next call with the same batch shapes replays a graph."""
        return self._recording is not None

    def __repr__(self) -> str:
        mode = {"cuda": "CUDA graph", "emulated": "emulated on the CPU", False: "uncaptured"}[self._mode]
        return (f"<thunder_nb.step.Step of {getattr(self.loss_fn, '__name__', 'loss_fn')}: {mode}, "
                f"{self.graphs_recorded} recorded, optimizer {self.optimizer_text}>")


# --- helpers ----------------------------------------------------------------------------------------


def _capture_mode(capture: Any, device: torch.device) -> str | bool:
    if capture == "auto":
        return "cuda" if device.type == "cuda" else "emulated"
    if capture is True:
        if device.type != "cuda":
            raise ValueError(f"capture=True needs the model on a CUDA device; its parameters are on {device}")
        return "cuda"
    if capture is False or capture == "emulated":
        return capture
    raise ValueError(f"capture must be one of ['auto', True, False, 'emulated'], not {capture!r}")


def _thunder_jit(fn: Callable[..., Any], executors: Sequence[Any]) -> Any:
    """``thunder.jit(fn)`` with no graph transform, with ``executors`` as `thunder_nb.jit` takes them."""
    import thunder

    options: dict[str, Any] = {}
    given = [e for e in executors if not isinstance(e, str)]
    named = executor_list([e for e in executors if isinstance(e, str)])
    if given or named is not None:
        rest = named if named is not None else thunder.get_default_executors()
        options["executors"] = given + [e for e in rest if e not in given]
    return thunder.jit(fn, **options)


def _batch_key(batch: Sequence[Any]) -> tuple:
    return tuple((b.shape, b.dtype, b.device) if isinstance(b, torch.Tensor) else (type(b), b) for b in batch)


def _key_difference(old: tuple | None, new: tuple) -> str:
    if old is None or len(old) != len(new):
        return f"the step now takes {len(new)} arguments (was {len(old or ())})"
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            if isinstance(a[0], torch.Size) and isinstance(b[0], torch.Size):
                what = [f"{name} {x} (was {y})" for name, x, y in zip(("shape", "dtype", "device"), b, a) if x != y]
                what = [w.replace("torch.Size(", "(").replace("])", ")").replace("([", "(") for w in what]
                return f"the batch's argument {i} has {', '.join(what)}"
            return f"the batch's argument {i} is {b[1]!r} (was {a[1]!r})"
    return "the batch changed"


def _autocast_key(device: torch.device) -> tuple:
    kind = device.type
    if not torch.is_autocast_enabled(kind):
        return (False,)
    return (True, torch.get_autocast_dtype(kind))


def _optimizer_plan(optimizer: torch.optim.Optimizer) -> tuple[str, Blocker | None]:
    """(how the step runs the optimizer, in words; what stops it from being captured, or None)."""
    name = type(optimizer).__name__
    if "capturable" in optimizer.defaults:
        lr = "lr from a device tensor" if isinstance(optimizer, _TENSOR_LR) else "lr fixed in the graph"
        return f"{name} (capturable=True, {lr})", None
    if isinstance(optimizer, torch.optim.SGD):
        return f"{name} (no step counter; lr fixed in the graph)", None
    return name, Blocker("optimizer", name, None,
                         f"{name} has no capturable step in torch {torch.__version__.split('+')[0]}: use "
                         "torch.optim.AdamW / Adam (capturable) or SGD", trace="optimizer")


def _make_capturable(optimizer: torch.optim.Optimizer, device: torch.device, *, tensor_lr: bool) -> list[str]:
    """Set ``capturable=True`` (and the lr tensor) in every param group, and move step counters onto the device."""
    notes = []
    if "capturable" in optimizer.defaults and not all(g.get("capturable") for g in optimizer.param_groups):
        for g in optimizer.param_groups:
            g["capturable"] = True
        notes.append(f"{type(optimizer).__name__}: capturable=True set in every param group (its step counters live "
                     "on the device)")
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor) and step.device != device:
            state["step"] = step.to(device=device, dtype=torch.float32)
    if tensor_lr:
        for g in optimizer.param_groups:
            if not isinstance(g["lr"], torch.Tensor):
                g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float32, device=device)
            elif g["lr"].device != device:
                g["lr"] = g["lr"].to(device)
        notes.append("lr is a 0-d device tensor in every param group: schedulers and group['lr'] = x change it "
                     "without recording again")
    return notes


# --- what stops a graph -----------------------------------------------------------------------------

_NOT_OPS = frozenset({"return", "python_return", "del", "python_del", "unpack_trivial", "unpack_sequence", "unpack_key",
                      "unpack_empty_dict", "unpack_attr", "clear_mutable_collection"})


def _ops(trace: Any) -> list[Any]:
    return [b for b in trace.bound_symbols if b.sym.name not in _NOT_OPS]


def _source_lines(traces: Sequence[Any]) -> tuple[dict[str, tuple[str, int]], dict[str, list[Any]]]:
    """Where the user's code made each value: (proxy name -> (file, line), op name -> [(file, line) or None, ...] in
    program order), from the traces that still carry source positions (thunder renames values when it splits the
    forward from the backward, so the second map pairs an op with the same op of an earlier trace by its order)."""
    by_name: dict[str, tuple[str, int]] = {}
    by_op: dict[str, list[Any]] = {}
    for trace in traces:
        ops: dict[str, list[Any]] = {}
        for b in trace.bound_symbols:
            pos = getattr(b, "source_positions", None)
            at = (b.source_filename, pos.lineno) if b.source_filename and pos is not None else None
            ops.setdefault(b.sym.name, []).append(at)
            if at is not None:
                for p in b.flat_proxy_outs:
                    by_name.setdefault(p.name, at)
        by_op.update((name, ats) for name, ats in ops.items() if any(ats))
    return by_name, by_op


def _where(file: str, line: int) -> str:
    from .diagnosis.failures import Where, where_text

    return where_text(Where(file, line, linecache.getline(file, line).strip(), ""))


def _at(pos: tuple[str, int] | None) -> dict[str, Any]:
    """A `Blocker`'s ``where``, ``filename`` and ``line`` for the user's line ``(file, line)`` (none when unknown)."""
    if pos is None:
        return {"where": None}
    return {"where": _where(*pos), "filename": pos[0], "line": pos[1]}


def _definition_line(fn: Any) -> dict[str, Any]:
    """`_at` the line that defines ``fn``."""
    try:
        code = inspect.unwrap(fn).__code__
    except AttributeError:
        return _at(None)
    return _at((code.co_filename, code.co_firstlineno))


def _loss_blocker(loss_fn: Any, out: Any) -> Blocker:
    what = type(out).__name__ if not isinstance(out, torch.Tensor) else f"a tensor of shape {tuple(out.shape)}"
    if isinstance(out, torch.Tensor) and out.numel() == 1:
        what = "a loss that does not require grad"
    return Blocker("loss", f"loss_fn returns {what}",
                   fix="return the loss alone, one tensor of one element computed from the parameters; return other "
                   "values from another function, or read them after the step", trace="loss_fn",
                   **_definition_line(loss_fn))


def trace_blockers(jfn: Any, loss_fn: Any, *, cuda: bool) -> tuple[list[Blocker], list[bool], int]:
    """What in ``jfn``'s last forward and backward traces cannot be in a graph, each with the user's line and the fix.

    Returns:
        (blockers, for each op whether it blocks (a host sync whose value only reaches Python first, then the
        forward then the backward trace's ops), the number of forward ops)
    """
    import thunder

    from .diagnosis.ops import classify_bsym

    traces = thunder.last_traces(jfn)
    backward = thunder.last_backward_traces(jfn)
    by_name, by_op = _source_lines(traces)
    blockers: list[Blocker] = []
    flags: list[bool] = []
    forward_ops = _ops(traces[-1])
    for name, ops in (("forward", forward_ops), ("backward", _ops(backward[-1]) if backward else [])):
        seen: dict[str, int] = {}
        for b in ops:
            nth = seen[b.sym.name] = seen.get(b.sym.name, -1) + 1
            found = classify_bsym(b, cuda_trace=cuda)
            flags.append(found is not None)
            if found is None:
                continue
            kind, fix = _FIXES.get(found[0], (found[0], "keep it out of the step"))
            pos = next((by_name[p.name] for p in b.flat_proxy_outs if p.name in by_name), None)
            if pos is None and name == "forward":
                ats = by_op.get(b.sym.name, [])
                pos = ats[nth] if nth < len(ats) else None
            blockers.append(Blocker(kind, found[1], fix=fix, trace=name, **_at(pos)))
    for b in _python_only(traces[0], cuda=cuda):  # NOTE: not in the traces that run: one op outside the graph each,
        flags.insert(0, True)  # counted before the forward (the rest of the iteration can still be one graph)
        pos = next((by_name[p.name] for p in b.flat_proxy_outs if p.name in by_name), None)
        blockers.append(Blocker("python-side state", f"{b.sym.name} (its value only reaches Python)", fix=_PYTHON_SIDE,
                                trace="forward", **_at(pos)))
    out = _flat_output(traces[-1])
    if out is not None and not _one_tensor(out):
        blockers.append(_loss_blocker_of_trace(loss_fn, out))
    if not backward:
        blockers.append(Blocker("loss", "no backward trace",
                                fix="the loss must depend on parameters that require grad, with grad mode on",
                                trace="loss_fn", **_definition_line(loss_fn)))
    return blockers, flags, len(forward_ops)


_PYTHON_SIDE = ("thunder runs the loss function's Python once, when it traces; no later step runs it (a print, a list "
                "append, a global or an `if` on the value keeps the first step's): return the loss and read "
                "loss.item() after the step")


def _python_only(trace: Any, *, cuda: bool) -> list[Any]:
    """The host syncs of thunder's first trace (what the user's code called) whose value no op and no output uses:
    a ``.item()`` that is printed, logged, kept in a list, tested by an ``if``."""
    from thunder.core.pytree import tree_flatten

    from .diagnosis.ops import classify_bsym

    used = {p.name for b in trace.bound_symbols for p in b.flat_proxy_args}
    used.update(getattr(p, "name", None) for p in tree_flatten(trace.output)[0])
    found = []
    for b in _ops(trace):
        kind = classify_bsym(b, cuda_trace=cuda)
        if kind is not None and kind[0] == "host-sync" and not any(p.name in used for p in b.flat_proxy_outs):
            found.append(b)
    return found


def _flat_output(trace: Any) -> Any:
    out = trace.output
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict) and "flat_output" in out[0]:
        from thunder.core.pytree import tree_flatten

        return tuple(tree_flatten(out[0]["flat_output"])[0])
    return None


def _one_tensor(flat: tuple) -> bool:
    from thunder.core.proxies import TensorProxy

    return len(flat) == 1 and isinstance(flat[0], TensorProxy) and flat[0].numel == 1


def _loss_blocker_of_trace(loss_fn: Any, flat: tuple) -> Blocker:
    from thunder.core.proxies import TensorProxy

    kinds = ", ".join("tensor" if isinstance(p, TensorProxy) else type(p).__name__.replace("Proxy", "").lower()
                      for p in flat)
    return Blocker("loss", f"loss_fn returns ({kinds})",
                   fix="return the loss alone, one tensor of one element; read other values after the step",
                   trace="loss_fn", **_definition_line(loss_fn))


def _where_from_traceback(e: BaseException) -> dict[str, Any]:
    """`_at` the deepest line of the user's own code in ``e``'s traceback."""
    from .diagnosis.failures import user_frame

    frame = user_frame(e.__traceback__)
    return _at((frame.filename, frame.line)) if frame else _at(None)


def capturability(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *batch: Any,
                  accumulate: int = 1, executors: Sequence[Any] = ()) -> Capturability:
    """How much of one training iteration one CUDA graph holds, and what stops the rest (nothing runs).

    Builds thunder's forward and backward traces of ``loss_fn`` for ``batch`` (the first micro-batch with
    ``accumulate``) and reads them with the rules of `thunder_nb.diagnosis.ops` (host syncs, device transfers, host
    memory, capture-dependent attention), plus the optimizer's step and the loss's form. Each blocker carries the
    user's line and the fix.
    """
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    desc, opt_blocker = _optimizer_plan(optimizer)
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    first = _split(batch, accumulate)[0]
    jfn = _thunder_jit(loss_fn, executors)
    notes = [f"shapes: recorded for {_shapes(first)}; another shape records again"]
    try:
        internals.build_traces(jfn, *first)
    except Exception as e:
        from .diagnosis.failures import error_line, known_limit, untraceable

        limit, op, known = known_limit(e), untraceable(e), internals.untraceable_op(e)
        kind = "thunder"
        if op is not None:  # NOTE: an op thunder cannot trace: nonzero, a boolean mask (a data-dependent shape), ...
            what, fix = op[0], f"{op[1]}: keep it outside the loss function (thunder compiles all of it)"
            if known is not None and known[1] in ("data-dependent-shape", "boolean-mask"):
                kind = "dynamic shape"
        else:
            what = error_line(e)[:200]
            fix = (f"{limit[0]}: {limit[1]}" if limit
                   else "see the error; jit_step(..., capture=False) trains uncaptured")
        blocker = Blocker(kind, what, fix=fix, trace="forward", **_where_from_traceback(e))
        return Capturability(name, 1, 0, (blocker,), desc, tuple(notes))
    blockers, flags, _ = trace_blockers(jfn, loss_fn, cuda=device.type == "cuda")
    flags.append(opt_blocker is not None)
    if opt_blocker is not None:
        blockers.append(opt_blocker)
    longest = run = 0
    for blocked in flags:
        run = 0 if blocked else run + 1
        longest = max(longest, run)
    if any(b.kind == "loss" for b in blockers) and not any(flags):  # NOTE: a loss of the wrong form blocks it all
        longest = 0
    return Capturability(name, len(flags), longest, tuple(blockers), desc, tuple(notes))



# --- the whole step against eager PyTorch -----------------------------------------------------------


def compare_step(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *batch: Any,
                 replays: int = 2, warmup: int = 3, repeats: int = 20, rounds: int = 3, capture: bool | str = "auto",
                 executors: Sequence[Any] = (), execute: bool = True,
                 progress: Callable[[str], None] | None = None) -> StepComparison:
    """Diagnose one training iteration, and when nothing stops it, run it as `jit_step` against eager PyTorch.

    First `capturability` (nothing runs). When it finds no blocker, eager PyTorch (``zero_grad``, ``loss_fn(*batch)``,
    ``backward``, ``optimizer.step()``) and `jit_step` each take ``warmup + 1 + replays`` steps on ``batch`` from the
    same state (parameters, buffers, optimizer state, torch's random state): ``warmup`` uncaptured steps, the
    recording, then replays. Their losses at every step and the parameters after the last are compared. On a GPU,
    ``rounds`` rounds of ``repeats`` consecutive steps of each are then timed (median round); the CPU stand-in
    (``capture="emulated"``, what ``"auto"`` picks without CUDA) is not timed.

    The model and the optimizer are the caller's own objects, trained here and put back: on return (or an
    exception) their parameters, buffers, optimizer state and hyperparameters, every ``.grad`` and torch's random
    state are what they were at the call.

    Args:
        model, loss_fn, optimizer: as `jit_step` takes them.
        batch: one batch, ``loss_fn(*batch) -> loss``; every step reuses it.
        capture: ``"auto"``, ``True`` (CUDA required) or ``"emulated"``, as `jit_step` takes it.
        execute: False: the report only.
        progress: called with a short text before each stage.

    Raises:
        ValueError: ``capture`` asks for what this model cannot do (``True`` with the model on the CPU, ``False``).
        Exception: what eager PyTorch raises in ``loss_fn``, also when thunder fails to trace it because the
            user's code fails (the state is put back first).
    """
    say = progress or (lambda _: None)
    if capture is False:
        raise ValueError("compare_step runs the step captured: capture must be 'auto', True or 'emulated'")
    params = _tensors_trained(model, optimizer)
    device = params[0].device if params else torch.device("cpu")
    mode = _capture_mode(capture, device)
    device_text = str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    say(f"tracing {name} with thunder and reading what stops one graph…")
    report = capturability(model, loss_fn, optimizer, *batch, executors=executors)
    if any(b.kind == "thunder" for b in report.blockers):
        _eager_forward(model, loss_fn, optimizer, batch)  # NOTE: a step that fails in eager too is the user's to fix
    if report.blockers or not execute:
        return StepComparison(report, device_text, "none", 0)
    rtol, atol = _tolerance(params)
    n = warmup + 1 + replays
    saved = _Saved(model, optimizer, params)
    step = None
    try:
        say(f"running {n} steps of eager PyTorch…")
        eager_losses = [float(_eager_step(loss_fn, optimizer, batch)) for _ in range(n)]
        eager_params = [p.detach().clone() for p in params]
        saved.restore()
        say(f"running {n} steps of the whole step ({warmup} uncaptured, the recording, {replays} replays)…")
        step = jit_step(model, loss_fn, optimizer, capture=capture, warmup=warmup, executors=executors)
        notes = []
        try:
            whole_losses = [float(step(*batch)) for _ in range(n)]
        except StepRefused as e:
            return StepComparison(report, device_text, mode, n, graphs=step.graphs_recorded, error=str(e),
                                  notes=(_PUT_BACK,))
        loss_ok, loss_error = _close(torch.tensor(whole_losses, dtype=torch.float64),
                                     torch.tensor(eager_losses, dtype=torch.float64), rtol, atol)
        param_ok, param_error = True, 0.0
        for p, ref in zip(params, eager_params):
            ok, err = _close(p.detach(), ref, rtol, atol)
            param_ok, param_error = param_ok and ok, max(param_error, err)
        notes.extend(f"in the run: {note}" for note in step.notes)
        timings: list[tuple[str, float]] = []
        if mode == "cuda" and repeats > 0:
            say(f"timing {rounds} rounds of {repeats} consecutive steps: the whole step…")
            timings.append(("eager", 0.0))
            timings.append(("whole step", _time_steps(lambda: step(*batch), repeats, rounds, device)))
            saved.restore()
            say(f"timing {rounds} rounds of {repeats} consecutive steps: eager PyTorch…")
            for _ in range(2):
                _eager_step(loss_fn, optimizer, batch)
            timings[0] = ("eager", _time_steps(lambda: _eager_step(loss_fn, optimizer, batch), repeats, rounds, device))
        return StepComparison(report, device_text, mode, n, (tuple(eager_losses), tuple(whole_losses)), len(params),
                              loss_error, param_error, (rtol, atol), loss_ok and param_ok, step.graphs_recorded,
                              tuple(timings), repeats if timings else 0, notes=(*notes, _PUT_BACK))
    finally:
        del step  # NOTE: the graph and its memory go before the state is put back
        saved.restore()


_PUT_BACK = ("your model and optimizer are as they were: this run trained them, then put back their parameters, "
             "buffers, optimizer state and hyperparameters, .grad and torch's random state")


class _Saved:
    """The state `compare_step` trains and puts back: parameters and buffers (in place), the optimizer's state dict,
    each ``.grad``, torch's random state."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]):
        import copy

        self._model, self._optimizer, self._params = model, optimizer, params
        self._tensors = [(t, t.detach().clone()) for t in (*params, *model.buffers())]
        self._grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        self._opt = copy.deepcopy(optimizer.state_dict())
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        import copy

        with torch.no_grad():
            for t, value in self._tensors:
                t.copy_(value)
        for p, g in zip(self._params, self._grads):
            p.grad = None if g is None else g.clone()
        # NOTE: a copy each time: load_state_dict keeps the tensors it is given, and the next steps update them in place
        self._optimizer.load_state_dict(copy.deepcopy(self._opt))
        torch.set_rng_state(self._cpu_rng)
        if self._cuda_rng is not None:
            torch.cuda.set_rng_state_all(self._cuda_rng)


def _tensors_trained(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The model's parameters that require grad, then any other tensor the optimizer updates (each once)."""
    seen: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        if p.requires_grad:
            seen.setdefault(id(p), p)
    for group in optimizer.param_groups:
        for p in group["params"]:
            seen.setdefault(id(p), p)
    return list(seen.values())


def _tolerance(params: Sequence[torch.Tensor]) -> tuple[float, float]:
    """(rtol, atol): the zoo's tolerances for a logged loss (float32), wider for 16-bit parameters."""
    if any(p.dtype in (torch.float16, torch.bfloat16) for p in params):
        return 2e-2, 2e-2
    return 1e-4, 1e-4


def _close(got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> tuple[bool, float]:
    """(whether ``got`` equals ``ref`` within the tolerance, the largest absolute difference)."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if got.shape != ref.shape:
        return False, float("inf")
    if not got.numel():
        return True, 0.0
    diff = (got - ref).abs()
    ok = bool(torch.all(diff <= atol + rtol * ref.abs())) and not bool(torch.isnan(got).any() ^ torch.isnan(ref).any())
    return ok, float(diff.nan_to_num(nan=0.0).max())


def _eager_forward(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer,
                   batch: Sequence[Any]) -> None:
    """Call ``loss_fn(*batch)`` once in eager PyTorch, state put back after; what it raises, raised."""
    saved = _Saved(model, optimizer, _tensors_trained(model, optimizer))
    try:
        with torch.no_grad():
            loss_fn(*batch)
    finally:
        saved.restore()


def _eager_step(loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, batch: Sequence[Any]) -> torch.Tensor:
    """One step of eager PyTorch, as the user writes it; the loss, detached (no host sync)."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(*batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _time_steps(run: Callable[[], Any], repeats: int, rounds: int, device: torch.device) -> float:
    """Milliseconds per step: the median of ``rounds`` rounds of ``repeats`` consecutive calls (no sync inside)."""
    import statistics
    import time

    per_round = []
    for _ in range(rounds):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        torch.cuda.synchronize(device)
        per_round.append((time.perf_counter() - start) / repeats * 1e3)
    return statistics.median(per_round)


def _split(batch: Sequence[Any], k: int) -> list[list[Any]]:
    """``batch`` as ``k`` micro-batches: each tensor chunked along dim 0, other values repeated."""
    if k == 1:
        return [list(batch)]
    parts = []
    for i, b in enumerate(batch):
        if isinstance(b, torch.Tensor):
            if b.dim() == 0 or b.shape[0] % k:
                raise ValueError(f"accumulate={k}: the batch's argument {i} has shape {tuple(b.shape)}, whose "
                                 f"first dimension does not split in {k} equal micro-batches")
            parts.append(b.chunk(k))
        else:
            parts.append([b] * k)
    return [list(p) for p in zip(*parts)]


def _shapes(batch: Sequence[Any]) -> str:
    return ", ".join(f"{list(b.shape)} {str(b.dtype).replace('torch.', '')}" if isinstance(b, torch.Tensor)
                     else repr(b) for b in batch)
