"""Which form is PyTorch's CUDA ``x / d`` for a Python float ``d``? Candidates compared bit for bit (GPU).

    python bench/cuda_scalar_division.py

On the H200 with torch 2.11 (2026-11-30): ``x * float32(1.0 / d)`` (reciprocal in double precision,
then rounded) matched eager for 300 of 300 divisors in float32, float16 and bfloat16, where
``x * (1.0f / float32(d))`` matched 228/300 in float32 and ``x / float32(d)`` 0/300. thunder-nb's
scalar hand-off (`thunder_nb.cudagraph.scalars._reader_form`) uses the first form.
"""
import torch

if not torch.cuda.is_available():
    raise SystemExit("cuda_scalar_division: needs a CUDA GPU (torch sees none)")
torch.manual_seed(0)
dev = "cuda"
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    x = (torch.randn(1 << 16) * 3).to(dev, dtype)
    xf = x.float(); xd = x.double()
    hits = {k: 0 for k in ("c1 x*f32(1/f32(d))", "c2 x*f32(1.0/d)", "c3 x/f32(d)", "c4 f(x64/d)", "c5 f(x64*(1/d))", "c6 f(x32*f32(1/d)) via python")}
    n = 0
    for v in (torch.randn(300, dtype=torch.float64) * 10.0 ** torch.randint(-4, 5, (300,))).tolist():
        d = float(torch.tensor(v, dtype=torch.float32)) + 1e-3  # a double that float32 cannot hold
        eager = x / d
        n += 1
        d32 = torch.tensor(d, dtype=torch.float32, device=dev)
        c1 = (xf * torch.reciprocal(d32)).to(dtype)
        c2 = (xf * torch.tensor(1.0 / d, dtype=torch.float32, device=dev)).to(dtype)
        c3 = (xf / d32).to(dtype)
        c4 = (xd / d).to(dtype)
        c5 = (xd * (1.0 / d)).to(dtype)
        inv64 = torch.tensor(1.0 / d, dtype=torch.float64, device=dev)
        c6 = (xf * inv64.to(torch.float32)).to(dtype)
        for k, c in zip(hits, (c1, c2, c3, c4, c5, c6)):
            hits[k] += int(torch.equal(c, eager))
    print(dtype, f"of {n} divisors, bitwise equal to eager:", hits, flush=True)
