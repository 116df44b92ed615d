"""The original/fixed toggle in a real browser: JupyterLab 4 running notebooks, exported pages, JavaScript off.

Debian's Chromium (``/usr/bin/chromium``) driven by Playwright; never ``playwright install``. Screenshots
go to ``out/test-artifacts/`` (their paths are printed at the end).
"""

from __future__ import annotations

import contextlib
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
# the MLP training step of tests/programs.py (mlp, mlp_inputs), as a user would write it in a notebook
MLP_NOTEBOOK = "mlp_training_step.ipynb"
MLP_CELLS = [
    "%load_ext thunder_nb",
    "import torch\n"
    "g = torch.Generator().manual_seed(0)\n"
    "x = torch.randn(4, 8, generator=g)\n"
    "w1 = torch.randn(8, 16, generator=g).requires_grad_()\n"
    "w2 = torch.randn(16, 2, generator=g).requires_grad_()",
    "%%thunder_cudagraph --train --repeats 2 mlp(x, w1, w2)\n"
    "def mlp(x, w1, w2):\n"
    "    h = torch.relu(x @ w1)\n"
    "    return (h @ w2).sum()",
]
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def _mlp_notebook():
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in MLP_CELLS],
                                    metadata={"kernelspec": KERNELSPEC})


# NOTE: what "fits a notebook column" means here. In a 1000 px wide browser window the magic's outputs
# must make nothing scroll sideways (no element in them wider than the output area, no horizontal
# scrollbar in them or in the notebook), and they must be at most COLUMN_MAX_HEIGHT tall by default:
# about one and a half screens, for a verdict, the toggle with both traces' diagrams, and the run
# table, plus the "next" step under the verdict (issue 53.3: 145 px of code; with it the outputs are 1,645 px).
# Before the collapsed defaults the same outputs were 6,900 px tall with 2,000 px wide diagrams.
WINDOW = {"width": 1000, "height": 900}
COLUMN_MAX_HEIGHT = 1700


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


@contextlib.contextmanager
def lab_server(tmp: Path, root: Path):
    """A JupyterLab 4 server on loopback serving ``root``, its settings under ``tmp``; yields (URL, token)."""
    env = dict(os.environ)
    # NOTE: the kernel imports this checkout's thunder_nb, not the one .venv's editable install points to
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
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


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab 4 server on loopback serving a copy of notebooks/ and the MLP notebook; yields (URL, token, root)."""
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
    nbformat.write(_mlp_notebook(), root / MLP_NOTEBOOK)
    with lab_server(tmp, root) as (base, token):
        yield base, token, root


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
    """Assert the fixed pane with its diagram shows first, open its lifetimes, click the original, assert it replaced it."""
    from playwright.sync_api import expect

    box = _toggle(page)
    expect(box).to_be_visible(timeout=30_000)
    box.evaluate(SCROLL_TO_TOP)
    original = box.locator(".tnb-pane", has_text=ORIGINAL_TITLE)
    fixed = box.locator(".tnb-pane", has_text=FIXED_TITLE)
    expect(box.locator(".widget-toggle-button.mod-active")).to_have_text(FIXED_LABEL)
    expect(fixed).to_be_visible()
    expect(fixed.locator(".tnb-diagram svg").first).to_be_visible()  # the region diagram
    # NOTE: the static fallback, an output of its own after the widget's, is hidden where the widget is drawn, with the
    # output that holds it: each diagram shows once
    expect(page.locator(".tnb-static").first).to_be_attached()
    expect(page.locator(".tnb-static").first).to_be_hidden()
    lifetimes = fixed.locator("svg.tnb-lifetime").first
    expect(lifetimes).to_be_hidden()  # NOTE: closed by default, one click away
    fixed.locator("summary", has_text="lifetimes").first.click()
    expect(lifetimes).to_be_visible()
    expect(original).to_be_hidden()
    _shoot(page, box, ARTIFACTS / f"{name}-before.png", whole_page, screenshots)

    box.get_by_role("button", name=ORIGINAL_LABEL, exact=True).click()
    expect(original).to_be_visible()
    expect(original.locator(".tnb-diagram svg").first).to_be_visible()
    expect(fixed).to_be_hidden()
    expect(box.locator(".widget-toggle-button.mod-active")).to_have_text(ORIGINAL_LABEL)
    _shoot(page, box, ARTIFACTS / f"{name}-after.png", whole_page, screenshots)


def _run_all(page, base: str, token: str, notebook: str) -> None:
    """Open ``notebook`` in a fresh Lab workspace, Run > Run All Cells, wait until every cell ran and the kernel idles."""
    from playwright.sync_api import expect

    # NOTE: a workspace of its own, or Lab restores the tabs of an earlier run
    page.goto(f"{base}/lab/workspaces/t{uuid.uuid4().hex[:8]}/tree/{notebook}?token={token}")
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


# How big an output area is, and whether anything in it (or the notebook) spills or scrolls sideways. What lies in a
# diagram's or chart's own scroll box (.tnb-diagram, .tnb-scroll) is clipped there, not spilled: a diagram wider than
# the column at legible size (text >= 11 px, issue #32) scrolls in its box, and those boxes are listed as scrollers.
MEASURE = """area => {
    const box = area.getBoundingClientRect();
    const spill = [], scrollers = [];
    for (const el of area.querySelectorAll('*')) {
        const r = el.getBoundingClientRect();
        if (r.width === 0 || r.height === 0) continue;  // hidden: a closed <details>, the other pane
        const clip = el.parentElement && el.parentElement.closest('.tnb-diagram, .tnb-scroll');
        if (r.right > box.right + 1 && !(clip && area.contains(clip))) spill.push(`${el.tagName.toLowerCase()}.${el.className.baseVal ?? el.className}: ${Math.round(r.right - box.right)} px`);
        const ox = getComputedStyle(el).overflowX;
        if ((ox === 'auto' || ox === 'scroll') && el.scrollWidth > el.clientWidth + 1) scrollers.push(el.className.baseVal ?? el.className);
    }
    const panel = area.closest('.jp-WindowedPanel-outer');
    return {width: box.width, height: box.height, spill: spill.slice(0, 5), scrollers: scrollers.slice(0, 5),
            panel_scrolls: panel ? panel.scrollWidth > panel.clientWidth + 1 : null,
            page_scrolls: document.documentElement.scrollWidth > window.innerWidth};
}"""


def test_lab_run_all_then_toggle(lab, browser, screenshots):
    """Open notebook 01 in JupyterLab 4, Run > Run All Cells, then switch the toggle to the original side."""
    base, token, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        _run_all(page, base, token, EXAMPLE)
        _check_toggle(page, "lab", screenshots, whole_page=True)
        assert errors == []
    finally:
        page.close()


def test_lab_mlp_training_step_fits_a_notebook_column(lab, browser, screenshots):
    """The MLP training step's outputs in a 1000 px window: nothing spills sideways, and only a diagram or chart
    scrolls, in its own box (a chart at legible size, or a diagram clicked to full size, may be wider than the 632-px
    column); at most COLUMN_MAX_HEIGHT tall."""
    base, token, _ = lab
    page = browser.new_page(viewport=WINDOW)
    try:
        _run_all(page, base, token, MLP_NOTEBOOK)
        area = page.locator(".jp-CodeCell").nth(2).locator(".jp-OutputArea").first
        area.evaluate(SCROLL_TO_TOP)
        m = area.evaluate(MEASURE)
        print(f"\nMLP training step in JupyterLab at {WINDOW['width']} px: outputs {m['width']:.0f} x {m['height']:.0f} px")
        page.screenshot(path=str(ARTIFACTS / "lab-mlp-fit.png"))
        screenshots.append(ARTIFACTS / "lab-mlp-fit.png")
        assert m["spill"] == [] and set(m["scrollers"]) <= {"tnb-diagram", "tnb-scroll"}, m
        assert not m["panel_scrolls"] and not m["page_scrolls"], m
        assert m["height"] <= COLUMN_MAX_HEIGHT, m
        # the user can expand: the full diagram opens in place, and still nothing spills sideways
        fixed = _toggle(page).locator(".tnb-pane", has_text="mlp: fixed")
        fixed.locator("summary", has_text="full diagram").first.click()
        expect_svg = fixed.locator("details.tnb-full svg").first
        assert expect_svg.is_visible()
        opened = area.evaluate(MEASURE)
        assert opened["height"] > m["height"] and opened["spill"] == [], opened
        assert set(opened["scrollers"]) <= {"tnb-diagram", "tnb-scroll"}, opened
    finally:
        page.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The example's standalone page, made by the command line as a user would (its one run in the session, which
    tests/notebook/test_notebooks.py checks too)."""
    import nbcheck

    run, out = nbcheck.example_once(tmp_path_factory)
    assert run.returncode == 0, run.stderr
    page = out / "01_del_bug.html"
    assert page.is_file()
    if 'data-thunder-nb="embed-amd.js"' not in page.read_text(encoding="utf-8"):
        pytest.skip("the widget JavaScript is not inlined (.cache/widget-js/ missing: run `bash dev.sh test`, needs npm)")
    return page


def open_offline(browser, page_path: Path, *, javascript: bool = True):
    """(context, page, requests refused, page errors): ``page_path`` from file://, every other request refused."""
    context = browser.new_context(java_script_enabled=javascript, viewport={"width": 1400, "height": 1000})
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
    page.goto(page_path.as_uri())
    return context, page, blocked, errors


def test_exported_page_offline(exported, browser, screenshots):
    """The exported page, from file:// with every other request refused: the widget renders and switches."""
    context, page, blocked, errors = open_offline(browser, exported)
    try:
        _check_toggle(page, "html-offline", screenshots, whole_page=False)
        assert errors == []
        assert blocked == []  # the page asked the network for nothing
    finally:
        context.close()


def _nbconvert_html(tmp: Path, nb, name: str) -> Path:
    src = tmp / f"{name}.ipynb"
    nbformat.write(nb, src)
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(src)], check=True,
                   capture_output=True, timeout=300)
    return tmp / f"{name}.html"


@pytest.fixture(scope="module")
def executed_mlp(tmp_path_factory):
    """The MLP notebook run by a kernel, widget state kept (as ``nbconvert --execute`` does)."""
    from nbclient import NotebookClient

    tmp = tmp_path_factory.mktemp("mlp")
    nb = _mlp_notebook()
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp)}},
                   store_widget_state=True).execute()
    return nb


def _check_static(page, title: str) -> None:
    """Without JavaScript: the fixed side with its diagrams shows, the original opens from its <details>."""
    from playwright.sync_api import expect

    static = page.locator(".tnb-static").first
    expect(static).to_be_visible()
    fixed = static.locator(".tnb-pane", has_text=f"{title}: fixed").first
    expect(fixed.locator(".tnb-diagram img").first).to_be_visible()  # NOTE: an <img>: untrusted Lab removes inline SVG
    original = static.locator("details", has_text=f"{title}: original").last
    expect(original.locator(".tnb-diagram img").first).to_be_hidden()
    original.locator("summary").first.click()
    expect(original.locator(".tnb-diagram img").first).to_be_visible()


def test_nbconvert_html_without_javascript(executed_mlp, browser, screenshots, tmp_path):
    """A notebook as JupyterLab saves it (no widget state), made HTML by ``jupyter nbconvert``, read with JavaScript off."""
    nb = nbformat.from_dict(json.loads(json.dumps(executed_mlp)))
    nb.metadata.pop("widgets", None)  # NOTE: JupyterLab's default ("Save widget state automatically" is off)
    page_file = _nbconvert_html(tmp_path, nb, "mlp")
    context = browser.new_context(viewport=WINDOW, java_script_enabled=False)
    page = context.new_page()
    try:
        page.goto(page_file.as_uri())
        _check_static(page, "mlp")
        page.screenshot(path=str(ARTIFACTS / "nbconvert-nojs.png"), full_page=True)
        screenshots.append(ARTIFACTS / "nbconvert-nojs.png")
        assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        context.close()


def test_exported_page_without_javascript(exported, browser, screenshots):
    """thunder-nb's own export (widget state kept) read with JavaScript off shows the static fallback."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, java_script_enabled=False)
    page = context.new_page()
    try:
        page.goto(exported.as_uri())
        _check_static(page, "f")
        page.screenshot(path=str(ARTIFACTS / "html-nojs.png"))
        screenshots.append(ARTIFACTS / "html-nojs.png")
    finally:
        context.close()
