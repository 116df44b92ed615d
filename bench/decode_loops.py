"""KV-cache decoding, one configuration at a time: how each way of feeding the next token changes the time per token.

    python bench/decode_loops.py [--configs thunder_nb.jit,reduce-overhead] [--tokens 200] [--repeats 3]

`bench_decode.py` times configurations taking turns in rounds; this times each alone, in loops that differ only in
how the next call's token is made (`bench_decode.Decoder`: litgpt pythia-14m, fp32, a prefill, then one token per
call with ``input_pos`` advancing, under ``no_grad``):

- ``same token``: the same token tensor every call (the zoo's decode loop);
- ``argmax``: the last call's argmax of its logits (a generation loop; `bench_decode.py`'s);
- ``argmax copied``: that argmax copied into one tensor, which every call takes;
- ``argmax, logits dropped``: as ``argmax``, the call's logits not kept past the argmax.

Prints µs per token (synchronised at each loop's ends): the lowest and the middle of ``--repeats`` loops. A
configuration alone near its GPU kernel time waits for the GPU; where a loop is far slower than the same loop in
`bench_decode.py`'s rounds, taking turns is what costs. Needs CUDA.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import bench_decode  # noqa: E402

LOOPS = ("same token", "argmax", "argmax copied", "argmax, logits dropped")


def time_loops(config: str, tokens: int, repeats: int) -> dict[str, list[float]]:
    """µs per token of each loop of `LOOPS` for ``config``, ``repeats`` times each, the loops taking turns."""
    dec = bench_decode.Decoder("litgpt-pythia-14m", config, torch.float32, "cuda")
    positions = dec.positions
    times: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    with torch.no_grad():
        token = dec.prefill()
        fixed = token.clone()
        for i in range(60):  # NOTE: warm-up: the decode shape's graph recorded, caches warm
            token = dec.fn(token, positions[i % len(positions)])[:, -1:].argmax(-1)
        for _ in range(repeats):
            for loop in LOOPS:
                torch.cuda.synchronize()
                start = time.perf_counter()
                for i in range(tokens):
                    position = positions[i % len(positions)]
                    if loop == "same token":
                        out = dec.fn(fixed, position)
                    elif loop == "argmax":
                        out = dec.fn(token, position)
                        token = out[:, -1:].argmax(-1)
                    elif loop == "argmax copied":
                        out = dec.fn(fixed, position)
                        fixed.copy_(out[:, -1:].argmax(-1))
                    else:
                        token = dec.fn(token, position)[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                times[loop].append((time.perf_counter() - start) / tokens * 1e6)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="thunder_nb.jit,reduce-overhead", help="zoo.CONFIGS names, comma-separated")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per loop")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("decode_loops.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print("| configuration | " + " | ".join(LOOPS) + " |")
    print("|---|" + "---:|" * len(LOOPS))
    for config in args.configs.split(","):
        try:
            times = time_loops(config, args.tokens, args.repeats)
        except Exception as e:  # NOTE: a configuration failing is a finding, reported in its row
            print(f"| {config} | fails: {type(e).__name__}: {str(e)[:120]} |")
            continue
        cells = [f"{min(v):.1f} / {sorted(v)[len(v) // 2]:.1f}" for v in times.values()]
        print(f"| {config} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
