"""Where ws-tune keeps every result: SQLite by default, PostgreSQL by URL.

``repository.py`` is the only module that issues SQL; ``models.py`` holds the
tables; the schema comes from the Alembic migrations in ``migrations/`` (installed as ``ws_tuner.migrations``).
"""

from .repository import (
    SchemaOutdatedError,
    Store,
    StoredTrial,
    StoreError,
    current_revision,
    default_db_url,
    head_revision,
    open_store,
    resolve_db_url,
    upgrade,
)

__all__ = [
    "SchemaOutdatedError",
    "Store",
    "StoreError",
    "StoredTrial",
    "current_revision",
    "default_db_url",
    "head_revision",
    "open_store",
    "resolve_db_url",
    "upgrade",
]
