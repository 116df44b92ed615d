"""Where a program generator's random choices come from: a seeded `random.Random`, or hypothesis (which shrinks)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["Chooser", "RandomChooser", "HypothesisChooser"]


class Chooser(Protocol):
    """Where a generator's random choices come from."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]`` (shrinks towards ``lo``)."""

    def choice(self, options: Sequence[Any]) -> Any:
        """One of ``options`` (shrinks towards the first)."""

    def boolean(self, p: float = 0.5) -> bool:
        """True with probability about ``p`` (shrinks towards False)."""


class RandomChooser:
    """Choices from ``random.Random(seed)``: program number ``seed`` is always the same program."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self._rng.randrange(len(options))]

    def boolean(self, p: float = 0.5) -> bool:
        return self._rng.random() < p


class HypothesisChooser:
    """Choices drawn from hypothesis (so failures shrink to small programs)."""

    def __init__(self, draw: Callable[[Any], Any]):
        from hypothesis import strategies as st

        self._draw = draw
        self._st = st

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(self._st.integers(lo, hi))

    def choice(self, options: Sequence[Any]) -> Any:
        return self._draw(self._st.sampled_from(list(options)))

    def boolean(self, p: float = 0.5) -> bool:
        # NOTE: an integer in [0, 999] shrinks to 0, i.e. to False
        return self._draw(self._st.integers(0, 999)) >= round(1000 * (1 - p))
