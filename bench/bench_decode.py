"""KV-cache decoding, tokens per second: the classic CUDA-graph workload, every configuration side by side (#31.2).

    python bench/bench_decode.py [--model litgpt-pythia-14m] [--dtypes float32,bfloat16] [--rounds 5] [--steps 30]
                                 [--configs eager,thunder no-sdpa,thunder_nb.jit,fused,reduce-overhead,k=8] [--out FILE.md]

The zoo's litgpt model at random init (`thunder_nb.testing.zoo`), its KV cache set up for one sequence
(``GPT.set_kv_cache``), greedy decoding: a prefill of 8 tokens, then one-token calls with ``input_pos`` advancing.
Each configuration first decodes 24 tokens (``--tokens``) from the same prompt as eager, and its tokens are compared
with eager's, token for token (``--model litgpt-pythia-14m-128 --tokens 64``: 64 tokens, in a 128-token cache). The
timed loop then decodes as a generation loop does: each call's argmax is the next call's token (on the device, no host
sync), the positions are device tensors made beforehand, and the position wraps inside the cache. Configurations take
turns in rounds of ``--steps`` tokens, synchronised only at the rounds' ends; reported: the median over rounds of
tokens per second and of ms per token, and the ratio of ms per token to torch.compile reduce-overhead's with its
spread over rounds, and torch.profiler's GPU kernel time per token (a configuration whose time per token is near it
waits for the GPU: fewer, fused kernels help it; one far above waits for the host). thunder's sdpa executor refuses
the decode step (a batch-broadcast mask), so plain thunder runs without it ("thunder no-sdpa"); `thunder_nb.jit`
chooses its executors itself. ``k=8`` and ``k=8 fused``: `thunder_nb.jit_decode`, eight tokens a replay (time per
token: pass ``--steps`` a multiple of 8).

``--model llama2-7b --dtypes bfloat16`` (`sized_models`: Llama-2-7b's shape at random init, 13.5 GB of weights a copy,
one copy per configuration: a few configurations a run) decodes where the GPU's memory bandwidth is the bound; the
table gives the time to read the weights once at the GPU's nominal bandwidth and its share of each row's time per
token.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import rounds  # noqa: E402
import sized_models  # noqa: E402
from thunder_nb.testing import zoo  # noqa: E402

CONFIGS = ("eager", "thunder no-sdpa", "stock", "thunder_nb.jit", "fused", "reduce-overhead", "k=8", "k=8 fused")
#: `thunder_nb.jit_decode` configurations: tokens per replay, and `thunder_nb.jit`'s executors
REPLAYS = {"k=8": (8, ()), "k=8 fused": (8, ("torchcompile",))}
LABELS = {"eager": "eager", "thunder no-sdpa": "thunder without sdpa (no graphs)",
          "stock": "thunder's CUDAGraphTransform",
          "thunder_nb.jit": "thunder_nb.jit", "fused": "thunder_nb.jit + torchcompile",
          "reduce-overhead": "torch.compile reduce-overhead",
          "thunder": "thunder (no graphs)", "fixed": "FixedCUDAGraphTransform",
          "k=8": "thunder_nb.jit_decode, 8 tokens a replay",
          "k=8 fused": "thunder_nb.jit_decode + torchcompile, 8 tokens a replay"}
PROMPT = 8
#: Greedy tokens each configuration decodes first, compared with eager's (``--tokens``).
TOKENS = 24


def _model_and_prompt(model_name: str, dtype: torch.dtype, device: str) -> tuple[Any, torch.nn.Module, torch.Tensor]:
    """The zoo (or sized) model, its network from the initial state in ``dtype`` and eval mode with its KV cache for
    one sequence, and the prompt every configuration decodes from."""
    model = sized_models.model(model_name)
    net = model.build(device).to(dtype).eval()
    net.set_kv_cache(batch_size=1, device=torch.device(device), dtype=dtype)
    g = torch.Generator().manual_seed(0)
    return model, net, torch.randint(0, 128, (1, PROMPT), generator=g).to(device)


class Decoder:
    """One configuration's model, KV cache and compiled step, from the zoo's initial state."""

    def __init__(self, model_name: str, config: str, dtype: torch.dtype, device: str):
        model, self.net, self.prompt = _model_and_prompt(model_name, dtype, device)
        self.fn, self.transform = zoo.compile_with(config, model.infer(self.net), capture=device == "cuda")
        self.length = self.net.max_seq_length
        self.positions = [torch.tensor([p], device=device) for p in range(PROMPT, self.length)]
        self.device = device
        self.token: torch.Tensor | None = None  # the timed loop's next input token

    def prefill(self) -> torch.Tensor:
        with torch.no_grad():
            out = self.fn(self.prompt, torch.arange(PROMPT, device=self.device))
        return out[:, -1:].argmax(-1)

    def tokens(self, n: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy decoding of ``n`` tokens after the prefill; the tokens and each call's logits (copies).

        Raises:
            ValueError: the prompt and ``n`` tokens do not fit the model's cache (the timed loop's positions wrap
                inside it; a comparison must not).
        """
        if PROMPT + n > self.length:
            raise ValueError(f"{n} tokens after the {PROMPT}-token prompt do not fit the model's {self.length}-token "
                             "cache (--tokens; litgpt-pythia-14m-128 holds 120)")
        tokens, logits = [], []
        with self.context():
            for i in range(n):
                logits.append(self.step(i).float().clone())
                tokens.append(int(self.token))
        self.token = None  # NOTE: the timed loop starts from its own prefill
        return tokens, logits

    def context(self) -> contextlib.AbstractContextManager:
        return torch.no_grad()

    def step(self, i: int) -> torch.Tensor:
        """One token: the last call's argmax at the next position (wrapping inside the cache), no host sync; the
        call's logits."""
        if self.token is None:
            self.token = self.prefill()
        out = self.fn(self.token, self.positions[i % len(self.positions)])
        self.token = out[:, -1:].argmax(-1)
        return out

class ReplayDecoder(Decoder):
    """`thunder_nb.jit_decode`: ``k`` greedy tokens a replay, token and position on the device between them. A
    step is one token's share: every ``k``-th step replays (``--steps`` a multiple of ``k`` times a whole number of
    replays); the position goes back to the prompt's end before it would pass the cache's end."""

    def __init__(self, model_name: str, config: str, dtype: torch.dtype, device: str):
        import thunder_nb

        _, self.net, self.prompt = _model_and_prompt(model_name, dtype, device)
        self.k, executors = REPLAYS[config]
        self.decoder = thunder_nb.jit_decode(self.net, tokens=self.k, executors=list(executors))
        self.transform, self.length, self.device, self.token = None, self.net.max_seq_length, device, None
        self.start_pos = torch.tensor([PROMPT], device=device)
        self.pos = PROMPT

    def tokens(self, n: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy decoding of ``n`` tokens after the prefill (the prefill's token first, as `Decoder`'s); no logits
        (a replay returns tokens)."""
        tokens = self.decoder.generate(self.prompt, n + 1)[0, 1:].tolist()
        self.token = None
        return tokens, []

    def step(self, i: int) -> torch.Tensor | None:
        if self.token is None or self.pos + self.k > self.length:
            if self.token is None:
                with torch.no_grad():
                    self.token = self.net(self.prompt, torch.arange(PROMPT, device=self.device))[:, -1:].argmax(-1)
            self.decoder.start(self.token, self.start_pos)
            self.pos = PROMPT
        if i % self.k:
            return None
        self.pos += self.k
        return self.decoder.replay()


def bench(model_name: str, dtype: torch.dtype, n_rounds: int, steps: int, configs: tuple[str, ...],
          device: str = "cuda", n: int = TOKENS) -> dict[str, dict]:
    """Every configuration's rows for one model and dtype; ``n`` greedy tokens compared with eager's first."""
    rows: dict[str, dict] = {}
    decoders: dict[str, Decoder] = {}
    reference: tuple[list[int], list[torch.Tensor]] | None = None
    for config in configs:
        row = rows[config] = {"config": config, "ms": [], "note": ""}
        try:
            start = time.perf_counter()
            dec = (ReplayDecoder if config in REPLAYS else Decoder)(model_name, config, dtype, device)
            tokens, logits = dec.tokens(n)
            rounds.sync(device)
            row["first_s"] = time.perf_counter() - start
        except Exception as e:  # NOTE: a configuration failing is a finding, reported in its row
            rounds.recover(device)
            row["note"] = f"fails: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:110]}"
            continue
        if reference is None:
            reference = (tokens, logits)
        same = sum(a == b for a, b in zip(tokens, reference[0]))
        err = max((float((a - b).abs().max()) for a, b in zip(logits, reference[1])), default=None)
        row["equal"] = f"{same}/{n} tokens" + (f", logits max abs diff {err:.2g}" if err is not None else "")
        decoders[config] = dec
        print(f"  {model_name} {dtype} {config}: {row['equal']}, first {row['first_s']:.1f} s", file=sys.stderr,
              flush=True)
    for dec in decoders.values():  # NOTE: one untimed round: the decode shape's graph is recorded, caches warm
        with dec.context():
            for i in range(steps):
                dec.step(i)
    rounds.time_rounds(decoders, rows, n_rounds, steps, device)
    for config, dec in decoders.items():
        rows[config]["weight_bytes"] = sum(p.numel() * p.element_size() for p in dec.net.parameters())
        if rows[config]["ms"]:
            rows[config]["kernel_us"] = rounds.kernel_us(dec, steps, device)
        if dec.transform is not None:
            rows[config]["graphs"], rows[config]["regions"] = zoo.count_graphs(dec.transform)
    rounds.add_ratios(rows)
    return rows


def peak_bandwidth() -> float | None:
    """The GPU's nominal memory bandwidth in bytes/s (2 x the memory clock x the bus width: an H100 SXM's 3.35 TB/s, an
    H200's 4.8 TB/s), or None without one."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return 2 * props.memory_clock_rate * 1e3 * props.memory_bus_width / 8


def table(results: dict, n_rounds: int, steps: int, n: int = TOKENS) -> str:
    peak = peak_bandwidth()
    lines = [f"Machine: {rounds.machine()}. {n_rounds} rounds of {steps} one-token decode calls per "
             "configuration, taking turns; the first columns are medians over rounds. Bandwidth bound: the time to "
             "read the weights once at the GPU's nominal bandwidth"
             + (f" ({peak / 1e12:.2f} TB/s)" if peak else " (no GPU: none)")
             + ", as a share of the measured time per token.", "",
             "| model, dtype | configuration | tokens/s | ms/token | vs reduce-overhead (min-max) | equal to eager "
             f"({n} greedy tokens) | GPU kernel time per token, µs | bandwidth bound: ms (share) | graphs (regions) | "
             f"first {n} tokens, s | note |",
             "|---|---|---:|---:|---:|---|---:|---:|---|---:|---|"]
    for (model, dtype), rows in results.items():
        for row in rows.values():
            ms = statistics.median(row["ms"]) if row["ms"] else None
            ratio = row.get("ratio")
            cells = [f"{model}, {str(dtype).removeprefix('torch.')}", LABELS.get(row["config"], row["config"]),
                     f"{1e3 / ms:,.0f}" if ms else "-", f"{ms:.3f}" if ms else "-",
                     f"{ratio[0]:.3f}x ({ratio[1]:.3f}-{ratio[2]:.3f})" if ratio else "-", row.get("equal", "-"),
                     f"{row['kernel_us']:.0f}" if row.get("kernel_us") else "-",
                     _bound(row.get("weight_bytes"), ms, peak),
                     f"{row['graphs']} ({row['regions']})" if row.get("graphs") is not None else "",
                     f"{row['first_s']:.1f}" if row.get("first_s") else "-", row["note"]]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bound(weight_bytes: int | None, ms: float | None, peak: float | None) -> str:
    """The weights' read time at ``peak`` bytes/s, and its share of ``ms`` (1.0: at the bandwidth limit)."""
    if not (weight_bytes and ms and peak):
        return "-"
    limit = weight_bytes / peak * 1e3
    return f"{limit:.3f} ({limit / ms:.0%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="litgpt-pythia-14m",
                        help="a zoo model with the decode protocol, or llama2-7b (bench/sized_models.py)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    rounds.add_round_arguments(parser)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="configuration,... (zoo.CONFIGS names)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: checks the script (no capture; inductor's configuration is left out)")
    parser.add_argument("--out", help="also write the table into this Markdown file")
    parser.add_argument("--tokens", type=int, default=TOKENS,
                        help="greedy tokens compared with eager's (the prompt's 8 and these fit the model's cache)")
    args = parser.parse_args()
    decoding = [n for n, m in {**zoo.MODELS, **sized_models.SIZED}.items() if "decode" in m.protocols]
    if args.model not in decoding:
        parser.error(f"{args.model} has no decode protocol (models with one: {decoding})")
    model = sized_models.model(args.model)
    if zoo.missing_package(model):
        print(f"skipped: {args.model} needs the {zoo.missing_package(model)} package")
        return 0
    configs = tuple(c.strip() for c in args.configs.split(","))
    if args.device == "cpu":
        configs = tuple(c for c in configs if c not in ("reduce-overhead", "stock", "fused", "k=8 fused"))
    rounds.run_rows([(args.model, getattr(torch, d)) for d in args.dtypes.split(",")],
                    lambda key: bench(key[0], key[1], args.rounds, args.steps, configs, args.device, args.tokens),
                    lambda key: f"{key[0]} {key[1]}", lambda results: table(results, args.rounds, args.steps,
                                                                            args.tokens),
                    args.out, "KV-cache decoding", time_limit=args.time_limit,
                    rest=("--dtypes", lambda key: str(key[1]).removeprefix("torch.")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
