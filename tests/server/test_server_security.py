"""Security: hashed tokens, the token CLI, no secret in logs, no exposed server
without a token, uploaded code never imported by the server, settings."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from sqlalchemy import create_engine, text
from svc_helpers import EXAMPLES, ROOT, SHAPE, wait_for

from ws_tuner.server.config import Settings, load_settings
from ws_tuner.server.security import is_loopback, parse_scopes
from ws_tuner.server.process import check_bind
from ws_tuner.store.registry import Registry


def ws_tune(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "WS_TUNE_DB": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ws_tuner", *args], capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)


def _dump(db_url: str) -> str:
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT * FROM ws_tune_tokens")).fetchall()
    finally:
        engine.dispose()
    return repr(rows)


def cli(*args: str) -> Any:
    """`ws-tune ARGS` in this process (typer's runner): exit code, stdout, stderr."""
    from typer.testing import CliRunner

    from ws_tuner.cli import app

    return CliRunner().invoke(app, list(args))


def test_token_cli_stores_only_a_hash(db_url: str) -> None:
    created = cli("token", "create", "--name", "ci", "--scope", "jobs:write,kernels:upload", "--db", db_url)
    assert created.exit_code == 0, created.output
    token = created.stdout.strip()
    assert token.startswith("wst_") and len(token) >= 40 and "\n" not in token
    assert "shown once" in created.stderr and token not in created.stderr
    dump = _dump(db_url)
    assert token not in dump and hashlib.sha256(token.encode()).hexdigest() in dump

    listed = cli("token", "list", "--db", db_url)
    assert listed.exit_code == 0 and token not in listed.stdout and token[:10] in listed.stdout and "ci" in listed.stdout
    bad = cli("token", "create", "--scope", "root", "--db", db_url)
    assert bad.exit_code == 2 and "unknown scope 'root'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert cli("token", "revoke", token[:10], "--db", db_url).exit_code == 0
    missing = cli("token", "revoke", token[:10], "--db", db_url)
    assert missing.exit_code == 1 and "no active token" in missing.stderr


def test_no_token_or_secret_in_logs(db_url: str, live_server: Callable, make_token: Callable) -> None:
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write")
    wrong = "wst_" + "A" * 43
    with live.client(token) as client:
        assert client.post("/jobs", json={"kernel": "gemm", "problem": SHAPE, "budget": 2}).status_code == 201
        assert client.post("/jobs", json={"kernel": "gemm", "problem": SHAPE}, headers={"Authorization": f"Bearer {wrong}"}).status_code == 401
        assert client.get("/jobs", params={"state": "nope"}).status_code == 422
    assert any("POST /api/v1/jobs" in line for line in live.log)  # the access log was captured...
    joined = "\n".join(live.log)
    assert token not in joined and wrong not in joined and "Bearer" not in joined  # ...and holds no secret


def test_refuses_non_loopback_bind_without_a_token(tmp_path: Path, open_db: Callable) -> None:
    db = f"sqlite:///{tmp_path / 'exposed.db'}"
    refused = ws_tune("serve", "--host", "0.0.0.0", "--port", "1", "--db", db, "--workers", "0")
    assert refused.returncode == 2, refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "refusing to listen on 0.0.0.0" in lines[0] and "ws-tune token create" in lines[0]
    assert "Traceback" not in refused.stderr

    registry = Registry(open_db(db))
    exposed = Settings(host="0.0.0.0", db=db)
    with pytest.raises(ValueError, match="refusing"):
        check_bind(exposed, registry)
    check_bind(Settings(host="127.0.0.1", db=db), registry)  # loopback needs nothing
    check_bind(Settings(host="0.0.0.0", db=db, bootstrap_token=secrets.token_urlsafe(32)), registry)  # an explicit token
    registry.add_token(name="t", token_hash="0" * 64, prefix="wst_x", scopes=("read",))
    check_bind(exposed, registry)  # a token in the database
    for host, loopback in [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True), ("localhost", True),
                           ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("gpu-box.internal", False)]:  # fmt: skip
        assert is_loopback(host) is loopback, host


def test_settings_sources_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "service.toml"
    config.write_text('port = 9001\nheartbeat_interval = 2.5\nkernel_dirs = ["/opt/kernels"]\n')
    monkeypatch.setenv("WS_TUNE_CONFIG", str(config))
    monkeypatch.setenv("WS_TUNE_PORT", "9002")  # the environment beats the file
    monkeypatch.setenv("WS_TUNE_KERNEL_DIRS", "/a,/b")
    settings = load_settings(host="127.0.0.2")  # arguments beat both
    assert (settings.port, settings.heartbeat_interval, settings.host) == (9002, 2.5, "127.0.0.2")
    assert settings.kernel_dirs == [Path("/a"), Path("/b")] and settings.grace == 7.5
    monkeypatch.setenv("WS_TUNE_BOOTSTRAP_TOKEN", "changethis")
    with pytest.raises(ValueError, match="bootstrap_token"):
        load_settings()
    bootstrap = secrets.token_urlsafe(32)
    monkeypatch.setenv("WS_TUNE_BOOTSTRAP_TOKEN", bootstrap)
    assert load_settings().bootstrap_token is not None and bootstrap not in repr(load_settings())
    assert parse_scopes(None) == ("read", "jobs:write") and parse_scopes(["admin,read", "admin"]) == ("admin", "read")


def test_bootstrap_token_is_an_admin(db_url: str, live_server: Callable) -> None:
    secret = secrets.token_urlsafe(32)
    live = live_server(db_url, bootstrap_token=secret)
    with live.client(secret) as client:
        assert client.post("/kernels", json={"name": "k", "source": "PROBLEM = {}\n"}).status_code == 201
        assert client.post("/jobs", json={"kernel": "gemm", "problem": SHAPE, "budget": 1}).status_code == 201
    with live.client(secret[:-1]) as client:
        assert client.post("/jobs", json={"kernel": "gemm", "problem": SHAPE, "budget": 1}).status_code == 401


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_uploaded_source_runs_only_in_a_worker_process(
    db_url: str, live_server: Callable, make_token: Callable, spawn_worker: Callable, tmp_path: Path
) -> None:
    marker = tmp_path / "imported-by.txt"
    payload = f"import os\nopen({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
    source = payload + (EXAMPLES / "gemm.py").read_text()
    live = live_server(db_url)
    token = make_token(db_url, "jobs:write", "kernels:upload")
    with live.client(token) as client:
        job = client.post("/jobs", json={"kernel": "evil_gemm", "source": source, "problem": SHAPE, "budget": 1, "strategy": "random"})
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        uploaded = client.get(f"/kernels/{job.json()['kernel_sha256']}").json()
        assert uploaded["name"] == "evil_gemm" and uploaded["registered"] is False and "source" not in uploaded
        assert client.get(f"/jobs/{job_id}").json()["state"] == "queued"
    assert not marker.exists()  # stored, parsed for syntax, never imported by the server
    assert not [m for m in sys.modules if m.startswith("ws_tune_kernel_evil")]

    # The real (spawned) compile pool, compile-only: four nvcc builds (three baselines and one search).
    worker = spawn_worker(db_url, "--compile-only", "--jobs", "2", "--exit-when-idle")
    with live.client() as client:
        done = wait_for(lambda: (j := client.get(f"/jobs/{job_id}").json())["state"] in ("succeeded", "failed") and j, 300)
    assert done["state"] == "succeeded", done
    assert worker.wait(timeout=60) == 0
    pids = set(marker.read_text().split())
    # Imported by the worker's spawned children only: neither the server nor the
    # worker's own process (which holds the database credentials) ran it.
    assert pids and str(os.getpid()) not in pids and str(worker.pid) not in pids
