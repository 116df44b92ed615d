"""The committed notebooks: their text agrees with their stored outputs, and those outputs stand without a kernel.

These read the notebooks as committed (no kernel runs); `test_notebooks.py` runs the same checks on
a fresh CPU execution. The stored outputs come from one GPU run (``python -m thunder_nb notebooks
--in-place`` on the H200), so these tests are the ones that hold the text to what that run showed.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import nbformat
import pytest

import nbcheck

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
#: GitHub renders a notebook up to about 1 MB; each committed notebook stays under it.
MAX_BYTES = 1_000_000


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=lambda p: p.stem)
def stored(request):
    """(path, the notebook as committed)."""
    return request.param, nbformat.read(request.param, as_version=4)


def test_trace_names_in_the_text_are_in_the_outputs(stored):
    """Every trace name (t8, f14, CUDAGraph1) and checker rule the markdown mentions appears in the stored outputs."""
    path, nb = stored
    missing = nbcheck.names_missing_from_outputs(nb)
    assert not missing, f"{path.name}: the text names {missing}, which no stored output shows"


def test_text_points_only_inside_the_repository(stored):
    path, nb = stored
    missing = nbcheck.files_missing(nb, path, REPO)
    assert not missing, f"{path.name}: the text refers the reader to {missing}, which the repository does not have"
    assert "bench/results" not in nbcheck.markdown(nb), f"{path.name}: show the numbers, don't send the reader to bench/results/"


def test_every_magic_output_has_a_static_fallback(stored, request):
    """After the widget's output comes its static fallback, an output of its own: both sides, the fixed one open, the
    original folded, diagrams as images, named after the widget so that the drawn widget hides it."""
    path, nb = stored
    if path.stem in nbcheck.FALLBACK_INSIDE_WIDGET:
        request.applymarker(pytest.mark.xfail(strict=True, reason=nbcheck.OWED_GPU_RUN))
    magic_cells = [i for i, c in enumerate(nb.cells) if nbcheck.is_toggle_cell(c)]
    toggles = nbcheck.toggle_outputs(nb)
    assert sorted({i for i, _, _ in toggles}) == magic_cells, f"{path.name}: each magic cell shows one toggle"
    for i, outputs, at in toggles:
        problems = nbcheck.fallback_problems(outputs, at, nbcheck.toggle_labels(nb, outputs[at]["data"]))
        assert not problems, f"{path.name}, cell {i}: " + "; ".join(problems)


def test_no_raw_svg_output(stored, request):
    """No output is a bare image/svg+xml (``display(SVG(...))``): JupyterLab does not render one in an untrusted
    notebook, as a stored notebook opens; a picture goes out as HTML with an <img> (``thunder_nb.render.backend.svg_img``)."""
    path, nb = stored
    if path.stem in nbcheck.RAW_SVG_OUTPUTS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=nbcheck.OWED_GPU_RUN))
    raw = [i for i, c in enumerate(nb.cells) for o in c.get("outputs", ()) if "image/svg+xml" in o.get("data", {})]
    assert raw == [], f"{path.name}: cells {raw} show an image/svg+xml output, which untrusted JupyterLab leaves blank"


def test_stored_outputs_come_from_the_gpu_the_text_names(stored, request):
    """Every code cell ran, none raised, on a GPU; the markdown names that GPU (the text says where the numbers come
    from). Each notebook is one run, and notebooks may come from different GPUs (05: an H100; the others: an H200)."""
    path, nb = stored
    if path.stem in nbcheck.GPU_RUN_OWED:
        request.applymarker(pytest.mark.xfail(strict=True, reason=nbcheck.GPU_RUN_OWED_REASON))
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), f"{path.name}: not every cell has a stored output (run it)"
    errors = [o for o in nbcheck.outputs(nb) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: a stored output is an error: {errors[0].get('ename')}"
    devices = nbcheck.device_lines(nb)
    assert len(devices) == 1, f"{path.name}: expected one `device:` line in the outputs, found {devices}"
    assert not devices[0].startswith("CPU"), (
        f"{path.name}: the stored outputs come from a CPU run ({devices[0]!r}); "
        "run `python -m thunder_nb notebooks --in-place` on the GPU machine"
    )
    gpu = re.sub(r"^NVIDIA\s+", "", devices[0]).split()[0]  # "NVIDIA H200" -> "H200"
    assert gpu in nbcheck.markdown(nb), f"{path.name}: the outputs come from {devices[0]!r}, which the text does not name"


def test_every_name_the_code_reads_is_bound_by_a_cell(stored):
    """Both branches of a ``device == "cuda"`` cell are read: the CPU run takes one, the GPU run the other."""
    path, nb = stored
    unbound = nbcheck.names_never_bound(nb)
    assert not unbound, f"{path.name}: the code reads {unbound}, which no cell binds"


def test_unbound_names_check():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import statistics\n%load_ext thunder_nb\ntimings = {}\ndef f(x):\n    return x + y"),
        nbformat.v4.new_code_cell("%%thunder_cudagraph -o diag f(x)\ndef f(x):\n    return x"),
        nbformat.v4.new_code_cell("if False:\n    print(eager_us, diag, statistics.median(timings['a']), len(In))"),
        nbformat.v4.new_code_cell("[z for z in range(3)]\ny = 1"),
    ])
    assert nbcheck.names_never_bound(nb) == ["eager_us"]


def test_small_enough_for_github(stored):
    """GitHub shows a notebook up to about 1 MB: diagrams must stay compact (issue #32's hierarchy, `--views`)."""
    path, _ = stored
    size = path.stat().st_size
    assert size < MAX_BYTES, f"{path.name}: {size / 1e6:.2f} MB, over the {MAX_BYTES / 1e6:.0f} MB GitHub renders"


def test_terms_are_explained_where_first_used():
    """Each term a newcomer does not know (prologue, runner, hand-out, ...) is emphasised where the series first uses it."""
    notebooks = [(p.name, nbformat.read(p, as_version=4)) for p in NOTEBOOKS]
    problems = nbcheck.terms_used_before_explained(notebooks)
    assert not problems, f"used before they are explained (emphasise and explain them there): {problems}"


def test_magic_options_are_named_before_use(stored):
    """Every option of a magic cell (`--train`, `-o`, `--repeats`) is named in the markdown above its first use."""
    path, nb = stored
    problems = nbcheck.options_used_before_named(nb)
    assert not problems, f"{path.name}: the magic uses {problems} before any text says what they do"


def test_figures_in_the_text_are_in_the_outputs(stored):
    """A measured figure the prose quotes (µs, MiB, "2.4x faster", a percentage) is one the stored outputs show."""
    path, nb = stored
    missing = nbcheck.figures_missing_from_outputs(nb)
    assert not missing, f"{path.name}: the text quotes {missing}, which no stored output shows (say it without the number)"


# --- the checks themselves, on small made-up notebooks ---------------------------------------------


def _notebook(text: str, printed: str, bundle: dict | None = None):
    cells = [nbformat.v4.new_markdown_cell(text), nbformat.v4.new_code_cell("print(...)")]
    cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    if bundle is not None:
        cells[1].outputs.append(nbformat.v4.new_output("display_data", data=bundle))
    return nbformat.v4.new_notebook(cells=cells)


def test_names_check_catches_a_name_the_outputs_do_not_show():
    nb = _notebook("it computes `t9`, deletes it in CUDAGraph1, then returns it (`use-after-del`)", "del t8\nCUDAGraph1")
    assert nbcheck.names_missing_from_outputs(nb) == ["t9", "use-after-del"]
    nb.cells[1].outputs[0].text = "t9 = ...; CUDAGraph1 ... use-after-del"
    assert nbcheck.names_missing_from_outputs(nb) == []
    # a name inside a longer one does not count: t9 is not shown by t90, nor a rule by a longer word
    assert nbcheck.names_missing_from_outputs(_notebook("`t9`, `never-freed`", "t90 never-freed-ish")) == [
        "never-freed", "t9"
    ]


def test_files_check_catches_a_pointer_outside_the_repository(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "02_next.ipynb").write_text("{}")
    (tmp_path / "README.md").write_text("")
    nb = _notebook("see THUNDER.md, README.md and `02_next.ipynb`; `x.sum().item()` is no file", "")
    assert nbcheck.files_missing(nb, tmp_path / "notebooks" / "01.ipynb", tmp_path) == ["THUNDER.md"]


GOOD_FALLBACK = (
    '<div class="thunder-nb tnb-static tnb-fallback-m"><b>fixed</b><svg><text>diagram</text></svg>'
    "<details><summary>original (stock)</summary><svg></svg></details></div>"
)


@pytest.mark.parametrize(
    "html, problem",
    [
        (GOOD_FALLBACK, None),
        (None, "no static fallback"),
        (GOOD_FALLBACK.replace("tnb-fallback-m", "tnb-fallback-other"), "cannot hide it"),
        (GOOD_FALLBACK.replace("<details>", "<details open>"), "no closed <details>"),
        ('<div class="tnb-fallback-m">fixed<details><summary>original (stock)</summary><svg></svg></details></div>',
         "the fixed side is not open"),
        (GOOD_FALLBACK.replace("<svg></svg></details>", "</details>"), "original side's diagrams are missing"),
        (GOOD_FALLBACK.replace("original (stock)", "original"), "'original (stock)' is not inside the closed <details>"),
        ("inside", "be an output of its own"),
    ],
)
def test_fallback_check(html, problem):
    widget = {nbcheck.WIDGET_VIEW: {"model_id": "m"}, "text/plain": "toggle: original (stock) | fixed"}
    if html == "inside":  # NOTE: the format before issue 53.1: the fallback in the widget's own output
        widget["text/html"] = GOOD_FALLBACK
    outputs = [nbformat.v4.new_output("display_data", data=widget)]
    if html not in (None, "inside"):
        outputs.append(nbformat.v4.new_output("display_data", data={"text/html": html}))
    problems = nbcheck.fallback_problems(outputs, 0, ["original (stock)", "fixed"])
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_terms_check():
    first = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("the **prologue** checks inputs; the runner")])
    later = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("the *runner*\n replays; an epilogue")])
    problems = nbcheck.terms_used_before_explained([("01", first), ("02", later)])
    assert "runner (01, cell 0)" in problems and "epilogue (02, cell 0)" in problems
    assert not any(p.startswith("prologue") for p in problems)
    split = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("a **second graph\n  instance**")])
    assert not any(p.startswith("graph instance") for p in nbcheck.terms_used_before_explained([("01", split)]))


def test_options_check():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("`--train` runs the backward"),
        nbformat.v4.new_code_cell("%%thunder_cudagraph --train -o step --repeats 5 f(x)\ndef f(x): ..."),
        nbformat.v4.new_markdown_cell("`-o NAME` keeps it"),
    ])
    assert nbcheck.options_used_before_named(nb) == ["-o", "--repeats"]


def test_figures_check():
    nb = _notebook("eager takes 3,901 µs, 2.4x faster, 17% busy, 96.0 MiB; 8 graphs", "eager 3901 us\n2.4x\n96.0 MiB")
    assert nbcheck.figures_missing_from_outputs(nb) == ["17 %"]


def test_a_gpu_only_paragraph_is_left_out_of_the_cpu_runs_check_and_no_other():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("The checker flags `never-freed` here.\n\n"
                                      f"{nbcheck.GPU_ONLY} the verdict also shows `static-input-rebound` in CUDAGraph2."),
        nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output("stream", text="CUDAGraph2: 1 graph")]),
    ])
    assert nbcheck.names_missing_from_outputs(nb) == ["never-freed", "static-input-rebound"]
    assert nbcheck.names_missing_from_outputs(nb, cpu_run=True) == ["never-freed"]


#: What earlier code printed and this code no longer does (the kernel label that gave a fused group a figure of 1;
#: the warning of an eager step run on a failed capture's stream; the memory plan listing inputs copied in a second
#: time, as "copied at the last replay"; notebook 03's count of results copied out, before rotation handed two of
#: them out where they lay; the memory plan's rotation clause on every "copied out" row, regions that save for a
#: backward included, before "copied out" and "handed out (rotation)" became two rows; a warning printed as the library
#: file and line that raised it, before thunder-nb's warnings became one line to the user; a too-big full diagram said
#: to be "listed by module below and in the generated code" where no listing followed, before fused ops got the module
#: tree; a region whose recording raised labelled "not run", before it read "capture failed" or "raised
#: UnboundLocalError": notebook 01's legacy region, notebook 05's stock forward region). `STALE`: the notebooks whose
#: stored outputs came
#: from before those changes, until the next H200 run (``python -m thunder_nb notebooks --in-place``) replaces them;
#: strict, so that the run which removes them fails here until the entry goes (and the prose is read again).
RETIRED = ("inductor decides for", "AccumulateGrad node's stream does not match",
           "nor a parameter or module buffer", "tensors copied out in 3 calls",
           "another instance serves the next call (rotation)", "RecaptureWarning: thunder-nb:",
           "listed by module below and in the generated code", "CUDAGraph1 · 1 op · not run", "CUDAGraph1: not run, ≈",
           # issue 53: the verdict counts error defects by trace as the diagram keys do, and words a hazard the run did
           # not show as what it would do, and when (amber)
           "more wrong result", "more error)", "equal to eager in this run (would be wrong")
_RETIRED_SHOWN = "stored outputs from before the RETIRED changes"
#: Why a notebook's stored outputs are stale, until the next H200 run (``python -m thunder_nb notebooks --in-place``)
#: replaces them: the code no longer prints what they show (`RETIRED`), or a code cell changed after that run (issue
#: 54). The tests that read what changed xfail on it, strictly, so that the run which fixes them fails here until the
#: entry goes (and the prose is read again against the new figures).
STALE: dict[str, str] = {}
#: The `STALE` notebooks whose stored outputs show a `RETIRED` phrase.
SHOWS_RETIRED: set[str] = set()


def _owed(request, stem: str, among=None) -> None:
    """Mark the test xfail, strictly, on notebook ``stem`` when its stored outputs are `STALE` (and among ``among``)."""
    if stem in STALE and (among is None or stem in among):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"{stem}: {STALE[stem]}: a GPU re-run is owed"))


def test_stored_outputs_show_nothing_the_code_no_longer_prints(stored, request):
    path, nb = stored
    _owed(request, path.stem, SHOWS_RETIRED)
    text = nbcheck.output_text(nb)
    found = [phrase for phrase in RETIRED if phrase in text]
    assert not found, f"{path.name}: the stored outputs show {found}, which the code no longer prints: run it again"


# --- issue 54: every claim printed, point by point (the stored notebooks) ----------------------------------


def _read(stem: str):
    return nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)


def _code_cell(nb, marker: str) -> int:
    """The index of the code cell whose source holds ``marker``."""
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and marker in c.source)


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _rows(text: str) -> dict[str, list[float]]:
    """The rows of a printed table: ``name   1234   56.7`` -> {name: [1234.0, 56.7]}."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^(\S.*?\S)\s+((?:\d+(?:\.\d+)?\s*)+)$", line)
        if m:
            rows[m[1]] = [float(n) for n in m[2].split()]
    return rows


def _on_gpu(nb) -> bool:
    return not nbcheck.device_lines(nb)[0].startswith("CPU")


def test_54_1_no_prose_denies_the_fused_group_the_outputs_show(stored):
    """05's outputs show `TorchCompile0: 12 ops fused (inductor)` (thunder's default torchcompile_xentropy): no sentence
    may say that no fusion executor joins ops."""
    path, nb = stored
    denied = nbcheck.fusion_denied(nb)
    assert not denied, f"{path.name}: the outputs show a fused group, yet the text says {denied}"


def test_54_2_a_memory_plan_row_holds_what_the_prose_says_it_holds(stored):
    """04's `copied out` row never mentions rotation: a sentence that names a row says only what the row shows."""
    path, nb = stored
    missing = nbcheck.row_claims_missing(nb)
    assert not missing, f"{path.name}: the text puts {missing} in a memory plan row that does not show it"


def test_54_3_no_prose_makes_a_region_one_graph(stored):
    """A region records a graph per key (05's forward region shows "2 graphs", 02's region "graphs: 8")."""
    path, nb = stored
    claims = nbcheck.one_graph_claims(nb)
    assert not claims, f"{path.name}: the text makes a region one graph: {claims}"


def test_54_3_the_glossary_gives_a_region_a_graph_per_key_as_the_outputs_show():
    entry = next(line for line in _read("01_del_bug").cells[1].source.split("\n- ") if line.startswith("**region**"))
    entry = re.sub(r"\s+", " ", entry)
    assert "one more graph for each new key" in entry
    assert all(key in entry for key in ("shape", "address", "value of a Python number", "still held")), entry
    islands = _read("02_islands")
    assert re.search(r"CUDAGraph2 .*graphs: 8", _printed(islands.cells[_code_cell(islands, "jg = thunder.jit(g")]))
    assert re.search(r"CUDAGraph1 .*\b2 graphs\b", nbcheck.shown_text(_read("05_nanogpt_training")))


#: Prose that puts a cost on notebook 05's logged loss.
LOGGED_COST = re.compile(r"\blogged loss costs\b|\bcost of the logged loss\b|\bthe logged loss (?:adds|slows)\b", re.I)


def test_54_4_a_cost_on_the_logged_loss_is_one_the_table_shows():
    """A cost the text puts on 05's logged loss shows in both rows that log it (the fixed transform's, and
    thunder_nb.jit(step)'s: 4,104 µs against 4,100 without it in the H200 run), 3% or more over the row without it."""
    nb = _read("05_nanogpt_training")
    rows = _rows(_printed(nb.cells[_code_cell(nb, "first_s = {}")]))
    base = rows["FixedCUDAGraphTransform, no logged loss"][0]
    costly = {name: rows[name][0] for name in ("FixedCUDAGraphTransform", "thunder_nb.jit(step)")}
    claims = [s for s in nbcheck.sentences(nbcheck.markdown(nb)) if LOGGED_COST.search(s)]
    if claims:
        assert all(us >= 1.03 * base for us in costly.values()), (
            f"the text says {claims}, but the table gives {costly} against {base} µs without the logged loss")


def test_54_5_verdicts_follow_the_order_the_text_describes(stored, request):
    """Each verdict line says first what went wrong in this run, else a hazard (`would ... when`) followed by how this
    run went (`in this run: ...`), in the wording of issue 53 (no `(+N more wrong results)`)."""
    path, nb = stored
    _owed(request, path.stem, SHOWS_RETIRED)
    problems = [(i, p) for i, verdict in nbcheck.verdict_lines(nb) for p in nbcheck.verdict_problems(verdict)]
    assert not problems, f"{path.name}: verdicts out of the order notebook 06 describes: {problems}"


def test_54_5_notebook_06_describes_the_verdicts_order():
    """06 says in which order the verdict gives a side's findings: the order of `thunder_nb.notebook.compared`'s
    `_findings` (what went wrong in this run; else a hazard, what it would do and when; then how this run went)."""
    text = re.sub(r"\s+", " ", next(c.source for c in _read("06_real_model").cells
                                    if c.cell_type == "markdown" and "**The verdict line**" in c.source))
    item = text[text.index("**The verdict line**"):text.index("**The fixed side's counts**")]
    at = [item.find(p) for p in ("went wrong in this run", "*would*", "`in this run: matches eager`")]
    assert -1 not in at and at == sorted(at), item
    assert "crash, wrong result, error" not in item


def test_54_6_notebook_05_counts_the_ops_its_diagrams_show(request):
    """The counts 05's cell prints (forward and backward ops, a fused group's ops one by one) are those of the original
    side's diagram, its forward one more for the captured ``.item()`` (501 and 816 on the H100, where compute_ops gave
    489 and 812); the fixed side's (`thunder_nb.jit`: layer norm and GELU one op each) are fewer, as the prose says."""
    _owed(request, "05_nanogpt_training")
    nb = _read("05_nanogpt_training")
    assert not nbcheck.op_counts_unmatched(nb), nbcheck.op_counts_unmatched(nb)
    reading = next(c.source for c in nb.cells if c.cell_type == "markdown" and "Reading it" in c.source)
    reading = re.sub(r"\s+", " ", reading)
    assert "its forward one more (the `.item()`)" in reading and "The fixed side's hold far fewer" in reading


def test_54_7_the_prose_names_what_the_lifetime_charts_key_shows(stored, request):
    """03 said "the defect colour", which the key never named: a colour or key entry the prose names is in the key."""
    path, nb = stored
    _owed(request, path.stem, {"03_lifetimes_and_memory"})
    missing = nbcheck.key_words_missing(nb)
    assert not missing, f"{path.name}: the text names {missing}, which no lifetime chart's key shows"


def test_54_8_notebook_04_prints_the_cause_read_from_the_exception(request):
    """04's failing stock call prints what the exception carries (the assertion thunder raised, from the traceback) and
    the backward trace it was about, not a cause written in the cell."""
    _owed(request, "04_training_step")
    nb = _read("04_training_step")
    cell = nb.cells[_code_cell(nb, "transforms=[CUDAGraphTransform()]")]
    printed = [line.strip() for line in _printed(cell).splitlines() if line.strip()]
    written = [line for line in printed if "Error" in line and line in cell.source]
    assert printed and not written, f"the cell prints a failure it wrote itself: {written}"
    text = "\n".join(printed)
    for shown in ("AssertionError", "raised in transform_trace_post_optimization", "thunder/transforms/cudagraph.py",
                  "trace.bound_symbols[9]", "= C0", "= C1", "thunder_nb.analyze:"):
        assert shown in text, f"cell 4 does not print {shown!r}:\n{text}"
    after = nb.cells[nb.cells.index(cell) + 1]
    assert after.cell_type == "markdown" and "`C1`" in after.source and "statement 9" in after.source


def test_54_9_recording_against_replaying_is_measured(request):
    """02's claim that a recording costs far more than a replay stands after the rows that time both: a fresh function
    without the hand-off on new values (each records a graph) and on the same values again (each replays)."""
    _owed(request, "02_islands")
    nb = _read("02_islands")
    at = _code_cell(nb, "recorder = FixedCUDAGraphTransform")
    claims = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
              and re.search(r"record\w*[^.]*\b(?:costs|takes) far\b", re.sub(r"\s+", " ", c.source), re.I)]
    assert claims and min(claims) > at, f"the cost of a recording is claimed in cells {claims}, above its figures ({at})"
    text = _printed(nb.cells[at])
    new = re.search(r"fixed, no hand-off, 6 new values\s+([\d.]+) µs/call\s+\((\d+) graphs recorded\)", text)
    same = re.search(r"fixed, no hand-off, same 6 values\s+([\d.]+) µs/call\s+\((\d+) graphs recorded\)", text)
    assert new and same, text
    assert int(new[2]) == 6 and int(same[2]) == 0, "6 new values record 6 graphs, the same 6 values none"
    assert float(new[1]) >= 3 * float(same[1]), f"a recording call ({new[1]} µs) is not far longer than a replay ({same[1]})"


@pytest.mark.parametrize("stem", ["05_nanogpt_training", "06_real_model"])
def test_54_9_the_compile_time_the_text_gives_is_printed(stem, request):
    """"Tens of seconds" of compiling stood in 05 and 06 with no figure: the first (compiling) step's time is printed,
    and a duration the text gives is one of those figures."""
    _owed(request, stem)
    nb = _read(stem)
    firsts = [float(s) for s in re.findall(r"first step \(compiles, captures\) took ([\d.]+) s", nbcheck.output_text(nb))]
    table = _printed(nb.cells[_code_cell(nb, "first_s = {}")])
    if "first step, s" in table:
        firsts += [numbers[1] for numbers in _rows(table).values() if len(numbers) == 2]
    assert firsts, f"{stem}: no first step's time printed"
    text = nbcheck.markdown(nb)
    if re.search(r"tens of seconds", text):
        assert max(firsts) >= 10, f"{stem}: the text says tens of seconds, the outputs {firsts}"
    assert not re.search(r"\b(?:several|\d+) seconds|\bminutes?\b", text), f"{stem}: a duration the outputs do not show"


#: Prose that blames thunder's work on every call for a difference it never timed.
BLAME = re.compile(r"the difference is thunder's (?:own )?work on every call|thunder's (?:own )?work on every call, "
                   r"which the fixed transform cuts", re.I)


def test_54_9_per_call_work_is_not_blamed_beyond_what_the_profile_shows():
    """05 and 06 put the stock transform's longer step on thunder's per-call work, untimed. 05 now says what its profile
    shows: thunder's transform and the fixed one, without the logged loss, run about as many kernels in as many graph
    launches with the same GPU time, and thunder's step takes longer."""
    for stem in ("05_nanogpt_training", "06_real_model"):
        blamed = [s for s in nbcheck.sentences(nbcheck.markdown(_read(stem))) if BLAME.search(s)]
        assert not blamed, f"{stem}: {blamed}"
    nb = _read("05_nanogpt_training")
    rows = _rows(_printed(nb.cells[_code_cell(nb, "def profile_steps(")]))
    stock, fixed = rows["thunder CUDAGraphTransform, no logged loss"], rows["FixedCUDAGraphTransform, no logged loss"]
    kernels, gpu_us, graphs, step_us = 0, 1, 3, 4
    assert abs(stock[kernels] - fixed[kernels]) <= 0.01 * fixed[kernels] and stock[graphs] == fixed[graphs]
    assert abs(stock[gpu_us] - fixed[gpu_us]) <= 0.05 * fixed[gpu_us] and stock[step_us] > fixed[step_us]


def test_54_9_the_kept_losses_hold_the_distinct_values_the_text_says(request):
    """06 said the kept losses average "one value": its loop now counts their distinct values, and the text's count for
    thunder's transform is the printed one."""
    _owed(request, "06_real_model")
    nb = _read("06_real_model")
    text = _printed(nb.cells[_code_cell(nb, "configs = [")])
    counts = dict(re.findall(r"^(.+?)\s{2,}logged .*; distinct kept losses: (\d+) of \d+$", text, flags=re.M))
    said = re.search(r"its row counts (\d+) distinct kept loss", re.sub(r"\s+", " ", nbcheck.markdown(nb)))
    assert said and counts.get("thunder CUDAGraphTransform") == said[1], (said and said[1], counts)


def test_54_9_the_defaults_the_text_gives_are_printed(stored, request):
    """A default the text gives for an option that bounds the graphs (``max_addresses``, ``max_instances``,
    ``instance_memory``, ``rotation``, ``max_values``) is the value an output prints (``max_instances=16``)."""
    path, nb = stored
    _owed(request, path.stem, {"03_lifetimes_and_memory"})
    missing = nbcheck.option_figures_unprinted(nb)
    assert not missing, f"{path.name}: the text gives {missing}, which no output prints as the option's value"


def test_54_10_a_glossary_heads_notebook_01():
    """Notebook 01's second cell defines the words of the series (`nbcheck.TERMS`), each in bold where it is defined;
    its title cell uses none of them first."""
    nb = _read("01_del_bug")
    title, glossary = nb.cells[0].source, nb.cells[1].source
    later = {"private pool", "epilogue"}  # NOTE: explained where notebooks 03 and 05 first use them
    assert glossary.startswith("## Words")
    defined = [re.sub(r"[`*]", "", t).lower() for t in re.findall(r"^- (\*\*.+?\*\*)(?:, or \*\*.+?\*\*| \(|,|:)",
                                                                      glossary, flags=re.M)]
    bold = " | ".join(re.sub(r"`", "", s).lower() for s in re.findall(r"\*\*(.+?)\*\*", glossary))
    missing = [t for t in nbcheck.TERMS if t.lower() not in later and t.lower() not in bold]
    assert not missing and len(defined) >= 20, (missing, defined)
    assert not [t for t in nbcheck.TERMS if t.lower() in title.lower()], "the title cell uses a term before the glossary"


def test_54_10_fusing_means_a_fusion_executors_work(stored):
    """01 said "the dels were fused into regions", 03 and 05 "after fusion" of regions: fusing is a fusion executor's
    (inductor's) in these notebooks, as 01's glossary says."""
    path, nb = stored
    found = nbcheck.fusing_regions(nb)
    assert not found, f"{path.name}: forming regions is called fusing: {found}"


# --- issue 54's checks themselves, on made-up notebooks and the old sentences -----------------------------------


def test_fusion_check():
    fused = {"text/plain": "TorchCompile0: 12 ops fused (inductor)"}
    old = "No fusion executor joins them here (no nvFuser wheel matches this torch), so they cost GPU time."
    assert nbcheck.fusion_denied(_notebook(old, "", fused)) == [old]
    assert nbcheck.fusion_denied(_notebook(old, "no fused group")) == []
    assert nbcheck.fusion_denied(_notebook("No other fusion executor runs here.", "", fused)) == []


def test_row_claims_check():
    row = ('<table class="tnb-memory"><tr><th>region</th></tr><tr><td>CUDAGraph2</td><td>copied out</td>'
           "<td><code>t124</code></td><td>returned: copied out of graph memory when it lies there</td></tr></table>")
    old = "In the forward, the `copied out` row gives the whole rule, rotation included (notebook 03)."
    assert nbcheck.row_claims_missing(_notebook(old, "", {"text/html": row})) == ["rotation (the `copied out` row)"]
    new = "In the forward, the `copied out` row names the returned loss. Rotation would leave it where it lies."
    assert nbcheck.row_claims_missing(_notebook(new, "", {"text/html": row})) == []


def test_one_graph_check():
    old = ("Each such part is a **region**: a stretch of ops that thunder generates as one Python function, records "
           "as one graph on its first call and replays after.")
    assert nbcheck.one_graph_claims(_notebook(old, "")) == [old]
    assert nbcheck.one_graph_claims(_notebook("2. Its counts: regions (each one graph: fewer is better).", ""))
    new = "A region records one more graph for each new key. Most regions have one graph."
    assert nbcheck.one_graph_claims(_notebook(new, "")) == []


@pytest.mark.parametrize("verdict, problem", [
    ("original (stock): capture fails, item inside CUDAGraph1 (270 errors: 1 error, 269 wrong results); fixed: "
     "2 regions, 0 islands, matches eager, 2.1x faster than eager", None),
    ("original (stock): t5, a static input of CUDAGraph2 would be wrong when another tensor is passed in a static "
     "input's place (104 wrong results: 40 in the forward trace, 64 in the backward), in this run: matches eager, grads "
     "match; fixed: 2 regions, 0 islands, matches eager", None),
    ("original (stock): needs a GPU to run (only its trace is shown), t9 returned in graph memory would be wrong when "
     "a result is kept across calls (the next call overwrites it), not run; fixed: 1 region, 0 islands", None),
    ("original (stock): capture fails, item inside CUDAGraph1 (+269 more wrong results); fixed: 2 regions",
     "the old wording"),
    ("original (stock): wrong result: CUDAGraph2 copies any other tensor passed as t1 into its static input (+103 more "
     "wrong results), equal to eager in this run (would be wrong when another tensor is passed in a static input's "
     "place), grads match; fixed: 2 regions", "the old wording"),
    ("original (stock): item inside CUDAGraph1, capture fails; fixed: 2 regions", "is not its first finding"),
    ("original (stock): matches eager, t9 returned in graph memory would be wrong when a result is kept across calls; "
     "fixed: 1 region", "not followed by how this run went"),
    ("original (legacy): crashes (UnboundLocalError), t9 used after del would fail when that region runs, in this run: "
     "not run; fixed: 0 regions", "a hazard after what went wrong"),
])
def test_verdict_order_check(verdict, problem):
    problems = nbcheck.verdict_problems(verdict)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_option_figures_check():
    old = ("Each address gets a graph of its own, and an input that takes more than `max_addresses` (32 by default) is "
           "copied from then on.")
    assert nbcheck.option_figures_unprinted(_notebook(old, "")) == ["32 (max_addresses)"]
    assert nbcheck.option_figures_unprinted(_notebook(old, "max_addresses=32")) == []
    quarter = "It fits in a quarter of the free memory, at most 16 of them (`instance_memory`, `max_instances`)."
    assert nbcheck.option_figures_unprinted(_notebook(quarter, "instance_memory=0.25, max_instances=8")) == [
        "16 (max_instances, instance_memory)"]
    assert nbcheck.option_figures_unprinted(_notebook("At most `rotation` instances take turns.", "")) == []


def test_key_words_check():
    key = ('<svg><g class="tnb-key"><text x="1">use after del</text><text fill="#e03131">name</text>'
           "<text>a value with a defect</text></g></svg>")
    old = "A value with a defect has its name marked in the defect colour."
    before = key.replace('<text fill="#e03131">name</text><text>a value with a defect</text>', "")  # the key of 53
    assert nbcheck.key_words_missing(_notebook(old, "", {"text/html": before})) == ["defect"]
    new = 'A value with a defect has its name in red: the key calls it "a value with a defect".'
    assert nbcheck.key_words_missing(_notebook(new, "", {"text/html": key})) == []
    assert nbcheck.key_words_missing(_notebook(new, "", {"text/html": key.replace("a value with", "one with")})) == [
        "a value with a defect"]
    # NOTE: a chart drawn as an <img> (issue 53.1) is read too
    img = f'<img src="data:image/svg+xml;base64,{base64.b64encode(key.encode()).decode()}">'
    assert nbcheck.key_words_missing(_notebook(new, "", {"text/html": img})) == []


def test_fusing_regions_check():
    for old in ("In July 2024 that pass ran *before* regions were formed, and the `del`s were fused into regions.",
                "And the fixed transform, with its top-level `del`s regenerated after fusion: every value it makes."):
        assert nbcheck.fusing_regions(_notebook(old, "")) == [old]
    assert nbcheck.fusing_regions(_notebook("Inductor fuses the ops inside each region into fewer kernels.", "")) == []


# --- a newcomer's reading (2026-12-06): what the prose says of the series, the warnings above, the copied inputs -----


def test_the_series_is_as_many_notebooks_as_the_text_says(stored):
    path, nb = stored
    wrong = [n for n in nbcheck.series_counts(nb) if n != len(NOTEBOOKS)]
    assert not wrong, f"{path.name}: the text counts {wrong} notebooks; notebooks/ holds {len(NOTEBOOKS)}"


def test_a_warning_the_text_points_at_is_shown_above_it(stored):
    path, nb = stored
    missing = nbcheck.warnings_not_shown_above(nb)
    assert not missing, f"{path.name}: the text points at {missing}, which no output above it shows"


def test_each_input_copied_into_a_graph_is_named_in_the_text(stored):
    """Notebook 08 prints which region inputs are copied in before each replay; the prose says what each one is."""
    path, nb = stored
    unexplained = nbcheck.copied_inputs_unexplained(nb)
    assert not unexplained, f"{path.name}: the outputs copy {unexplained} into the graph; the text never names them"


def test_series_warning_and_copied_input_checks():
    assert nbcheck.series_counts(_notebook("The words these six notebooks use.", "")) == [6]
    above_nothing = _notebook("The `UserWarning` above is inductor's.", "")
    assert nbcheck.warnings_not_shown_above(above_nothing) == ["cell 0: `UserWarning` above"]
    nb = _notebook("Some words.", "done")
    nb.cells.append(nbformat.v4.new_markdown_cell("The `UserWarning` above is inductor's."))
    assert nbcheck.warnings_not_shown_above(nb) == ["cell 2: `UserWarning` above"]
    nb.cells[1].outputs.append(nbformat.v4.new_output("stream", name="stderr", text="UserWarning: TF32"))
    assert nbcheck.warnings_not_shown_above(nb) == []
    nb = _notebook("`idx` is the token.", "copied in before each call: input_pos, idx")
    assert nbcheck.copied_inputs_unexplained(nb) == ["input_pos"]
