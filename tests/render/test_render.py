"""Tests of thunder_nb.render: diagrams (golden DOT), lifetimes, source views, text and HTML reports."""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import shutil
import textwrap
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import graphviz
import pytest

from thunder_nb import render
from thunder_nb.diagnosis import analysis
from thunder_nb.diagnosis.model import (
    Defect,
    Op,
    Outside,
    Region,
    Report,
    Site,
    SourceLine,
    TraceReport,
    TypeInfo,
    Value,
)
from thunder_nb.diagnosis.plans import GraphRecord, RegionPlan, RegionStats, ScalarHandoff
from thunder_nb.diagnosis.judge import assert_equal

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REGEN = os.environ.get("THUNDER_NB_REGEN_GOLDEN") == "1"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not on PATH")


def assert_golden(name: str, text: str) -> None:
    """Compare ``text`` with ``tests/golden/NAME``; THUNDER_NB_REGEN_GOLDEN=1 rewrites the file."""
    path = GOLDEN / name
    if REGEN:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with THUNDER_NB_REGEN_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{name} differs from its golden file (THUNDER_NB_REGEN_GOLDEN=1 rewrites it)"


def assert_in_order(text: str, *parts: str) -> None:
    """Assert that every part occurs in ``text``, each after the previous one."""
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} not found after position {at}"
        at = found + len(part)


# ---------------------------------------------------------------------------------------------------
# Real thunder traces (CPU: capture fails, the traces stay)


@pytest.fixture(scope="module")
def thunder_mod():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NOTE: thunder warns about transformer_engine on import
        import thunder
        import torch
    return thunder, torch


@pytest.fixture(scope="module")
def transforms(thunder_mod):
    from thunder.transforms.cudagraph import CUDAGraphTransform

    class SplitAtHostSync(CUDAGraphTransform):
        """The stock transform, but host-synchronising ops stay outside regions."""

        def can_fuse(self, bsym: Any) -> bool:
            return super().can_fuse(bsym) and analysis.classify_bsym(bsym) is None

    return CUDAGraphTransform, SplitAtHostSync


def _report(thunder_mod, fn, transform, *args) -> Report:
    thunder, _ = thunder_mod
    jfn = thunder.jit(fn, transforms=[transform()])
    error = None
    try:
        jfn(*args)
    except Exception as e:  # NOTE: no GPU here; on a GPU the call may succeed
        error = e
    rep = analysis.analyze(jfn, error=error)
    # NOTE: the error text depends on the machine; text tests pin it
    return dataclasses.replace(rep, error="RuntimeError: no GPU")


def f(x):
    return x.sum().item()


def g(x):
    y = x.sin().cos()
    s = y.sum().item()
    return (y * s).exp()


def mlp(x, w1, w2):
    h = (x @ w1).relu()
    return (h @ w2).sum()


@pytest.fixture(scope="module")
def stock_f(thunder_mod, transforms):
    return _report(thunder_mod, f, transforms[0], thunder_mod[1].randn(3))


@pytest.fixture(scope="module")
def stock_g(thunder_mod, transforms):
    return _report(thunder_mod, g, transforms[0], thunder_mod[1].randn(4, 3))


@pytest.fixture(scope="module")
def split_g(thunder_mod, transforms):
    return _report(thunder_mod, g, transforms[1], thunder_mod[1].randn(4, 3))


@pytest.fixture(scope="module")
def stock_mlp(thunder_mod, transforms):
    torch = thunder_mod[1]
    args = [torch.randn(*s, requires_grad=True) for s in ((2, 3), (3, 4), (4, 2))]
    return _report(thunder_mod, mlp, transforms[0], *args)


# ---------------------------------------------------------------------------------------------------
# Traces from generated source and by hand


TINY = '''\
def computation(x):
  # x: "cuda:0 f32[8]"
  [t1, t2] = CUDAGraph1(x)
  # prog.py:3: 	s = y.sum().item()
  f3 = Tensor.item(t2)  # f3: "float ?"
  del t2
  [t4] = CUDAGraph2(t1, f3)
  del t1
  return (t4,)

def CUDAGraph1(x):
  # prog.py:2: 	y = x.sin()
  t1 = torch.sin(x)  # t1: "cuda:0 f32[8]"
  # prog.py:3: 	s = y.sum().item()
  t2 = torch.sum(t1)  # t2: "cuda:0 f32[]"
  return [t1, t2]

def CUDAGraph2(t1, f3):
  # prog.py:4: 	return y * s
  t4 = torch.mul(t1, f3)  # t4: "cuda:0 f32[8]"
  del t1
  return [t4]
'''


def chain_source(regions: int, ops: int) -> str:
    """Generated source of ``regions`` regions of ``ops`` sin ops each, an ``.item()`` island after each."""
    top = ["def computation(x):", '  # x: "cuda:0 f32[8]"']
    fns = []
    prev, k = "x", 0
    for r in range(1, regions + 1):
        body = [f"def CUDAGraph{r}({prev}):"]
        cur = prev
        for j in range(ops):
            k += 1
            body.append(f'  t{k} = torch.sin({cur})  # t{k}: "cuda:0 f32[8]"')
            if j > 0:
                body.append(f"  del {cur}")
            cur = f"t{k}"
        body.append(f"  return [{cur}]")
        fns.append("\n".join(body))
        top.append(f"  [{cur}] = CUDAGraph{r}({prev})")
        if prev != "x":
            top.append(f"  del {prev}")
        k += 1
        top.append(f'  f{k} = Tensor.item({cur})  # f{k}: "float ?"')
        prev = cur
    top.append(f"  return ({prev},)")
    return "\n\n".join(["\n".join(top), *fns]) + "\n"


NASTY = 'a<b>&"{}|\\'
SCRIPT = "<script>alert(1)</script>"


def nasty_trace() -> TraceReport:
    """A trace whose names, op text and user lines hold everything DOT and HTML treat specially."""
    tensor = TypeInfo("tensor", "f32", (2,), "cuda:0", "cuda:0 f32[2]")
    user = SourceLine("evil<1>.py", 3, f"y = {SCRIPT} & {NASTY}")
    op = Op("call", "torch.sin", ("t1",), (NASTY,), 5, f"t1 = torch.sin({NASTY})  # {SCRIPT}", user)
    ret = Op("return", "return", (), ("t1",), 6, "return [t1]")
    region = Region("CUDAGraph1", 0, (op, ret), (NASTY,), ("t1",), (False,),
                    f"def CUDAGraph1(x):\n  # {SCRIPT}\n  t1 = torch.sin({NASTY})\n  return [t1]\n", (user,))
    item = Op("call", "Tensor.item", ("f2",), ("t1",), 3, f"f2 = Tensor.item(t1)  # {SCRIPT}", user)
    top_ret = Op("return", "return", (), ("f2",), 4, "return f2")
    call = Op("region", "CUDAGraph1", ("t1",), (NASTY,), 2, f"[t1] = CUDAGraph1({NASTY})")
    islands = (Outside("island1", 1, item, "host-sync", f"item {NASTY}"),
               Outside("island2", 2, top_ret, "bookkeeping", "return"))
    values = (
        Value(NASTY, tensor, None, "input", (Site(0, "CUDAGraph1", 0, 5), Site(0)), (), True),
        Value("t1", tensor, Site(0, "CUDAGraph1", 0, 5), "CUDAGraph1", (Site(1),), (), True),
        Value("f2", TypeInfo("number", "float", text="float ?"), Site(1), "island1", (Site(2),), (), False, True),
    )
    defect = Defect("host-sync-in-region", "forward", "CUDAGraph1", "t1", 5, f"bad {SCRIPT} {NASTY}", "hint <b>")
    return TraceReport("forward", "computation", "by <hand>", f"def computation({NASTY}):\n  # {SCRIPT}\n",
                       (call, item, top_ret), (region,), islands, values, (defect,), (NASTY,), True)


# ---------------------------------------------------------------------------------------------------
# Region/island diagram


def test_region_diagram_source_of_a_small_trace():
    trace = analysis.analyze_source(
        'def computation(x):\n  # x: "cuda:0 f32[2]"\n  f1 = Tensor.item(x)  # f1: "float ?"\n  return f1\n',
        kind="forward",
    )
    source = render.region_diagram(trace).source.replace("\t", "    ")
    assert source == textwrap.dedent(
        r"""        digraph forward {
            compound=true fontsize=10 label="forward trace `computation` · no defects" labelloc=t rankdir=TB
            node [fontsize=10]
            edge [fontsize=9]
            subgraph inputs {
                rank=source
                x [label="x\nf32[2]" shape=ellipse tooltip="input x"]
            }
            island0 [label="island0\nhost sync: item" fillcolor="#fff3bf" shape=box style="rounded,filled" tooltip="island0: f1 = Tensor.item(x)"]
            step1 [label=return color="#adb5bd" fontcolor="#6c757d" fontsize=9 height=0.2 margin="0.04,0.02" shape=box style=rounded tooltip="step1: return f1"]
            x -> island0 [label="x\nf32[2]" fontsize=9 tooltip="x f32[2]"]
            island0 -> step1 [label="f1\nfloat\nPython number" color="#e8590c" fontcolor="#e8590c" fontsize=9 style=dashed tooltip="f1 float"]
            subgraph legend {
                rank=sink
                _legend [label="legend\ldashed orange edge: Python number\l" fontsize=9 shape=note]
            }
        }
        """
    )


def test_region_diagram_golden_generated_source():
    trace = analysis.analyze_source(TINY, kind="forward")
    assert_golden("tiny_forward.gv", render.region_diagram(trace).source)


@pytest.mark.parametrize(
    ("name", "report", "kind", "collapse"),
    [
        ("f_stock_forward", "stock_f", "forward", None),
        ("g_stock_forward", "stock_g", "forward", None),
        ("g_split_forward", "split_g", "forward", None),
        ("mlp_stock_forward", "stock_mlp", "forward", None),
        ("mlp_stock_backward", "stock_mlp", "backward", None),
        ("mlp_stock_backward_collapsed", "stock_mlp", "backward", True),
    ],
)
def test_region_diagram_golden_real_traces(request, name, report, kind, collapse):
    rep = request.getfixturevalue(report)
    trace = rep.forward if kind == "forward" else rep.backward
    assert_golden(f"{name}.gv", render.region_diagram(trace, collapse=collapse).source)


def test_region_diagram_draws_regions_islands_values_and_defects(split_g):
    source = render.region_diagram(split_g.forward).source
    assert_in_order(
        source,
        'x [label="x\\nf32[4,3]"',
        'subgraph cluster_CUDAGraph1 {',
        'label="CUDAGraph1 · 3 ops · not run\\nin 1: 1 copied · out 2"',
        'CUDAGraph1_in_x [label="x\\n⚠ region-deletes-outside-value" color="#e03131"',
        't13 [label="t13 = torch.sin"',
        'CUDAGraph1_out_t16 [label="t16\\n⚠ never-freed"',
        'island1 [label="island1\\nhost sync: item"',
        'subgraph cluster_CUDAGraph2 {',
        'label="CUDAGraph2 · 2 ops · not run\\nin 3: 2 copied, 1 number · out 1: 1 returned as-is"',
        'CUDAGraph2_in_f20 [label="f20\\nPython number\\n⚠ region-deletes-outside-value\\n⚠ scalar-region-input"',
        'CUDAGraph2_in_f20 -> t21 [label="f20\\nfloat\\nPython number" color="#e8590c"',
        'CUDAGraph2_out_t22 [label="t22\\nas-is"',
        'step3 [label="return\\n⚠ WRONG RESULT:\\nreturned-graph-memory" color="#a61e4d"',
        'x -> CUDAGraph1_in_x [label="x\\nf32[4,3]"',
        "_legend [label=",
        "scalar-region-input ×1: a Python number region",
    )
    # NOTE: the message of every defect is in a tooltip
    for d in split_g.forward.defects:
        assert d.message in source


def test_region_diagram_is_deterministic(stock_mlp):
    for trace in stock_mlp.traces:
        assert render.region_diagram(trace).source == render.region_diagram(trace).source
        assert "0x" not in render.region_diagram(trace).source  # NOTE: no id()-style names


def test_region_diagram_collapses_big_traces_and_details_one_region():
    trace = analysis.analyze_source(chain_source(20, 10), kind="forward")
    assert sum(len(r.compute_ops) for r in trace.regions) > render.COLLAPSE_THRESHOLD
    collapsed = render.region_diagram(trace).source
    assert "subgraph cluster_" not in collapsed
    summary = 'CUDAGraph1 [label="CUDAGraph1\\n10 ops · not run\\nin 1 · out 1\\ntorch.sin ×10"'
    assert_in_order(collapsed, summary, "CUDAGraph20 [")
    detailed = render.region_diagram(trace, detail="CUDAGraph3")
    assert detailed.source.count("subgraph cluster_") == 1
    assert "subgraph cluster_CUDAGraph3 {" in detailed.source
    assert_golden("chain_detail_CUDAGraph3.gv", detailed.source)
    small = analysis.analyze_source(chain_source(2, 3), kind="forward")
    assert render.region_diagram(small).source.count("subgraph cluster_") == 2
    assert "subgraph cluster_" not in render.region_diagram(small, collapse=True).source


def test_region_diagram_rejects_an_unknown_region(split_g):
    message = r"unknown region: 'CUDAGraph9' \(must be one of \['CUDAGraph1', 'CUDAGraph2'\]\)"
    with pytest.raises(ValueError, match=message):
        render.region_diagram(split_g.forward, detail="CUDAGraph9")


def test_region_diagram_merges_bookkeeping_islands_when_collapsed(stock_mlp):
    source = render.region_diagram(stock_mlp.backward, collapse=True).source
    assert 'step1 [label="clear ×2"' in source
    assert "step2 [" not in source and "island" not in source  # NOTE: bookkeeping is never an island
    full = render.region_diagram(stock_mlp.backward, collapse=False).source
    assert 'step2 [label="clear C1"' in full


def test_region_diagram_marks_hand_offs():
    trace = analysis.analyze_source(TINY, kind="forward")
    region = dataclasses.replace(trace.regions[1], plan=RegionPlan("CUDAGraph2", (), (), scalar_handoffs=(ScalarHandoff("f3", "t1"),)))
    trace = dataclasses.replace(trace, regions=(trace.regions[0], region))
    for collapse in (False, True):
        source = render.region_diagram(trace, collapse=collapse).source
        assert "hand-offs: f3 -> t1" in source
        assert_in_order(source, "-> ", "hand-off f3 -> t1", 'color="#1971c2"')


def test_region_diagram_groups_many_values_into_one_edge():
    params = ", ".join(f"a{i}" for i in range(6))
    comments = "".join(f'  # a{i}: "cuda:0 f32[2]"\n' for i in range(6))
    body = "".join(f'  t{i} = torch.sin(a{i})  # t{i}: "cuda:0 f32[2]"\n' for i in range(6))
    src = (f"def computation(c):\n  {params}, = c\n{comments}  [t0] = CUDAGraph1({params})\n  return t0\n\n"
           f"def CUDAGraph1({params}):\n{body}  return [t0]\n")
    source = render.region_diagram(analysis.analyze_source(src, kind="forward"), collapse=True).source
    assert 'step0 -> CUDAGraph1 [label="6 values\\na0, a1, a2, …"' in source
    assert source.count("step0 -> CUDAGraph1") == 1


# ---------------------------------------------------------------------------------------------------
# Escaping


def test_dot_labels_escape_what_dot_treats_specially():
    source = render.region_diagram(nasty_trace()).source
    assert 'label="a<b>&\\"{}|\\\\\\nf32[2]"' in source  # quote escaped, backslash doubled, then \n
    assert "label=<" not in source  # never an HTML-like label
    assert 'tooltip="t1 = torch.sin(a<b>&\\"{}|\\\\)  # <script>alert(1)</script>' in source
    assert "id_613c623e26227b7d7c5c" in source  # a name that is no DOT id gets a stable hex id


@pytest.mark.dot
@needs_dot
def test_dot_renders_escaped_labels_to_safe_svg():
    image = render.svg(render.region_diagram(nasty_trace()))
    assert image is not None and image.startswith("<svg")
    ET.fromstring(image)
    assert "<script" not in image
    assert "&lt;script&gt;" in image
    assert "a&lt;b&gt;&amp;&quot;{}|\\" in image


def test_html_and_svg_views_escape_everything():
    trace = nasty_trace()
    report = Report("evil<fn>", "stock<x>", trace, error=f"RuntimeError: {SCRIPT}", notes=(SCRIPT,))
    for markup in (render.source_html(trace), render.trace_source_html(trace), render.lifetime_svg(trace),
                   render.side_by_side_html(report, report)):
        assert "<script" not in markup
        assert "a&lt;b&gt;&amp;&quot;{}|\\" in markup
    assert "&lt;script&gt;" in render.source_html(trace)
    assert "&lt;script&gt;" in render.side_by_side_html(report, report)
    ET.fromstring(render.lifetime_svg(trace))
    text = render.report_text(report)
    assert NASTY in text and SCRIPT in text  # plain text is not escaped


def test_text_views_of_a_hand_built_trace():
    trace = nasty_trace()
    assert render.source_text(trace) == textwrap.dedent(
        f"""\
        source: forward `computation`
          evil<1>.py
              3  y = {SCRIPT} & {NASTY}  CUDAGraph1, island1 (host sync: item {NASTY})  ⚠ host-sync-in-region"""
    )


# ---------------------------------------------------------------------------------------------------
# Lifetimes


USE_AFTER_DEL = '''\
def computation(x):
  # x: "cuda:0 f32[2]"
  [t1, t3] = CUDAGraph1(x)
  del t1
  f2 = Tensor.item(t1)  # f2: "float ?"
  return f2

def CUDAGraph1(x):
  t1 = torch.sin(x)  # t1: "cuda:0 f32[2]"
  t3 = torch.cos(x)  # t3: "cuda:0 f32[2]"
  return [t1, t3]
'''


def test_lifetime_text_of_a_real_trace(split_g):
    assert render.lifetime_text(split_g.forward) == textwrap.dedent(
        """\
        lifetimes: forward `computation` (7 values, 13 steps)
          regions: 1=CUDAGraph1, 2=CUDAGraph2
                       |111111 22222 |
          x   f32[4,3] |=x           | input -> CUDAGraph1[0]@0; del CUDAGraph1[1]@0
          t13 f32[4,3] |===x         | CUDAGraph1[0]@0 -> CUDAGraph1[2]@0; del CUDAGraph1[3]@0
          t16 f32[4,3] |  ======x----| CUDAGraph1[2]@0 -> CUDAGraph2[0]@2; del CUDAGraph2[1]@2; never freed
          t19 f32[]    |    ====-----| CUDAGraph1[4]@0 -> CUDAGraph2[0]@2; never freed
          f20 float    |      ==x    | @1 -> CUDAGraph2[0]@2; del CUDAGraph2[1]@2
          t21 f32[4,3] |       ===x  | CUDAGraph2[0]@2 -> CUDAGraph2[2]@2; del CUDAGraph2[3]@2
          t22 f32[4,3] |         ====| CUDAGraph2[2]@2 -> @3; returned"""
    )


def test_lifetimes_show_use_after_del_and_never_freed():
    trace = analysis.analyze_source(USE_AFTER_DEL, kind="forward")
    assert render.lifetime_text(trace) == textwrap.dedent(
        """\
        lifetimes: forward `computation` (4 values, 6 steps)
          regions: 1=CUDAGraph1
                    |111   |
          x  f32[2] |==    | input -> CUDAGraph1[1]@0
          t1 f32[2] |===x! | CUDAGraph1[0]@0 -> @2; del @1; USE AFTER DEL at @2
          t3 f32[2] | =----| CUDAGraph1[1]@0, never read; never freed
          f2 float  |    ==| @2 -> @3; returned"""
    )
    image = render.lifetime_svg(trace)
    ET.fromstring(image)
    assert_in_order(image, '<g class="tnb-span"><title>CUDAGraph1: steps 0-2</title>',
                    "<title>t1 f32[2]: CUDAGraph1[0]@0 -&gt; @2; del @1; USE AFTER DEL at @2 [use-after-del]</title>",
                    'class="tnb-del"', 'class="tnb-use-after-del"', "use after del",
                    "<title>t3 f32[2]", 'class="tnb-held"', 'fill="#f08c00"', "never freed")


def test_lifetime_svg_of_a_real_trace(split_g):
    image = render.lifetime_svg(split_g.forward)
    ET.fromstring(image)
    assert image.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="tnb-lifetime"')
    assert_in_order(image, ">CUDAGraph1</text>", ">CUDAGraph2</text>", "<title>island1: host sync: item</title>",
                    ">x</text>", ">t13</text>", ">t16</text>", ">t19</text>", "never freed", ">t22</text>")


def test_lifetimes_cap_rows_of_huge_traces():
    trace = analysis.analyze_source(chain_source(10, 60), kind="forward")
    assert len(trace.values) > 600
    text = render.lifetime_text(trace, max_rows=50)
    assert len(text.splitlines()) == 3 + 50 + 1
    assert text.endswith(f"  … {len(trace.values) - 50} more values")
    image = render.lifetime_svg(trace)
    assert image.count('<g class="tnb-row">') == render.MAX_ROWS
    assert f"… {len(trace.values) - render.MAX_ROWS} more values" in image


# ---------------------------------------------------------------------------------------------------
# Source views


def test_source_text_marks_regions_islands_and_defects():
    trace = analysis.analyze_source(TINY, kind="forward")
    assert render.source_text(trace) == textwrap.dedent(
        """\
        source: forward `computation`
          prog.py
              2  y = x.sin()         CUDAGraph1
              3  s = y.sum().item()  CUDAGraph1, island1 (host sync: item)
              4  return y * s        CUDAGraph2  ⚠ region-deletes-outside-value"""
    )


def test_source_views_of_a_real_trace(split_g):
    text = render.source_text(split_g.forward)
    assert_in_order(text, __file__, "y = x.sin().cos()", "CUDAGraph1", "s = y.sum().item()",
                    "CUDAGraph1, island1 (host sync: item)", "return (y * s).exp()", "CUDAGraph2")
    markup = render.source_html(split_g.forward)
    assert_in_order(markup, '<div class="tnb-source">', "test_render.py", "<code>y = x.sin().cos()</code>",
                    "CUDAGraph1</span>", "<code>s = y.sum().item()</code>", "island1 (host sync: item)</span>",
                    "<code>return (y * s).exp()</code>", "CUDAGraph2</span>")


def test_trace_source_views_highlight_defect_lines(split_g):
    trace = split_g.forward
    text = render.trace_source_text(trace)
    assert_in_order(
        text,
        "forward `computation` (top level):",
        "!!   10    [t16, t19] = CUDAGraph1(x)  <- never-freed: t16 is never deleted",
        "region CUDAGraph1:",
        "!!    6    del x  <- region-deletes-outside-value",
        "region CUDAGraph2:",
        "!!    3  def CUDAGraph2(t19, t16, f20):  <- dead-region-input",
    )
    markup = render.trace_source_html(trace)
    assert_in_order(
        markup,
        "forward `computation` (top level)",
        '<span class="tnb-defect-line" title="never-freed: t16 is never deleted',
        "[t16, t19] = CUDAGraph1(x)",
        "⚠ never-freed</span>",
        "region CUDAGraph1",
        "del x",
        "region CUDAGraph2",
        "⚠ dead-region-input, scalar-region-input</span>",
    )


def test_trace_source_lists_a_shared_source_once():
    trace = analysis.analyze_source(TINY, kind="forward")
    text = render.trace_source_text(trace)
    assert text.splitlines()[0] == "forward `computation` (top level), region CUDAGraph1, region CUDAGraph2:"
    assert text.count("def CUDAGraph2") == 1
    assert "!!   21    del t1  <- region-deletes-outside-value" in text


# ---------------------------------------------------------------------------------------------------
# Reports


def test_report_text_of_generated_source():
    report = Report("prog", "fixed", analysis.analyze_source(TINY, kind="forward"), notes=("a note",))
    assert report.to_text() == render.report_text(report)
    assert render.report_text(report) == textwrap.dedent(
        """\
        thunder-nb report: prog (transform: fixed)
        verdict: runs, but wastes time or memory (2 warnings)
        note: a note
        launches: ≈3 kernels in 2 regions per call, replayed as 2 graph launches: ≈4 µs of host time saved per call (estimate: 4 µs per kernel launch removed, measured on an H200)

        forward trace `computation`: 2 regions (3 ops), 1 island
          regions:
            CUDAGraph1 @0: 2 ops, ≈2 kernels, not run
              inputs:  x f32[8]
              outputs: t1 f32[8], t2 f32[]
            CUDAGraph2 @3: 1 op, ≈1 kernel, not run
              inputs:  t1 f32[8], f3 float (Python number)
              outputs: t4 f32[8]
          islands (outside every graph: capture cannot take them):
            island1 @1: host sync: item: f3 = Tensor.item(t2)
          also outside regions (not islands):
            + 1 bookkeeping (unpack, return, collection clearing)
          defects:
            warning region-deletes-outside-value at CUDAGraph2:21 (t1): CUDAGraph2 deletes t1, which was produced outside the region
                    hint: delete values produced outside a region at top level, after their last consumer
            warning scalar-region-input at CUDAGraph2:18 (f3): CUDAGraph2 takes the Python number f3: each new value captures a new graph
                    hint: hand the number over as a 0-d device tensor
          lifetimes: forward `computation` (5 values, 10 steps)
            regions: 1=CUDAGraph1, 2=CUDAGraph2
                      |111  222  |
            x  f32[8] |=         | input -> CUDAGraph1[0]@0
            t1 f32[8] |======x-x | CUDAGraph1[0]@0 -> CUDAGraph2[0]@3; del CUDAGraph2[1]@3, @4
            t2 f32[]  | ===x     | CUDAGraph1[1]@0 -> @1; del @2
            f3 float  |   ===    | @1 -> CUDAGraph2[0]@3
            t4 f32[8] |     =====| CUDAGraph2[0]@3 -> @5; returned"""
    )


def test_report_text_of_a_real_trace(stock_f):
    assert render.report_text(stock_f) == textwrap.dedent(
        """\
        thunder-nb report: f (transform: stock)
        verdict: fails or computes wrong values (1 error, 1 warning)
        error: RuntimeError: no GPU
        launches: ≈2 kernels in 1 region per call, replayed as 1 graph launch: ≈4 µs of host time saved per call (estimate: 4 µs per kernel launch removed, measured on an H200)

        forward trace `computation`: 1 region (2 ops), 0 islands
          constructed by: Unwrap the actual return value
          regions:
            CUDAGraph1 @0: 2 ops, ≈2 kernels, not run
              inputs:  x f32[3]
              outputs: f10 float (Python number)
              copied in: x (copied into the graph's static buffer before each replay)
          islands: none
          also outside regions (not islands):
            + 1 bookkeeping (unpack, return, collection clearing)
          defects:
            warning region-deletes-outside-value at CUDAGraph1:6 (x): CUDAGraph1 deletes x, which was produced outside the region
                    hint: delete values produced outside a region at top level, after their last consumer
            error   host-sync-in-region at CUDAGraph1:9 (f10): Tensor.item (item) reads a device value on the host inside CUDAGraph1
                    hint: keep data-dependent ops out of regions (an island)
          lifetimes: forward `computation` (3 values, 6 steps)
            regions: 1=CUDAGraph1
                       |11111 |
            x   f32[3] |=x    | input -> CUDAGraph1[0]@0; del CUDAGraph1[1]@0
            t9  f32[]  |===x  | CUDAGraph1[0]@0 -> CUDAGraph1[2]@0; del CUDAGraph1[3]@0
            f10 float  |  ====| CUDAGraph1[2]@0 -> @1; returned"""
    )


def test_report_text_lists_both_traces_and_graphs(stock_mlp):
    region = dataclasses.replace(
        stock_mlp.forward.regions[0],
        stats=RegionStats(graphs=(GraphRecord(0, "first call", 1536), GraphRecord(1, "x: shape (2, 3) -> (4, 3)", 96, 2 << 20))),
    )
    rep = dataclasses.replace(stock_mlp, forward=dataclasses.replace(stock_mlp.forward, regions=(region,)))
    text = render.report_text(rep)
    assert_in_order(
        text,
        "thunder-nb report: mlp (transform: stock)",
        "forward trace `computation`: 1 region",
        "CUDAGraph1 @0: 5 ops, ≈5 kernels, captured",
        "graphs: #0 first call (static 1.5 KiB); #1 x: shape (2, 3) -> (4, 3) (static 96 B, pool 2.0 MiB)",
        "backward trace `backward_fn`: 1 region",
        "inputs:  t27 f32[], w2 f32[4,2], t50 f32[2,4], t49 b8[2,4], w1 f32[3,4], x f32[2,3]",
        "read in place: t50, t49 (marked static by thunder",
        "copied in: t27, w2, w1, x (copied into the graph's static buffer before each replay)",
        "+ 8 bookkeeping (unpack, return, collection clearing)",
        "never-freed at top:20 (w2)",
        "lifetimes: backward `backward_fn`",
    )
    assert 'label="CUDAGraph1 · 5 ops · captured\\nin 3: 3 copied · out 3: 2 saved as-is, 1 returned as-is' in render.region_diagram(rep.forward).source


@pytest.mark.dot
@needs_dot
def test_report_mimebundle_embeds_the_diagrams(stock_mlp):
    bundle = stock_mlp._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/plain"] == render.report_text(stock_mlp)
    markup = bundle["text/html"]
    assert "<script" not in markup and "<?xml" not in markup
    # NOTE: pictures as <img> with a data: URI, not inline <svg>: a notebook opened untrusted sanitizes inline SVG away
    assert "<svg" not in markup
    assert_in_order(markup, '<div class="thunder-nb">', "mlp", "verdict:", "error: RuntimeError: no GPU",
                    "forward trace <code>computation</code>",
                    '<div class="tnb-diagram"><label class="tnb-zoomable"', '<img class="tnb-img tnb-diagram-img"', "region-deletes-outside-value",
                    "<summary>lifetimes</summary>", '<img class="tnb-img tnb-lifetime-img"',
                    "<summary>source</summary>", "<summary>generated code</summary>",
                    "backward trace <code>backward_fn</code>", '<div class="tnb-diagram">', '<img')
    pictures = [base64.b64decode(src).decode() for src in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', markup)]
    assert pictures[0].startswith("<svg") and ">CUDAGraph1<" in pictures[0] and "<title>" not in pictures[0]


def test_report_mimebundle_honours_include_and_exclude(stock_f):
    assert set(render.report_mimebundle(stock_f, include={"text/plain"})) == {"text/plain"}
    assert set(render.report_mimebundle(stock_f, exclude={"text/html"})) == {"text/plain"}


def test_without_dot_one_warning_and_a_text_fallback(monkeypatch, tmp_path, stock_mlp):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(render.backend, "_dot_missing_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert render.svg(render.region_diagram(stock_mlp.forward)) is None
        bundle = render.report_mimebundle(stock_mlp)
        render.side_by_side_html(stock_mlp, stock_mlp)
    found = [w for w in caught if issubclass(w.category, render.DiagramWarning)]
    assert len(found) == 1
    assert "apt-get install graphviz" in str(found[0].message)
    markup = bundle["text/html"]
    assert "tnb-lifetime-img" in markup  # NOTE: the lifetime view needs no dot
    assert_in_order(markup, "forward trace", "apt-get install graphviz", '<pre class="tnb-dot">digraph forward {',
                    "x [label=&quot;x\\nf32[2,3]&quot;", '<pre class="tnb-text">forward trace `computation`',
                    "backward trace", '<pre class="tnb-dot">digraph backward {')
    assert bundle["text/plain"] == render.report_text(stock_mlp)


def test_side_by_side_html(stock_g, split_g):
    markup = render.side_by_side_html(stock_g, split_g)
    assert_in_order(markup, '<div class="tnb-side">', "(transform: stock)", "(transform: SplitAtHostSync)",
                    "forward trace <code>computation</code>: 1 region, 0 islands",
                    "forward trace <code>computation</code>: 2 regions, 1 island")
    assert "no backward trace" not in markup
    # each report's header says what graph replays save
    assert_in_order(markup, "(transform: stock)", f"launches: {render.common.launch_line(stock_g)}",
                    "(transform: SplitAtHostSync)", f"launches: {render.common.launch_line(split_g)}")
    # NOTE: the widget's panes stay as short as they were: a notebook column holds them
    assert "launches:" not in render.html.pane_html(split_g)


def test_side_by_side_html_with_a_missing_trace(stock_mlp):
    markup = render.side_by_side_html(stock_mlp, dataclasses.replace(stock_mlp, backward=None))
    assert_in_order(markup, "backward trace <code>backward_fn</code>", "<div><p>no backward trace</p></div>")


# ---------------------------------------------------------------------------------------------------
# Scale


@pytest.mark.dot
@needs_dot
def test_default_diagram_of_5000_ops_is_collapsed_and_renders():
    # NOTE: how long it takes is measured by bench/bench_render.py, not asserted here
    trace = analysis.analyze_source(chain_source(25, 200), kind="forward")
    assert sum(len(r.compute_ops) for r in trace.regions) == 5000
    graph = render.region_diagram(trace)
    assert "subgraph cluster_" not in graph.source
    image = render.svg(graph)
    assert image is not None and "CUDAGraph25" in image
    ET.fromstring(render.lifetime_svg(trace))


@pytest.mark.dot
@needs_dot
def test_svg_strips_the_xml_prolog():
    source = graphviz.Digraph().pipe(format="svg", encoding="utf-8")
    assert source.startswith("<?xml")
    image = render.svg(graphviz.Digraph())
    assert image.startswith("<svg") and image == source[source.index("<svg"):]


@pytest.mark.filterwarnings("ignore:thunder-nb")  # NOTE: no GPU: the fixed transform says it runs eagerly
def test_side_by_side_of_stock_and_fixed_transforms(thunder_mod, stock_g):
    from thunder_nb.fix import FixedCUDAGraphTransform

    fixed = _report(thunder_mod, g, FixedCUDAGraphTransform, thunder_mod[1].randn(4, 3))
    markup = render.side_by_side_html(stock_g, fixed)
    assert_in_order(markup, "(transform: stock)", "verdict: fails or computes wrong values",
                    f"(transform: {fixed.transform})", f"verdict: {render.common.verdict(fixed.defects)}",
                    "forward trace <code>computation</code>", "forward trace <code>computation</code>")


# ---------------------------------------------------------------------------------------------------
# Fused groups (inductor fusions inside a fixed region, emulated capture on the CPU)


@pytest.fixture(scope="module")
def fused(thunder_mod) -> Report:
    """The fixed transform with thunder-nb's torchcompile: three inductor fusions and a plain mul in one region."""
    thunder, torch = thunder_mod

    def hand_off_then_fuse(x):
        s = x.sum().item()
        y = torch.cos(torch.sin(x) * 2.0).reshape(-1)
        return torch.tanh(y * s + 1.0)

    from thunder_nb.cudagraph.executors import executor_list
    from thunder_nb.fix import FixedCUDAGraphTransform
    from thunder_nb.testing.emulate import emulated_capture

    transform = FixedCUDAGraphTransform(capture=False)
    transform.cuda_graph_runner.capture = True  # NOTE: emulated_capture takes the capture path on the CPU
    jfn = thunder.jit(hand_off_then_fuse, transforms=[transform], executors=executor_list(["torchcompile"]))
    g = torch.Generator().manual_seed(0)
    with emulated_capture():
        for _ in range(3):
            x = torch.randn(64, generator=g)
            assert_equal(jfn(x), hand_off_then_fuse(x))
    return analysis.analyze(jfn)


@pytest.mark.slow
def test_report_text_of_a_fused_trace_gives_kernels_fused_groups_and_launch_time(fused):
    (region,) = fused.forward.regions
    # NOTE: the mul reads the island's number (handed off as t2): thunder-nb's torchcompile leaves it unfused
    assert [g.ops for g in region.fusions] == [("sum",), ("sin", "mul", "cos", "reshape"), ("add", "tanh")]
    assert region.kernels == 4
    assert_in_order(
        render.report_text(fused),
        "verdict: no defects found",
        "launches: ≈4 kernels in 1 region per call, replayed as 1 graph launch: ≈12 µs of host time saved per call "
        "(estimate: 4 µs per kernel launch removed, measured on an H200)",
        "CUDAGraph1 @0: 8 ops, ≈4 kernels, captured, 3 replays",  # NOTE: 7 fused and the mul
        # NOTE: inductor's own count (torch._inductor.metrics), noted when thunder-nb's executor compiled each group
        "TorchCompile0: 1 op fused (inductor), inductor generated 1 kernel: sum",
        "TorchCompile1: 4 ops fused (inductor), inductor generated 1 kernel: sin, mul, cos, reshape",
        "TorchCompile2: 2 ops fused (inductor), inductor generated 1 kernel: add, tanh",
        "inputs:  x f32[64]",
    )


@pytest.mark.slow
def test_region_diagram_golden_fused_trace(fused):
    assert_golden("fused_fixed_forward.gv", render.region_diagram(fused.forward).source)


@pytest.mark.slow
def test_region_diagram_collapsed_names_fused_groups_and_kernels(fused):
    source = render.region_diagram(fused.forward, collapse=True).source
    assert_in_order(source, 'CUDAGraph1 [label="CUDAGraph1\\n8 ops · ≈4 kernels · captured',
                    "TorchCompile0: 1 op fused (inductor)\\nTorchCompile1: 4 ops fused (inductor)\\n"
                    "TorchCompile2: 2 ops fused (inductor)")


@pytest.mark.slow
@pytest.mark.dot
@needs_dot
def test_region_diagram_of_a_fused_trace_draws_fused_groups_inside_their_region(fused):
    image = render.svg(render.region_diagram(fused.forward))
    root = ET.fromstring(image)
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text or "" for t in root.iter(f"{ns}text")]
    clusters = [g for g in root.iter(f"{ns}g") if g.get("class") == "cluster"]
    (cluster,) = [c for c in clusters if (c.findtext(f"{ns}title") or "") == "cluster_CUDAGraph1"]
    assert "CUDAGraph1 · 8 ops · ≈4 kernels · captured" in texts
    # each fused group is a node drawn inside the region's cluster box
    box = _bbox(next(e for e in cluster.iter() if e.tag in (f"{ns}path", f"{ns}polygon")))
    for node_name, lines in (("y", ["y = TorchCompile1", "4 ops fused (inductor)", "inductor generated 1 kernel",
                                    "sin, mul, cos, reshape"]),
                             ("t10", ["t10 = TorchCompile2", "2 ops fused (inductor)", "inductor generated 1 kernel",
                                      "add, tanh"])):
        node = next(g for g in root.iter(f"{ns}g") if g.get("class") == "node" and g.findtext(f"{ns}title") == node_name)
        assert [t.text for t in node.iter(f"{ns}text")] == lines
        inner = _bbox(next(node.iter(f"{ns}polygon")))
        assert box[0] <= inner[0] and inner[2] <= box[2] and box[1] <= inner[1] and inner[3] <= box[3], node_name
    assert "double box: ops a fusion executor compiles together" in " ".join(texts)


def _bbox(shape) -> tuple[float, float, float, float]:
    """(min x, min y, max x, max y) of an SVG polygon's points or a path's coordinates."""
    import re

    text = shape.get("points") or shape.get("d") or ""
    nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", text)]
    xs, ys = nums[0::2], nums[1::2]
    return min(xs), min(ys), max(xs), max(ys)


def test_the_launch_estimate_of_regions_that_ran_eagerly_says_nothing_was_captured():
    """On the CPU nothing is captured: the report says what a capture would save, not that it saved it."""
    import thunder
    import torch

    from thunder_nb import FixedCUDAGraphTransform

    def fn(x):
        y = x.sin().cos()
        return (y * y.sum().item()).exp()

    jfn = thunder.jit(fn, transforms=[FixedCUDAGraphTransform(capture=False)])
    jfn(torch.randn(8))
    (line,) = [ln for ln in analysis.analyze(jfn).to_text().splitlines() if ln.startswith("launches:")]
    assert "nothing was captured in this run (the regions ran eagerly): captured, 1 graph launch would save ≈" in line
    assert "saved per call" not in line
