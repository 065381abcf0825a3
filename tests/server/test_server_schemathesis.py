"""Property-based API fuzzing with schemathesis against the OpenAPI spec of a real
uvicorn server (SQLite, and PostgreSQL when reachable), with every check
schemathesis has: no 5xx; every status, header, content type and body as
documented; schema-violating requests refused (strict types, bounded numbers,
no unknown parameters); schema-valid ones accepted; every operation that
declares a token refuses to run without one.

Two allowances, written in CONFIG. A request can be valid by the schema and
still wrong for this server, which no JSON Schema can say: a kernel source
that is not Python, a problem the kernel does not take, an unregistered kernel
name (422), cancelling a job that has finished (409), a body over the server's
byte limit (413; the schema counts characters). Those four operations may
answer so to schema-valid data; every other operation may not. And a request
refused for its size (413) counts as refused, as a 422 would. 5xx is never
expected. Hooks (schemathesis_hooks.py) drop generated path and query values
that cannot be sent as generated (an empty list vanishes from the URL; the list
[8] reads as the valid 8), and give such a value of the coverage phase, which
runs no filter hook, the valid form it is read as.

Kept to a few dozen examples per operation so that the suite stays fast; run
with WS_TUNE_FUZZ_EXAMPLES=500 for a longer hunt. The schemathesis command line
(``st run --checks all``, with its stateful phase) runs against each backend too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
import schemathesis_hooks  # noqa: F401 - registers the hook
from svc_helpers import fast_settings, wait_for

from ws_tuner.server.main import create_app
from ws_tuner.server.security import display_prefix, generate_token, hash_token

EXAMPLES = int(os.environ.get("WS_TUNE_FUZZ_EXAMPLES", "15"))
TOKEN = generate_token()  # admin; its hash goes into each fuzzed database
CONFIG = """
checks.negative_data_rejection.expected-statuses = ["400", "401", "403", "404", "406", "413", "422", "428"]

[[operations]]
include-operation-id = ["jobs-create_job", "kernels-upload_kernel", "best-get_best", "jobs-cancel_job"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "413", "422"]
"""


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def fuzzed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("fuzz")
    if request.param == "sqlite":
        db_url = f"sqlite:///{tmp / 'fuzz.db'}"
    else:
        import uuid

        from sqlalchemy import create_engine, text

        pg = request.getfixturevalue("pg_database")
        schema = f"fuzz_{uuid.uuid4().hex[:8]}"
        engine = create_engine(pg)
        with engine.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        engine.dispose()
        db_url = pg.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    app = create_app(fast_settings(db_url, tmp, max_budget=1000))
    app.state.services.registry.add_token(name="fuzz", token_hash=hash_token(TOKEN), prefix=display_prefix(TOKEN), scopes=("admin",))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 15)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)


def _spec() -> dict[str, Any]:
    # The spec needs no database: the app is assembled around a placeholder.
    from ws_tuner.server.config import Settings

    return create_app(Settings(), services=object()).openapi()  # type: ignore[arg-type]


# Built at import: schemathesis 4.6's lazy fixture loader reads pytest internals
# that pytest 9 no longer has (`Function._nodeid`); the eager schema does not.
schema = schemathesis.openapi.from_dict(_spec(), config=SchemathesisConfig.from_str(CONFIG))


@schema.auth()
class Bearer:
    """The token comes from an auth provider, so that `ignored_auth` can take it away."""

    def get(self, case: Any, ctx: Any) -> str:
        return TOKEN

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_every_check(case: Any, fuzzed: str) -> None:
    case.call_and_validate(base_url=fuzzed)  # no `checks=`: all of them


def test_schemathesis_command_line(fuzzed: str, tmp_path: Path) -> None:
    """`st run --checks all` as an outside tester runs it: every phase, stateful included."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    st = Path(sys.executable).with_name("st")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [str(st), "--no-color", "--config-file", str(config), "run", f"{fuzzed}/openapi.json", "--checks", "all",
         "--url", fuzzed, "-H", f"Authorization: Bearer {TOKEN}", "--max-examples", str(EXAMPLES), "--seed", "1"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[run.stdout.find("FAILURES"):][:6000]
    assert "Failures:" not in run.stdout and "Test cases:" in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("sent, query, mode", [("3", {}, "positive"), (["3"], None, "positive"), ("%33", {"limit": "5"}, "positive"),
                                              ("3", {"limit": "2.06"}, "negative"), ("0", {}, "negative"), ("false", {}, "negative")])  # fmt: skip
def test_a_coverage_value_read_as_a_valid_one_is_checked_as_valid(sent: Any, query: Any, mode: str) -> None:
    """The coverage phase means a job id "3" (a random string, or the list [3]) as wrongly
    typed; the server reads the integer 3, and a 200 to it is no accepted negative data."""
    from schemathesis.generation import GenerationMode
    from schemathesis.generation.hypothesis.builder import _iter_coverage_cases

    operation = schema["/api/v1/jobs/{job_id}/trials"]["GET"]
    case = next(c for c in _iter_coverage_cases(operation=operation, generation_modes=[GenerationMode.NEGATIVE],
                                                generate_duplicate_query_parameters=False, unexpected_methods=set(),
                                                generation_config=schema.config.generation) if c.meta.phase.data.parameter == "job_id")  # fmt: skip
    case.path_parameters, case.query = {"job_id": sent}, query
    assert case.meta.generation.mode.is_negative
    schemathesis_hooks.before_call(None, case, {})
    assert case.meta.generation.mode.value == mode
    assert case.formatted_path.endswith(f"/{case.path_parameters['job_id']}/trials")


def test_every_mutation_needs_a_token(fuzzed: str) -> None:
    spec = httpx.get(f"{fuzzed}/openapi.json").json()
    mutations = [(path, method) for path, ops in spec["paths"].items() for method in ops if method in ("post", "put", "patch", "delete")]
    assert len(mutations) == 3  # jobs-create_job, jobs-cancel_job, kernels-upload_kernel
    with httpx.Client(base_url=fuzzed) as client:
        for path, method in mutations:
            assert spec["paths"][path][method]["security"] == [{"HTTPBearer": []}], path
            url = path.replace("{job_id}", "1")
            for headers in ({}, {"Authorization": "Bearer wst_invalid"}, {"Authorization": f"Token {TOKEN}"}):
                response = client.request(method.upper(), url, json={}, headers=headers)
                assert response.status_code == 401, (path, headers, response.text)
                assert isinstance(response.json()["detail"], str)


def test_openapi_declares_one_error_shape() -> None:
    """Every operation: malformed requests (400, JSON or the HTTP server's plain
    text), and every other error as ErrorPublic; no list-shaped validation errors."""
    spec = _spec()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert set(responses["400"]["content"]) == {"application/json", "text/plain"}, (method, path)
            for status, response in responses.items():
                if status.startswith(("4", "5")) and status != "400":
                    assert response["content"] == {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorPublic"}}}
            if operation.get("parameters") or "requestBody" in operation:
                assert "422" in responses, (method, path)
            if method == "post":
                assert {"401", "403", "408", "413", "503"} <= set(responses), (method, path)
