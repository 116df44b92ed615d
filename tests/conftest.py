import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
warnings.filterwarnings("ignore", message="transformer_engine module not found")

REPO = Path(__file__).resolve().parent.parent
# NOTE: before torch is imported, and inherited by every kernel, notebook and process a test starts. Inductor's compiled
# kernels are kept in the checkout's git-ignored .cache/ (a fresh clone starts empty, a second run reuses them, and
# pytest-xdist's workers share them); under pytest-xdist each worker (`bash dev.sh test` starts one more than the cores) keeps to
# one thread of its own, so that two workers on two cores do not fight over both.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "inductor"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU machine)")
    skip_dot = pytest.mark.skip(reason="needs Graphviz's dot on PATH (apt-get install graphviz)")
    has_gpu = torch.cuda.is_available()
    has_dot = shutil.which("dot") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "dot" in item.keywords and not has_dot:
            item.add_marker(skip_dot)


@pytest.fixture(autouse=True)
def _no_side_stream_left_current(request):
    """A GPU test must leave the thread on the stream it found: ``torch.cuda.graph`` keeps its capture stream current
    when a capture fails (thunder's own transform on ``.item()``, #727), and every later test in that worker then ran
    on it (2026-12-03: `test_a_failed_capture_leaves_the_callers_stream_current` found another test's stream current).
    A test that leaves one fails here, naming itself; the stream is put back either way."""
    if "gpu" not in request.keywords:
        yield
        return
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        before = None
    else:
        before = torch.cuda.current_stream()
    yield
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    found = before if before is not None else torch.cuda.default_stream()
    left = torch.cuda.current_stream()
    if left != found:
        torch.cuda.set_stream(found)
        pytest.fail(f"the test left CUDA stream {left} current (it started on {found}): a failed capture's stream; "
                    "call thunder_nb.recover_from_failed_capture() after it", pytrace=False)
