"""The database a user names (``--db``, ``WS_TUNE_DB``, the service's ``db``),
checked and spelled as SQLAlchemy wants before anything is opened: a typo must
not silently become a new SQLite file, and ``postgres://`` (Heroku's and many
tools' spelling) means PostgreSQL through psycopg 3, the driver ws-tune installs."""

from __future__ import annotations

from pathlib import Path

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
PSYCOPG = "postgresql+psycopg"


def check_db_url(value: str, what: str = "--db") -> str:
    """``value`` as a URL or SQLite path ws-tune can open, else ValueError (one line;
    a password in ``value`` is never echoed)."""
    value = value.strip()
    if "://" not in value:
        path = Path(value).expanduser()
        if path.suffix.lower() in SQLITE_SUFFIXES or path.is_file():
            return value
        raise ValueError(
            f"{what} {value!r} is neither a database URL (sqlite:///PATH, postgresql://USER@HOST/DB) "
            f"nor a SQLite file path ending in {', '.join(SQLITE_SUFFIXES)}"
        )
    scheme, rest = value.split("://", 1)
    backend, _, driver = scheme.lower().partition("+")
    if backend in ("postgres", "postgresql"):
        return f"{'postgresql+' + driver if driver else PSYCOPG}://{rest}"
    if backend == "sqlite":
        return value
    raise ValueError(
        f"{what}: unsupported database {scheme}://...; ws-tune stores results in SQLite "
        "(a .db path or sqlite:///PATH) or PostgreSQL (postgresql://USER@HOST/DB)"
    )
