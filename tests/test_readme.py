"""The README as a user meets it: every snippet runs on its own as written (Python ones in a fresh process, notebook
cells in a fresh kernel), its options table is the magic's own declarations, and its signatures are the code's."""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch

from thunder_nb.notebook import export

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"

#: The first line of a snippet that cannot run without a GPU (the README must say so, and the tests skip it).
NEEDS_GPU = "# needs a GPU"

#: What a snippet prints, found by a piece of its code: its output must contain each string.
EXPECTED_OUTPUT = {
    "thunder_nb.jit(": ["loss "],
    "thunder_nb.analyze(": [
        "thunder-nb report: fn",  # report.to_text()
        "\n[]\n",  # check(report): no defect
        "fixed: 1 region",  # cmp.verdict()
        "check fixed",  # cmp.run_text()
        "timings",
    ],
}


def code_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, in order."""
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def python_snippets() -> list[str]:
    """The README's Python snippets: every ```python block that is not a notebook cell."""
    return [b for b in code_blocks(README.read_text(encoding="utf-8")) if not b.startswith("%")]


def notebook_cells() -> list[str]:
    """The README's notebook cells: the ```python blocks that start with an IPython magic."""
    return [b for b in code_blocks(README.read_text(encoding="utf-8")) if b.startswith("%")]


def _first_code_line(snippet: str) -> str:
    return next(line for line in snippet.splitlines() if line.strip() and not line.startswith(("import", "from")))


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_readme_has_snippets_of_both_kinds():
    """The snippet tests below found what they run (a changed fence or layout would make them run nothing)."""
    assert len(python_snippets()) >= 2
    cells = notebook_cells()
    assert cells[0] == "%load_ext thunder_nb\n" and len(cells) >= 2
    assert all(c.startswith("%%thunder_cudagraph") for c in cells[1:])


@pytest.mark.slow
@pytest.mark.parametrize("snippet", python_snippets(), ids=lambda s: _first_code_line(s)[:40])
def test_each_python_snippet_runs_on_its_own(snippet, tmp_path):
    """Each Python snippet as one script in a fresh process: no name from another snippet, no set-up beforehand."""
    if snippet.startswith(NEEDS_GPU) and not torch.cuda.is_available():
        pytest.skip("the README marks this snippet as needing a GPU, and this machine has none")
    out = run_python(snippet, tmp_path)
    assert out.returncode == 0, out.stderr
    for marker, expected in EXPECTED_OUTPUT.items():
        if marker in snippet:
            for text in expected:
                assert text in out.stdout, (text, out.stdout)


def test_every_expected_output_belongs_to_a_snippet():
    """A snippet that was rewritten without its expectations here fails, instead of running unchecked."""
    snippets = python_snippets()
    assert all(any(marker in s for s in snippets) for marker in EXPECTED_OUTPUT)


@pytest.mark.slow
@pytest.mark.parametrize("cell", [c for c in notebook_cells()[1:] if "--train" not in c.splitlines()[0]],
                         ids=lambda c: c.splitlines()[0])
def test_each_magic_cell_runs_on_its_own_in_a_real_kernel(cell, tmp_path):
    """Each ``%%thunder_cudagraph`` cell in a fresh kernel, after only the README's ``%load_ext`` cell: no error,
    and its verdict. (The ``--train`` cell: `test_magic_kernel`, which also runs the next step it shows.)"""
    cells = [nbformat.v4.new_code_cell(source.rstrip("\n")) for source in (notebook_cells()[0], cell)]
    path = tmp_path / "readme.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    nb = export.execute_notebook(path, timeout=600)
    errors = export.error_outputs(nb)
    assert not errors, "\n".join(f"{e}\n" + "\n".join(e.traceback) for e in errors)
    texts = [o.get("data", {}).get("text/plain", "") for c in nb.cells for o in c.get("outputs", [])]
    # NOTE: the toggle's own text form is the verdict again (what a text-only reader of the notebook sees)
    verdicts = list(dict.fromkeys(t for t in texts if t.startswith("original (")))
    assert len(verdicts) == 1, texts
    (verdict,) = verdicts
    fixed = verdict[verdict.index("fixed:"):]
    assert "matches eager" in fixed, verdict
    if "--original legacy" in cell:
        assert verdict.startswith("original (legacy): crashes (UnboundLocalError)"), verdict


def torchrun_command() -> list[str]:
    """The README's ``torchrun`` command, word by word (an indented line of the section "Several GPUs")."""
    (line,) = re.findall(r"^ {4}(torchrun .+)$", README.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return line.split()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--step"], ["--step", "--shard"]], ids=["ddp", "jit_step", "jit_step-shard"])
def test_the_readme_torchrun_command_trains_every_rank_alike(extra):
    """The README's ``torchrun`` command as written (torchrun from this Python's environment), on the CPU (gloo): each
    rank prints every step's loss of the whole batch, the same on both ranks, and the same as one process training
    the example's model on the whole batches eagerly (were the gradients not all-reduced, the ranks' models would part
    and the losses after the first step would not be one process's). With the README's ``--step`` too: the example
    trains through ``jit_step``, whose graph holds the all-reduce; with ``--step --shard``, its ZeRO-2 (reduce_scatter
    and all_gather in the graph)."""
    import importlib.util

    from thunder_nb.diagnosis.judge import TRAINED, assert_equal

    command = torchrun_command()
    assert command[0] == "torchrun" and command[-1] == "examples/ddp_train.py"
    world = int(command[command.index("--nproc_per_node") + 1])
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # NOTE: the CPU and gloo, whatever the machine has
    torchrun = str(Path(sys.executable).parent / "torchrun")
    if extra:
        assert "`--step`: `jit_step`, `--step --shard`: sharded" in README.read_text(encoding="utf-8")
    out = subprocess.run([torchrun, *command[1:], *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    printed: dict[int, list[str]] = {}
    for rank, _, loss in re.findall(r"^rank (\d+) step (\d+) loss (\S+)$", out.stdout, flags=re.MULTILINE):
        printed.setdefault(int(rank), []).append(loss)
    assert sorted(printed) == list(range(world)), out.stdout
    assert all(losses == printed[0] for losses in printed.values()), printed

    spec = importlib.util.spec_from_file_location("ddp_train", ROOT / "examples" / "ddp_train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=example.LR)
    reference = []
    for x, y in example.batches(world):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        reference.append(loss.item())
    assert len(printed[0]) == example.STEPS
    assert_equal(torch.tensor([float(v) for v in printed[0]]), torch.tensor(reference), tolerance=TRAINED,
                 label="the ranks' losses", reference="one process's")


OPTIONS_START = "<!-- options: generated from the magic's declarations; regenerate with python -m thunder_nb.magics -->\n"
OPTIONS_END = "<!-- end of options -->\n"


def test_the_options_table_is_generated_from_the_magics_declarations():
    """The README's options table is `options_markdown()`: an option added or changed in the magic fails here.

    ``THUNDER_NB_REGEN_README=1`` rewrites the table in the README instead (or paste ``python -m thunder_nb.magics``).
    """
    from thunder_nb.magics import options_markdown

    text = README.read_text(encoding="utf-8")
    start = text.index(OPTIONS_START) + len(OPTIONS_START)
    end = text.index(OPTIONS_END, start)
    if os.environ.get("THUNDER_NB_REGEN_README"):
        README.write_text(text[:start] + options_markdown() + text[end:], encoding="utf-8")
        return
    assert text[start:end] == options_markdown(), "regenerate it: THUNDER_NB_REGEN_README=1 pytest tests/test_readme.py"


def test_options_markdown_has_a_row_per_declared_option():
    from thunder_nb.magics import ThunderCUDAGraphMagics, options_markdown

    table = options_markdown()
    for action in ThunderCUDAGraphMagics.thunder_cudagraph.parser._actions:
        for option in action.option_strings:
            assert f"`{option}" in table, option
    assert table.count("\n") == 2 + len(ThunderCUDAGraphMagics.thunder_cudagraph.parser._actions)


def _documented_calls(text: str) -> dict[str, ast.Call]:
    """Inline code spans like ``compare(fn, args, kwargs=None, ...)``: the README's signatures, by function name."""
    calls = {}
    for span in re.findall(r"`((?:thunder_nb\.)?\w+\([^`]*=[^`]*\))`", text):
        node = ast.parse(span.replace("\n", " "), mode="eval").body
        if isinstance(node, ast.Call):
            calls[ast.unparse(node.func).removeprefix("thunder_nb.")] = node
    return calls


def test_the_signatures_in_the_readme_are_the_codes():
    """Every parameter the README names exists, with the default the README gives it."""
    import thunder_nb

    calls = _documented_calls(README.read_text(encoding="utf-8"))
    assert {"jit", "compare"} <= set(calls), sorted(calls)
    for name, call in calls.items():
        params = inspect.signature(getattr(thunder_nb, name)).parameters
        for arg in call.args:
            assert isinstance(arg, ast.Name) and arg.id in params, (name, ast.unparse(arg))
        for kw in call.keywords:
            if kw.arg is None:  # **transform_options
                assert ast.unparse(kw.value) in params, (name, ast.unparse(kw.value))
                continue
            assert kw.arg in params, (name, kw.arg)
            assert params[kw.arg].default == ast.literal_eval(kw.value), (name, kw.arg, params[kw.arg].default)


def test_the_readme_is_a_user_guide():
    """Measurements live in bench/results/README.md, development in CONTRIBUTING.md, design in ARCHITECTURE.md."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200, "the README grows again: move detail to ARCHITECTURE.md, CONTRIBUTING.md or bench/results"
    assert "µs" not in text, "timings belong in bench/results/README.md"
    commit_ids = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not commit_ids, commit_ids
    assert "../shared" not in text and ".gpu/" not in text, "workplace-specific steps belong in CONTRIBUTING.md"
    for page in ("ARCHITECTURE.md", "CONTRIBUTING.md", "bench/results/README.md", "notebooks/"):
        assert f"]({page})" in text, page


@pytest.mark.slow
def test_public_names_are_the_function_and_the_class(tmp_path):
    """``thunder_nb.compare`` and ``thunder_nb.Comparison``, first thing in a fresh process, and after the magic ran."""
    code = textwrap.dedent(
        """
        import torch, thunder_nb
        assert thunder_nb.Comparison.__name__ == "Comparison"
        c = thunder_nb.compare(lambda x: x.sin().sum(), (torch.randn(4),), repeats=1)
        assert isinstance(c, thunder_nb.Comparison)
        from IPython.testing import globalipapp
        from IPython.utils.capture import capture_output
        ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # NOTE: IPython starts it once
        ip.run_line_magic("load_ext", "thunder_nb")
        with capture_output():
            ip.run_cell_magic("thunder_cudagraph", "--repeats 1 f(torch.randn(4))", "import torch\\ndef f(x):\\n    return x.cos()\\n")
        assert callable(thunder_nb.compare) and isinstance(thunder_nb.compare(ip.user_ns["f"], (torch.randn(4),), repeats=1), thunder_nb.Comparison)
        import thunder_nb.notebook.comparison
        assert thunder_nb.compare is thunder_nb.notebook.comparison.compare
        print("ok")
        """
    )
    out = run_python(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


@pytest.mark.parametrize("page", ["README.md", "CONTRIBUTING.md", "bench/results/README.md"])
def test_every_relative_link_leads_to_a_file_in_the_repository(page):
    """A link to a results file, a picture or a notebook that was moved or never committed fails here, not for a reader."""
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    assert targets, f"{page}: no relative link found (the pattern no longer matches the page's links?)"
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert not missing, f"{page}: links to missing files: {missing}"


def test_the_checker_rule_table_lists_every_rule_with_its_severity():
    """CONTRIBUTING.md's table of checker rules (the README links to it) against the model's rules and severities."""
    from thunder_nb.diagnosis.model import RULES, Defect

    text = CONTRIBUTING.read_text(encoding="utf-8")
    table = text[text.index("## Checker rules"):]
    rows = dict(re.findall(r"^\| `([\w-]+)` \| ([\w ]+) \|", table, flags=re.MULTILINE))
    assert set(rows) == set(RULES)
    for rule, severity in rows.items():
        assert severity == Defect(rule, "forward", None, None, None, "", "").severity, rule
