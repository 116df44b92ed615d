"""Notebooks opened untrusted in JupyterLab 4 (issue 53, point 1): every diagram shows, as an image with a size.

A stored notebook opens untrusted (nobody signed it on this machine), as a teaching notebook does for a new user, a
colleague or GitHub. Lab then renders no widget and sanitizes each ``text/html`` output: inline ``<svg>`` goes and its
text runs on as loose words ("forward forward trace … x x f32[4096] op0 …"). The diagrams must reach the reader as
``<img>`` elements all the same, never wider than the output column.

The server gets a ``JUPYTER_DATA_DIR`` of its own, so no signature of this machine's makes a notebook trusted. Debian's
Chromium driven by Playwright (never ``playwright install``); screenshots go to ``out/test-artifacts/``.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import nbformat
import pytest

import nbcheck
from test_browser import ARTIFACTS, _missing, browser, lab_server, screenshots  # noqa: F401 (fixtures)
from thunder_nb.notebook import export

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]

#: The stored notebooks whose outputs come from before diagrams were images (the H200 run): the test fails on them,
#: strictly, until the next GPU run (``python -m thunder_nb notebooks --in-place``) stores the new outputs; then the
#: entry goes.
STALE = set(nbcheck.RAW_SVG_OUTPUTS)
#: The stored notebooks opened untrusted: 01 and 06 (the magic's toggle), 02 and 03 (lifetime charts of their own).
STORED = ["01_del_bug", "02_islands", "03_lifetimes_and_memory", "06_real_model"]
#: Notebook 01 executed here on the CPU (never committed): what the code shows now, opened untrusted the same way.
FRESH = "01_fresh_cpu.ipynb"
#: Notebook 02 executed here on the CPU: its lifetime chart as the code shows it now.
FRESH_02 = "02_fresh_cpu.ipynb"

# Per output area of a cell with diagrams: its images (drawn: decoded with a size), its inline SVGs, the text that a
# sanitized SVG leaves ("trace `computation` · no defects" is the drawing's own title, the HTML's reads
# "trace computation:"), and whether any image is wider than the area.
MEASURE = """area => {
    const box = area.getBoundingClientRect();
    const imgs = [...area.querySelectorAll('img')].filter(i => i.src.startsWith('data:image/'));
    const text = area.innerText;
    return {
        images: imgs.length,
        drawn: imgs.filter(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0).length,
        shown: imgs.filter(i => i.getBoundingClientRect().width > 0 && i.getBoundingClientRect().height > 0).length,
        too_wide: imgs.filter(i => i.getBoundingClientRect().right > box.right + 1).length,
        svg: area.querySelectorAll('svg text').length,
        widget: area.querySelectorAll('.widget-toggle-buttons').length,
        run_on: (text.match(/trace `[^`]*` · /g) || []).length,
        // the diagrams' zoom checkbox and "shrunk to fit … click" line work by a style sheet, which the sanitizer drops:
        // hidden inline, neither shows here
        controls: [...area.querySelectorAll('input, .tnb-zoom-hint')].filter(e => e.getBoundingClientRect().width > 0).length,
        width: box.width,
    };
}"""


@pytest.fixture(scope="module")
def untrusted_lab(tmp_path_factory, monkeypatch_module):
    """A JupyterLab server whose notebooks are all untrusted: the `STORED` ones, and 01 and 02 run here; yields (URL,
    token)."""
    tmp = tmp_path_factory.mktemp("untrusted")
    root = tmp / "root"
    root.mkdir()
    for stem in STORED:
        shutil.copy(NOTEBOOKS / f"{stem}.ipynb", root / f"{stem}.ipynb")
    for source, name in (("01_del_bug.ipynb", FRESH), ("02_islands.ipynb", FRESH_02)):
        fresh = nbcheck.executed_once(NOTEBOOKS / source, tmp_path_factory)
        assert export.error_outputs(fresh) == []
        nbformat.write(fresh, root / name)
    # NOTE: a data folder of its own: no signature database that trusts a notebook
    monkeypatch_module.setenv("JUPYTER_DATA_DIR", str(tmp / "data"))
    with lab_server(tmp, root) as (base, token):
        # NOTE: every cell laid out (no windowing), so that outputs far down the notebook are in the DOM to measure
        tracker = tmp / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True, exist_ok=True)
        tracker.write_text(json.dumps({"windowingMode": "none"}))
        yield base, token


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _diagram_cells(nb) -> list[int]:
    """Indices of the code cells whose stored outputs hold a diagram: the magic's, or an SVG or an HTML one with one."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        data = [o.get("data", {}) for o in cell.get("outputs", ())]
        if nbcheck.is_toggle_cell(cell) or any(
                "image/svg+xml" in d or any(m in str(d.get("text/html", "")) for m in ("<svg", "data:image/svg"))
                for d in data):
            found.append(i)
    return found


def _check(page, root_nb, name: str, screenshots) -> list[str]:
    """Open ``name`` untrusted; return what is wrong with each diagram cell's outputs (empty: every diagram drawn)."""
    from playwright.sync_api import expect

    page.goto(f"{page.base}/lab/workspaces/t{uuid.uuid4().hex[:8]}/tree/{name}?token={page.token}")
    expect(page.locator(".jp-Notebook .jp-Cell").first).to_be_visible(timeout=60_000)
    code_cells = [i for i, c in enumerate(root_nb.cells) if c.cell_type == "code"]
    problems = []
    cells = page.locator(".jp-Notebook .jp-Cell")
    expect(cells).to_have_count(len(root_nb.cells), timeout=30_000)
    for i in _diagram_cells(root_nb):
        assert i in code_cells
        area = cells.nth(i).locator(".jp-OutputArea").first
        area.scroll_into_view_if_needed()
        page.wait_for_function(
            "a => [...a.querySelectorAll('img')].every(i => i.complete)", arg=area.element_handle(), timeout=15_000)
        m = area.evaluate(MEASURE)
        where = f"{name}, cell {i}"
        if m["widget"]:
            problems.append(f"{where}: a live widget is drawn, so the notebook is trusted (the test is void)")
        if not m["images"]:
            problems.append(f"{where}: no diagram image ({m['svg']} SVG text elements, {m['run_on']} run-on drawing titles)")
        elif m["drawn"] < m["images"] or m["shown"] == 0:
            problems.append(f"{where}: {m['images']} images, {m['drawn']} decoded with a size, {m['shown']} shown")
        if m["run_on"]:
            problems.append(f"{where}: {m['run_on']} drawing title(s) as loose text: an SVG was sanitized into words")
        if m["controls"]:
            problems.append(f"{where}: {m['controls']} zoom checkbox(es) or 'click' line(s) shown, which do nothing here")
        if m["too_wide"]:
            problems.append(f"{where}: {m['too_wide']} image(s) wider than the {m['width']:.0f}-px output column")
        shot = ARTIFACTS / f"untrusted-{Path(name).stem}-cell{i}.png"
        area.evaluate("e => e.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(shot))
        screenshots.append(shot)
    return problems


def _open(browser, untrusted_lab):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.base, page.token = untrusted_lab
    return page


@pytest.mark.parametrize("stem", STORED)
def test_stored_notebook_shows_its_diagrams_untrusted(stem, untrusted_lab, browser, screenshots, request):
    """The committed notebook opened untrusted: each diagram cell shows its diagrams as images, no SVG as loose words."""
    if stem in STALE:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "stored outputs from the H200 run before diagrams were <img>: inline SVG, which untrusted Lab removes, or a "
            "raw image/svg+xml output, which it does not render; a GPU re-run of the notebook is owed (python -m "
            "thunder_nb notebooks --in-place), then drop it from STALE")))
    nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    page = _open(browser, untrusted_lab)
    try:
        problems = _check(page, nb, f"{stem}.ipynb", screenshots)
    finally:
        page.close()
    assert problems == [], "\n".join(problems)


def test_notebook_run_now_shows_its_diagrams_untrusted(untrusted_lab, browser, screenshots):
    """Notebook 01 executed now (CPU, not committed), opened untrusted: the toggle's fallback shows both sides' diagrams
    as images, the original's in its closed <details>, and nothing of an SVG as loose words."""
    from playwright.sync_api import expect

    root_nb = nbformat.read(NOTEBOOKS / "01_del_bug.ipynb", as_version=4)
    page = _open(browser, untrusted_lab)
    try:
        problems = _check(page, root_nb, FRESH, screenshots)
        assert problems == [], "\n".join(problems)
        (i,) = [i for i, c in enumerate(root_nb.cells) if nbcheck.is_toggle_cell(c)]
        area = page.locator(".jp-Notebook .jp-Cell").nth(i).locator(".jp-OutputArea").first
        folded = area.locator("details", has_text="original (legacy)").first
        expect(folded.locator("img").first).to_be_hidden()
        folded.locator("summary").first.click()
        expect(folded.locator("img").first).to_be_visible()
        assert folded.locator("img").first.evaluate("i => i.naturalWidth") > 0
    finally:
        page.close()


def test_lifetime_chart_run_now_shows_untrusted(untrusted_lab, browser, screenshots):
    """Notebook 02 executed now (CPU, not committed), opened untrusted: its lifetime chart cell shows the chart as an
    image (the stored H200 output is a raw image/svg+xml, which untrusted Lab leaves as text)."""
    root_nb = nbformat.read(NOTEBOOKS / "02_islands.ipynb", as_version=4)
    page = _open(browser, untrusted_lab)
    try:
        problems = _check(page, root_nb, FRESH_02, screenshots)
    finally:
        page.close()
    assert problems == [], "\n".join(problems)
