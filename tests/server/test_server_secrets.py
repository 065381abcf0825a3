"""Finding 1 of issue 10: uploaded kernel code must not take over the service.

A kernel is uploaded whose top level looks for secrets everywhere a process of
the worker's user can look: its own environment and command line, and the
environment and command line of every process on the machine (its parent, the
worker, among them), then tries to reach the database with any URL it found.
It runs for real: ``ws-tune serve`` with an embedded worker, or a standalone
``ws-tune worker`` as docker compose runs it, with the database password, the
bootstrap token and proxy credentials in their environment, and a container's
capabilities (root with CAP_SYS_PTRACE or CAP_SYS_ADMIN can read anything).
It must find none of them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from sqlalchemy import make_url
from svc_helpers import ROOT, wait_for

SPY = """
import glob, json, os, re, sys
seen = {"pid": os.getpid(), "ppid": os.getppid(), "environ": dict(os.environ), "argv": sys.argv, "files": {}, "denied": []}
for proc in glob.glob("/proc/[0-9]*"):
    for what in ("environ", "cmdline"):
        try:
            seen["files"][f"{proc}/{what}"] = open(f"{proc}/{what}", "rb").read().decode("latin-1")
        except OSError:
            seen["denied"].append(f"{proc}/{what}")
near = [json.dumps(seen["environ"]), " ".join(sys.argv)] + [
    seen["files"].get(f"/proc/{os.getppid()}/{what}", "") for what in ("environ", "cmdline")]
seen["reached"] = []
for url in {u for text in near for u in re.findall(r"postgresql(?:\\+psycopg)?://[^\\s\\x00\\"']+", text)}:
    try:
        import psycopg
        psycopg.connect(url.replace("+psycopg", ""), connect_timeout=3).close()
        seen["reached"].append(url)
    except Exception:
        pass
json.dump(seen, open(os.path.join(OUT, f"{os.getpid()}.json"), "w"))
raise RuntimeError("spy done")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _secrets(db_url: str) -> tuple[str, dict[str, str], list[str]]:
    """(the database URL with a password, the secret environment, the markers that must not leak)."""
    password, token, proxy = (f"secret-{uuid.uuid4().hex}" for _ in range(3))
    url = make_url(db_url)
    if url.get_backend_name() == "postgresql":  # the test server trusts: any password works
        db_url = url.set(password=password).render_as_string(hide_password=False)
    env = {"WS_TUNE_DB": db_url, "WS_TUNE_BOOTSTRAP_TOKEN": token, "HTTPS_PROXY": f"http://me:{proxy}@127.0.0.1:9"}
    return db_url, env, [password, token, proxy]


def _base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WS_TUNE_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), WS_TUNE_HEARTBEAT_INTERVAL="0.3", WS_TUNE_POLL_INTERVAL="0.1",
               WS_TUNE_KERNEL_CACHE_DIR=str(tmp_path / "kernel-cache"))  # fmt: skip
    return env


def _spy(tmp_path: Path) -> tuple[str, Path]:
    out = tmp_path / "seen"
    out.mkdir()
    return f"OUT = {str(out)!r}\n" + SPY, out


def _assert_found_nothing(out: Path, markers: list[str], sealed: dict[str, int]) -> dict[str, Any]:
    [report] = [json.loads(p.read_text()) for p in out.glob("*.json")]
    text = json.dumps(report)
    leaked = [m for m in markers if m in text]
    assert not leaked, [k for k, v in report["files"].items() if any(m in v for m in leaked)] or report["environ"]
    assert report["reached"] == []
    assert not [k for k in report["environ"] if k.startswith("WS_TUNE_")]
    for who, pid in {**sealed, "its parent (the worker)": report["ppid"]}.items():
        assert f"/proc/{pid}/environ" in report["denied"], f"{who} is readable"
    assert f"/proc/{report['pid']}/environ" in report["files"]  # reading /proc works: the denials are the seals
    return report


@pytest.mark.timeout(300)
def test_uploaded_kernel_finds_no_secret_under_serve(db_url: str, tmp_path: Path, as_in_a_container: list[str]) -> None:
    db_url, secret_env, markers = _secrets(db_url)
    port = _free_port()
    env = {**_base_env(tmp_path), **secret_env}
    serve = subprocess.Popen(
        [*as_in_a_container, sys.executable, "-m", "ws_tuner", "serve", "--port", str(port), "--workers", "1",
         "--worker-arg=--compile-only", "--no-access-log"],
        env=env, cwd=ROOT, stdout=open(tmp_path / "serve.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    source, out = _spy(tmp_path)
    try:
        api = f"http://127.0.0.1:{port}/api/v1"
        wait_for(lambda: _ready(f"{api}/ready"), 60, 0.2, "the server")
        admin = {"Authorization": f"Bearer {secret_env['WS_TUNE_BOOTSTRAP_TOKEN']}"}
        with httpx.Client(base_url=api, headers=admin, timeout=30) as client:
            job = client.post("/jobs", json={"kernel": "spy", "source": source, "problem": "M=1", "budget": 1})
            assert job.status_code == 201, job.text
            done = wait_for(lambda: (j := client.get(f"/jobs/{job.json()['id']}").json())["state"] != "queued"
                            and j["state"] != "running" and j, 120, 0.2, "the job")  # fmt: skip
        assert done["state"] == "failed" and "spy done" in done["error"], done
        _assert_found_nothing(out, markers, {"the server": serve.pid})
    finally:
        serve.terminate()
        serve.wait(60)
    assert not [m for m in markers if m in (tmp_path / "serve.log").read_text()]


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_uploaded_kernel_finds_no_secret_in_a_worker(
    pg_url: str, tmp_path: Path, as_in_a_container: list[str], live_server: Callable, make_token: Callable
) -> None:
    """`ws-tune worker` as compose runs it: the password in WS_TUNE_DB; and a careless
    deploy that also hands it the bootstrap token and proxy credentials."""
    db_url, secret_env, markers = _secrets(pg_url)
    live = live_server(pg_url)
    uploader = make_token(pg_url, "jobs:write", "kernels:upload")
    source, out = _spy(tmp_path)
    with live.client(uploader) as client:
        job = client.post("/jobs", json={"kernel": "spy", "source": source, "problem": "M=1", "budget": 1})
        assert job.status_code == 201, job.text
    worker = subprocess.Popen(
        [*as_in_a_container, sys.executable, "-m", "ws_tuner", "worker", "--compile-only", "--exit-when-idle"],
        env={**_base_env(tmp_path), **secret_env}, cwd=ROOT, stdout=open(tmp_path / "worker.log", "wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert worker.wait(180) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    with live.client() as client:
        done = client.get(f"/jobs/{job.json()['id']}").json()
    assert done["state"] == "failed" and "spy done" in done["error"], done
    _assert_found_nothing(out, markers, {})
    assert str(tmp_path) not in done["error"]  # the worker's paths stay on the worker


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
