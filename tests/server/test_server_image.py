"""The server image has neither torch nor tilelang: ``ws-tune db upgrade``, the
app, kernel registration and a job's submission must work where importing
either fails, and the deploy files must hand the settings of
configs/service.env.example to the containers without breaking them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from svc_helpers import EXAMPLES, ROOT, SHAPE

from ws_tuner.server.config import Settings

# As in the image: importing the kernel stack fails (a meta path finder, before any other).
NO_KERNEL_STACK = '''
import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "tilelang", "tvm", "tvm_ffi"):
            raise ModuleNotFoundError(f"No module named {name!r} (not in the server image)")
        return None
sys.meta_path.insert(0, _Absent())
'''

SERVER = NO_KERNEL_STACK + '''
import secrets
from starlette.testclient import TestClient
from ws_tuner.cli import main
from ws_tuner.server.config import Settings
from ws_tuner.server.main import create_app
from ws_tuner.server.security import display_prefix, generate_token, hash_token
from ws_tuner.store import open_store
from ws_tuner.store.registry import Registry

db, examples = sys.argv[1], sys.argv[2]
try:
    main(["db", "upgrade", "--db", db])  # the image's prestart
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
token = generate_token()
with open_store(db) as store:
    Registry(store).add_token(name="t", token_hash=hash_token(token), prefix=display_prefix(token), scopes=("jobs:write",))
with TestClient(create_app(Settings(db=db, kernel_dirs=[examples]))) as client:
    assert client.get("/api/v1/ready").status_code == 200
    names = sorted(k["name"] for k in client.get("/api/v1/kernels").json()["data"])
    job = client.post("/api/v1/jobs", json={"kernel": "gemm", "problem": "%s", "budget": 4},
                      headers={"Authorization": "Bearer " + token})
    assert job.status_code == 201, job.text
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tilelang", "tvm"))
print("kernels", names, "loaded", loaded)
''' % SHAPE


def test_the_server_runs_without_torch_and_tilelang(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SERVER, f"sqlite:///{tmp_path / 's.db'}", str(EXAMPLES)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'gemm'" in proc.stdout and proc.stdout.rstrip().endswith("loaded []"), proc.stdout


def test_importing_the_server_app_loads_no_kernel_stack() -> None:
    code = "import sys, ws_tuner.cli, ws_tuner.server.main, ws_tuner.server.service; " \
           "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tilelang', 'tvm')))"  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_the_server_image_installs_neither_torch_nor_tilelang() -> None:
    dockerfile = (ROOT / "docker" / "server.Dockerfile").read_text()
    installs = " ".join(line for line in dockerfile.splitlines() if "pip install" in line)
    assert "torch" not in installs and "--no-deps" in installs and "-c constraints.txt" in installs


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {k: v for k, v in pairs}


def test_compose_hands_the_env_example_to_the_containers(monkeypatch) -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    for name in ("server", "worker-0"):
        service = compose["services"][name]
        (env_file,) = service["env_file"]
        path = env_file["path"] if isinstance(env_file, dict) else env_file
        assert "configs/service.env.example" in path
        env = {**_env_file(ROOT / "configs" / "service.env.example"), **{k: str(v) for k, v in service["environment"].items()}}
        env = {k: re.sub(r"\$\{[^}]*\}", "", re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", v)) for k, v in env.items()}  # compose's substitutions
        for key in [k for k in os.environ if k.startswith("WS_TUNE_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = Settings()  # every variable known, every value valid
        if name == "server":
            assert settings.host == "0.0.0.0" and settings.kernel_dirs == [Path("/opt/ws-tune/kernels")]
        else:
            assert settings.bootstrap_token is None  # a worker never gets it
