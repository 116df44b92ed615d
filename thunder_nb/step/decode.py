"""Several greedy decode tokens per CUDA-graph replay: the `Decoder` behind `thunder_nb.jit_decode` (issue #55)."""

from __future__ import annotations

import linecache
from collections.abc import Callable
from typing import Any

import torch

from .. import internals
from ..cudagraph.capture import Capture, parse_capture
from ..cudagraph.record import RECORDERS
from ..diagnosis.failures import Where, where_text
from ..diagnosis.ops import classify_bsym

__all__ = ["Decoder", "DecodeRefused", "litgpt_forward"]


class DecodeRefused(RuntimeError):
    """The model's decode step cannot be recorded into one graph: the message names the user's line and what to
    change."""


def litgpt_forward(model: Any, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """One decode call in litgpt's convention: ``model(idx, input_pos)`` -> logits ``(B, T, vocab)``.

    ``input_pos_maxp1`` is not passed: litgpt then attends over the whole cache under its causal mask, the same
    shape at every position. litgpt's own generate passes it as a Python int (``max(input_pos) + 1``), which a graph
    would keep at its recorded value (and thunder would trace anew for each value).
    """
    return model(token, input_pos)


class _NoStream:
    """What `thunder_nb.cudagraph.record.record_graph` reads of a runner: no shared stream or pool (a graph of its
    own)."""

    stream: dict = {}
    mem_pool: dict = {}


class _Eager:
    """A decoder's replay without a graph (capture off, or AUTO on the CPU): the steps run as they are."""

    def __init__(self, run: Callable[..., Any], state: tuple[torch.Tensor, ...]):
        self.run, self.state = run, state

    def replay(self) -> None:
        with torch.no_grad():
            self.run(*self.state)


class Decoder:
    """A model's greedy decoding, ``tokens`` decode steps recorded as one CUDA graph; made by `jit_decode`."""

    def __init__(self, model: Any, tokens: int, forward: Callable[..., Any], capture: Any, *, jit: Callable[..., Any],
                 **jit_options: Any):
        internals.check_versions()
        self.model, self.tokens, self.forward, self.capture = model, tokens, forward, parse_capture(capture)

        def step(token, input_pos, done, eos):
            logits = forward(model, token, input_pos)
            # NOTE: masking: a row past its EOS repeats it, so what follows it is discarded; the EOS id is a tensor
            # (-1 for none, never an argmax), so one trace and one graph serve every EOS id
            nxt = torch.where(done, eos, logits[:, -1:].argmax(-1))
            return nxt, input_pos + 1, done | (nxt == eos)

        # NOTE: the step is traced once and run eagerly by its regions (capture off); the k calls of it are recorded
        # together into this decoder's own graph, so a longer k costs no more tracing
        self.step = jit(step, capture=Capture.OFF, **jit_options)
        self._graphs: dict[tuple, tuple[Any, tuple[torch.Tensor, ...]]] = {}
        self._last: tuple | None = None  # NOTE: the key of the graph `start` set up, which `replay` replays
        self.replays = 0

    # --- the graph ----------------------------------------------------------------------------------------------

    def _run(self, token: torch.Tensor, pos: torch.Tensor, done: torch.Tensor, eos: torch.Tensor,
             out: torch.Tensor):
        """The graph's work: ``out.shape[1]`` steps from the state buffers, the tokens into ``out``, the state written
        back (the next replay starts where this one ended, with no host in between)."""
        with torch.no_grad():  # NOTE: here too, for a stand-in's replay, which runs this again
            t, p, d = token, pos, done
            for i in range(out.shape[1]):
                t, p, d = self.step(t, p, d, eos)
                out[:, i:i + 1].copy_(t)
            token.copy_(t)
            pos.copy_(p)
            done.copy_(d)
        return (out,)

    def _graph(self, batch: int, device: torch.device) -> tuple[Any, tuple[torch.Tensor, ...]]:
        if self.tokens < 1:
            raise ValueError(f"tokens must be at least 1, got {self.tokens}")
        key = (batch, device, self.tokens)
        if key in self._graphs:
            return self._graphs[key]
        length = getattr(self.model, "max_seq_length", None)
        if isinstance(length, int) and 2 * self.tokens > length:
            raise ValueError(f"tokens={self.tokens}: recording runs two replays' steps from position 0, more than the "
                             f"cache's {length} positions; pass tokens <= {length // 2}")
        state = (torch.zeros(batch, 1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long,
                 device=device), torch.zeros(batch, 1, dtype=torch.bool, device=device),
                 torch.full((batch, 1), -1, dtype=torch.long, device=device), torch.zeros(batch, self.tokens, dtype=torch.long, device=device))
        # NOTE: recorded before the prompt's prefill, at position 0: the warm-up's and recording's writes into the
        # cache lie where the prefill and the decode steps write before anything reads them (the causal mask hides
        # every position past the current one)
        with torch.no_grad():
            try:
                self._run(*state)  # NOTE: the trace and the warm-up
            except Exception as e:
                raise DecodeRefused(
                    f"thunder could not trace the decode step ({type(e).__name__}: "
                    f"{(str(e).splitlines() or [''])[0][:200]}). A Python number read from the position (an "
                    "`.item()` used as a size or an int, as litgpt's sliding-window cache does) cannot be traced: keep "
                    "it a tensor, or pass forward= a call that avoids it (litgpt: model(idx, input_pos) without "
                    "input_pos_maxp1)") from e
            self._refuse_host_work(device)
            state[1].zero_()
            graph = RECORDERS["record"](_NoStream(), self._run, state, 0)[0] if self._records(device) else _Eager(self._run, state)
        self._graphs[key] = graph, state
        return graph, state

    def _records(self, device: torch.device) -> bool:
        """Whether replays are a recorded graph (or its emulated stand-in) rather than the steps run as they are."""
        if self.capture is Capture.AUTO:
            return device.type == "cuda"
        return self.capture is not Capture.OFF

    def _refuse_host_work(self, device: torch.device) -> None:
        """Raise `DecodeRefused` for an op of the step a graph would not replay (a host sync such as ``.item()``, a
        device transfer, a CPU op of a CUDA step), naming the user's line."""
        import thunder

        traces = thunder.last_traces(self.step)
        lines: dict[str, tuple[str, int]] = {}
        for trace in traces:
            for b in trace.bound_symbols:
                at = internals.source_line(b)
                if at is not None:
                    for p in b.flat_proxy_outs:
                        lines.setdefault(p.name, at)
        for b in traces[-1].bound_symbols:
            if getattr(b.sym, "is_fusion", False):
                continue
            found = classify_bsym(b, cuda_trace=device.type == "cuda")
            if found is None:
                continue
            at = next((lines[p.name] for p in b.flat_proxy_outs if p.name in lines), None)
            where = (where_text(Where(at[0], at[1], linecache.getline(at[0], at[1]).strip(), ""))
                     if at else "a line thunder kept no position for")
            raise DecodeRefused(
                f"the decode step cannot be recorded as one graph: {where} runs {found[1]} ({found[0]}), which a "
                "replay would not run again. Keep positions on the device: read them as tensors (litgpt: call "
                "model(idx, input_pos) without input_pos_maxp1, as litgpt_forward does; a sliding-window cache reads "
                "input_pos.max().item() and cannot be recorded), or pass forward= a call that avoids it")

    # --- decoding -----------------------------------------------------------------------------------------------

    def start(self, token: torch.Tensor, input_pos: torch.Tensor, eos_id: int | None = None) -> None:
        """Set the next replay's input: the last token, ``(B, 1)``, its position, ``(1,)`` (a device tensor), and the
        EOS id to stop at (None: none). Records the graph for this batch size and ``tokens`` the first time."""
        _, (t, p, d, e, _) = self._graph(token.shape[0], token.device)
        self._last = (token.shape[0], token.device, self.tokens)
        t.copy_(token)
        p.copy_(input_pos.reshape(1))
        e.fill_(-1 if eos_id is None else eos_id)
        d.copy_(token == e)

    def replay(self) -> torch.Tensor:
        """Decode ``tokens`` more tokens: ``(B, tokens)`` on the device, each row's tokens after its EOS equal to
        the EOS id. The tensor is the graph's: the next replay overwrites it (clone what you keep)."""
        if self._last is None:
            raise RuntimeError("call start(token, input_pos) first")
        graph, state = self._graphs[self._last]
        graph.replay()
        self.replays += 1
        return state[4]

    def generate(self, prompt: torch.Tensor, max_new_tokens: int, eos_id: int | None = None) -> torch.Tensor:
        """Greedy continuation of ``prompt`` ``(B, T)``: ``(B, n)`` new tokens, ``n <= max_new_tokens``, ending
        with the EOS id where every row reached it (a row that ended earlier continues with it).

        The prompt goes through the model as it is (one call, not recorded); each replay then decodes ``tokens``
        tokens. With an EOS id, ``done`` is read after each replay (one host read per ``tokens`` tokens) to stop.
        """
        batch, length = prompt.shape
        limit = getattr(self.model, "max_seq_length", None)
        if isinstance(limit, int) and length + max_new_tokens > limit:
            raise ValueError(f"{length} prompt tokens + max_new_tokens={max_new_tokens} exceed the model's "
                             f"max_seq_length {limit}")
        device = prompt.device
        _, state = self._graph(batch, device)
        with torch.no_grad():
            logits = self.forward(self.model, prompt, torch.arange(length, device=device))
        first = logits[:, -1:].argmax(-1)
        chunks = [first]
        self.start(first, torch.tensor([length], device=device), eos_id)
        eos = eos_id
        while sum(c.shape[1] for c in chunks) < max_new_tokens:
            if eos is not None and bool(state[2].all()):
                break
            chunks.append(self.replay().clone())
        out = torch.cat(chunks, 1)[:, :max_new_tokens]
        if eos is not None:
            ended = (out == eos).cumsum(1) > 0
            ended_before = torch.cat([torch.zeros_like(ended[:, :1]), ended[:, :-1]], 1)
            out = out.masked_fill(ended_before, eos)  # NOTE: already so; the prefill's EOS row included
            stops = ended.all(0).nonzero()
            if len(stops):
                out = out[:, : int(stops[0]) + 1]
        return out
