"""The job's sampler state: Optuna's RDB storage on the store's database, so that
workers on any host share a job's study (``study_name``)."""

from __future__ import annotations

import threading
from typing import Any

from .engine import StoreError, configure_connections, connect_args_for, mask_url
from .guard import DbTimeouts


def study_name(job_id: int) -> str:
    """The Optuna study that holds a job's sampler state."""
    return f"job-{job_id}"


def optuna_storage(url: str, *, attempts: int = 5, timeouts: DbTimeouts | None = None,
                   abort: threading.Event | None = None) -> Any:
    """Optuna's RDB storage on the store's database. On SQLite its connections get
    the store's treatment (WAL, ``BEGIN IMMEDIATE``, a long busy timeout): Optuna's
    own read-then-write transactions otherwise fail at once with "database is
    locked" under concurrent workers. On PostgreSQL, the store's bounds on every
    wait (guard.py). Creating the tables races between workers starting
    together, so it is retried, unless ``abort`` is set: each attempt on a silent
    database costs its connect timeout, and a worker leaving must not spend five."""
    import optuna
    from sqlalchemy import make_url

    timeouts = timeouts or DbTimeouts()
    connect_args = connect_args_for(make_url(url), timeouts)
    last: Exception | None = None
    abort = abort or threading.Event()
    storage = None
    for attempt in range(attempts):
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": connect_args})
            break
        except Exception as exc:  # noqa: BLE001 - optuna wraps driver errors variously
            last = exc
            if abort.wait(0.2 * (attempt + 1)):
                break
    if storage is None:
        raise StoreError(f"cannot open Optuna storage at {mask_url(url)}: {' '.join(str(last).split())[:300]}")
    configure_connections(storage.engine, timeouts)
    storage.engine.dispose()  # connections made so far lack the listeners
    return storage
