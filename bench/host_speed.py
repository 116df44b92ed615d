"""How fast this host's CPU is right now: the CPU seconds of one fixed pure-Python loop, the median of three runs.

The 2-core hosts behind this workplace changed speed by up to 2x within one evening (2026-12-06: 2.5 to 5.0 s for this
loop), more than any change to the test suite moves its wall time. Run it before and after a timing (``bash dev.sh
test``, a benchmark on the CPU) and give both figures with the result:

    python bench/host_speed.py
"""

from __future__ import annotations

import statistics
import time


def loop_seconds(n: int = 30_000_000) -> float:
    """CPU seconds of summing ``range(n)`` in a Python loop at a module's top level (its names global, as in
    ``python -c``: the figures above were taken so)."""
    start = time.process_time()
    exec(f"s = 0\nfor i in range({n}):\n    s += i\n", {})
    return time.process_time() - start


if __name__ == "__main__":
    print(f"host speed: {statistics.median(loop_seconds() for _ in range(3)):.2f} CPU-s for the loop (lower is faster)")
