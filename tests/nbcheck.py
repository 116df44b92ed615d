"""What a teaching notebook's text claims and what its outputs show: shared by the notebook tests."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
from filelock import FileLock

from thunder_nb.diagnosis.model import RULES
from thunder_nb.notebook import export
from thunder_nb.notebook.widget import SIDE_VIEWS

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MAGIC = "%%thunder_cudagraph"
#: The first line of a magic cell: the cell magic or the line magic, and its options.
MAGIC_LINE = re.compile(r"^%%?thunder_cudagraph\b(?P<options>.*)$")
#: The views the original/fixed toggle holds; a magic without ``--views`` shows the diagram.
TOGGLE_VIEWS = SIDE_VIEWS

# NOTE: thunder names a trace's values t12 (tensor), f14 (float), i3 (int), b5 (bool) and its regions
# CUDAGraph1; the numbers change with thunder's numbering, so the text may only name what the
# outputs show
TRACE_NAME = re.compile(r"\b(?:[tfib]\d+|CUDAGraph\d+|island\d+)\b")
RULE_NAME = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, RULES), key=len, reverse=True)) + r")(?![\w-])")
# a file of the repository the text refers the reader to
FILE_NAME = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w.-]+\.(?:md|ipynb|py|txt|json))\b")
DEVICE_LINE = re.compile(r"^device: (.+)$", re.M)


#: A markdown paragraph that starts with this speaks of what only a GPU run shows (a finding of real capture); a CPU
#: run's outputs need not show its names (`names_missing_from_outputs(..., cpu_run=True)`). The stored outputs (an
#: H200 run) still must.
GPU_ONLY = "On a GPU"


#: Stored notebooks (the H200 run) whose toggle outputs predate the static fallback as an output of its own (issue 53.1):
#: the fallback is the text/html of the widget's output, which nbconvert's default page of a notebook with widget state
#: drops. Tests that need the new format xfail on them, strictly, until the next GPU run (``python -m thunder_nb
#: notebooks --in-place``) stores it; then the entries go.
FALLBACK_INSIDE_WIDGET = {"01_del_bug", "04_training_step", "05_nanogpt_training", "06_real_model"}
#: Stored notebooks whose cells drew the lifetime chart as a raw ``image/svg+xml`` output (``display(SVG(...))``), which
#: JupyterLab does not render in an untrusted notebook; their source now shows it as HTML (`svg_img`), their stored
#: outputs await the GPU re-run as above.
RAW_SVG_OUTPUTS = {"02_islands", "03_lifetimes_and_memory"}
#: Stored notebooks committed with the outputs of a CPU run, their GPU run still to come (notebooks 07 and 08, issue 54):
#: the tests that need the stored outputs from a GPU xfail on them, strictly, with `GPU_RUN_OWED_REASON`, until the H200
#: run (``python -m thunder_nb notebooks --in-place 07 08``) stores its outputs; then the entry goes.
GPU_RUN_OWED = {"07_whole_step", "08_kv_cache_decoding"}
GPU_RUN_OWED_REASON = ("GPU re-run owed: the stored outputs come from a CPU run (python -m thunder_nb notebooks "
                       "--in-place on the GPU machine), then its entry in nbcheck.GPU_RUN_OWED goes")
#: Why a test xfails on a notebook of `FALLBACK_INSIDE_WIDGET` or `RAW_SVG_OUTPUTS`.
OWED_GPU_RUN = ("stored outputs from the H200 run before issue 53.1's change (the toggle's fallback an output of its "
                "own; no raw image/svg+xml output): a GPU re-run of the notebook is owed (python -m thunder_nb notebooks "
                "--in-place), then its entry in nbcheck goes")


def markdown(nb, *, cpu_run: bool = False) -> str:
    """All markdown cells' text (for a CPU run, without the paragraphs that start with `GPU_ONLY`)."""
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    if cpu_run:
        text = "\n\n".join(p for p in re.split(r"\n\s*\n", text) if not p.lstrip().startswith(GPU_ONLY))
    return text


def widget_state(nb) -> dict:
    return nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def outputs(nb) -> list:
    return [o for cell in nb.cells for o in cell.get("outputs", [])]


def output_text(nb) -> str:
    """Everything a reader can see in the outputs: streams, errors, every text-like MIME type, the widgets' panes."""
    parts = []
    for o in outputs(nb):
        parts.append(o.get("text", ""))
        parts += [o.get("ename", ""), o.get("evalue", "")]
        for mime, data in o.get("data", {}).items():
            if mime.startswith("text/") or mime == "image/svg+xml":
                parts.append(data if isinstance(data, str) else "".join(data))
    for model in widget_state(nb).values():
        value = model.get("state", {}).get("value")
        if isinstance(value, str):
            parts.append(value)
    return "\n".join(parts)


def names_missing_from_outputs(nb, *, cpu_run: bool = False) -> list[str]:
    """Trace names and checker rules the markdown mentions that no output of the notebook shows (for a CPU run, leaving
    out the paragraphs about what only a GPU run shows: `GPU_ONLY`)."""
    text, shown = markdown(nb, cpu_run=cpu_run), output_text(nb)
    named = sorted(set(TRACE_NAME.findall(text)) | set(RULE_NAME.findall(text)))
    return [n for n in named if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", shown)]


def files_missing(nb, notebook: Path, repo: Path) -> list[str]:
    """Files the markdown names that are neither next to the notebook nor in the repository."""
    return [
        f for f in sorted(set(FILE_NAME.findall(markdown(nb))))
        if not (notebook.parent / f).exists() and not (repo / f).exists()
    ]


def device_lines(nb) -> list[str]:
    """What the notebook's ``device:`` lines say (each notebook prints one in its first code cell)."""
    return DEVICE_LINE.findall("".join(o.get("text", "") for o in outputs(nb) if o.get("name") == "stdout"))


def widget_bundles(nb) -> list[tuple[int, dict]]:
    """(cell index, output data) of every output that shows a widget."""
    return [
        (i, o["data"]) for i, cell in enumerate(nb.cells) for o in cell.get("outputs", [])
        if WIDGET_VIEW in o.get("data", {})
    ]


def toggle_labels(nb, bundle: dict) -> list[str]:
    """The toggle buttons' labels of the widget this output shows (from the saved widget state)."""
    state = widget_state(nb)
    box = state.get(bundle[WIDGET_VIEW]["model_id"], {}).get("state", {})
    for child in box.get("children", []):
        model = state.get(child.removeprefix("IPY_MODEL_"), {})
        if model.get("model_name") == "ToggleButtonsModel":
            return list(model["state"]["_options_labels"])
    return []


class _Fallback(HTMLParser):
    """Where a static HTML rendering puts its SVGs: outside every ``<details>``, or inside a closed one."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[bool] = []  # open flag of each enclosing <details>
        self.svg_shown = 0
        self.svg_folded = 0
        self.folded_text: list[str] = []
        self.shown_text: list[str] = []
        self.closed_details = 0

    def handle_starttag(self, tag, attrs):
        if tag == "details":
            is_open = any(name == "open" for name, _ in attrs)
            self.closed_details += not is_open
            self.stack.append(is_open)
        elif tag == "svg" or (tag == "img" and (dict(attrs).get("src") or "").startswith("data:image/")):
            if all(self.stack):
                self.svg_shown += 1
            else:
                self.svg_folded += 1

    def handle_endtag(self, tag):
        if tag == "details" and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        (self.shown_text if all(self.stack) else self.folded_text).append(data)


def fallback_problems(outputs: list, at: int, labels: list[str]) -> list[str]:
    """What is wrong with the static fallback of the widget that output ``at`` of a cell's ``outputs`` shows (empty:
    nothing).

    The fallback is an output of its own right after the widget's (nbconvert's HTML of a notebook with widget state
    writes only the widget view of the widget's output, and untrusted JupyterLab its text): ``text/html`` whose outer
    element has the class ``tnb-fallback-<the widget's model id>`` (so that the drawn widget hides it), both sides
    rendered, the fixed one shown with its diagrams, the original folded in a closed ``<details>`` with its own. The
    widget's output holds no ``text/html`` of its own (frontends without the widget would show the sides twice).
    """
    bundle = outputs[at].get("data", {})
    if "text/html" in bundle:
        return ["the widget's output holds text/html: nbconvert's page of a notebook with widget state drops it, and a "
                "frontend without the widget shows it next to the fallback (the fallback must be an output of its own)"]
    model_id = bundle.get(WIDGET_VIEW, {}).get("model_id", "")
    html = outputs[at + 1].get("data", {}).get("text/html") if at + 1 < len(outputs) else None
    if not html:
        return [f"no text/html output after the widget's ({sorted(bundle)}): without a live kernel the widget shows "
                "nothing (no static fallback)"]
    html = html if isinstance(html, str) else "".join(html)
    problems = []
    if not re.search(rf'^<div class="[^"]*\btnb-fallback-{re.escape(model_id)}\b', html):
        problems.append(f"the output after the widget's is not named tnb-fallback-{model_id}: the drawn widget cannot "
                        "hide it, so the reader sees both sides twice")
    p = _Fallback()
    p.feed(html)
    p.close()
    if not p.svg_shown:
        problems.append("no diagram (<svg>, or <img> of one) shown outside a closed <details>: the fixed side is not open")
    if not p.closed_details:
        problems.append("no closed <details>: the original side is not folded")
    elif not p.svg_folded:
        problems.append("the closed <details> holds no diagram (<svg> or <img>): the original side's diagrams are missing")
    if labels:
        original, fixed = labels[0], labels[-1]
        if original not in "".join(p.folded_text):
            problems.append(f"{original!r} is not inside the closed <details>")
        if fixed not in "".join(p.shown_text):
            problems.append(f"{fixed!r} is not in the shown part")
    return problems


def toggle_outputs(nb) -> list[tuple[int, list, int]]:
    """(cell index, the cell's outputs, index of the widget's output among them) of every output that shows a widget."""
    return [(i, cell.outputs, j) for i, cell in enumerate(nb.cells) for j, o in enumerate(cell.get("outputs", []))
            if WIDGET_VIEW in o.get("data", {})]


#: Terms the notebooks use that a newcomer does not know: each must be emphasised (``*term*`` or
#: ``**term**``, where it is explained) in the first markdown cell of the series that uses it.
TERMS = ("region", "island", "unfused op", "prologue", "runner", "private pool", "scalar hand-off", "hand-out",
         "graph instance", "epilogue")
#: The magic's options a notebook uses: each is named in the notebook's markdown before its first use.
OPTIONS = re.compile(r"(?<![\w-])(--[a-z][\w-]*|-o)(?![\w-])")
# a measured figure quoted in prose: a time, a size, a speed ratio or a share
FIGURE = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s*(µs|us|ms|MiB|GiB|MB|x faster|x slower|%)(?!\w)")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).lower()


def terms_used_before_explained(notebooks: list) -> list[str]:
    """``"term (notebook, cell)"`` for each `TERMS` entry whose first markdown use in the series is not emphasised.

    ``notebooks``: (name, notebook) pairs in reading order.
    """
    problems = []
    for term in TERMS:
        for name, nb in notebooks:
            cell = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and term in _flat(c.source)), None)
            if cell is None:
                continue
            prose = re.sub(r"`[^`]*`", "", nb.cells[cell].source)  # a `y * s` is no emphasis
            spans = [_flat(s) for s in re.findall(r"\*{1,2}([^*]+)\*{1,2}", prose)]
            if not any(term in s for s in spans):
                problems.append(f"{term} ({name}, cell {cell})")
            break
    return problems


def is_magic_cell(cell) -> bool:
    """A code cell that runs ``%%thunder_cudagraph`` or the line magic ``%thunder_cudagraph``."""
    return cell.cell_type == "code" and bool(MAGIC_LINE.match(cell.source.split("\n", 1)[0]))


def is_toggle_cell(cell) -> bool:
    """A magic cell that shows the original/fixed toggle: not ``--whole-step`` (a report of its own), and a view the
    toggle holds (the default views do)."""
    if not is_magic_cell(cell):
        return False
    options = MAGIC_LINE.match(cell.source.split("\n", 1)[0])["options"]
    if "--whole-step" in options:
        return False
    views = re.search(r"--views[ =](\S+)", options)
    return views is None or any(v in TOGGLE_VIEWS for v in views[1].split(","))


def options_used_before_named(nb) -> list[str]:
    """Options of the magic cells (``--train``, ``-o``) that no markdown cell before their first use names."""
    named: set[str] = set()
    problems = []
    for c in nb.cells:
        if c.cell_type == "markdown":
            named |= set(OPTIONS.findall(re.sub(r"```.*?```", "", c.source, flags=re.S)))
        elif is_magic_cell(c):
            first_line = c.source.splitlines()[0]
            problems += [o for o in OPTIONS.findall(first_line) if o not in named and o not in problems]
    return problems


def figures_missing_from_outputs(nb) -> list[str]:
    """Measured figures the markdown quotes (``3,901 µs``, ``2.37x faster``, ``17%``) that no output shows."""
    shown = output_text(nb).replace(",", "")
    missing = []
    for number, unit in FIGURE.findall(markdown(nb)):
        if not re.search(rf"(?<![\d.]){re.escape(number.replace(',', ''))}(?![\d])", shown):
            missing.append(f"{number} {unit}")
    return missing


def executed_once(path: Path, tmp_path_factory) -> nbformat.NotebookNode:
    """``path`` run top to bottom in a fresh kernel (`export.execute_notebook`, in a folder of its own) once per test
    session: the tests that read a notebook executed now share one run, across pytest-xdist's workers too (the
    session's temporary root, a lock per notebook). Each call returns its own copy; a run whose cell raised is kept as
    it is (`export.error_outputs` says so)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # NOTE: each worker's base is a folder of the session's root
    done = root / "executed-notebooks" / path.name
    done.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(done) + ".lock"):
        if not done.exists():
            cwd = done.parent / path.stem
            cwd.mkdir(exist_ok=True)
            nbformat.write(export.execute_notebook(path, timeout=600, cwd=cwd), done)
    return nbformat.read(done, as_version=4)
