"""The original/fixed toggle in a real browser: JupyterLab 4 running notebook 01, and the exported page offline.

Debian's Chromium (``/usr/bin/chromium``) driven by Playwright; never ``playwright install``. Screenshots
before and after the click go to ``out/test-artifacts/`` (their paths are printed at the end).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
EXAMPLE = "01_del_bug.ipynb"
ARTIFACTS = REPO / "out" / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# what notebook 01's %%thunder_cudagraph --original legacy f(x) shows
ORIGINAL_LABEL, FIXED_LABEL = "original (legacy)", "fixed"
ORIGINAL_TITLE, FIXED_TITLE = "f: original (legacy)", "f: fixed"


def _missing() -> str | None:
    if not CHROMIUM.is_file():
        return f"needs Debian's Chromium at {CHROMIUM} (apt-get install chromium fonts-liberation2; bash dev.sh test does it as root)"
    if importlib.util.find_spec("playwright") is None:
        return "needs the playwright Python package (the `browser` extra: uv sync --extra browser)"
    if importlib.util.find_spec("jupyterlab") is None:
        return "needs jupyterlab (the `browser` extra: uv sync --extra browser)"
    return None


pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


@pytest.fixture(scope="module")
def screenshots(request):
    """Collect screenshot paths; print them when the module is done (also under -q)."""
    shots: list[Path] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield shots
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():  # NOTE: past pytest's output capture, so -q shows them too
        print("".join(f"\nscreenshot: {p}" for p in shots))


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab 4 server on loopback serving a copy of notebooks/; yields (base URL, token)."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    shutil.copytree(NOTEBOOKS, root)
    # NOTE: from a clean slate, even once the committed notebook holds outputs and widget state
    nb = nbformat.read(root / EXAMPLE, as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, root / EXAMPLE)
    env = dict(os.environ)
    for var, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
    ]:
        env[var] = str(tmp / sub)
        (tmp / sub).mkdir()
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(tmp / "lab.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{(tmp / 'lab.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in 60 s:\n{(tmp / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.3)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _toggle(page):
    """The toggle widget: a VBox holding the ToggleButtons and the Stack of panes."""
    return page.locator(".widget-vbox").filter(has=page.locator(".widget-toggle-buttons")).first


# the widget at the top of the window; in Lab a little lower, clear of the notebook's toolbar
SCROLL_TO_TOP = """e => {
    e.scrollIntoView({block: 'start'});
    const panel = e.closest('.jp-WindowedPanel-outer');
    if (panel) panel.scrollBy(0, -60);
}"""


def _shoot(page, box, path: Path, whole_page: bool, screenshots: list[Path]) -> None:
    if whole_page:
        # NOTE: in Lab the widget scrolls inside the notebook panel, and an element screenshot of
        # something taller than that panel comes out garbled: shoot the window, widget at the top
        box.evaluate(SCROLL_TO_TOP)
        page.screenshot(path=str(path))
    else:
        box.screenshot(path=str(path))
    screenshots.append(path)


def _check_toggle(page, name: str, screenshots: list[Path], *, whole_page: bool) -> None:
    """Assert the original pane with its diagram shows, click "fixed", assert the fixed pane replaced it."""
    from playwright.sync_api import expect

    box = _toggle(page)
    expect(box).to_be_visible(timeout=30_000)
    box.evaluate(SCROLL_TO_TOP)
    original = box.locator(".tnb-pane", has_text=ORIGINAL_TITLE)
    fixed = box.locator(".tnb-pane", has_text=FIXED_TITLE)
    expect(box.get_by_role("button", name=ORIGINAL_LABEL, exact=True)).to_be_visible()
    expect(original).to_be_visible()
    expect(original.locator(".tnb-diagram svg").first).to_be_visible()  # the region diagram
    expect(original.locator("svg").nth(1)).to_be_visible()  # the lifetimes
    expect(fixed).to_be_hidden()
    _shoot(page, box, ARTIFACTS / f"{name}-before.png", whole_page, screenshots)

    box.get_by_role("button", name=FIXED_LABEL, exact=True).click()
    expect(fixed).to_be_visible()
    expect(fixed.locator("svg").first).to_be_visible()
    expect(original).to_be_hidden()
    expect(box.locator(".widget-toggle-button.mod-active")).to_have_text(FIXED_LABEL)
    _shoot(page, box, ARTIFACTS / f"{name}-after.png", whole_page, screenshots)


def test_lab_run_all_then_toggle(lab, browser, screenshots):
    """Open notebook 01 in JupyterLab 4, Run > Run All Cells, then switch the toggle to the fixed side."""
    from playwright.sync_api import expect

    base, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        # NOTE: a workspace of its own, or Lab restores the tabs of an earlier run
        page.goto(f"{base}/lab/workspaces/t{uuid.uuid4().hex[:8]}/tree/{EXAMPLE}?token={token}")
        expect(page.get_by_text("Python 3 (ipykernel) | Idle")).to_be_visible(timeout=60_000)
        page.locator("#jp-MainMenu").get_by_text("Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        # done: the toggle is there, no cell waits or runs ("[*]"), and the kernel is idle again
        expect(_toggle(page)).to_be_visible(timeout=120_000)
        page.wait_for_function(
            """() => {
                const prompts = [...document.querySelectorAll('.jp-Notebook .jp-InputArea-prompt')];
                return prompts.length > 0 && prompts.every(p => !p.textContent.includes('*'));
            }""",
            timeout=120_000,
        )
        expect(page.get_by_text("Python 3 (ipykernel) | Idle")).to_be_visible(timeout=60_000)
        assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").filter(
            has_text="Traceback"
        ).count() == 0
        assert page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']").count() == 0
        _check_toggle(page, "lab", screenshots, whole_page=True)
        assert errors == []
    finally:
        page.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The example's standalone page, made by the command line as a user would."""
    out = tmp_path_factory.mktemp("example")
    subprocess.run([sys.executable, "-m", "thunder_nb", "example", "--out", str(out)], check=True, cwd=REPO, timeout=600)
    page = out / "01_del_bug.html"
    assert page.is_file()
    if 'data-thunder-nb="embed-amd.js"' not in page.read_text(encoding="utf-8"):
        pytest.skip("the widget JavaScript is not inlined (.cache/widget-js/ missing: run `bash dev.sh test`, needs npm)")
    return page


def test_exported_page_offline(exported, browser, screenshots):
    """The exported page, from file:// with every other request refused: the widget renders and switches."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    blocked: list[str] = []

    def only_files(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_files)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(exported.as_uri())
        _check_toggle(page, "html-offline", screenshots, whole_page=False)
        assert errors == []
        assert blocked == []  # the page asked the network for nothing
    finally:
        context.close()
