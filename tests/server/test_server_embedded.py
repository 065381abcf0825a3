"""`ws-tune serve` with no database URL: the SQLite file in ~/.cache/ws-tune and an
embedded (production, compile-only: no GPU here) worker process, end to end on a
real kernel; and the deploy files stay consistent."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import shutil

import httpx
from svc_helpers import ROOT, wait_for

from ws_tuner.server.config import OTHER_VARIABLES, Settings


def test_serve_defaults_to_sqlite_with_an_embedded_worker(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WS_TUNE_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), WS_TUNE_HEARTBEAT_INTERVAL="0.3", WS_TUNE_POLL_INTERVAL="0.1")
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "plain_gemm.py", kernels)
    # No --db, no --workers: the per-user SQLite file and one embedded worker.
    serve = subprocess.Popen(
        [sys.executable, "-m", "ws_tuner", "serve", "--port", str(port), "--kernel-dir", str(kernels),
         "--worker-arg=--compile-only", "--worker-arg=--jobs=2"],
        env=env, cwd=ROOT, stdout=open(tmp_path / "serve.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        api = f"http://127.0.0.1:{port}/api/v1"
        wait_for(lambda: _get(f"{api}/ready") == 200, 30, 0.1, "the server")
        token = subprocess.run([sys.executable, "-m", "ws_tuner", "token", "create"], env=env, cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"}) as client:
            job = client.post("/jobs", json={"kernel": "plain_gemm", "problem": "M=1024,N=1024,K=1024", "budget": 2, "strategy": "random"})
            assert job.status_code == 201, job.text
            done = wait_for(lambda: (j := client.get(f"/jobs/{job.json()['id']}").json())["state"] == "succeeded" and j, 240)
            assert done["progress"]["done"] == 2 and done["device"] == "compile-only"
            assert client.get("/ready").json()["workers_alive"] == 1
            trials = client.get(f"/jobs/{job.json()['id']}/trials").json()["data"]
            assert [t["status"] for t in trials] == ["built", "built"]  # verified and compiled by nvcc, nothing timed
            best = client.get("/best", params={"kernel": "plain_gemm", "problem": "M=1024,N=1024,K=1024", "device": "NVIDIA H200"})
            assert best.status_code == 404 and "compile-only tunings (no GPU) verify and build candidates but time nothing" in best.json()["detail"]
        assert (tmp_path / ".cache" / "ws-tune" / "ws-tune.db").is_file()
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60)
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log[-3000:]
    assert "1 embedded worker(s)" in log and "stopped: 2 trial(s) recorded" in log  # the worker drained too


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return 0


def test_deploy_files_are_consistent(monkeypatch) -> None:
    docker = ROOT / "docker"
    compose = (docker / "compose.yaml").read_text()
    for dockerfile in ("server.Dockerfile", "worker.Dockerfile"):
        text = (docker / dockerfile).read_text()
        assert f"dockerfile: docker/{dockerfile}" in compose
        for source in re.findall(r"^COPY (\S+)", text, re.M):
            assert (ROOT / source).exists(), f"{dockerfile} copies {source}, which does not exist"
    prestart = (docker / "prestart.sh").read_text()
    assert "ws-tune db upgrade" in prestart and 'exec "$@"' in prestart
    assert os.access(docker / "prestart.sh", os.X_OK)
    # Every WS_TUNE_* name used by the deploy files is a setting (or the store's WS_TUNE_DB).
    fields = {f"WS_TUNE_{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    used = set(re.findall(r"WS_TUNE_[A-Z_]+", compose + (docker / "server.Dockerfile").read_text()
                          + (docker / "worker.Dockerfile").read_text() + (ROOT / "configs" / "service.env.example").read_text()))
    assert used <= fields, used - fields
    monkeypatch.setenv("WS_TUNE_CONFIG", str(ROOT / "configs" / "service.toml"))
    monkeypatch.chdir(ROOT)
    settings = Settings()
    assert settings.port == 8000 and settings.grace == 15.0 and settings.kernel_dirs == [Path("examples")]
