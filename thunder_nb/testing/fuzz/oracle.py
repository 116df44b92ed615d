"""The differential oracle: one program through eager PyTorch and thunder's CUDA-graph transforms, its claims judged
(the first, on the fixed transform, in `claim_fixed`; the others, on thunder's own and the legacy one, in
`claim_originals`)."""

from __future__ import annotations

import warnings
from contextlib import nullcontext

from ..modes import CaptureMode, capturing, check_mode
from .claim_fixed import judge_fixed
from .claim_originals import judge_legacy, judge_stock, region_sources
from .collectives import world_of_one
from .programs import Program
from .reference import Reference
from .verdicts import FixedStats, ProgramOutcome, Verdict

__all__ = ["judge", "ProgramOutcome", "Verdict", "FixedStats", "region_sources"]


def judge(program: Program, *, device: str = "cpu", capture: CaptureMode = False) -> ProgramOutcome:
    """Run ``program`` through eager PyTorch and thunder (plain, fixed, legacy, stock) and judge the claims.

    Each version goes through `calls.PROTOCOL` (three calls with fresh inputs, two parameter sets,
    two forwards before one backward, every result kept). The claims, each broken one a line of
    ``ProgramOutcome.problems``:

    1. fixed: everything the calls leave (outputs fresh and kept, aliasing, arguments after the
       calls, gradients) equals eager PyTorch's (`calls.differences`), and its traces have no defect
       but ``scalar-region-input`` on a number whose hand-off it refused and explained;
    2. legacy and stock: the checker's error defects predict the run (`rules.predict`): every kind
       of failure is one a reported defect can cause in this mode (no false negative), and every
       must-show defect did show (no false positive). The rules found in the traces before the
       first call are kept apart from those the runner recorded during the run;
    3. stock: ``host-sync-in-region`` is reported exactly when a region's code calls ``.item()``.

    A module program (``Program.distributed``: `collectives`) is its module, compiled so and wrapped in thunder's
    ``ddp`` or ``fsdp``, judged in a gloo process group of one rank made for it and destroyed after
    (`collectives.world_of_one`). A program that PyTorch or plain thunder rejects is discarded. Values are judged by the
    one judge of "equal" (`thunder_nb.diagnosis.judge`): where plain thunder's own results differ from eager PyTorch's,
    a transform may differ from eager as far as plain thunder does, and no further; where plain thunder is itself wrong
    (not finite where eager is, far from eager) and the fixed transform differs from eager, the program is discarded as
    thunder's wrong result ("thunder wrong: ..."), never judged equal. Bugs already found are in `rules.KNOWN_BUGS`:
    counted, not reported again.

    Args:
        program: the program.
        device: where its inputs live (``"cpu"`` or ``"cuda"``).
        capture: True: capture CUDA graphs for real (needs ``device="cuda"``); False: regions run
            eagerly; ``"emulated"``: the runners' capture path on the CPU (`thunder_nb.testing.emulated_capture`).

    Returns:
        The `ProgramOutcome`; ``discarded`` says why when PyTorch or plain thunder rejects the program, or plain thunder
        is itself wrong where the fixed transform differs from eager.
    """
    outcome = ProgramOutcome(program, capture=check_mode(capture))
    fn = program.function()
    with warnings.catch_warnings(), capturing(capture), world_of_one() if program.distributed else nullcontext():
        warnings.simplefilter("ignore")
        ref = Reference(fn, program, device, outcome)
        if ref.eager.error is not None:
            outcome.discarded = f"PyTorch rejects: {type(ref.eager.error).__name__}"
            return outcome
        if not judge_fixed(fn, program, device, capture, outcome, ref):
            return outcome
        judge_legacy(fn, program, device, capture, outcome, ref)
        judge_stock(fn, program, device, capture, outcome, ref)
    return outcome

