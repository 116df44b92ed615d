"""What a teaching notebook's text claims and what its outputs show: shared by the notebook tests."""

from __future__ import annotations

import base64
import builtins
import json
import os
import re
import subprocess
import symtable
import sys
from html import unescape
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
FALLBACK_INSIDE_WIDGET: set[str] = set()
#: Stored notebooks whose cells drew the lifetime chart as a raw ``image/svg+xml`` output (``display(SVG(...))``), which
#: JupyterLab does not render in an untrusted notebook; their source now shows it as HTML (`svg_img`), their stored
#: outputs await the GPU re-run as above.
RAW_SVG_OUTPUTS: set[str] = set()
#: Stored notebooks committed with the outputs of a CPU run, their GPU run still to come (notebooks 07 and 08, issue 54):
#: the tests that need the stored outputs from a GPU xfail on them, strictly, with `GPU_RUN_OWED_REASON`, until the H200
#: run (``python -m thunder_nb notebooks --in-place 07 08``) stores its outputs; then the entry goes.
GPU_RUN_OWED: set[str] = set()
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
    """Every output of every cell, in order, each run of one stream's pieces joined as Jupyter shows it
    (`thunder_nb.notebook.export.merge_streams`: a notebook stored before it may hold a line in two pieces)."""
    return [o for cell in nb.cells for o in export.joined_streams(cell.get("outputs", []))]


def printed(cell) -> str:
    """What a code cell shows as text: what it printed (each stream's pieces joined) and each display's text/plain."""
    parts = []
    for o in export.joined_streams(cell.get("outputs", [])):
        parts.append(o.get("text", ""))
        plain = o.get("data", {}).get("text/plain", "")
        parts.append(plain if isinstance(plain, str) else "".join(plain))
    return "\n".join(parts)


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
#: ``**term**``, where it is explained) in the first markdown cell of the series that uses it. Notebook 01's glossary
#: (its second cell, issue 54.10) explains the most of them, so that is where the series first uses them.
TERMS = ("region", "island", "unfused op", "prologue", "runner", "private pool", "scalar hand-off", "hand-out",
         "graph instance", "epilogue", "thunder-nb", "trace", "top-level function", "graph", "replay", "recording",
         "fused", "lifetime view", "static input", "autograd wrapper", "shallow_copy", "EagerFallbackWarning",
         "Collection", "cotangents")
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
    for term in map(str.lower, TERMS):
        for name, nb in notebooks:
            cell = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and term in _flat(c.source)), None)
            if cell is None:
                continue
            # NOTE: a `y * s` is no emphasis; a **`shallow_copy`** is
            prose = re.sub(r"`([^`]*)`", lambda m: "" if "*" in m[1] else m[1], nb.cells[cell].source)
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


def _session_root(tmp_path_factory) -> Path:
    """The test session's temporary root, the same folder in every pytest-xdist worker."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # NOTE: each worker's base is a folder of the session's root
    return root


def executed_once(path: Path, tmp_path_factory) -> nbformat.NotebookNode:
    """``path`` run top to bottom in a fresh kernel (`export.execute_notebook`, in a folder of its own) once per test
    session: the tests that read a notebook executed now share one run, across pytest-xdist's workers too (the
    session's temporary root, a lock per notebook). Each call returns its own copy; a run whose cell raised is kept as
    it is (`export.error_outputs` says so)."""
    done = _session_root(tmp_path_factory) / "executed-notebooks" / path.name
    done.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(done) + ".lock"):
        if not done.exists():
            cwd = done.parent / path.stem
            cwd.mkdir(exist_ok=True)
            nbformat.write(export.execute_notebook(path, timeout=600, cwd=cwd), done)
    return nbformat.read(done, as_version=4)


def example_once(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """(the finished command, DIR): ``python -m thunder_nb example --out DIR`` as a user runs it, from a folder of its
    own, once per test session, shared like `executed_once` (its tests read what it printed and wrote, and change
    nothing there)."""
    root = _session_root(tmp_path_factory) / "example-command"
    root.mkdir(parents=True, exist_ok=True)
    done, out = root / "run.json", root / "out"
    with FileLock(str(done) + ".lock"):
        if not done.exists():
            cwd = root / "cwd"
            cwd.mkdir(exist_ok=True)
            run = subprocess.run([sys.executable, "-m", "thunder_nb", "example", "--out", str(out)], cwd=cwd,
                                 capture_output=True, text=True, timeout=600)
            done.write_text(json.dumps([run.args, run.returncode, run.stdout, run.stderr]))
    return subprocess.CompletedProcess(*json.loads(done.read_text())), out


# --- issue 54: the prose against the outputs, point by point ----------------------------------------

_DATA_SVG = re.compile(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"')


def plain(html: str) -> str:
    """``html`` as a reader sees its words: tags dropped, entities decoded, white space collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html))).strip()


def with_images(text: str) -> str:
    """``text`` followed by the SVGs it shows as ``<img>`` (issue 53.1 draws diagrams so), decoded."""
    return "\n".join([text, *(base64.b64decode(m).decode("utf-8", "replace") for m in _DATA_SVG.findall(text))])


def shown_text(nb) -> str:
    """The words of every output, the pictures' included (`output_text`, `with_images`, `plain`)."""
    return plain(with_images(output_text(nb)))


def cell_text(cell) -> str:
    """The words of one cell's outputs, its pictures' included."""
    return shown_text(nbformat.v4.new_notebook(cells=[cell]))


def sentences(text: str) -> list[str]:
    """The sentences of markdown ``text``, each on one line (a list item and a paragraph end one too)."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\"])|\n\s*\n|\n\s*(?:[-*]|\d+\.)\s+", text)
    return [re.sub(r"\s+", " ", p).strip() for p in parts if p.strip()]


#: A fusion executor's group as a diagram labels it: ``TorchCompile0: 12 ops fused (inductor)``.
FUSED_GROUP = re.compile(r"\b(?:TorchCompile|nvFusion)\d+: \d+ ops? fused \(")
#: Prose that says that no fusion executor joins any op.
NO_FUSION = re.compile(r"\bno fusion executor\b|\bnothing (?:here )?is fused\b|\bnone of them is fused\b", re.I)


def fusion_denied(nb) -> list[str]:
    """The sentences that say no fusion executor joins ops, in a notebook whose outputs show a fused group (54.1)."""
    if not FUSED_GROUP.search(shown_text(nb)):
        return []
    return [s for s in sentences(markdown(nb)) if NO_FUSION.search(s)]


#: Words of the memory plan that a sentence naming a row (the `copied out` row) may say the row holds.
PLAN_WORDS = ("rotation", "handed out", "guarded", "lent")
_PLAN_ROW = re.compile(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>", re.S)


def plan_rows(nb) -> dict[str, list[str]]:
    """The memory plans' rows the outputs show, by what they say (``copied out``): each row's words."""
    rows: dict[str, list[str]] = {}
    for table in re.findall(r'<table class="tnb-memory">(.*?)</table>', output_text(nb), flags=re.S):
        for cells in _PLAN_ROW.findall(table):
            rows.setdefault(plain(cells[1]), []).append(plain(" ".join(cells)))
    return rows


def row_claims_missing(nb) -> list[str]:
    """``"rotation (the `copied out` row)"``: a `PLAN_WORDS` word in a sentence that names a memory plan row, which no
    such row of the outputs shows (54.2)."""
    rows = plan_rows(nb)
    missing = []
    for s in sentences(markdown(nb)):
        for label in re.findall(r"`([^`]+)` row", s):
            shown = " ".join(rows.get(label, [])).lower()
            missing += [f"{w} (the `{label}` row)" for w in PLAN_WORDS
                        if w in s.lower() and w not in label and w not in shown]
    return missing


#: Prose that makes a region one graph: it records one graph per key (shape, address, number, held outputs).
ONE_GRAPH = re.compile(r"\bregions?\b[^.;]*?\b(?:is|as|each|records?) (?:exactly )?one (?:CUDA )?graph\b"
                       r"(?! per\b| for each\b)", re.I)


def one_graph_claims(nb) -> list[str]:
    """The sentences that say a region is one graph (54.3)."""
    return [s for s in sentences(markdown(nb)) if ONE_GRAPH.search(s)]


#: How the verdict starts a side that went wrong in this run (`thunder_nb.notebook.verdict`'s failure phrases).
VERDICT_FAILURES = ("capture fails", "compile fails", "crashes (", "needs a GPU to run", "not run: it would kill")
#: A hazard the run did not show: ``t106 saved for the backward in graph memory would be wrong when ...``.
VERDICT_HAZARD = re.compile(r" would (?:be wrong|fail|kill the process|hang)\b.*? when ")
#: What the verdict said before issue 53 (a count of the rest, and a hazard after the run).
VERDICT_RETIRED = ("more wrong result", "more error)", "equal to eager in this run")


def verdict_lines(nb) -> list[tuple[int, str]]:
    """(cell index, verdict) of every magic cell's verdict line (its first ``original (...)`` text)."""
    found = []
    for i, c in enumerate(nb.cells):
        if not is_toggle_cell(c):
            continue
        for o in c.get("outputs", []):
            text = o.get("data", {}).get("text/plain", "")
            text = text if isinstance(text, str) else "".join(text)
            if text.startswith("original ("):
                found.append((i, text.splitlines()[0]))
                break
    return found


def _top_level_split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    return parts + [text[start:]]


def verdict_problems(verdict: str) -> list[str]:
    """Where a verdict line breaks the order notebook 06 describes (54.5): what went wrong in this run first (a failure,
    then the defect behind it, or a number that differs); else a hazard this run did not show (``would ... when``),
    followed by how this run went (``in this run: ...``); the wording of issue 53 only."""
    problems = [f"the old wording {old!r}" for old in VERDICT_RETIRED if old in verdict]
    for side in _top_level_split(verdict, "; "):
        name, _, text = side.partition(": ")
        failures = [w for w in VERDICT_FAILURES if w in text]
        if failures and not text.startswith(failures[0]):
            problems.append(f"{name}: the failure ({failures[0]!r}) is not its first finding")
        hazard = VERDICT_HAZARD.search(text)
        if hazard is None:
            continue
        if any(w != "needs a GPU to run" for w in failures) or "DIFFERS" in text[:hazard.start()]:
            problems.append(f"{name}: a hazard after what went wrong in this run")
        rest = text[hazard.end():]
        if ", in this run: " not in rest and not rest.endswith(", not run"):
            problems.append(f"{name}: the hazard is not followed by how this run went")
    return problems


#: The options of `FixedCUDAGraphTransform` that bound its graphs: a default the prose gives is one an output prints.
BOUND_OPTIONS = ("max_values", "max_addresses", "max_instances", "instance_memory", "rotation")
_NUMBER_WORDS = {"a quarter": 0.25, "¼": 0.25, "half": 0.5}


def option_figures_unprinted(nb) -> list[str]:
    """``"32 (`max_addresses`)"``: a number in a sentence that names a `BOUND_OPTIONS` option, which is not the value an
    output prints for one of the options it names (``max_addresses=32``) (54.9)."""
    shown = output_text(nb)
    missing = []
    for s in sentences(markdown(nb)):
        named = [o for o in BOUND_OPTIONS if f"`{o}`" in s]
        if not named:
            continue
        printed = {float(v) for o in named for v in re.findall(rf"\b{o}=(\d+(?:\.\d+)?)", shown)}
        prose = re.sub(r"`[^`]*`|notebook \d+|\b\d+-d\b", "", s)
        numbers = [float(n) for n in re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])", prose)]
        numbers += [v for w, v in _NUMBER_WORDS.items() if w in prose]
        missing += [f"{n:g} ({', '.join(named)})" for n in numbers if n not in printed]
    return missing


def lifetime_keys(nb) -> list[str]:
    """The entries of every lifetime chart's colour key in the outputs (a raw SVG, an inline one or an ``<img>``)."""
    svg = with_images(output_text(nb))
    return [unescape(t) for key in re.findall(r'<g class="tnb-key">(.*?)</g>', svg, flags=re.S)
            for t in re.findall(r"<text[^>]*>([^<]*)</text>", key)]


#: How prose points at a colour of a chart: ``in the defect colour``, ``the key calls it "a value with a defect"``.
_COLOUR_ROLE = re.compile(r"\bin the ([\w -]+?) colou?r\b", re.I)


def key_words_missing(nb) -> list[str]:
    """What the prose says a lifetime chart's key shows (a colour's role, a quoted entry in a sentence about the key)
    that no key in the outputs shows (54.7)."""
    keys = " | ".join(lifetime_keys(nb)).lower()
    missing = []
    for s in sentences(markdown(nb)):
        named = _COLOUR_ROLE.findall(s) + (re.findall(r'"([^"]+)"', s) if re.search(r"\bkey\b", s) else [])
        missing += [n for n in named if n.lower() not in keys]
    return missing


#: Forming regions called fusing: in these notebooks fusing is a fusion executor's (notebook 01's glossary, 54.10).
FUSING_REGIONS = re.compile(r"\bfused into (?:a |one )?regions?\b|\b(?:after|before) fusion\b|\bregion fusion\b", re.I)


def fusing_regions(nb) -> list[str]:
    """The sentences that call the forming of regions fusing."""
    return [s for s in sentences(markdown(nb)) if FUSING_REGIONS.search(s)]


_COUNT_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def series_counts(nb) -> list[int]:
    """How many notebooks the prose says the series has (``these eight notebooks``); -1 for a word not a number."""
    found = re.findall(r"\bthese (\w+) notebooks\b", _flat(markdown(nb)), re.I)
    return [int(w) if w.isdigit() else _COUNT_WORDS.get(w.lower(), -1) for w in found]


def warnings_not_shown_above(nb) -> list[str]:
    """Warnings the prose points at above it (``the `UserWarning` above``) that no output above that cell shows."""
    problems, shown = [], []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            shown.append(cell_text(cell))
            continue
        for name in re.findall(r"`(\w+Warning)` above", re.sub(r"\s+", " ", cell.source)):
            if not any(name in text for text in shown):
                problems.append(f"cell {i}: `{name}` above")
    return problems


def copied_inputs_unexplained(nb) -> list[str]:
    """Region inputs an output prints as ``copied in before each call: a, b`` that no markdown cell names."""
    text = markdown(nb)
    names = {n.strip() for m in re.findall(r"copied in before each call: ([\w, ]+)", output_text(nb))
             for n in m.split(",") if n.strip()}
    return sorted(n for n in names if not re.search(rf"`{re.escape(n)}`", text))


#: Names IPython puts in a kernel's namespace.
IPYTHON_NAMES = frozenset({"get_ipython", "display", "In", "Out", "exit", "quit"})


def _as_python(cell) -> str:
    """A code cell as Python: IPython's line magics and shell lines left out, a cell magic's body kept; the name a
    ``%%thunder_cudagraph`` (or ``%thunder_cudagraph``) line binds with ``-o`` bound, as the magic's parser reads it."""
    from thunder_nb.magics import ThunderCUDAGraphMagics
    from thunder_nb.notebook.magic_line import parse_line

    lines = cell.source.splitlines()
    head = []
    magic = MAGIC_LINE.match(lines[0]) if lines else None
    if magic:
        args, _ = parse_line(ThunderCUDAGraphMagics.thunder_cudagraph, magic["options"])
        head = [f"{args.output} = None"] if args.output else []
    if lines and lines[0].startswith("%%"):
        return "\n".join(head + lines[1:])
    return "\n".join(head + [line for line in lines if not line.lstrip().startswith(("%", "!"))])


def names_never_bound(nb) -> list[str]:
    """Names the notebook's code reads (at top level, or as a function's global) that no code cell binds and that are
    no builtin: a cell that raises NameError on a branch no run took (a GPU branch on the CPU), found without a run."""
    top = symtable.symtable("\n".join(_as_python(c) for c in nb.cells if c.cell_type == "code"), "notebook", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        read |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and (table is top or s.is_global())}
        tables += table.get_children()
    return sorted(read - bound - set(dir(builtins)) - IPYTHON_NAMES)


def op_counts_unmatched(nb) -> list[str]:
    """Notebook 05's op counts against its first magic's diagrams: the cell that prints ``forward: 1 region(s) of N
    ops`` (``thunder.jit`` with the fixed transform and thunder's executors) counts what the original side's regions
    hold, its forward one op more (the ``.item()`` thunder captures); the fixed side (`thunder_nb.jit`, whose
    executors run layer norm and GELU as one op each) holds fewer in each. What does not hold, one line each."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and "region(s) of" in c.source)
    counted = dict(re.findall(r"(forward|backward): 1 region\(s\) of (\d+) ops", printed(cell)))
    if set(counted) != {"forward", "backward"}:
        return [f"the counting cell printed {counted}, not one forward and one backward region"]
    magic = next(c for c in nb.cells if is_toggle_cell(c))
    drawn = [int(n) for n in re.findall(r"CUDAGraph\d+ (\d+) ops ·", cell_text(magic))]
    forward, backward = int(counted["forward"]), int(counted["backward"])
    original = [forward + 1, backward]
    if len(drawn) != 4 or sorted(drawn[2:]) != sorted(original):
        return [f"the diagrams count {drawn}: the original side's regions should hold {original} ops (fixed side "
                f"first, then the original)"]
    return [f"the fixed side's region of {n} ops is no smaller than the original's {m}"
            for n, m in zip(drawn[:2], original) if n >= m]
