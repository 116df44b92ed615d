"""Run notebooks in a real kernel and export them as standalone HTML pages whose widgets work offline."""

from __future__ import annotations

import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NOTE: nbformat, nbclient and nbconvert are imported only when used
    from collections.abc import Callable

    import nbformat

__all__ = [
    "REPO",
    "EXAMPLE",
    "ASSETS_ENV",
    "CellError",
    "OfflineWidgetWarning",
    "find_notebooks",
    "merge_streams",
    "joined_streams",
    "default_assets_dir",
    "widget_assets",
    "execute_notebook",
    "error_outputs",
    "widget_views_without_state",
    "export_html",
]

#: The repository checkout this package was imported from (an editable install or the source tree).
REPO = Path(__file__).resolve().parents[2]
#: The notebook ``python -m thunder_nb example`` runs and exports.
EXAMPLE = "01_del_bug.ipynb"
#: Environment variable naming a folder with ``require.js`` and ``embed-amd.js`` (default: `default_assets_dir`).
ASSETS_ENV = "THUNDER_NB_WIDGET_JS"
#: The two files `export_html` inlines, as ``bash dev.sh`` lays them out.
ASSET_FILES = ("require.js", "embed-amd.js")

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# NOTE: the lab template with the two CDN <script src=...> replaced by the files' text. The renderer
# goes at the end of the body, where nbconvert's loader would append it; it renders on the window's
# load event, so the saved widget state that the template writes after it is there by then. MathJax,
# which nbconvert always loads from a CDN, is kept only for a notebook with LaTeX in it. A widget view is
# the lab template's, plus the output's text/html in a <noscript> inside it: the toggle's static fallback in outputs
# written before it became an output of its own (issue 53.1), which the widget's panes hide where it is drawn.
_TEMPLATE_NAME = "thunder_nb_standalone.html.j2"
_TEMPLATE = """\
{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}
<script data-thunder-nb="require.js">
{{ resources.thunder_nb_assets["require.js"] }}
</script>
{%- endblock html_head_js_requirejs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{%- block html_head_js_mathjax -%}
{%- if resources.thunder_nb_math -%}{{ super() }}{%- endif -%}
{%- endblock html_head_js_mathjax -%}
{%- block data_widget_view scoped %}
{% set div_id = uuid4() %}
{% set datatype = (output.data | filter_data_type)[0] %}
<div id="{{ div_id }}" class="jupyter-widgets jp-OutputArea-output {{ extra_class }}">
<script type="text/javascript">
var element = document.getElementById('{{ div_id }}');
</script>
<script type="{{ datatype }}">
{{ output.data[datatype] | json_dumps | escape_html_script }}
</script>
{%- if "text/html" in output.data %}
<noscript>{{ output.data["text/html"] }}</noscript>
{%- endif %}
</div>
{%- endblock data_widget_view -%}
{% block footer_js %}
{{ super() }}
{%- if "widgets" in nb.metadata %}
<script data-thunder-nb="embed-amd.js">
{{ resources.thunder_nb_assets["embed-amd.js"] }}
</script>
{%- endif %}
{% endblock footer_js %}
"""


class OfflineWidgetWarning(UserWarning):
    """The exported page loads the widget's JavaScript from a CDN: without network the widget does not show."""


@dataclass(frozen=True, slots=True)
class CellError:
    """An ``error`` output of an executed notebook."""

    cell: int  #: index of the cell in ``nb.cells``
    ename: str
    evalue: str
    traceback: tuple[str, ...]

    def __str__(self) -> str:
        return f"cell {self.cell}: {self.ename}: {self.evalue}"


def find_notebooks(folder: str | os.PathLike[str] | None = None) -> Path:
    """Return the folder of the teaching notebooks (``notebooks/`` of the repository checkout).

    Raises:
        FileNotFoundError: there is none, e.g. because thunder-nb was installed from a wheel.
    """
    candidates = [Path(folder)] if folder is not None else [REPO / "notebooks", Path.cwd() / "notebooks"]
    for c in candidates:
        if c.is_dir() and any(c.glob("*.ipynb")):
            return c.resolve()
    looked = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise FileNotFoundError(
        f"no notebooks found (looked in {looked}): the notebooks ship with the repository, not the package; "
        "run this from a checkout of thunder-nb (`bash dev.sh example`), installed with `pip install -e .`"
    )


def default_assets_dir() -> Path:
    """Where the widget JavaScript is looked for: ``$THUNDER_NB_WIDGET_JS``, else ``.cache/widget-js/`` of the checkout."""
    return Path(os.environ.get(ASSETS_ENV) or REPO / ".cache" / "widget-js")


def widget_assets(assets_dir: str | os.PathLike[str] | None = None) -> dict[str, str] | None:
    """Read ``require.js`` and ``embed-amd.js`` from ``assets_dir`` (default `default_assets_dir`); None if either is missing."""
    folder = Path(assets_dir) if assets_dir is not None else default_assets_dir()
    paths = {name: folder / name for name in ASSET_FILES}
    if not all(p.is_file() for p in paths.values()):
        return None
    return {name: p.read_text(encoding="utf-8") for name, p in paths.items()}


def execute_notebook(
    path: str | os.PathLike[str], *, timeout: int = 600, cwd: str | os.PathLike[str] | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> nbformat.NotebookNode:
    """Run a notebook top to bottom in a fresh kernel and return it with its outputs and widget state.

    Like ``jupyter nbconvert --execute``, execution stops at the first cell that raises; unlike it,
    the notebook is returned rather than an exception raised: `error_outputs` lists what failed.

    Args:
        path: the ``.ipynb`` file (it is not modified).
        timeout: seconds a single cell may run.
        cwd: the kernel's working folder (default: the notebook's folder).
        progress: called after each code cell with (its number among the code cells, their count, its seconds):
            a long notebook says where it is, and a run cut short says where its time went.

    Returns:
        The executed notebook; ``nb.metadata.widgets`` holds the widget state an HTML export needs.
    """
    import nbformat
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    ready: list[bool] = []  # NOTE: the kernel answered (nbclient's on_notebook_start), so it could use the sockets
    with tempfile.TemporaryDirectory(prefix="thunder-nb-kernel-") as sockets:
        try:
            ipc = sockets if os.name == "posix" else None
            return _execute(nbformat.read(path, as_version=4), path, timeout, cwd, ipc, progress, ready)
        except CellExecutionError:
            raise
        except Exception as e:
            # NOTE: a kernel that cannot start over a Unix socket here: TCP then. A kernel that started and failed
            # later (it died, or the run was interrupted, whose clean-up then raises) is not run again: a notebook
            # interrupted on a GPU machine at cell 8 ran again from its first cell over TCP (2026-12-06)
            if os.name != "posix" or ready:
                raise
            warnings.warn(f"the kernel could not start over Unix sockets ({type(e).__name__}: {e}); running over TCP",
                          RuntimeWarning, stacklevel=2)
    return _execute(nbformat.read(path, as_version=4), path, timeout, cwd, None, progress)


def _execute(nb, path: Path, timeout: int, cwd, sockets: str | None, progress=None, ready=None):
    """Run ``nb`` in a fresh kernel: over Unix sockets in ``sockets`` (no network, no TCP warning), or over TCP.
    ``ready``, a list, gets an item once the kernel answers."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from traitlets.config import Config

    config = Config()
    if sockets is not None:
        # NOTE: the kernel talks to us through Unix sockets in a private folder instead of TCP ports:
        # nothing listens on the network, and ipykernel has no "running over TCP without encryption"
        # warning to print. The path is absolute: the kernel runs in the notebook's folder, not ours.
        config.KernelManager.transport = "ipc"
        config.KernelManager.ip = os.path.join(sockets, "kernel")
    client = NotebookClient(
        nb,
        timeout=timeout,
        resources={"metadata": {"path": str(Path(cwd) if cwd is not None else path.parent)}},
        store_widget_state=True,
        # NOTE: no per-cell timestamps: executed notebooks are committed, and timestamps only make diffs
        record_timing=False,
        config=config,
    )
    if ready is not None:
        client.on_notebook_start = lambda notebook: ready.append(True)
    if progress is not None:
        code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
        started = {}
        client.on_cell_start = lambda cell, cell_index: started.update(t=time.perf_counter())
        client.on_cell_executed = lambda cell, cell_index, execute_reply: progress(
            code.index(cell_index) + 1, len(code), time.perf_counter() - started["t"])
    try:
        client.execute(env=kernel_env())
    except CellExecutionError:
        pass  # NOTE: the error is in the failing cell's outputs; error_outputs reports it
    return merge_streams(nb)


def merge_streams(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with each cell's outputs `joined_streams`, as Jupyter shows them, and returned.

    The kernel sends what a cell prints in pieces, one each time its buffer is flushed (on a timer, or when the code
    flushes): under load a piece can end mid-line. nbclient stores each piece as an output of its own, which a reader
    of the file (a test splitting the text into lines, nbconvert's HTML: a block per output) sees as a line broken in
    two; JupyterLab joins them. (nbclient's own ``coalesce_streams`` moves every stdout piece up to the first, past
    the displays between them.)
    """
    for cell in nb.cells:
        if "outputs" in cell:
            cell.outputs = joined_streams(cell.outputs)
    return nb


def joined_streams(outputs: list) -> list:
    """``outputs`` with each run of consecutive stream outputs of one name (stdout, stderr) made one; the order of
    streams and displays kept. The outputs it joins are copied, the rest returned as they are."""
    joined: list = []
    for o in outputs:
        last = joined[-1] if joined else None
        if (o.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                and last.get("name") == o.get("name")):
            joined[-1] = type(last)(last, text="".join(last.get("text", "")) + "".join(o.get("text", "")))
        else:
            joined.append(o)
    return joined


def kernel_env() -> dict[str, str]:
    """The environment a notebook's kernel starts with: ours, less what would change what a reader's kernel shows.

    ``PYTHONWARNINGS`` goes: set to ``ignore`` around a batch run (a GPU machine's job script), it silenced every
    warning the notebooks show their reader (notebook 02's `RecaptureWarning`) in the stored outputs.
    """
    return {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}


def error_outputs(nb: nbformat.NotebookNode) -> list[CellError]:
    """List the ``error`` outputs of an executed notebook, in cell order."""
    return [
        CellError(i, o.get("ename", ""), o.get("evalue", ""), tuple(o.get("traceback", ())))
        for i, cell in enumerate(nb.cells)
        for o in cell.get("outputs", ())
        if o.get("output_type") == "error"
    ]


def widget_views_without_state(nb: nbformat.NotebookNode) -> int:
    """How many widget outputs the notebook has with no saved widget state to draw them from (0: none missing)."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    views = [
        o["data"][WIDGET_VIEW].get("model_id")
        for cell in nb.cells
        for o in cell.get("outputs", ())
        if WIDGET_VIEW in o.get("data", {})
    ]
    return sum(1 for model_id in views if model_id not in state)


_MATH = re.compile(r"\$\$|\$[^$\n]+\$|\\\(|\\\[|\\begin\{")


def _has_math(nb: nbformat.NotebookNode) -> bool:
    """Whether a markdown cell or an output has LaTeX that MathJax would typeset."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and _MATH.search(cell.source):
            return True
        if any("text/latex" in o.get("data", {}) for o in cell.get("outputs", ())):
            return True
    return False


def _inline_script(js: str) -> str:
    """Make JavaScript safe as the text of an HTML ``<script>`` element.

    NOTE: only ``</script`` ends the element and ``<!--`` changes how the HTML parser reads it; both
    are rewritten with a backslash, which means the same inside JS strings, regexes and comments
    (the pinned require.js and embed-amd.js contain neither anyway).
    """
    js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE)
    return js.replace("<!--", "<\\!--")


def export_html(
    nb: nbformat.NotebookNode,
    dest: str | os.PathLike[str],
    *,
    assets_dir: str | os.PathLike[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write an executed notebook as one HTML page whose widgets render and switch without a kernel or network.

    The page asks the network for nothing, except MathJax when the notebook has LaTeX in it. (nbconvert's
    own page loads require.js and the widget renderer from CDNs: offline the toggle silently disappears.
    Both are inlined here from a local copy that ``bash dev.sh`` fetches into ``.cache/widget-js/``.)

    Args:
        nb: an executed notebook (`execute_notebook`); its saved widget state drives the widgets.
        dest: the ``.html`` file to write (its folder is created).
        assets_dir: a folder with ``require.js`` and ``embed-amd.js`` to inline (default
            `default_assets_dir`, filled by ``bash dev.sh``).
        title: the page title (default: the file name without extension).

    Returns:
        ``dest`` as a `Path`.

    Warns:
        OfflineWidgetWarning: the assets are missing, so the page loads them from CDNs (the page is
            written all the same; without network its widgets do not show, the rest does).
    """
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    dest = Path(dest)
    assets = widget_assets(assets_dir)
    resources = {"metadata": {"name": title or dest.stem}}
    if assets is None:
        where = Path(assets_dir) if assets_dir is not None else default_assets_dir()
        warnings.warn(
            OfflineWidgetWarning(
                f"{dest}: the widget JavaScript ({' and '.join(ASSET_FILES)}) is not in {where}, so the page loads it "
                "from a CDN and its widgets need network (run `bash dev.sh example`, which fetches them with npm)"
            ),
            stacklevel=2,
        )
        exporter = HTMLExporter()
    else:
        exporter = HTMLExporter(extra_loaders=[DictLoader({_TEMPLATE_NAME: _TEMPLATE})], template_file=_TEMPLATE_NAME)
        resources["thunder_nb_assets"] = {name: _inline_script(text) for name, text in assets.items()}
        resources["thunder_nb_math"] = _has_math(nb)
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(body, encoding="utf-8")
    return dest
