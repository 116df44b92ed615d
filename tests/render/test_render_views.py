"""Tests of what the views say and how big they are: memory plans, wrong results, the lifetime chart, default sizes.

Reports come from real thunder traces: thunder's transform on CPU, and thunder-nb's with the emulated
capture of `thunder_nb.testing` (the runner's real plans and stats; replays write memory in place).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import warnings
import xml.etree.ElementTree as ET

import pytest

import programs
from test_render import USE_AFTER_DEL, assert_in_order, chain_source
from thunder_nb import render
from thunder_nb.diagnosis import analysis
from thunder_nb.diagnosis.model import Report
from thunder_nb.diagnosis.plans import StaticInputChange
from thunder_nb.render import html_diagram

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not on PATH")
SVG = "{http://www.w3.org/2000/svg}"


def _fixed(fn, args, body, **options) -> Report:
    """thunder-nb's transform under emulated capture; ``body(jfn, args)`` makes the calls."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NOTE: thunder warns about transformer_engine on import
        import thunder

        from thunder_nb.fix import FixedCUDAGraphTransform
        from thunder_nb.testing import emulated_capture

    t = FixedCUDAGraphTransform(capture=False, **options)
    jfn = thunder.jit(fn, transforms=[t])
    with emulated_capture():
        t.cuda_graph_runner.capture = True
        body(jfn, args)
    return analysis.analyze(jfn)


@pytest.fixture(scope="module")
def held_mlp() -> Report:
    """The MLP training step, two forwards before each backward (as when two losses are summed), twice."""

    def two_forwards(jfn, args):
        x, w1, w2 = args
        for _ in range(2):
            (jfn(x, w1, w2) + jfn(x * 2, w1, w2)).backward()

    return _fixed(programs.mlp, programs.mlp_inputs(), two_forwards)


@pytest.fixture(scope="module")
def slot() -> Report:
    """The island program with the hand-off off: a Python number baked into the second region, a graph per value."""
    return _fixed(programs.island, (programs.vec(16),), lambda jfn, args: [jfn(*args) for _ in range(3)],
                  scalar_handoff=False)


@pytest.fixture(scope="module")
def stock_mlp() -> Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import thunder
        from thunder.transforms.cudagraph import CUDAGraphTransform
    jfn = thunder.jit(programs.mlp, transforms=[CUDAGraphTransform()])
    try:
        jfn(*programs.mlp_inputs()).backward()
    except Exception as e:  # NOTE: no GPU: capture fails, the traces stay
        return analysis.analyze(jfn, error=e)
    return analysis.analyze(jfn)


# ---------------------------------------------------------------------------------------------------
# The memory plan: text, diagram, HTML


def test_report_text_shows_each_regions_memory_plan(held_mlp):
    text = render.report_text(held_mlp)
    assert_in_order(
        text,
        "forward trace `computation`",
        "CUDAGraph1 @0: 5 ops, ≈5 kernels, captured, 4 replays",
        "copied in: x, w1, w2 (an input of the function)",
        "guarded: t47, t48 (saved for the backward: left where the graph wrote it and guarded",
        "copied out: t52 (returned: copied out of graph memory",
        "instances: 2 graph instances",
        "graphs: #0 first call",
        "#1 outputs of 1 instance still held for a backward",
        "hand_out1 @1: hand-out: copies out t52; guards t48, t47 (4 calls: 4 copied out, 8 guarded)",
        "backward trace `backward_fn`",
        # NOTE: the cotangent apart from what the forward saved (NB04 listed it as saved), the region's count once
        "read in place: t27 (the gradient of an output, from autograd: read where it lies when a graph wrote it",
        "keyed by address: 2 addresses)",
        "read in place: w2, t48, t47, x (saved for the backward: read where the forward's graph left it (copied when "
        "it lies elsewhere))",
        "lent: t58, t61 (a backward's gradient: handed to autograd where the graph wrote it",
        "hand_out12 @12: hand-out: lends t61, t58 (4 calls: 0 copied out, 0 guarded, 8 lent)",
    )
    assert "bookkeeping" in text and "+ 1 bookkeeping" in text  # NOTE: the hand-out is listed, not counted in there
    # NOTE: the MLP has no island: neither the hand-out nor bookkeeping is one, nor named like one
    assert "0 islands" in text and "island" not in re.sub(r"0 islands|islands: none|\(not islands\)", "", text)


def test_report_text_shows_a_number_baked_into_a_region(slot):
    text = render.report_text(slot)
    # NOTE: an input planned as copied in is listed once (NB04 listed x and w1 again as "copied at the last replay")
    assert "copied at the last replay" not in text
    assert_in_order(
        text,
        "CUDAGraph1 @0:",
        "copied in: x (an input of the function)",
        "CUDAGraph2 @3:",
        "read in place: t16 (output of CUDAGraph1: read where that graph left it; keyed by address: 1 address)",
        "number: f20 (a number the region reads)",
        "copied out: t22",
        "island1 @1: host sync: item: f20 = Tensor.item(t19)",
        "hand_out5 @5: hand-out: copies out t22",
    )


def test_diagram_shows_the_memory_plan(held_mlp, slot):
    full = render.region_diagram(held_mlp.forward, collapse=False).source
    assert_in_order(
        full,
        'label="CUDAGraph1 · 5 ops · captured\\nin 3: 3 copied · out 3: 2 guarded, 1 copied out"',
        "tooltip=\"CUDAGraph1: captured\\ncopied in: x, w1, w2 (an input of the function)",
        'CUDAGraph1_out_t47 [label="t47\\nguarded"',
        'CUDAGraph1_out_t52 [label="t52\\ncopied out"',
        # NOTE: the hand-out is bookkeeping, not an island: drawn small, what it did in the tooltip
        'hand_out1 [label="hand-out: copied out 1 · guarded 2" color="#adb5bd" fontcolor="#6c757d" fontsize=9',
        "hand_out1: hand-out: copies out t52; guards t48, t47 (4 calls: 4 copied out, 8 guarded)",
    )
    collapsed = render.region_diagram(held_mlp.backward, collapse=True).source
    summary = 'CUDAGraph2 [label="CUDAGraph2\\n9 ops · captured\\nin 5: 5 in place (2 addresses)\\nout 2: 2 lent'
    assert summary in collapsed
    assert "read in place: w2, t48, t47, x (saved for the backward" in collapsed  # the tooltip
    assert "read in place: t27 (the gradient of an output, from autograd" in collapsed
    source = render.region_diagram(slot.forward).source
    assert 'CUDAGraph2_in_f20 [label="f20\\nPython number' in source
    assert 'CUDAGraph2_in_t16 [label="t16\\nin place"' in source


def test_thunders_own_runner_hands_out_graph_buffers(stock_mlp):
    text = render.report_text(stock_mlp)
    assert_in_order(
        text,
        "verdict: computes wrong results without an error (5 wrong results, 0 errors, ",
        "CUDAGraph1 @0:",
        "copied in: x, w1, w2 (copied into the graph's static buffer before each replay)",
        "⚠ saved as-is: t47, t48 (the graph's own buffer, no hand-out: a second forward before the backward",
        "⚠ returned as-is: t52 (the graph's own buffer, no hand-out: the next replay overwrites it)",
        "wrong result returned-graph-memory at top:",
        "backward trace",
        "read in place: t48, t47 (marked static by thunder",
        "⚠ returned as-is: t58, t61",  # NOTE: gradients in graph memory (the next backward's replay overwrites them)
        "wrong result returned-graph-memory at top:",
    )


def test_rebound_and_demoted_inputs_are_listed(held_mlp):
    region = held_mlp.backward.regions[0]
    stats = dataclasses.replace(region.stats, demoted=(StaticInputChange("x", 0, "demoted", limit=32),),
                                rebound=(StaticInputChange("w2", 1, "rebound"),))
    trace = dataclasses.replace(held_mlp.backward, regions=(dataclasses.replace(region, stats=stats),))
    lines = render.text.trace_text(trace)
    assert "      demoted: x: took more than 32 addresses, copied into the graph's buffer from now on" in lines
    assert "      ⚠ rebound: w2: static input received another tensor; thunder's runner copies it" in "\n".join(lines)
    assert "demoted: x: took more than 32 addresses" in render.region_diagram(trace).source


def test_an_input_past_its_addresses_is_demoted_by_name_and_position():
    """A real demotion: one weight argument at three addresses, with room for two."""
    import torch

    def layer(x, w):
        return torch.tanh(x @ w)

    weights = [torch.nn.Parameter(torch.full((4, 4), 0.1 * i)) for i in range(3)]
    report = _fixed(layer, (torch.ones(2, 4),), lambda jfn, args: [jfn(args[0], w) for w in weights], max_addresses=2)
    (region,) = report.forward.regions
    (change,) = region.stats.demoted
    assert change.reason == "demoted" and change.limit == 2 and change.position == region.inputs.index(change.name)
    assert str(change) == f"{change.name}: took more than 2 addresses, copied into the graph's buffer from now on"
    assert f"      demoted: {change}" in render.text.trace_text(report.forward)


def test_wrong_results_stand_out(stock_mlp):
    trace = stock_mlp.forward
    source = render.region_diagram(trace).source
    assert re.search(r'step\d+ \[label="return\\n⚠ WRONG RESULT:\\nreturned-graph-memory\\nsaved-graph-memory" '
                     r'color="#a61e4d"', source)
    assert "defects: 3 wrong results, 0 errors, 3 warnings" in source
    pane = render.html.side_html(stock_mlp)
    # NOTE: without a GPU thunder's capture fails: what its defects would do is said as such
    would = "" if stock_mlp.error is None else " had it run"
    assert_in_order(pane, "forward trace", '<span class="tnb-wrong"', f"3 wrong results{would}</span>")
    table = render.html.defects_html(trace)
    assert '<tr class="tnb-wrong-result"><td>wrong result</td><td><code>returned-graph-memory' in table
    # NOTE: one row per rule, however many defects it has
    assert table.count("<tr class=") == len({d.rule for d in trace.defects}) < len(trace.defects)
    assert ('<tr class="tnb-wrong"><td>CUDAGraph1</td><td>returned as-is</td><td><code>t52</code>'
            in render.html.memory_html(trace))


# ---------------------------------------------------------------------------------------------------
# The lifetime chart


def _texts(group: ET.Element) -> list[ET.Element]:
    return list(group.iter(f"{SVG}text"))


def _ends_within(t: ET.Element, width: float) -> bool:
    # NOTE: the chart places labels with a monospace advance of 0.6 em; a label must end inside the chart
    size = float(t.get("font-size", "11"))
    return float(t.get("x")) + 0.61 * size * len(t.text or "") <= width


def test_lifetime_chart_has_axis_key_named_islands_and_readable_rows(slot):
    image = render.lifetime_svg(slot.forward)
    root = ET.fromstring(image)
    width = float(root.get("width"))
    assert width <= render.lifetimes.SVG_WIDTH
    groups = {g.get("class"): g for g in root.iter(f"{SVG}g")}
    axis = [t.text for t in _texts(groups["tnb-axis"])]
    assert axis[0] == "step" and axis[1:3] == ["0", "5"]
    key = [t.text for t in _texts(groups["tnb-key"])]
    assert key == ["live: defined to last use", "a Python number", "held after its last use", "never freed", "del",
                   "use after del", "name", "a value with a defect", "region (its statements)", "island",
                   "hand-out (not an island)"]
    islands = [t.text for g in root.iter(f"{SVG}g") if g.get("class") == "tnb-island" for t in _texts(g)]
    assert islands == ["island1"]  # the host sync, by name on the chart
    hand_outs = [t.text for g in root.iter(f"{SVG}g") if g.get("class") == "tnb-hand-out" for t in _texts(g)]
    assert hand_outs == ["hand-out"]  # NOTE: its own column, never named island5
    spans = [t.text for g in root.iter(f"{SVG}g") if g.get("class") == "tnb-span" for t in _texts(g)]
    assert spans == ["CUDAGraph1", "CUDAGraph2"]
    ys = [float(_texts(g)[0].get("y")) for g in root.iter(f"{SVG}g") if g.get("class") == "tnb-row"]
    assert len(ys) == len(slot.forward.values)
    assert min(b - a for a, b in zip(ys, ys[1:])) >= 18


def test_lifetime_chart_of_many_regions_fits_and_cuts_no_label():
    trace = analysis.analyze_source(chain_source(12, 60), kind="forward")
    root = ET.fromstring(render.lifetime_svg(trace, max_rows=40))
    width = float(root.get("width"))
    assert width == render.lifetimes.SVG_WIDTH
    labels = [t for g in root.iter(f"{SVG}g") if g.get("class") in ("tnb-span", "tnb-island") for t in _texts(g)]
    assert sorted(t.text for t in labels if t.text.startswith("CUDA")) == sorted(f"CUDAGraph{k}" for k in range(1, 13))
    assert all(_ends_within(t, width) and "…" not in t.text for t in labels)
    assert all(_ends_within(t, width) for t in root.iter(f"{SVG}text"))


def test_lifetime_chart_keys_the_red_name_of_a_value_with_a_defect(slot):
    """A row's name is red when its value has a defect; the key says what a red name means (issue 54.7), and only in a
    chart that has one."""
    root = ET.fromstring(render.lifetime_svg(slot.forward))
    red = [t.text for g in root.iter(f"{SVG}g") if g.get("class") == "tnb-row" for t in _texts(g)[:1]
           if t.get("fill") == render.common.DEFECT_COLOR]
    assert red, "the slot program has a value with a defect"
    key = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "tnb-key")
    texts = _texts(key)
    at = [t.text for t in texts].index("a value with a defect")
    assert texts[at - 1].text == "name" and texts[at - 1].get("fill") == render.common.DEFECT_COLOR
    clean = analysis.analyze_source(chain_source(2, 3), kind="forward")
    assert not clean.defects
    assert "a value with a defect" not in render.lifetime_svg(clean)


def test_lifetime_chart_marks_use_after_del_and_keys_numbers():
    image = render.lifetime_svg(analysis.analyze_source(USE_AFTER_DEL, kind="forward"))
    assert_in_order(image, 'class="tnb-use-after-del"', ">use after del</text>", '<g class="tnb-key">',
                    ">a Python number</text>")


# ---------------------------------------------------------------------------------------------------
# Default sizes of the HTML views


@pytest.mark.dot
@needs_dot
def test_a_big_diagram_shows_collapsed_with_the_full_one_behind_details(held_mlp):
    full = render.svg(render.region_diagram(held_mlp.forward))
    w, h = render.backend.svg_size(full)
    assert w > render.html.FIT[0] or h > render.html.FIT[1]  # NOTE: the MLP's full forward is taller than a screen
    markup, drawn = render.html.diagram_html(held_mlp.forward)
    assert drawn
    assert_in_order(markup, '<div class="tnb-diagram">', '<svg', "<title>CUDAGraph1</title>", "</svg>",
                    '<details class="tnb-full"><summary>full diagram: 5 ops', "<title>cluster_CUDAGraph1</title>")
    small = render.backend.svg_size(markup[: markup.index("</svg>")])
    assert small[0] <= render.html.FIT[0] and small[1] <= render.html.FIT[1]


@pytest.mark.dot
@needs_dot
def test_a_small_diagram_stays_in_full():
    markup, _ = render.html.diagram_html(analysis.analyze_source(USE_AFTER_DEL, kind="forward"))
    assert "<details" not in markup and "<title>cluster_CUDAGraph1</title>" in markup


@pytest.mark.dot
@needs_dot
def test_dot_past_its_time_limit_is_stopped_with_the_limit_said():
    graph = render.region_diagram(analysis.analyze_source(USE_AFTER_DEL, kind="forward"))
    assert render.svg(graph).startswith("<svg")  # NOTE: the same drawing, given its time
    with pytest.raises(render.backend.DrawingTooSlow, match=r"^Graphviz's dot took more than 0.0001 s to lay out the "
                                                            r"diagram and was stopped$"):
        render.svg(graph, timeout=1e-4)


def _dot_runs(monkeypatch, limit=lambda source: None) -> list[str]:
    """The source of every drawing `html_diagram` asks of (the real) ``dot`` from now on; ``limit(source)``: its
    seconds."""
    real, runs = render.backend.svg, []

    def counted(graph, **_):
        runs.append(graph.source)
        return real(graph, timeout=limit(graph.source))

    monkeypatch.setattr(html_diagram, "svg", counted)
    return runs


@pytest.mark.dot
@needs_dot
def test_the_narrow_layout_is_tried_only_after_a_quick_first_one(held_mlp, monkeypatch):
    runs = _dot_runs(monkeypatch)
    html_diagram._draw(held_mlp.forward)  # NOTE: 787 px wide, over NARROW_AT: a narrow layout is worth a try
    assert len(runs) == 2 and 'rank=source' not in runs[1].split("subgraph inputs", 1)[1].split("}", 1)[0]
    monkeypatch.setattr(html_diagram, "NARROW_IF_UNDER", 0.0)  # NOTE: as if the first layout had taken long
    runs.clear()
    html_diagram._draw(held_mlp.forward)
    assert len(runs) == 1


@pytest.mark.dot
@needs_dot
def test_a_full_drawing_past_the_time_limit_gives_way_to_the_collapsed_one(held_mlp, monkeypatch):
    runs = _dot_runs(monkeypatch, lambda source: 1e-4 if "subgraph cluster_" in source else None)
    markup, drawn = render.html.diagram_html(held_mlp.forward)
    assert drawn and [("subgraph cluster_" in r) for r in runs] == [True, False]  # NOTE: no narrow try after it
    assert_in_order(markup, '<div class="tnb-diagram">', "<title>CUDAGraph1</title>", "</svg>",
                    "<p class=\"tnb-full\">full diagram not drawn: Graphviz&#x27;s dot took more than 0.0001 s")
    assert "cluster_" not in markup


@pytest.mark.dot
@needs_dot
def test_a_trace_too_slow_to_draw_at_all_says_so_and_keeps_its_text_view(held_mlp, monkeypatch):
    monkeypatch.setattr(render.backend, "DOT_SECONDS", 1e-4)
    pane = render.html.side_html(held_mlp, ("diagram",))
    assert pane.count("not drawn: Graphviz&#x27;s dot took more than 0.0001 s to lay out the diagram and was stopped"
                      " (5 ops in 1 region); the text view below lists them.") == 1
    assert_in_order(pane, "forward trace", "not drawn:", "backward trace", "not drawn:",
                    '<div class="tnb-h">text view</div><pre class="tnb-text">', "forward trace", "CUDAGraph1")


@pytest.mark.dot
@needs_dot
def test_a_long_chain_still_too_tall_when_collapsed_scrolls_within_the_fit_height():
    trace = analysis.analyze_source(chain_source(10, 20), kind="forward")
    markup, _ = render.html.diagram_html(trace)
    assert markup.startswith('<div class="tnb-diagram tnb-tall"><label class="tnb-zoomable"')
    assert render.backend.svg_size(markup)[1] > render.html.FIT[1]
    assert ".thunder-nb .tnb-tall{max-height:%dpx;overflow-y:auto}" % render.html.FIT[1] in render.html.CSS


def test_side_pane_opens_with_diagrams_and_keeps_details_closed(held_mlp):
    pane = render.html.side_html(held_mlp)
    assert pane.count("<style>") == 1
    assert "<details open" not in pane
    assert_in_order(pane, "forward trace", "<details><summary>memory plan</summary>",
                    "<details><summary>lifetimes: 11 values</summary>", "<details><summary>generated code</summary>",
                    "backward trace")


def test_rows_table_and_verdict_spans_escape():
    table = render.html.rows_table([("a<b", "x & y")])
    assert table == ('<table class="tnb-run"><tr><th style="text-align:left;padding-right:1em">a&lt;b</th>'
                     "<td>x &amp; y</td></tr></table>")
    assert render.html.verdict_spans([("<ok>", "good")]) == (
        '<div class="tnb-verdict" style="font-weight:600"><span class="tnb-good" style="color:#2b8a3e">&lt;ok&gt;'
        "</span></div>")
    assert '<span class="tnb-bad" style="color:#e03131">x</span>' in render.html.verdict_spans([("x", "bad")])


def test_many_inputs_are_drawn_as_one_node():
    params = [f"a{i}" for i in range(12)]
    src = (f"def computation({', '.join(params)}):\n" + "".join(f'  # {p}: "cuda:0 f32[2]"\n' for p in params)
           + f"  [t0] = CUDAGraph1({', '.join(params)})\n  return t0\n\n"
           + f"def CUDAGraph1({', '.join(params)}):\n  t0 = torch.stack([{', '.join(params)}])  # t0: \"cuda:0 f32[12, 2]\"\n"
           + "  return [t0]\n")
    source = render.region_diagram(analysis.analyze_source(src, kind="forward"), collapse=True).source
    assert '_inputs [label="12 inputs\\na0, a1, a2, …" shape=ellipse tooltip="input a0 f32[2]\\ninput a1 f32[2]' in source
    assert '_inputs -> CUDAGraph1 [label="12 values\\na0, a1, a2, …"' in source
    assert "a5 [" not in source
