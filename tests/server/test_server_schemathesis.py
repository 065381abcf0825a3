"""Property-based API fuzzing with schemathesis against the OpenAPI spec of a real
uvicorn server (SQLite, and PostgreSQL when reachable): no 5xx for anything the
generator sends, and every operation that declares a token refuses to run
without one (401), and with an invalid one.

Kept to a few dozen examples per operation so that the suite stays fast; run
with WS_TUNE_FUZZ_EXAMPLES=500 for a longer hunt.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import ignored_auth
from svc_helpers import fast_settings, wait_for

from ws_tuner.server.main import create_app
from ws_tuner.server.security import display_prefix, generate_token, hash_token

EXAMPLES = int(os.environ.get("WS_TUNE_FUZZ_EXAMPLES", "15"))
TOKEN = generate_token()  # admin; its hash goes into each fuzzed database


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
schema = schemathesis.openapi.from_dict(_spec())


@schema.auth()
class Bearer:
    """The token comes from an auth provider, so that `ignored_auth` can take it away."""

    def get(self, case: Any, ctx: Any) -> str:
        return TOKEN

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors_and_auth_enforced(case: Any, fuzzed: str) -> None:
    case.call_and_validate(base_url=fuzzed, checks=[not_a_server_error, ignored_auth])


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
