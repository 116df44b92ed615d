"""An older thunder_nb next to this one in the same process, for paired timings against a commit.

    git archive 23129af thunder_nb | tar -x -C /tmp/baseline-23129af
    python bench/bench_zoo.py --baseline /tmp/baseline-23129af --rows nanogpt:train --configs reduce-overhead,thunder_nb.jit,baseline

`load(path)` copies ``path/thunder_nb`` to a temporary folder as the package ``thunder_nb_baseline`` (its absolute
``thunder_nb`` imports renamed) and imports it, so that both versions' loops take turns in one process's rounds and
share the host's drift, which separate processes do not.
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

NAME = "thunder_nb_baseline"


def load(path: str | Path) -> ModuleType:
    """The package under ``path/thunder_nb``, imported as ``thunder_nb_baseline``."""
    source = Path(path) / "thunder_nb"
    if not (source / "__init__.py").is_file():
        raise FileNotFoundError(f"{source}/__init__.py: extract the old commit there first "
                                f"(git archive COMMIT thunder_nb | tar -x -C {path})")
    root = Path(tempfile.mkdtemp(prefix="thunder-nb-baseline-"))
    shutil.copytree(source, root / NAME)
    absolute = re.compile(r"\b(from|import)\s+thunder_nb\b")
    for file in (root / NAME).rglob("*.py"):
        text = file.read_text()
        file.write_text(absolute.sub(lambda m: f"{m.group(1)} {NAME}", text))
    sys.path.insert(0, str(root))
    return importlib.import_module(NAME)
