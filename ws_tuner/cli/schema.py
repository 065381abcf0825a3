"""``ws-tune db upgrade|current``: the database schema."""

from __future__ import annotations

from typing import Optional

from .common import (
    DbOpt,
    db_app,
    handles_errors,
    out,
)

# --- db ---------------------------------------------------------------------


@db_app.command("upgrade")
@handles_errors
def db_upgrade(db: Optional[str] = DbOpt) -> None:
    """Apply the migrations up to this ws-tune's schema."""
    from ..store import resolve_db_url, upgrade
    from ..store import mask_url

    url = resolve_db_url(db)
    revision = upgrade(url)
    out.print(f"{mask_url(url)} is at schema revision {revision}")


@db_app.command("current")
@handles_errors
def db_current(db: Optional[str] = DbOpt) -> None:
    """Print the database's schema revision and this ws-tune's."""
    from ..store import current_revision, head_revision, resolve_db_url

    out.print(f"database: {current_revision(resolve_db_url(db)) or 'empty'}; this ws-tune: {head_revision()}")
