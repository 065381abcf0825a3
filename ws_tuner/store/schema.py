"""The store's schema: the Alembic migrations in ``migrations/`` (installed as
``ws_tuner.migrations``), applied in code, and the check a store makes when it opens.

``SchemaOutdatedError`` is the one a user fixes with ``ws-tune db upgrade``.
"""

from __future__ import annotations

import importlib.resources
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Engine, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .engine import Database, Sql, StoreError, make_engine, mask_url, one_line, open_failure
from .models import VERSION_TABLE, Base

_log = logging.getLogger(__name__)

# The migrations (migrations/ in the repository) install as ws_tuner.migrations, so an
# installed wheel can create and upgrade its own schema without a checkout or an alembic.ini.
MIGRATIONS_DIR = Path(str(importlib.resources.files("ws_tuner.migrations")))
# pg_advisory_xact_lock key ("ws_tune" in ASCII) held while migrating, so that two
# workers opening a fresh database at once do not both create the tables.
_MIGRATION_LOCK_KEY = 0x77735F74756E65


class SchemaOutdatedError(StoreError):
    """The database's schema is older than this ws-tune's; ``ws-tune db upgrade`` fixes it."""

    def __init__(self, url: str, current: str, head: str) -> None:
        self.current, self.head = current, head
        super().__init__(
            f"database at {url} has schema revision {current}; this ws-tune needs {head}: "
            f"run `ws-tune db upgrade --db {url}`"
        )


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config built in code; env.py takes the URL or a connection from ``attributes``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.attributes["url"] = url
    return config


def head_revision() -> str:
    """The schema revision this ws-tune writes and expects."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


def known_revisions() -> set[str]:
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def schema_state(connection: Connection) -> tuple[str | None, bool]:
    """(stamped revision, whether any ws-tune table exists)."""
    tables = set(inspect(connection).get_table_names())
    revision = None
    if VERSION_TABLE in tables:
        revision = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
    return revision, bool(tables & set(Base.metadata.tables))


def migrate(engine: Engine, revision: str = "head") -> None:
    """Apply the migrations up to ``revision``."""
    # One transaction for all of it: the tables and the stamp appear together or
    # not at all. Concurrent migrators serialize on a lock (SQLite: BEGIN IMMEDIATE,
    # PostgreSQL: an advisory lock); the later one finds the schema at head.
    with engine.begin() as connection:
        Sql(connection.dialect.name).transaction_lock(connection, _MIGRATION_LOCK_KEY)
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(url: str) -> str | None:
    """The revision stamped in the database at ``url`` (None when it has none)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return schema_state(connection)[0]
    except DBAPIError as exc:
        raise open_failure(url, exc) from None
    finally:
        engine.dispose()


def upgrade(url: str) -> str:
    """Apply the migrations up to head (a no-op at head); returns the new revision."""
    engine = make_engine(url)
    try:
        migrate(engine)
        with engine.connect() as connection:
            revision = schema_state(connection)[0]
    except (DBAPIError, CommandError) as exc:
        raise StoreError(f"cannot upgrade ws-tune database at {mask_url(url)}: {one_line(exc)}") from None
    finally:
        engine.dispose()
    assert revision is not None
    return revision


def stamped_revision(db: Database) -> str | None:
    """The revision stamped in ``db`` (readiness probes)."""
    try:
        with db.engine.connect() as connection:
            return schema_state(connection)[0]
    except DBAPIError as exc:
        raise db.error(exc) from None


def ensure_schema(db: Database) -> None:
    """Create the schema in a database fresh for ws-tune; refuse one at another revision.

    Called as a store opens: a wrong URL fails here, once, with a clear message,
    rather than in the middle of a tuning run."""
    try:
        with db.engine.connect() as connection:
            revision, has_tables = schema_state(connection)
    except DBAPIError as exc:
        raise open_failure(db.url, exc) from None
    head = head_revision()
    if revision is None and not has_tables:
        # Fresh for ws-tune (other tools' tables may be there): create the schema.
        try:
            migrate(db.engine)
        except (DBAPIError, CommandError) as exc:
            raise StoreError(f"cannot create the ws-tune schema at {db.display_url}: {one_line(exc)}") from None
        _log.info("created ws-tune schema %s at %s", head, db.display_url)
    elif revision is None:
        raise StoreError(
            f"database at {db.display_url} has ws-tune tables but no revision in {VERSION_TABLE}; "
            "it was not created by ws-tune's migrations"
        )
    elif revision != head:
        if revision in known_revisions():
            raise SchemaOutdatedError(db.display_url, revision, head)
        raise StoreError(
            f"database at {db.display_url} has schema revision {revision}, unknown to this ws-tune "
            f"(head {head}): it was written by a newer ws-tune; upgrade ws-tune to use it"
        )
