"""The whole-step graph: `jit_step` records forward, loss, backward and the optimizer's step as one CUDA graph, and
replays it while its host guards (`thunder_nb.step.guard`) find nothing changed."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import internals
from ..cudagraph.capture import Capture, parse_capture, resolve
from .blockers import (StepRefused, loss_blocker, refuse_blockers, refuse_fp16, refuse_no_grad, returned_value, split,
                       thunder_jit)
from .guard import Snapshot, autocast_key, batch_key, key_difference, not_recorded_words, trained_parameters
from .optimizer import TENSOR_LR, lr_to_tensor, make_capturable, optimizer_plan, without_state
from .ranks import data_parallel
from .recording import CudaRecording, EmulatedRecording, record_cuda, replay_on, updated, versions
from .shard import GradientShard

__all__ = ["jit_step", "Step", "RecordAgainWarning"]


#: The recordings a step keeps, one per batch key (shapes, dtypes, autocast); the oldest goes past it.
MAX_RECORDINGS = 4


class RecordAgainWarning(UserWarning):
    """The step was recorded again; the message says what changed since the last recording, and where thunder's cache
    could not see the change, that the loss function was traced anew."""


#: What the step does where thunder's cache cannot see a change (`thunder_nb.step.guard.Change.unseen`), in words.
_NEW_TRACE = ("thunder traces the loss function anew, as a new thunder.jit (its cache checks neither which members a "
              "module has nor the class of the module at a name, and would run the old trace)")


def jit_step(model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *,
             accumulate: int = 1, max_grad_norm: float | None = None, capture: bool | str | Capture = "auto",
             warmup: int = 3, copy_loss: bool = True, executors: Sequence[Any] = (), ddp: bool | None = None,
             process_group: Any = None, shard: bool = False) -> Step:
    """Compile one training iteration of ``model`` into one CUDA graph: ``step(*batch) -> loss``.

    Each call is ``zero_grad`` (set to None: every parameter the optimizer holds, and every one trained, as an eager
    loop's ``optimizer.zero_grad()``; a frozen parameter keeps no old gradient for the step to read), ``loss =
    loss_fn(*batch)`` (run as thunder's trace of the function: the model and the loss), ``loss.backward()``, optional
    clipping, ``optimizer.step()``. The first ``warmup`` calls run it
    uncaptured on a side stream (real steps, as PyTorch's whole-network capture recipe asks); the next call
    records it as one ``torch.cuda.CUDAGraph`` (gradients set to None first, so they are allocated in the graph's
    own memory) and every later call copies the batch into the graph's static input buffers and replays it.

    Replay is guarded on the host: the batch's shapes, dtypes and devices (and its non-tensor values), autocast,
    every module of the model (its submodules, parameters and buffers: the same objects in the same memory; each
    parameter's ``requires_grad``; its training flag; the names in its instance dict) and the optimizer's state,
    param groups and hyperparameters. A change records again, after ``warmup`` more uncaptured steps where thunder's
    trace changes, with a `RecordAgainWarning` that states the cause. Where thunder's own cache cannot see the change
    (a submodule, parameter, buffer or attribute added or removed, which ``hasattr(model, ...)`` in the loss may
    branch on; another module at a name), the loss function is traced anew by a new ``thunder.jit``, in every mode
    (``capture=False`` too), and the warning says so; a parameter the optimizer has no state for yet (a param group
    added later) gets one uncaptured step first, so that its state (Adam's moments) is not made inside the graph.
    A change of the same cause is said once (a scheduler changes SGD's lr at every step). Each batch key keeps its
    own recording (up to `MAX_RECORDINGS`) after its own ``warmup`` steps, so a ragged last batch is recorded in its
    turn; a key left before its recording is said once. A call under ``torch.no_grad()`` or float16 autocast is
    refused.

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
        capture: (a `thunder_nb.cudagraph.capture.Capture`, or its spellings) ``"auto"``: a real CUDA graph when
            the model is on CUDA, else the CPU stand-in; ``True`` (``"on"``): CUDA required; ``"emulated"``: the CPU
            stand-in (every replay runs the iteration eagerly and writes its loss and gradients into the recorded
            memory, as a replay does); ``False`` (``"off"``): never record (every call is an uncaptured step; no
            refusals, no warnings; a change the guards find is met as in the other modes).
        warmup: uncaptured steps before each recording, at least 1 (thunder's first call and the optimizer's first
            step, which makes its state, stay out of the graph).
        copy_loss: return a copy of the graph's loss (one small copy per step). With False the returned tensor is
            the graph's own loss buffer, overwritten by the next replay.
        executors: thunder executors, or names as `thunder_nb.jit` takes them (``"no-sdpa"``, ``"torchcompile"``).
        ddp: data parallelism, one process a rank, in the graph (`thunder_nb.step.ranks`): after the backward, each
            gradient becomes its mean over the ranks (static buckets, one ``all_reduce`` each), before clipping and
            the optimizer's step; rank 0's parameters and buffers are broadcast at ``jit_step``. None (default): where
            ``torch.distributed`` is initialized with more than one rank in the group; True: always (a world of one
            too); False: never, each rank trains alone.
        process_group: the group to average over, as ``DistributedDataParallel`` takes it (None: the default group).
        shard: ZeRO-2, FSDP's SHARD_GRAD_OP without parameter resharding (`thunder_nb.step.shard`; implies
            ``ddp=True``): the trained parameters split among the ranks by whole parameter, greedily by size, the same
            on every rank; after the backward one ``reduce_scatter_tensor`` per dtype leaves each rank the mean of its
            own parameters' gradients, its optimizer steps those alone (state for them only: the memory saved),
            clipping takes the global norm, then one ``all_gather_into_tensor`` gives every rank every updated
            parameter, all in the graph. After a step, ``.grad`` of a parameter another rank owns is None and
            ``optimizer.state_dict()`` holds this rank's shard only (a checkpoint saves each rank's). FSDP's FULL_SHARD
            (parameters sharded) is not supported: each would be gathered inside thunder's trace, and in one graph
            held in its static memory for the whole replay, saving nothing.

    Returns:
        a `Step`. What it returns is the loss as a tensor on the model's device (a copy: a logged ``loss.item()``
        after the call gives eager's number). Between steps each parameter's ``.grad`` holds the last step's
        gradients (clipped when ``max_grad_norm`` is set), in the graph's memory: the next replay overwrites them
        in place. The step never accumulates into them across calls; ``zero_grad`` between calls changes nothing
        the next step computes (with ``set_to_none=True`` the next call puts the graph's gradients back).
        Optimizer step hooks do not run on replays.

    Raises:
        ValueError: ``warmup`` below 1, ``accumulate`` below 1, a model with no parameter that requires grad;
            ``ddp=True``, ``shard=True`` or a ``process_group`` without ``torch.distributed`` initialized;
            ``shard=True`` with ``ddp=False``.
        TypeError: the model, or a module the loss function reaches, wrapped by torch's ``DistributedDataParallel`` or
            FSDP or by thunder's ``ddp`` or ``fsdp``: pass the plain module (the step averages the gradients itself).
        StepRefused: at the first call with a batch (before anything runs), when the iteration cannot be one
            graph: a host sync (``.item()``), a device transfer or a host-memory op inside ``loss_fn``, an
            optimizer with no capturable step, a loss that is not one tensor; the message names the op, the
            user's line and the fix. `capturability` lists them all. At any call: under ``torch.no_grad()``, and
            under float16 autocast (its gradients need a GradScaler, which the step cannot apply: use bfloat16),
            with the user's line.
    """
    return Step(model, loss_fn, optimizer, accumulate=accumulate, max_grad_norm=max_grad_norm, capture=capture,
                warmup=warmup, copy_loss=copy_loss, executors=executors, ddp=ddp, process_group=process_group,
                shard=shard)


class Step:
    """A training iteration recorded as one CUDA graph (see `jit_step`); call it with a batch."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer, *,
                 accumulate: int = 1, max_grad_norm: float | None = None, capture: bool | str | Capture = "auto",
                 warmup: int = 3, copy_loss: bool = True, executors: Sequence[Any] = (), ddp: bool | None = None,
                 process_group: Any = None, shard: bool = False):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if accumulate < 1:
            raise ValueError(f"accumulate must be >= 1 (got {accumulate})")
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (got {warmup}): thunder's first call and the optimizer's first step "
                             "(which makes its state: Adam's moments, SGD's momentum) must run outside the graph, or "
                             "every replay would make that state anew")
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.accumulate, self.max_grad_norm, self.warmup, self.copy_loss = accumulate, max_grad_norm, warmup, copy_loss
        self._params = trained_parameters(model)
        if not self._params:
            raise ValueError("the model has no parameter that requires grad: nothing to train")
        self.device = self._params[0].device
        # NOTE: the mode the step runs in: CUDA, EMULATED (AUTO without a CUDA device) or OFF
        self._mode = resolve(parse_capture(capture), self.device, what="the model", auto=Capture.EMULATED)
        self._executors = executors
        self._jfn = thunder_jit(loss_fn, executors)  # NOTE: made anew where thunder's cache cannot see a change
        # NOTE: ranks: the gradients' mean across ranks (`GradientAverage`, `GradientShard`), None in one process;
        # notes: what jit_step changed or decided, in words
        self.ranks, self.notes = data_parallel(model, loss_fn, ddp, process_group, GradientShard if shard else None)
        self.optimizer_text, self._optimizer_blocker = optimizer_plan(optimizer)
        # NOTE: Adam's and AdamW's lr is read at every step (a device tensor in the graph; the optimizer itself in the
        # CPU stand-in), so it stays out of the guards; other optimizers' lr is a number recorded in the graph
        self._lr_live = self._optimizer_blocker is None and isinstance(optimizer, TENSOR_LR)
        self._capturable = self._mode is Capture.CUDA and self._optimizer_blocker is None  # capturable=True set on it
        self._tensor_lr = self._capturable and self._lr_live
        self._lrs: list[torch.Tensor] = []  # the lr tensors the graph reads
        if self._capturable:
            self.notes.extend(self._set_up_optimizer())
        self._stream = torch.cuda.Stream(self.device) if self._mode is Capture.CUDA else None
        self._snap = Snapshot(model, optimizer, lr_live=self._lr_live)  # the model and optimizer the last step saw
        # NOTE: one recording per batch key, newest last: a ragged last batch keeps its own graph beside the full one
        self._recordings: OrderedDict[tuple, CudaRecording | EmulatedRecording] = OrderedDict()
        self._key: tuple | None = None  # `_key_of` the last call's batch
        self._recorded_key: tuple | None = None  # the key of the newest recording
        self._checked: set[tuple] = set()  # the batch keys whose traces were checked for blockers
        self._short: set[tuple] = set()  # the keys already said to have been left before their recording
        self._written: dict[tuple, frozenset[int]] = {}  # batch key -> positions its steps update in place
        self._stateless: frozenset[int] | None = None  # `_without_state()` after the last uncaptured step
        self._warm: dict[tuple, int] = {}  # uncaptured steps of each key since its trace last changed
        self._grad_norm: torch.Tensor | None = None
        self.graphs_recorded = 0
        self.recordings: list[str] = []  # why each recording was made
        self._why: str | None = "first recording"  # why the next one will be (None: another batch key)
        self._said: set[str] = set()  # the changes a RecordAgainWarning has named

    # --- the call ---------------------------------------------------------------------------------

    def __call__(self, *batch: Any) -> torch.Tensor:
        """Run one training iteration on ``batch``; returns the loss (see `jit_step` for what it and ``.grad`` hold)."""
        if not torch.is_grad_enabled():
            refuse_no_grad()
        key = self._key_of(batch)
        rec = self._recordings.get(key)
        if rec is not None and self._snap.change() is None:
            if key != self._key:
                self._left(self._key, key)
                self._key = key
            return self._replay(rec, batch)
        return self._slow(batch, key)

    def _replay(self, rec: Any, batch: Sequence[Any]) -> torch.Tensor:
        if self._tensor_lr:
            lr_to_tensor(self.optimizer, self._lrs)  # NOTE: a scheduler's number into the graph's lr
        replay_on(rec, batch, self._written.get(self._key, frozenset()))  # NOTE: batch in, replay, updates back
        for p, g in zip(self._params, rec.grads):
            if p.grad is not g:
                p.grad = g
        return rec.loss.clone() if self.copy_loss else rec.loss

    def _slow(self, batch: Sequence[Any], key: tuple) -> torch.Tensor:
        first = self._micro(batch)[0]  # NOTE: a batch that does not split is refused before anything changes
        refuse_fp16(key[1])
        if self._capturable:  # NOTE: load_state_dict replaces the param groups: capturable=False, lr a number
            self.notes.extend(f"{note} (again: the optimizer's param groups had lost it)"
                              for note in self._set_up_optimizer())
        change = self._snap.change()
        if change is not None:
            words = change.words + (f"; {_NEW_TRACE}" if change.unseen else "")
            if self._recordings:
                # NOTE: once per cause: a hyperparameter a scheduler changes at every step says its fix the first time
                if (change.cause or words) not in self._said:
                    self._said.add(change.cause or words)
                    warnings.warn(RecordAgainWarning(f"jit_step: recording the step again: {words}"), stacklevel=3)
                self._drop()
                self._why = change.words
            if change.unseen:
                # NOTE: in every mode: the old jitted function's cache would hit the trace made before the change
                self._jfn = thunder_jit(self.loss_fn, self._executors)
            if change.retrace:
                self._checked.clear()  # NOTE: another module, another parameter: thunder traces other code
                self._warm.clear()  # NOTE: its first call, and any compilation, stay out of the graph
            self._snap = Snapshot(self.model, self.optimizer, lr_live=self._lr_live)
            self._params = self._snap.params
        if key != self._key:
            self._left(self._key, key)
        self._key = key
        if self._mode is not Capture.OFF and key not in self._checked:
            # NOTE: before anything runs: the model stays as it was
            refuse_blockers(self._jfn, self.loss_fn, first, self.device, self._optimizer_blocker)
            self._checked.add(key)
        if self._mode is Capture.OFF or self._warm.get(key, 0) < self.warmup or self._lazy_state_pending():
            self._warm[key] = self._warm.get(key, 0) + 1
            loss = self._uncaptured(batch)
            self._stateless = self._without_state()
            return loss
        if self._why is None:  # NOTE: another batch key, the ones before it kept
            self._why = key_difference(self._recorded_key, key)
            warnings.warn(RecordAgainWarning(f"jit_step: recording the step again: {self._why}"), stacklevel=3)
        return self._record(batch, key)

    def _left(self, old: tuple | None, new: tuple) -> None:
        """Say once when the batch key changes before the old key's steps were recorded (a ragged last batch, seen
        once an epoch, runs uncaptured for its first ``warmup`` epochs)."""
        if self._mode is Capture.OFF or old is None or old in self._recordings or old in self._short:
            return
        ran = self._warm.get(old, 0)
        if ran >= self.warmup:
            return
        self._short.add(old)
        warnings.warn(RecordAgainWarning(not_recorded_words(old, new, ran, self.warmup)), stacklevel=4)

    # --- what runs --------------------------------------------------------------------------------

    def _micro(self, batch: Sequence[Any]) -> list[list[Any]]:
        return split(batch, self.accumulate)

    def _iteration(self, batch: Sequence[Any], *, capturing: bool = False) -> torch.Tensor:
        """Forward, loss, backward (per micro-batch), clipping, optimizer step; the loss, detached. ``capturing``:
        inside a real capture (see the note on cuBLAS's workspaces)."""
        k = self.accumulate
        total = None
        for part in self._micro(batch):
            loss = self._jfn(*part)
            if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
                raise StepRefused([loss_blocker(self.loss_fn, returned_value(loss))], "needs the loss")
            if k > 1:
                loss = loss / k
            if capturing:
                # NOTE: torch keys cuBLAS's workspace by (handle, stream), a handle per thread: the forward's matmuls
                # run on this thread, the backward's on autograd's, so one capture would hold two workspaces (32 MiB
                # each on Hopper). Freed here, inside the capture, the forward's goes back to the graph's pool and the
                # backward's takes it, in stream order: one at a time, as in the per-region transform's peak (#34)
                internals.clear_cublas_workspaces()
            loss.backward()
            if capturing:
                internals.clear_cublas_workspaces()  # NOTE: the next micro-batch's forward takes the backward's block
            total = loss.detach() if total is None else total + loss.detach()
        if self.ranks is not None:
            self.ranks(self._params)  # NOTE: the gradients' mean over the ranks (sharded: the owned ones), in the graph
        if self.max_grad_norm is not None:  # NOTE: sharded, the global norm: one all_reduce of the shards' squares
            clip = torch.nn.utils.clip_grad_norm_ if self.ranks is None else self.ranks.clip
            self._grad_norm = clip(self._params, self.max_grad_norm)
        self.optimizer.step()
        if self.ranks is not None:
            self.ranks.after_step(self._params)  # NOTE: sharded: every rank's updated parameters gathered to all
        return total

    def _zero_grad(self) -> None:
        """``optimizer.zero_grad()`` (set to None) over the optimizer's parameters and the trained ones, as an eager
        loop's step begins: a parameter no longer trained (frozen by ``requires_grad_(False)``, its module removed)
        keeps no gradient of an earlier step, which the optimizer's step would read (decay, moments, step count)."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        for p in self._params:
            p.grad = None

    def _uncaptured(self, batch: Sequence[Any]) -> torch.Tensor:
        self._zero_grad()
        before = versions(batch)
        if self._stream is None:
            loss = self._iteration(batch)
        else:
            current = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                loss = self._iteration(batch)
            current.wait_stream(self._stream)
            loss.record_stream(current)
        self._written[self._key] = self._written.get(self._key, frozenset()) | updated(batch, before)
        return loss

    def _record(self, batch: Sequence[Any], key: tuple) -> torch.Tensor:
        static = [b.clone() if isinstance(b, torch.Tensor) else b for b in batch]  # NOTE: the graph's input buffers
        self._zero_grad()  # NOTE: the recipe's zero_grad(set_to_none=True): gradients allocated in the graph's pool
        if self._tensor_lr:
            lr_to_tensor(self.optimizer, self._lrs)  # NOTE: a scheduler's number into the graph's lr
        if self._mode is Capture.CUDA:
            if self.ranks is not None:
                with torch.cuda.stream(self._stream):
                    self.ranks.warm(self.device)  # NOTE: the communicator exists before the capture, on its stream
            rec: Any = record_cuda(self._iteration, static, self._params, self._stream, self.device)
        else:
            rec = EmulatedRecording(self._iteration, static, self._params)
        self._recordings[key] = rec
        if len(self._recordings) > MAX_RECORDINGS:
            self._recordings.popitem(last=False)  # NOTE: its graph's memory goes with it; the key warms up again
        self._recorded_key = key
        self.graphs_recorded += 1
        self.recordings.append(self._why)
        self._why = None
        return self._replay(rec, batch)

    def _drop(self) -> None:
        self._recordings.clear()
        for p in self._params:
            p.grad = None  # NOTE: the old graph's gradients go with its memory

    # --- guards and the optimizer -----------------------------------------------------------------

    def _key_of(self, batch: Sequence[Any]) -> tuple:
        """What thunder's trace depends on besides the model: the batch's shapes, dtypes, devices and values, and
        autocast. Another key means another trace: warm-up steps before the next recording."""
        return batch_key(batch), autocast_key(self.device)

    def _without_state(self) -> frozenset[int]:
        """The ids of the parameters the optimizer trains that it has no state for (yet); sharded, of those this rank
        owns (another rank's never get any here)."""
        return without_state(self.optimizer) - (self.ranks.others if self.ranks is not None else frozenset())

    def _lazy_state_pending(self) -> bool:
        """Whether the optimizer's next step would still make state (Adam's moments, SGD's momentum) for a parameter:
        made inside the graph, each replay would make it anew. One uncaptured step makes it; a parameter that still
        has none after it gets none (no gradient reaches it, or the optimizer keeps no state)."""
        missing = self._without_state()
        return bool(missing) and missing != self._stateless

    def _set_up_optimizer(self) -> list[str]:
        """Give the optimizer what a capture needs (`make_capturable`) and keep its lr tensors; what changed, in
        words."""
        notes = make_capturable(self.optimizer, self.device, tensor_lr=self._tensor_lr)
        if self._tensor_lr:
            self._lrs = [g["lr"] for g in self.optimizer.param_groups]
        return notes

    # --- what a user reads ------------------------------------------------------------------------

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """The gradients' total norm before clipping at the last step (a copy; None without ``max_grad_norm``)."""
        return None if self._grad_norm is None else self._grad_norm.clone()

    @property
    def captured(self) -> bool:
        """Whether the next call with the same batch shapes replays a graph."""
        return bool(self._recordings)

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        """The newest recording's ``torch.cuda.CUDAGraph`` (None: nothing recorded, or the CPU stand-in's): a benchmark
        replays it alone to time the step's GPU work."""
        rec = self._recordings.get(self._recorded_key) if self._recorded_key is not None else None
        return rec.graph if isinstance(rec, CudaRecording) else None

    def __repr__(self) -> str:
        mode = {Capture.CUDA: "CUDA graph", Capture.EMULATED: "emulated on the CPU",
                Capture.OFF: "uncaptured"}[self._mode]
        ranks = f", {self.ranks.short()}" if self.ranks is not None else ""
        return (f"<thunder_nb.step.Step of {getattr(self.loss_fn, '__name__', 'loss_fn')}: {mode}, "
                f"{self.graphs_recorded} recorded, optimizer {self.optimizer_text}{ranks}>")
