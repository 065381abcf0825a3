"""Alembic environment for ws-tune's schema.

Driven in code by ``ws_tuner.store.schema`` (there is no alembic.ini on
disk): it builds a ``Config`` whose ``script_location`` is this directory and
passes a live connection in ``config.attributes["connection"]``, so migrations
run inside the caller's transaction (and lock). A URL in
``config.attributes["url"]`` or ``sqlalchemy.url`` works too, e.g. for
``alembic revision --autogenerate`` with a hand-written ini.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Connection

from ws_tuner.store.models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    # Autogenerate compares only ws-tune's own tables. Optuna's (or anyone's)
    # tables in the same database would otherwise show up as "removed" and a
    # generated migration would drop them.
    return type_ != "table" or name in target_metadata.tables


def _options(sqlite: bool) -> dict[str, Any]:
    return {
        "target_metadata": target_metadata,
        "version_table": VERSION_TABLE,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        "render_as_batch": sqlite,
        "include_name": _include_name,
        "compare_type": True,
    }


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("ws-tune migrations need a connection or a URL in the Alembic config")
    return str(url)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, **_options(connection.dialect.name == "sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    url = _url()
    context.configure(url=url, literal_binds=True, **_options(url.startswith("sqlite")))
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
