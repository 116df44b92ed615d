"""``bash dev.sh lab``, the README's third command: JupyterLab on the notebooks with the extension ready, as root too."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").exists(),
                       reason="needs the set-up of `bash dev.sh test` (.venv) in this checkout"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lab_serves_the_notebooks_and_the_kernel_loads_the_extension(tmp_path):
    port, token = _free_port(), secrets.token_hex(8)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws"),
           "THUNDER_NB_LAB_DIR": str(tmp_path / "lab")}
    before = _git_status()
    proc = subprocess.Popen(["bash", "dev.sh", "lab", "--no-browser", f"--ServerApp.port={port}",
                             "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "JupyterLab did not answer in 120 s"
                time.sleep(1)
        with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=10) as r:
            names = {item["name"] for item in json.load(r)["content"]}
        assert "01_del_bug.ipynb" in names  # NOTE: the server's root is a working copy of notebooks/
        # NOTE: as Lab's autosave and File > New do: a teaching notebook saved with a change, a new notebook made
        _save(base, token, "01_del_bug.ipynb", lambda nb: nb["cells"].append(
            {"cell_type": "markdown", "metadata": {}, "source": "my note"}))
        _save(base, token, "mine.ipynb", lambda nb: None)
        assert (tmp_path / "lab" / "mine.ipynb").exists()
        assert "my note" in (tmp_path / "lab" / "01_del_bug.ipynb").read_text()
        assert _git_status() == before, "dev.sh lab changed the repository's files"
        # NOTE: a notebook saved in this Lab keeps its widget state (ipywidgets' jupyterlab-manager saves it)
        plugin = "@jupyter-widgets/jupyterlab-manager:plugin"
        with urllib.request.urlopen(f"{base}/lab/api/settings/{plugin}?token={token}", timeout=10) as r:
            got = json.load(r)
            # NOTE: Lab applies overrides.json as the schema's default; the user's own settings may still say no
            assert got["schema"]["properties"]["saveState"]["default"] is True, str(got)[:800]
        with urllib.request.urlopen(f"{base}/api/kernelspecs?token={token}", timeout=10) as r:
            spec = json.load(r)["kernelspecs"]["python3"]["spec"]
        # NOTE: the kernel is the project's Python, so `%load_ext thunder_nb` finds the package. jupyter_client runs a
        # kernel whose command is "python" (or "python3", "python3.X") with the server's own Python: dev.sh starts
        # the server with .venv's. Run from elsewhere, so that the package is not found in the working folder.
        exe = spec["argv"][0]
        if exe in {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}"}:
            exe = str(REPO / ".venv" / "bin" / "python")
        check = subprocess.run([exe, "-c", "import thunder_nb; print(thunder_nb.__file__)"],
                               capture_output=True, text=True, cwd=tmp_path)
        assert check.returncode == 0 and str(REPO / "thunder_nb") in check.stdout, check.stderr
        # NOTE: and as the user does it: a kernel the server starts, a cell with the magic's `%load_ext`, its help
        outputs, reply = _run_in_a_lab_kernel(base, token, "%load_ext thunder_nb\n"
                                                             "print(get_ipython().find_cell_magic('thunder_cudagraph'))")
        assert reply["status"] == "ok", (reply, outputs)
        assert "bound method ThunderCUDAGraphMagics.thunder_cudagraph" in "".join(outputs), outputs
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--", "notebooks"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def _save(base: str, token: str, name: str, edit) -> None:
    """Save notebook ``name`` through the server's contents API, as Lab does: the stored one edited, or a new one."""
    url = f"{base}/api/contents/{name}?token={token}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            nb = json.load(r)["content"]
    except urllib.error.HTTPError:
        nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    edit(nb)
    body = json.dumps({"type": "notebook", "format": "json", "content": nb}).encode()
    req = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status in (200, 201)


def _run_in_a_lab_kernel(base: str, token: str, code: str, timeout: float = 120) -> tuple[list[str], dict]:
    """Start a kernel through the server's REST API, run ``code`` over its websocket (the channels JupyterLab uses),
    and return (the stream and result texts it printed, its execute_reply's content); the kernel is shut down."""
    import asyncio
    import uuid

    from tornado.websocket import websocket_connect

    request = urllib.request.Request(f"{base}/api/kernels?token={token}", data=b'{"name": "python3"}', method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        kernel = json.load(r)["id"]

    async def run() -> tuple[list[str], dict]:
        ws = await websocket_connect(f"{base.replace('http', 'ws')}/api/kernels/{kernel}/channels?token={token}")
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": uuid.uuid4().hex,
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        outputs: list[str] = []
        reply, idle = None, False
        while reply is None or not idle:  # NOTE: the reply (shell) may come before the last output (iopub)
            msg = json.loads(await asyncio.wait_for(ws.read_message(), timeout))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                outputs.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                outputs.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                outputs.append("\n".join(content["traceback"]))
            elif kind == "execute_reply":
                reply = content
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        ws.close()
        return outputs, reply

    try:
        return asyncio.run(run())
    finally:
        delete = urllib.request.Request(f"{base}/api/kernels/{kernel}?token={token}", method="DELETE")
        urllib.request.urlopen(delete, timeout=30).close()


def test_the_fast_tier_selects_no_slow_browser_or_gpu_test_and_passes_pytest_arguments_on():
    """``bash dev.sh test --fast``: the inner loop's tier (CONTRIBUTING.md), pytest's arguments passed on."""
    out = subprocess.run(["bash", "dev.sh", "test", "--fast", "--collect-only", "-q", "tests/test_layout.py",
                          "tests/test_dev_lab.py", "tests/cudagraph/test_fusion.py"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "running the fast tier" in out.stderr
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert any(i.startswith("tests/test_layout.py::") for i in ids)
    # NOTE: this module is marked slow, and so is the fusion test that takes most of a minute
    assert not any(i.startswith("tests/test_dev_lab.py::") for i in ids)
    assert not any("keeps_an_islands_number_out_of_fusions" in i for i in ids)
