"""Where ws-tune keeps every result: SQLite by default, PostgreSQL by URL.

Layers, each a module; SQL lives in this package only:

* ``engine.py``: URLs, engines, sessions, and the dialects' differences (``Sql``);
  ``guard.py`` bounds every PostgreSQL wait; ``schema.py`` applies the Alembic
  migrations in ``migrations/`` (installed as ``ws_tuner.migrations``);
* ``models.py``: the tables; ``records.py``: the frozen records handed out and
  their row mappers;
* ``repository.py``: results (``Store``); ``registry.py``: kernels, tokens, lookups;
* the service's job queue (``queue.JobQueue``): ``jobs.py``, ``leases.py``,
  ``workers.py``, ``sweeper.py``, and the sampler's Optuna storage (``sampler.py``).
"""

from .engine import StoreError, default_db_url, mask_url, resolve_db_url
from .records import StoredTrial
from .repository import Store, open_store
from .schema import SchemaOutdatedError, current_revision, head_revision, upgrade

__all__ = [
    "SchemaOutdatedError",
    "Store",
    "StoreError",
    "StoredTrial",
    "current_revision",
    "default_db_url",
    "head_revision",
    "mask_url",
    "open_store",
    "resolve_db_url",
    "upgrade",
]
