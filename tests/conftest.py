"""Shared fixtures: the example kernel, and fresh databases on SQLite and PostgreSQL.

PostgreSQL: one uniquely named database per test session (CREATE DATABASE on
the server at $WS_TUNE_TEST_PG_URL, dropped at the end) and one schema per test
inside it, selected through ``search_path`` in the URL, so every test starts
empty and nothing ws-tune does may assume the ``public`` schema.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import URL, create_engine, make_url, text
from sqlalchemy.exc import OperationalError

from ws_tuner.store import Store

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gemm.py"
DATA = Path(__file__).resolve().parent / "data"
SHAPE = "M=4096,N=4096,K=4096"


@pytest.fixture(scope="session")
def example_path() -> Path:
    return EXAMPLE


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def gemm_spec():
    from ws_tuner.kernel import load_kernel

    return load_kernel(EXAMPLE)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty tilelang kernel cache for the spawned workers: compiles are real."""
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl-cache"))


@pytest.fixture
def uncached() -> Iterator[None]:
    """Compiles in this process past tilelang's kernel cache: a cached kernel keeps its code,
    not what it was lowered to (``compiler.shared_memory``)."""
    import tilelang

    tilelang.disable_cache()
    yield
    tilelang.enable_cache()


@pytest.fixture(scope="session")
def gemm_task(gemm_spec):
    from ws_tuner.task import Task

    # The sync form: enough for the tests that use it, and half the space to walk
    # (test_space.py and test_example_kernels.py cover the async seed).
    return Task.make(gemm_spec, gemm_spec.parse_problem(SHAPE), gemm_spec.parse_params("mma=sync,consumers=cooperative"))


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where an NVIDIA GPU is visible, and in one process:
    they time kernels, which parallel workers (``-n``) sharing the GPU would distort."""
    from ws_tuner.runner import gpu_available

    if not gpu_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA Hopper GPU")
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        skip = pytest.mark.skip(reason="GPU tests time kernels on one GPU: run them without -n")
    else:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


PG_ADMIN_URL = os.environ.get("WS_TUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[URL]:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    name = f"ws_tune_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.skip(f"PostgreSQL at {make_url(PG_ADMIN_URL).render_as_string()} is unreachable "
                    f"(set WS_TUNE_TEST_PG_URL): {' '.join(str(exc.orig).split())}")
    try:
        yield make_url(PG_ADMIN_URL).set(database=name)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_url(pg_database: URL) -> Iterator[str]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(pg_database)
    with engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield pg_database.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with engine.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """The URL of an empty database: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ws-tune.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def open_db() -> Iterator[Callable[[str], Store]]:
    """Opens stores and closes them after the test (their pools would hold connections)."""
    stores: list[Store] = []

    def _open(url: str) -> Store:
        stores.append(Store(url))
        return stores[-1]

    yield _open
    for store in stores:
        store.close()


@pytest.fixture
def store(db_url: str, open_db: Callable[[str], Store]) -> Store:
    return open_db(db_url)


# Docker's default capabilities: a worker in a container has these, not CAP_SYS_PTRACE
# or CAP_SYS_ADMIN, either of which lets root read any process's memory and environment.
DOCKER_CAPS = "chown,dac_override,fowner,fsetid,kill,setgid,setuid,setpcap,net_bind_service,net_raw,sys_chroot,mknod,audit_write,setfcap"


@pytest.fixture(scope="session")
def as_in_a_container() -> list[str]:
    """A command prefix that runs a process with a container's capabilities when the
    tests run as root (otherwise nothing: a plain user has none of those powers)."""
    import shutil

    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux) to drop capabilities")
    return [setpriv, "--bounding-set", "-all," + ",".join("+" + c for c in DOCKER_CAPS.split(",")), "--"]
