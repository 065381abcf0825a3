"""``ws-tune dashboard``: the web dashboard of a database, without running a service's workers."""

from __future__ import annotations

from typing import Optional

import typer

from .common import DbOpt, app, err, handles_errors


@app.command()
@handles_errors
def dashboard(
    db: Optional[str] = DbOpt,
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default 127.0.0.1; others need a token)"),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default 8000)"),
) -> None:
    """Browse the database's tunings and jobs in a web page: leaderboards, best-so-far plots,
    schedules, job progress (http://HOST:PORT/dashboard; it needs no internet)."""
    from ..server.config import load_settings
    from ..server.dashboard import PAGE
    from ..server.process import serve as run_server

    # The service's app with no workers: the dashboard reads what tunings and jobs stored.
    settings = load_settings(host=host, port=port, db=db, workers=0, http_workers=1)
    err.print(f"dashboard at http://{settings.host}:{settings.port}{PAGE} (Ctrl-C stops it)")
    run_server(settings)
