"""The options `thunder_nb.compare` and the magic share, checked once for both, each in its caller's words: the run's
(`check_run`) and the fusion executors, resolved to the names a `Comparison` records (`resolve_executors`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["PYTHON_WORDS", "MAGIC_WORDS", "check_run", "resolve_executors"]

#: How `compare`'s messages name its arguments ...
PYTHON_WORDS = {"repeats": "repeats", "lr": "lr", "training": "training=True", "peers": "peers",
                "no run": "execute=False"}
#: ... and how the magic's name its options.
MAGIC_WORDS = {"repeats": "--repeats", "lr": "--lr", "training": "--train", "peers": "--peers", "no run": "--no-run"}


def check_run(repeats: int, training: bool, lr: float | None, peers: bool, execute: bool,
              words: Mapping[str, str] = PYTHON_WORDS) -> None:
    """Check how the run is asked for: timed calls, the SGD step, the peer run.

    Raises:
        ValueError: ``repeats`` below 1, ``lr`` without training or not positive, ``peers`` without a run; the message
            names each option as ``words`` does (`PYTHON_WORDS`, `MAGIC_WORDS`).
    """
    if int(repeats) < 1:
        raise ValueError(f"{words['repeats']} must be at least 1, not {repeats!r}")
    if lr is not None and not training:
        raise ValueError(f"{words['lr']} needs {words['training']} (an SGD step needs gradients)")
    if lr is not None and not lr > 0:
        raise ValueError(f"{words['lr']} must be a positive number, not {lr!r}")
    if peers and not execute:
        raise ValueError(f"{words['peers']} needs a run (it times torch.compile): not with {words['no run']}")


def resolve_executors(names: Sequence[str]) -> tuple[str, ...]:
    """The fusion executors asked for, by name (`thunder_nb.cudagraph.executors.EXECUTOR_NAMES`), checked and each
    once: what `compare` records (`Comparison.executors`) and makes both sides' executors of, the fixed side's as
    `thunder_nb.jit` makes them (`jit_executors`), the original's as ``thunder.jit``'s (`executor_list`). Imports
    thunder only for nvFuser, whose wheel may be missing.

    Raises:
        ValueError: an unknown name, or an executor thunder cannot use here.
    """
    from ..cudagraph.executors import executor_list, executor_names

    resolved = executor_names(tuple(names))
    if "nvfuser" in resolved:
        executor_list(resolved)  # NOTE: raises where no nvFuser wheel matches this torch
    return resolved
