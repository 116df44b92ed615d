"""The README's two commands on a fresh clone, as a new user runs them: Debian's python3 first on PATH, no uv anywhere.

The clone is of the committed HEAD of this checkout (uncommitted changes are not in it). uv's
download cache (``~/.cache/uv``) is shared with this machine, as it would be on a second run; the
clone's own ``.cache/`` (private uv, widget JavaScript) and ``.venv`` start empty.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEBIAN_PYTHON = Path("/usr/bin/python3")
PATH = "/usr/bin:/bin"


def _why_not() -> str | None:
    """Why the fresh-clone test cannot apply here (None: it can)."""
    if not Path("/etc/debian_version").is_file():
        return "needs a Debian/Ubuntu machine (the README's set-up targets them)"
    if not DEBIAN_PYTHON.is_file():
        return f"needs Debian's python3 at {DEBIAN_PYTHON} (apt-get install python3)"
    version = subprocess.run([str(DEBIAN_PYTHON), "-c", "import sys; print(sys.version_info >= (3, 10))"],
                             capture_output=True, text=True)
    if version.stdout.strip() != "True":
        return f"{DEBIAN_PYTHON} is older than Python 3.10"
    if shutil.which("uv", path=PATH):
        return f"uv is installed in {PATH}: the test needs a machine where it is not (a fresh one)"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return "needs git and a git checkout to clone"
    venv_ok = subprocess.run([str(DEBIAN_PYTHON), "-c", "import ensurepip, venv"], capture_output=True).returncode == 0
    if not venv_ok and not (os.geteuid() == 0 and shutil.which("apt-get")):
        return "Debian's python3-venv is missing and dev.sh can install it only as root (apt-get install python3-venv)"
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return "needs network access to PyPI (pypi.org) to install uv"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

#: What a user must never see: pip refusing the system Python, apt/dpkg chatter, the kernel's TCP warning.
NOISE = (
    "externally-managed-environment",
    "Reading package lists",
    "Selecting previously unselected",
    "Setting up ",
    "Unpacking ",
    "without encryption",
)


#: What this process's environment has that a new user's shell would not: the project's Python and pytest.
_NOT_A_NEW_USERS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "UV_PROJECT_ENVIRONMENT")


def _env() -> dict[str, str]:
    """A new user's shell: Debian's python3 first on PATH, no uv, no virtualenv, nothing of this checkout.

    The machine's own settings stay (``HOME`` and its caches, proxies and TLS certificates such as
    ``SSL_CERT_FILE``): a user's shell has them too.
    """
    env = {
        k: v for k, v in os.environ.items()
        if k not in _NOT_A_NEW_USERS and not k.startswith(("PYTEST_", "THUNDER_NB_"))
    }  # fmt: skip
    env["PATH"] = PATH
    return env


def _dev(clone: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "dev.sh", *args], cwd=clone, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _progress(stderr: str) -> list[str]:
    return [line.removeprefix("dev.sh: ") for line in stderr.splitlines() if line.startswith("dev.sh: ")]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("fresh") / "thunder-nb"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REPO), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", head.stdout.strip()], check=True)
    return dest


@pytest.fixture(scope="module")
def example(clone) -> subprocess.CompletedProcess:
    return _dev(clone, "example", timeout=1800)


def test_example_sets_up_everything_and_runs(clone, example):
    assert example.returncode == 0, example.stderr[-4000:]
    steps = _progress(example.stderr)
    assert any(s.startswith("uv: installing it from PyPI into .cache/uv-venv") for s in steps), steps
    assert any(s.startswith(".venv: creating it") for s in steps), steps
    assert any(s.startswith("Graphviz: ") for s in steps) and any(s.startswith("widget JavaScript: ") for s in steps)
    assert steps[-1].startswith("running the example")
    assert (clone / "out" / "01_del_bug.html").is_file() and (clone / "out" / "01_del_bug.ipynb").is_file()
    # uv lives in its own virtualenv made from Debian's python3, which itself got nothing installed
    cfg = (clone / ".cache" / "uv-venv" / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg, cfg
    assert (clone / ".cache" / "uv-venv" / "bin" / "uv").is_file()
    # the project's virtualenv runs the clone's own code
    where = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", "import thunder_nb; print(thunder_nb.__file__)"],
                           cwd="/", env=_env(), capture_output=True, text=True)
    assert where.stdout.strip() == str(clone / "thunder_nb" / "__init__.py"), where.stderr


def test_example_is_quiet(example):
    """One line per step; no pip, apt or dpkg chatter, no kernel warning."""
    shown = example.stdout + example.stderr
    for noise in NOISE:
        assert noise not in shown, f"{noise!r} in the output:\n{shown[-3000:]}"
    assert "HTML page:" in example.stdout


def test_second_command_reuses_the_set_up(clone, example):
    """``bash dev.sh test`` on the same clone: nothing installed again, then pytest runs."""
    assert example.returncode == 0
    # NOTE: ``-n 0`` (extra arguments go to pytest, after dev.sh's ``-n 3 --dist loadfile``, which pytest-xdist still
    # parses) runs the five tests in pytest's own process: three workers importing torch cost 7.7 s of CPU more
    run = _dev(clone, "test", "-q", "-n", "0", "-m", "not slow", "tests/test_package.py", timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = _progress(run.stderr)
    assert steps[0] == "uv: .cache/uv-venv/bin/uv (private)", steps
    assert not any("installing" in s for s in steps), steps
    assert "passed" in run.stdout
    for noise in NOISE:
        assert noise not in run.stdout + run.stderr


def test_the_python_of_the_set_up_is_debians():
    """The premise: on this PATH, python3 is Debian's, which refuses ``pip install`` into itself (PEP 668)."""
    assert shutil.which("python3", path=PATH) in ("/usr/bin/python3", "/bin/python3")
    marker = Path(subprocess.run([str(DEBIAN_PYTHON), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                 capture_output=True, text=True).stdout.strip()) / "EXTERNALLY-MANAGED"
    if not marker.is_file():
        pytest.skip(f"{DEBIAN_PYTHON} is not marked externally managed ({marker} missing): an older Debian")
    refused = subprocess.run([str(DEBIAN_PYTHON), "-m", "pip", "install", "--dry-run", "uv"], env=_env(),
                             capture_output=True, text=True)
    if "No module named pip" in refused.stderr:
        return  # Debian's python3 without python3-pip: nothing could install into it at all
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr


def _dev_sh_functions(*names: str) -> str:
    """The shell text of dev.sh's functions ``names`` (its helpers, without running its commands)."""
    import re

    text = (REPO / "dev.sh").read_text()
    return "\n".join(re.search(rf"^{name}\(\) \{{.*?^\}}", text, re.S | re.M).group(0) for name in names)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("apt-get") is None, reason="needs root and apt-get (dev.sh's "
                    "Debian packages are installed only then)")
@pytest.mark.parametrize("held_for,wait,ok", [(3, 600, True), (None, 5, False)], ids=["released", "held"])
def test_apt_get_update_waits_for_another_apt_get_that_holds_the_package_lists(held_for, wait, ok):
    """#32.13: another apt-get update (the daily timer's) holds /var/lib/apt/lists/lock; dev.sh waits for it, up to
    APT_LOCK_WAIT seconds, where apt-get alone fails at once with exit 100. The lock is apt's own (fcntl), held here
    as apt holds it; the update is the real one (the network is needed, as dev.sh needs it)."""
    import fcntl
    import threading
    import time

    script = _dev_sh_functions("say", "apt_get_update") + "\napt_get_update\n"
    with open("/var/lib/apt/lists/lock", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        alone = subprocess.run(["apt-get", "update"], capture_output=True, text=True, timeout=60)
        assert alone.returncode == 100 and "Could not get lock" in alone.stderr, alone.stderr
        if held_for is not None:
            threading.Timer(held_for, fcntl.lockf, (lock, fcntl.LOCK_UN)).start()
        start = time.monotonic()
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=wait + 300,
                              env={**os.environ, "APT_LOCK_WAIT": str(wait)})
        took = time.monotonic() - start
    assert "another apt-get holds the package lists; waiting for it" in done.stderr, done.stderr
    if ok:
        assert done.returncode == 0, done.stderr
        assert took >= held_for - 1, took
    else:
        assert done.returncode == 100, done.stderr
        assert "Could not get lock" in done.stderr and "this failed (exit status 100): apt-get update" in done.stderr
