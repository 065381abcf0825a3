"""The README's service example, run as written (a port and a database of the
test's own added): the server registers the examples, the token command's
output is the token, the README's job body is accepted, and ``/best`` answers
with why nothing is timed yet."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from svc_helpers import ROOT, wait_for


def _readme_service_block() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## The tuning service"):].split("\n## ", 1)[0]


def _command(block: str, start: str) -> list[str]:
    line = next(ln.strip() for ln in block.splitlines() if ln.strip().startswith(start))
    return shlex.split(line.split("#", 1)[0].rstrip(" &)"))


def test_the_readme_service_example_works_as_written(tmp_path: Path) -> None:
    block = _readme_service_block()
    serve_args = _command(block, "ws-tune serve")
    token_args = _command(block, "TOKEN=$(ws-tune token create")
    assert token_args[0] == "TOKEN=$(ws-tune"
    body = json.loads(re.search(r"-d '(\{.*?\})'", block).group(1))
    best_url = re.search(r"curl '(http://127\.0\.0\.1:8000/api/v1/best\?[^']+)'", block).group(1)

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WS_TUNE_")}
    env.update(WS_TUNE_DB=str(tmp_path / "service.db"), HOME=str(tmp_path))
    # The README's command, with this test's port and no embedded worker (nothing is compiled here).
    serve = subprocess.Popen([sys.executable, "-m", "ws_tuner", *serve_args[1:], "--port", str(port), "--workers", "0"],
                             env=env, cwd=ROOT, stdout=open(tmp_path / "serve.log", "wb"), stderr=subprocess.STDOUT)  # fmt: skip
    try:
        api = f"http://127.0.0.1:{port}/api/v1"
        wait_for(lambda: _ready(api), 60, 0.1, "the server")
        token = subprocess.run([sys.executable, "-m", "ws_tuner", *token_args[1:]], env=env, cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
        created = httpx.post(f"{api}/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
        assert created.status_code == 201, created.text
        assert created.json()["kernel"] == body["kernel"] and created.json()["budget"] == body["budget"]
        best = httpx.get(best_url.replace(":8000", f":{port}"))
        assert best.status_code == 404 and best.json()["detail"].startswith(f"no timed result for {body['kernel']} at ")
    finally:
        serve.terminate()
        serve.wait(timeout=60)


def _ready(api: str) -> bool:
    try:
        return httpx.get(f"{api}/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
