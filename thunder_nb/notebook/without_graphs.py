"""Thunder without CUDA graphs beside a compiled side of `thunder_nb.compare` (`WithoutGraphs`): the yardstick of how
far thunder's own numerics take that side from eager."""

from __future__ import annotations

from typing import Any

from .reach import bind
from .runs import Plan, Ran, Run, build_traces, checked_call, params

__all__ = ["WithoutGraphs"]


class WithoutGraphs:
    """Thunder without CUDA graphs, with the executors of the side it stands beside, on its own copies: the yardstick
    of how far thunder's own numerics take that side from eager (the one judge's rule 4,
    `thunder_nb.diagnosis.judge`). It runs only when the side differs from eager beyond the base tolerance, and then
    as many steps as the side took; where it fails, or draws random numbers, the base tolerance alone decides."""

    def __init__(self, fn: Any, args: tuple, kwargs: dict, executors: list[Any] | None, plan: Plan):
        self._fn, self._args, self._kwargs, self._executors, self._plan = fn, args, kwargs, executors, plan
        self._run: Run | None = None
        self._failed = False

    def checked(self) -> Ran | None:
        """Its checked call (value and gradients, as `reference`'s), made on first use; None where it failed."""
        if self._run is None and not self._failed:
            import thunder

            run = Run("thunder", bind(self._fn, self._args, self._kwargs))
            try:
                run.jfn = thunder.jit(run.bound.fn, **({"executors": self._executors}
                                                       if self._executors is not None else {}))
                build_traces(run)
                self._failed = _draws_random(run.jfn)
            except Exception:  # NOTE: without a yardstick the base tolerance decides; the side's own run says the rest
                self._failed = True
            if not self._failed:
                run.ran = checked_call(run, self._plan)
                self._failed = run.ran.error is not None
            self._run = run
        return None if self._failed else self._run.ran

    def params_after(self, steps: int) -> dict[str, Any] | None:
        """Its trainable tensors after ``steps`` training steps (each followed by its SGD step), or None."""
        if self.checked() is None:
            return None
        run = self._run
        try:
            while run.steps < steps:
                run.call(self._plan.training)
                run.after_step(self._plan.lr)
        except Exception:  # NOTE: as in `checked`: no yardstick
            self._failed = True
            return None
        return params(run)


def _draws_random(jfn: Any) -> bool:
    """Whether ``jfn``'s last traces run an op that draws random numbers (its draws are not eager's, nor another
    run's: no yardstick)."""
    import thunder

    from ..diagnosis.ops import CAPTURE_DEPENDENT, RANDOM_NAMES

    def names(bsyms: Any) -> Any:
        for b in bsyms:
            yield b.sym.name
            yield from names(b.subsymbols)

    traces = [*thunder.last_traces(jfn)[-1:], *(thunder.last_backward_traces(jfn) or [])[-1:]]
    return any(n in RANDOM_NAMES or n in CAPTURE_DEPENDENT for t in traces for n in names(t.bound_symbols))

