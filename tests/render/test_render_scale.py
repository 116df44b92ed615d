"""Issue 32's points 2, 8, 9, 10 as a user meets them: one name and one count for islands, text of at least 11 px at
the notebook's column width, a real model drawn as a module hierarchy small enough for a notebook (fused by inductor
too), and kernel counts that are inductor's own and its library calls, or say who decides.

Reports come from real thunder traces (thunder's bundled 6-layer nanoGPT training step under thunder-nb's transform
with the emulated capture of `thunder_nb.testing`; 3 of its layers with ``--executors torchcompile``); diagrams from
real ``dot``; the browser test drives Debian's Chromium through Playwright (never ``playwright install``) and leaves
screenshots in ``out/test-artifacts/``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import warnings
import xml.etree.ElementTree as ET
from collections import Counter

import pytest

import programs
from thunder_nb import render
from thunder_nb.diagnosis import analysis, build
from thunder_nb.diagnosis.model import FusedGroup, Report
from thunder_nb.render import html_diagram

pytestmark = pytest.mark.slow  # NOTE: a 6-layer nanoGPT traced once for the module (about 24 s)

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not on PATH")
SVG = "{http://www.w3.org/2000/svg}"
#: What the notebook stores per %%thunder_cudagraph cell: two sides, each pane twice (widget state and static HTML).
PANES_PER_CELL = 4
#: Notebook 05's two magic cells show these views (besides the run table).
NOTEBOOK_05_VIEWS = (("diagram", "lifetimes"), ("diagram",))


def _fixed(fn, args, body, executors: tuple[str, ...] = (), **options) -> Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import thunder

        from thunder_nb.cudagraph.executors import executor_list
        from thunder_nb.fix import FixedCUDAGraphTransform
        from thunder_nb.testing import emulated_capture

    t = FixedCUDAGraphTransform(capture=False, **options)
    jfn = thunder.jit(fn, transforms=[t], executors=executor_list(executors))
    with emulated_capture():
        t.cuda_graph_runner.capture = True
        body(jfn, args)
    return analysis.analyze(jfn)


@pytest.fixture(scope="module")
def nanogpt() -> Report:
    """Notebook 05's model: thunder's nanoGPT with 6 layers, one training step (small widths: the CPU traces it)."""
    from thunder_nb.testing.models import model_case

    case = model_case("nanoGPT", layers=6, width=64, heads=2, vocab=128, batch=2, seq=16)
    return _fixed(case.step, case.make_batch(0), lambda jfn, args: jfn(*args).backward())


@pytest.fixture(scope="module")
def nanogpt_fused() -> Report:
    """The same step with ``--executors torchcompile``, 3 of the 6 layers (what the fused tests read, grouping by
    module with repeated blocks folded and inductor's and the libraries' kernels, is each block's; 6 layers cost 11
    CPU-s more of tracing and of inductor's compile): inductor fuses each trace's region into one group. Its forward
    runs once (emulated capture), so inductor compiles the forward's group on the CPU and counts its kernels; the
    backward is traced with it and read as traced (inductor would compile its group at its first call, which no test
    here reads: about 17 s of the fixture's 60)."""
    from thunder_nb.testing.models import model_case

    case = model_case("nanoGPT", layers=3, width=64, heads=2, vocab=128, batch=2, seq=16)
    return _fixed(case.step, case.make_batch(0), lambda jfn, args: jfn(*args), executors=("torchcompile",))


@pytest.fixture(scope="module")
def island() -> Report:
    """An ``.item()`` island between two regions, a hand-out and bookkeeping (thunder-nb's transform)."""
    return _fixed(programs.island, (programs.vec(16),), lambda jfn, args: [jfn(*args) for _ in range(2)],
                  scalar_handoff=False)  # NOTE: the item stays (with the hand-off its number reaches the graph on the device)


# ---------------------------------------------------------------------------------------------------
# Point 2: an island is an op capture cannot take; bookkeeping, the hand-out and unfused ops are not


def test_one_count_of_islands_in_every_view(island):
    trace = island.forward
    (isl,) = trace.islands
    assert (isl.name, isl.reason, isl.label) == ("island1", "host-sync", "host sync: item")
    assert {o.kind for o in trace.outside} == {"island", "hand-out", "bookkeeping"}
    # headers: text, HTML pane, repr, the comparison's words all say 1 island
    assert "forward trace `computation`: 2 regions (" in render.report_text(island)
    assert "), 1 island\n" in render.report_text(island)
    assert "2 regions, 1 island," in render.html.side_html(island)
    assert "forward: 2 regions, 1 island," in repr(island)
    # the diagram: one node named island, the others named by what they are
    source = render.region_diagram(trace).source
    assert re.findall(r"^\s*(island\d+) \[", source, re.M) == ["island1"]
    assert 'hand_out5 [label="hand-out' in source
    assert re.search(r'step\d+ \[label=return', source)
    # the lifetime chart: one island column; the hand-out's column says hand-out
    root = ET.fromstring(render.lifetime_svg(trace))
    names = {g.get("class"): [t.text for t in g.iter(f"{SVG}text")] for g in root.iter(f"{SVG}g")
             if g.get("class") in ("tnb-island", "tnb-hand-out")}
    assert names == {"tnb-island": ["island1"], "tnb-hand-out": ["hand-out"]}
    assert not any(re.fullmatch(r"island\d+", t.text or "") and t.text != "island1" for t in root.iter(f"{SVG}text"))


def test_a_one_op_stretch_is_an_unfused_op_not_an_island():
    """thunder's transform leaves a one-op group unfused (`len(bsyms) == 1`): it runs eagerly, and it is no island."""
    import torch

    def seed(x):
        return x.sum().item()  # NOTE: the fixed transform keeps the item out; the sum alone is a one-op stretch

    report = _fixed(seed, (torch.ones(4),), lambda jfn, args: jfn(*args))
    trace = report.forward
    assert [(o.reason, o.detail) for o in trace.unfused] == [("unfused", "sum")]
    assert [i.detail for i in trace.islands] == ["item"]
    text = render.report_text(report)
    assert "0 regions (0 ops), 1 island, 1 unfused op" in text
    assert "op0 @0: unfused: sum:" in text
    source = render.region_diagram(trace).source
    assert 'op0 [label="unfused: sum"' in source and "dashed box: an unfused op" in source


# ---------------------------------------------------------------------------------------------------
# Point 9: a real model as a hierarchy, small enough for a notebook


def test_a_models_ops_are_grouped_by_module_with_repeated_blocks_folded(nanogpt):
    fwd, bwd = nanogpt.forward, nanogpt.backward
    assert dict(fwd.parameters)[next(n for n, p in fwd.parameters if p == "transformer.h.0.ln_1.weight")]
    tree = render.modules.module_tree(fwd, fwd.regions[0])
    top = [g.name for g in tree.items if isinstance(g, render.modules.Group)]
    assert top == ["transformer", "lm_head"]
    transformer = next(g for g in tree.items if isinstance(g, render.modules.Group))
    blocks = [(g.name, g.repeat) for g in transformer.items if isinstance(g, render.modules.Group)]
    assert ("h.0 … h.5", 6) in blocks
    block = next(g for g in transformer.items if isinstance(g, render.modules.Group) and g.repeat == 6)
    assert [g.name for g in block.items if isinstance(g, render.modules.Group)] == ["ln_1", "attn", "ln_2", "mlp"]
    markup = render.html.trees_html(fwd)
    assert_tree = ["CUDAGraph1 by module: 596 ops", ">transformer</span>", ">h.0 … h.5, ×6</span>", ">attn</span>",
                   ">lm_head</span>"]
    at = 0
    for part in assert_tree:
        at = markup.index(part, at)
    assert "<details open" not in markup  # NOTE: one level opens per click
    assert render.html.trees_html(bwd).count(", ×") >= 1  # the backward folds its blocks too


def _one_fusion():
    """A trace of one region that is one fused group, from source text: the group's ops are not known."""
    return analysis.analyze_source(
        'def computation(x):\n  # x: "cuda:0 f32[8]"\n  [t1] = CUDAGraph1(x)\n  return (t1,)\n\n'
        'def CUDAGraph1(x):\n  [t1] = TorchCompile0(x)  # t1: "cuda:0 f32[8]"\n  return [t1]\n', kind="forward")


def _modules(g: render.modules.Group) -> list:
    """A module tree's modules, nested: (name, repeat, submodules)."""
    return [(i.name, i.repeat, _modules(i)) for i in g.items if isinstance(i, render.modules.Group)]


def _as_3_layers(modules: list) -> list:
    """`_modules` of the 6-layer nanoGPT's tree with its folded blocks named as the 3-layer one's are."""
    return [(("h.0 … h.2", 3) if (name, repeat) == ("h.0 … h.5", 6) else (name, repeat)) + (_as_3_layers(sub),)
            for name, repeat, sub in modules]


def test_a_fused_models_ops_are_grouped_by_module_as_the_unfused_ones(nanogpt, nanogpt_fused):
    """Inductor's fusion leaves a region one op (``TorchCompile0``): its tree groups the ops fused in it, which read the
    module parameters as unfused ops do, into the unfused region's modules, repeated blocks folded (the fused model has
    3 of the unfused one's 6 layers: the same modules, its blocks folded ×3)."""
    fwd, bwd = nanogpt_fused.forward, nanogpt_fused.backward
    (region,) = fwd.regions
    (group,) = region.fusions
    assert [o.callee for o in region.compute_ops] == ["TorchCompile0"]  # NOTE: what the tree had to draw before
    markup = render.html.trees_html(fwd)
    at = 0
    for part in [f"CUDAGraph1 by module: {len(group.ops)} ops, all fused in TorchCompile0 (one block of each folded",
                 ">transformer</span>", ">h.0 … h.2, ×3</span>", ">attn</span>",
                 "transformer.h.0.attn.c_attn.weight", ">lm_head</span>"]:
        at = markup.index(part, at)
    # NOTE: one fused group, named in the heading: no op repeats its name (notebook 05 came to 1.14 MB with them), and
    # parameters read by their paths in the model, not by thunder's proxy names
    assert "(in TorchCompile0)" not in markup and "t___globals___" not in markup
    fused_tree = render.modules.module_tree(fwd, region)
    assert _modules(fused_tree) == _as_3_layers(_modules(render.modules.module_tree(nanogpt.forward,
                                                                                    nanogpt.forward.regions[0])))
    assert [g.name for g in fused_tree.items if isinstance(g, render.modules.Group)] == ["transformer", "lm_head"]
    # the backward: thunder's fusion moves weight-gradient sums after other modules' ops; each module stays one box
    (bregion,) = bwd.regions
    transformer = next(g for g in render.modules.module_tree(bwd, bregion).items
                       if isinstance(g, render.modules.Group) and g.name == "transformer")
    blocks = [(g.name, g.repeat) for g in transformer.items if isinstance(g, render.modules.Group)]
    assert ("h.2 … h.1", 2) in blocks and ("h.0", 1) in blocks and len(blocks) == len(set(blocks)), blocks
    assert "CUDAGraph2 by module: " in render.html.trees_html(bwd)


def test_library_calls_add_to_inductors_count_and_never_to_an_unknown_one():
    """inductor's ``generated_kernel_count`` leaves out the matmuls, convolutions and attention it hands to a library;
    a group whose count is not known still gets no figure (its library calls would be only part of it)."""
    (region,) = _one_fusion().regions
    ops = ("linear", "sin", "matmul", "linear", "scaled_dot_product_attention", "convolution", "add")

    def with_group(group: FusedGroup):
        kernels = build.estimate_kernels(region.ops, {}, {group.name: group})
        return dataclasses.replace(region, fusions=(group,), kernels=kernels)

    counted = with_group(FusedGroup("TorchCompile0", "inductor", ops, 2))
    assert counted.kernels == 7 and render.common.kernels(counted) == "≈7 kernels"
    assert render.common.fused_line(counted.fusions[0], limit=2) == (
        "TorchCompile0: 7 ops fused (inductor), inductor generated 2 kernels + 5 library calls (linear ×2, matmul, "
        "scaled_dot_product_attention, convolution): linear, sin, +5 more")
    assert render.common.replay_kernels(counted).startswith("≈7 kernels per replay, 5 of them library calls (")
    assert build.library_calls(counted.fusions[0]) == ("linear", "matmul", "linear", "scaled_dot_product_attention",
                                                       "convolution")
    unknown = with_group(FusedGroup("TorchCompile0", "inductor", ops, None))
    assert unknown.kernels == 1 and render.common.kernels(unknown) == "kernels: inductor decides (1 fused group)"
    assert render.common.fused_line(unknown.fusions[0], limit=2) == (
        "TorchCompile0: 7 ops fused (inductor), inductor decides its kernels: linear, sin, +5 more")
    assert "library" not in render.common.replay_kernels(unknown)
    # NOTE: nvFuser may generate its matmuls itself: no library calls are read into its groups
    assert build.library_calls(FusedGroup("nvFusion0", "nvFuser", ops, None)) == ()


def test_a_fused_groups_library_calls_are_the_extern_kernels_inductor_calls():
    """The library calls counted from a fused group's ops are the extern kernels inductor's own code calls (a
    vector's matmul is inductor's arithmetic), and the region adds them to inductor's generated kernels."""
    import torch
    import torch.nn.functional as F
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    def f(x, w, b, q, k, img, cw, v):
        y = F.linear(x, w, b).sin()
        a = (q @ k.transpose(-1, -2)).softmax(-1)
        c = F.conv2d(img, cw).relu()
        return y.sum() + a.sum() + c.sum() + v @ v

    g = torch.Generator().manual_seed(0)
    args = tuple(torch.randn(*shape, generator=g) for shape in
                 ((2, 3, 8), (4, 8), (4,), (1, 2, 4, 8), (1, 2, 4, 8), (1, 3, 6, 6), (2, 3, 3, 3), (5,)))
    code: list[str] = []

    def body(jfn, args):
        with config.patch({"fx_graph_cache": False}):  # NOTE: inductor's code of a compile, not of a cache hit
            code.extend(run_and_get_code(jfn, *args)[1])

    report = _fixed(f, args, body, executors=("torchcompile",))
    (region,) = report.forward.regions
    (group,) = region.fusions
    extern = re.findall(r"extern_kernels\.(\w+)\(", "".join(code))
    assert sorted(extern) == ["addmm", "bmm", "convolution"]
    assert group.kernels and region.kernels == group.kernels + len(extern)
    assert f"inductor generated {render.common.plural(group.kernels, 'kernel')} + 3 library calls (linear, matmul, " \
           "conv2d): " in render.report_text(report)
    assert build.library_calls(group) == ("linear", "matmul", "conv2d") and group.ops.count("matmul") == 2


def test_the_kernel_label_of_a_fused_model_counts_its_library_calls(nanogpt_fused):
    (region,) = nanogpt_fused.forward.regions
    (group,) = region.fusions
    # NOTE: 4 linears a block and the head; attention's 2 matmuls a block (on the CPU thunder decomposes attention)
    assert {k: n for k, n in Counter(group.ops).items() if k in ("linear", "matmul")} == {"linear": 13, "matmul": 6}
    assert region.kernels == group.kernels + 19
    text = render.report_text(nanogpt_fused)
    # NOTE: the region's ops as its unfused self counts them (the fused ops and the calls left out of the group)
    assert len(region.every_op) == len(group.ops) + len(region.compute_ops) - 1
    assert f"CUDAGraph1 @0: {len(region.every_op)} ops, ≈{region.kernels} kernels, captured" in text
    assert (f"TorchCompile0: {len(group.ops)} ops fused (inductor), inductor generated {group.kernels} kernels + 19 "
            "library calls (linear ×13, matmul ×6): arange, ") in text
    source = render.region_diagram(nanogpt_fused.forward).source
    assert f"CUDAGraph1: captured, ≈{region.kernels} kernels per replay, 19 of them library calls (" in source
    assert "+ 19 library calls\\n" in source  # NOTE: the fused group's box: a line of its own
    assert Counter(build.library_calls(group)) == {"linear": 13, "matmul": 6}


@pytest.mark.dot
@needs_dot
def test_a_full_diagram_too_big_to_show_counts_fused_ops_and_names_only_listings_that_follow(nanogpt_fused,
                                                                                            monkeypatch):
    fwd = nanogpt_fused.forward
    n = len(fwd.regions[0].fusions[0].ops)
    shown, full, drawn = html_diagram.diagram_parts(fwd)
    assert drawn and f"full diagram: {n} ops, all in 1 fused group (" in full
    assert full.endswith("too big to show; its ops are listed by module below</p>")  # NOTE: not in the generated code
    report = render.report_html(nanogpt_fused)
    assert report.index("its ops are listed by module below") < report.index("CUDAGraph1 by module:")
    pane = render.html.side_html(nanogpt_fused)
    assert pane.index("CUDAGraph1 by module:") < pane.index("its ops are listed by module above")
    assert "listed by module below" not in pane
    # a region whose fused ops are not known (source text) has no tree: nothing is said to list them
    monkeypatch.setattr(html_diagram, "FULL_MAX_BYTES", 0)
    monkeypatch.setattr(html_diagram, "FIT", (1, 1))
    _, full, _ = html_diagram.diagram_parts(_one_fusion())
    assert "full diagram: 1 op (" in full and full.endswith(": too big to show</p>") and "listed" not in full


def test_a_memory_plan_row_of_a_models_parameters_lists_a_few_and_folds_the_rest(nanogpt):
    """77 parameters read in place made one row 77 lines tall (seen in JupyterLab, tests/test_lab_legibility.py)."""
    fwd = nanogpt.forward
    table = render.html.memory_html(fwd)
    n = render.html.MEMORY_NAMES
    (row,) = [r for r in re.findall(r"<tr>.*?</tr>", table) if "read in place" in r]
    shown = re.search(r"<td><code>(.*?)</code>, <details><summary>\+(\d+) more</summary><code>(.*?)</code>", row)
    assert shown is not None, row
    names = [*shown.group(1).split(", "), *shown.group(3).split(", ")]
    assert len(shown.group(1).split(", ")) == n and int(shown.group(2)) == len(names) - n
    entry = next(e for e in render.memory.region_memory(fwd, fwd.regions[0]) if e.label == "read in place")
    assert names == [render.common.esc(x) for x in entry.names]


@pytest.mark.dot
@needs_dot
def test_the_default_views_of_a_6_layer_nanogpt_fit_a_notebook(nanogpt, capsys):
    """Its default views fit a notebook's bytes and column; and, folded in here to share this module's trace (it was
    tests/render/test_render_views.py's ``test_a_real_models_default_views_fit`` on a 2-layer nanoGPT traced for it
    alone), each trace's diagram fits `render.html.FIT`, its 79 inputs drawn as one node, and the backward's lifetime
    chart is no wider than its width."""
    sizes = {views: len(render.html.side_html(nanogpt, views).encode()) for views in
             (*NOTEBOOK_05_VIEWS, render.html.SIDE_VIEWS)}
    notebook = sum(PANES_PER_CELL * sizes[v] for v in NOTEBOOK_05_VIEWS)
    report = len(render.report_html(nanogpt).encode())
    with capsys.disabled():
        print(f"\n6-layer nanoGPT pane bytes: {sizes}; Report HTML {report}; notebook 05's two cells' panes {notebook}")
    assert notebook < 1_000_000  # NOTE: 5.9 MB before (the full op-level drawings, tooltips of 187 names)
    assert sizes[render.html.SIDE_VIEWS] < 250_000 and report < 250_000
    for trace in nanogpt.traces:
        markup, drawn = render.html.diagram_html(trace)
        assert drawn
        for image in re.findall(r"<svg.*?</svg>", markup, re.S):
            w, h = render.backend.svg_size(image)
            assert w <= 2 * render.html.COLUMN, (trace.kind, w)
        w, h = render.backend.svg_size(markup)
        assert 0 < w <= render.html.FIT[0] and 0 < h <= render.html.FIT[1], (trace.kind, w, h)
    assert "79 inputs" in render.region_diagram(nanogpt.forward).source
    root = ET.fromstring(render.lifetime_svg(nanogpt.backward))
    assert float(root.get("width")) <= render.lifetimes.SVG_WIDTH


# ---------------------------------------------------------------------------------------------------
# Point 10: a fused group's kernels are inductor's count, or say that inductor decides


def test_a_fused_group_without_inductors_count_says_inductor_decides():
    trace = analysis.analyze_source(
        'def computation(x):\n  # x: "cuda:0 f32[8]"\n  [t1] = CUDAGraph1(x)\n  return (t1,)\n\n'
        'def CUDAGraph1(x):\n  [t1] = TorchCompile0(x)  # t1: "cuda:0 f32[8]"\n  return [t1]\n', kind="forward")
    (region,) = trace.regions
    (group,) = region.fusions
    assert group.kernels is None and region.undecided == (group,)
    text = render.report_text(Report("f", "fixed", trace))
    # NOTE: no figure for a group whose kernels are not known (notebook 05's fused backward read "≈1 kernel" for
    # 1173 ops), and never a bound (each op's own count is an estimate: ≈)
    assert "CUDAGraph1 @0: 1 op, kernels: inductor decides (1 fused group), not run" in text
    assert "TorchCompile0: ops fused (inductor), inductor decides its kernels" in text
    assert "≥" not in text and "launches: 1 fused group whose kernels inductor decides in 1 region" in text
    mixed = dataclasses.replace(region, kernels=4)  # NOTE: 3 kernels of its own ops, and the group
    assert render.common.kernels(mixed) == "≈3 kernels + 1 fused group (inductor decides its kernels)"
    counted = dataclasses.replace(group, kernels=354)
    region = dataclasses.replace(region, fusions=(counted,), kernels=354)
    assert render.common.kernels(region) == "≈354 kernels"
    assert render.common.fused_line(counted) == "TorchCompile0: ops fused (inductor), inductor generated 354 kernels"


# ---------------------------------------------------------------------------------------------------
# Points 8 and 9 in a real browser: text sizes and widths at the notebook's column width, one level per click

from test_browser import ARTIFACTS, _missing, browser, screenshots  # noqa: E402,F401 (fixtures)

_TEXTS = """(root) => {
  const out = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (!node.textContent.trim()) continue;
    const el = node.parentElement;
    const box = el.getBoundingClientRect();
    // NOTE: inside a closed <details> (Chromium lays it out: checkVisibility says it is hidden), or a <title>
    if (box.width === 0 || box.height === 0 || !el.checkVisibility({visibilityProperty: true})) continue;
    let px = parseFloat(getComputedStyle(el).fontSize);
    if (el instanceof SVGElement) { const m = el.getScreenCTM(); px *= Math.hypot(m.a, m.b); }
    out.push([px, node.textContent.trim().slice(0, 40)]);
  }
  return out;
}"""
_WIDTHS = """(root) => [root.scrollWidth, ...[...root.querySelectorAll('svg')].map(s => s.getBoundingClientRect().width)
                                                   .filter(w => w > 0)]"""


def _smallest(page) -> tuple[float, str]:
    texts = page.locator("#column").evaluate(_TEXTS)
    assert texts
    return min((round(px, 2), text) for px, text in texts)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.dot
@needs_dot
@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_default_views_read_at_11_px_in_a_notebook_column_and_open_one_level_per_click(
        nanogpt, island, browser, screenshots, tmp_path, capsys):
    from playwright.sync_api import expect

    column = render.html.COLUMN
    body = render.html.side_html(nanogpt) + render.html.side_html(island)
    page_path = tmp_path / "views.html"
    page_path.write_text(f'<!doctype html><meta charset="utf-8"><body style="margin:0">'
                         f'<div id="column" style="width:{column}px">{body}</div></body>')
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(page_path.as_uri())
        smallest = _smallest(page)
        widths = page.locator("#column").evaluate(_WIDTHS)
        page.screenshot(path=str(ARTIFACTS / "scale-default.png"), full_page=True)
        screenshots.append(ARTIFACTS / "scale-default.png")
        assert smallest[0] >= render.html.MIN_TEXT_PX, smallest
        assert widths[0] <= column and max(widths[1:]) <= column, widths  # NOTE: within one column, let alone two
        # the module tree: the top level shows; each click opens one level
        tree = page.locator(".tnb-tree").first
        block = tree.locator("summary", has_text="h.0 … h.5, ×6")
        expect(tree.locator("summary", has_text="transformer").first).to_be_visible()
        expect(block).to_be_hidden()
        tree.locator("summary", has_text="transformer").first.click()
        expect(block).to_be_visible()
        expect(tree.locator("summary", has_text="attn").first).to_be_hidden()
        block.click()
        expect(tree.locator("summary", has_text="attn").first).to_be_visible()
        tree.locator("summary", has_text="attn").first.click()
        expect(tree.locator("summary", has_text="c_attn").first).to_be_visible()
        # the memory plan: its region column on one line
        page.locator("summary", has_text="memory plan").last.click()
        cell = page.locator("table.tnb-memory td").first
        expect(cell).to_have_text("CUDAGraph1")
        lines = cell.evaluate("td => { const r = document.createRange(); r.selectNodeContents(td);"
                              " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size }")
        assert lines == 1
        opened = _smallest(page)
        widths_opened = page.locator("#column").evaluate(_WIDTHS)
        tree.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "scale-opened.png"), full_page=True)
        screenshots.append(ARTIFACTS / "scale-opened.png")
        assert opened[0] >= render.html.MIN_TEXT_PX, opened
        assert widths_opened[0] <= 2 * column, widths_opened
        with capsys.disabled():
            print(f"\nat {column} px: smallest text {smallest[0]} px ({smallest[1]!r}), widths {widths[0]} px "
                  f"(SVGs {[round(w) for w in widths[1:]]}); opened: smallest {opened[0]} px ({opened[1]!r}), "
                  f"width {widths_opened[0]} px")
    finally:
        context.close()


def test_a_tree_marks_only_the_fewer_side_of_one_fused_group(nanogpt_fused):
    """One fused group holding most ops: the ops left out say "not fused", the fused ones nothing (the heading names
    the group); holding few: those few say which group. Either way each op can be told apart, at the least markup."""
    from thunder_nb.render.modules import _Marks

    (region,) = nanogpt_fused.forward.regions
    owners = render.modules.fused_owners(region)
    fused, other = next(iter(owners)), object()
    most = _Marks(owners, {}, 1, True)
    few = _Marks(owners, {}, 1, False)
    assert most.of(fused) == "" and "not fused" in most.of(other)
    assert "(in TorchCompile0)" in few.of(fused) and few.of(other) == ""
    several = _Marks(owners, {}, 2, True)
    assert "(in TorchCompile0)" in several.of(fused) and "not fused" in several.of(other)
    assert _Marks({}, {}, 0, False).of(other) == ""
