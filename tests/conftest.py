import gc
import hashlib
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
warnings.filterwarnings("ignore", message="transformer_engine module not found")

REPO = Path(__file__).resolve().parent.parent


def _cpu_kernels() -> str:
    """``avx2-1a2b3c4d``: the CPU kernels ATen runs here (``ATEN_CPU_CAPABILITY``, else ``native``) and a hash of the
    CPU's feature flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    digest = hashlib.sha1((flags or platform.processor() or platform.machine()).encode()).hexdigest()[:8]
    return f"{os.environ.get('ATEN_CPU_CAPABILITY', 'native')}-{digest}"


# NOTE: before torch is imported, and inherited by every kernel, notebook and process a test starts. Inductor's compiled
# kernels are kept in the checkout's git-ignored .cache/ (a fresh clone starts empty, a second run reuses them, and
# pytest-xdist's workers share them), one folder per CPU and ATEN_CPU_CAPABILITY: torch 2.11's cache key leaves the
# capability out, and kernels compiled for avx512 read back under ATEN_CPU_CAPABILITY=avx2 gave torch.compile wrong
# results (0.995 off on tanh(sin(x) * 2 + 1)) and killed workers with a bus error (2026-12-05; a fresh folder: equal).
# The capability alone is no AVX2 CPU for inductor, which compiles with -march=native: see CONTRIBUTING.md.
# Under pytest-xdist each worker (`bash dev.sh test` starts one more than the cores) keeps to one thread of its own, so
# that two workers on two cores do not fight over both.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "inductor" / _cpu_kernels()))
# NOTE: inductor's first compile in a process checks each vector ISA the CPU's flags name by building a kernel and
# loading it in a fresh Python that imports torch. The tests take the CPU's flags at their word for the base ISA (the
# same ISA is chosen, ATEN_CPU_CAPABILITY still picks one), and make the others' checks once for the checkout, in every
# process they start too: tests/startup/ on the PYTHONPATH runs `inductor_checks` at each Python's start.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
STARTUP = str(Path(__file__).parent / "startup")
if STARTUP not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join([STARTUP, *filter(None, [os.environ.get("PYTHONPATH")])])
sys.path.insert(0, STARTUP)
import inductor_checks  # noqa: E402 (after its folder is on the path)

inductor_checks.install()  # NOTE: this process started before its PYTHONPATH named the folder
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_finish(session):
    from thunder_nb import internals

    if internals.supported():
        # NOTE: what thunder-nb's first entry point does in a user's process (its patches of thunder, each once), from
        # the start of the session, so that every test's traces (plain thunder.jit's too) take the same, faster path
        # (tests/test_tracing.py) and the same backward (tests/test_grads.py)
        internals.check_versions()
    # NOTE: what the collection made (torch, thunder, every test module: about 360,000 objects) lives for the session;
    # frozen, the collector's full passes, which thunder's tracing sets off hundreds of times a model, leave it alone
    # (a zoo case's collections: 0.89 -> 0.27 s of CPU, 2026-12-05). What the tests make is collected as before.
    gc.collect()
    gc.freeze()


def pytest_runtest_logreport(report):
    """With ``THUNDER_NB_FAILURE_LOG`` set (bench/device/pytest.sh sets it), each failure's name and traceback are
    appended to that file as it happens: a GPU run cut short by its time limit never prints pytest's summary."""
    path = os.environ.get("THUNDER_NB_FAILURE_LOG")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


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
    gone = [name for name in LONGEST_FILES if not (REPO / name).is_file()]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py's LONGEST_FILES names files that are gone: {gone}")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        first = {name: rank for rank, name in enumerate(LONGEST_FILES)}
        order = {id(item): i for i, item in enumerate(items)}
        items.sort(key=lambda item: (first.get(item.nodeid.split("::")[0], len(first)), order[id(item)]))


#: The test files that take longest on a 2-core CPU, longest first (their CPU seconds with inductor's cache cold, from
#: `bench/suite_cpu.py`, 2026-12-05; those that read the session's executed notebooks last, after test_notebooks has
#: made them). Under pytest-xdist, with ``--dist loadfile --no-loadscope-reorder`` (`bash dev.sh test`), files are handed
#: out in collection order: these start first, so that the run does not end with one worker on a long file while the
#: others wait. (Without ``--no-loadscope-reorder``, xdist 3.8 hands out the files with most tests first, whatever
#: their cost, and this list did nothing; with it the warm run took as long, 10:01 both, 2026-12-05: the workers were
#: balanced already, 346-402 CPU-s each, and the suite is bound by its 18.5 CPU-minutes.)
LONGEST_FILES = (
    "tests/notebook/test_notebooks.py", "tests/test_zoo.py", "tests/test_fuzz_loops.py",
    "tests/render/test_render_scale.py", "tests/cudagraph/test_torchcompile_numerics.py", "tests/test_readme.py",
    "tests/test_lab_legibility.py", "tests/cudagraph/test_prologue.py", "tests/cudagraph/test_fusion.py",
    "tests/test_setup.py", "tests/test_fuzz.py", "tests/cudagraph/test_runner.py", "tests/notebook/test_comparison.py",
    "tests/test_step.py", "tests/test_browser.py", "tests/notebook/test_export_cli.py",
    "tests/test_distributed_shard.py", "tests/test_distributed.py", "tests/cudagraph/test_memory_safety.py",
    "tests/cudagraph/test_native_kernels.py", "tests/test_step_structure.py", "tests/test_magics.py",
    "tests/diagnosis/test_capture_hazards.py", "tests/test_magic_kernel.py",
    "tests/notebook/test_browser_pages.py", "tests/notebook/test_untrusted.py",
)


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
