"""``ws-tune jobs list|show|watch|cancel``: the service's jobs, over its REST API.

The server is ``--url`` (or ``$WS_TUNE_URL``, default http://127.0.0.1:8000) and
the token ``--token`` (or ``$WS_TUNE_TOKEN``; loopback reads need none). A server
that cannot be reached, or refuses, is one line: exit 2 for what the user can
fix (the URL, the token), 1 for a job that does not exist or a server error.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .common import EXIT_BAD_INPUT, EXIT_NOT_FOUND, _fail, app, err, failure_lines, handles_errors, out, rate_text

jobs_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Jobs of a ws-tune server: list, show, watch, cancel.")
app.add_typer(jobs_app, name="jobs")

URL_ENV, TOKEN_ENV = "WS_TUNE_URL", "WS_TUNE_TOKEN"
FINAL = ("succeeded", "failed", "cancelled")
UrlOpt = typer.Option("http://127.0.0.1:8000", "--url", envvar=URL_ENV, help=f"The server (also ${URL_ENV})")
TokenOpt = typer.Option(None, "--token", envvar=TOKEN_ENV, help=f"API token (also ${TOKEN_ENV}); loopback reads need none")
JobArg = typer.Argument(..., min=1, help="Job id (see `ws-tune jobs list`)")


class Api:
    """The few calls the commands make, each answer checked: errors become one line."""

    def __init__(self, url: str, token: Optional[str]) -> None:
        import httpx

        if not url.startswith(("http://", "https://")):
            raise _fail(f"--url {url!r} is not an http:// or https:// address")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=f"{self.url}/api/v1", headers=headers, timeout=30)

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            response = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise _fail(f"cannot reach the ws-tune server at {self.url}: {exc or type(exc).__name__} "
                        f"(is `ws-tune serve` running? --url or ${URL_ENV} names another)") from None  # fmt: skip
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text.strip()[:200] or response.reason_phrase
            code = EXIT_NOT_FOUND if response.status_code == 404 or response.status_code >= 500 else EXIT_BAD_INPUT
            hint = f" (give a token: --token or ${TOKEN_ENV})" if response.status_code == 401 else ""
            raise _fail(f"{method} {path}: {response.status_code} {detail}{hint}", code)
        return response.json()


def _problem(job: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in job["problem"].items())


def _progress(job: dict[str, Any]) -> str:
    p = job["progress"]
    extra = p["baselines"]["done"] + p["baselines"]["failed"]
    return f"{p['done'] + p['failed']}/{p['budget']}" + (f" +{extra} baselines" if extra else "")


def _best(job: dict[str, Any]) -> str:
    return f"{job['best']['median_ms']:.4f} ms" if job.get("best") else "-"


@jobs_app.command("list")
@handles_errors
def jobs_list(
    state: Optional[str] = typer.Option(None, "--state", help="Only jobs in this state: queued, running, succeeded, failed, cancelled"),
    limit: int = typer.Option(50, "--limit", min=1, max=500, help="How many of the newest jobs"),
    url: str = UrlOpt,
    token: Optional[str] = TokenOpt,
) -> None:
    """List the server's jobs, newest first, with their progress."""
    page = Api(url, token)("GET", "/jobs", params={k: v for k, v in dict(state=state, limit=limit).items() if v is not None})
    table = Table(title=f"jobs ({len(page['data'])} of {page['count']})")
    for col in ("id", "state", "kernel", "problem", "strategy", "search done", "best", "created"):
        table.add_column(col, justify="right" if col in ("id", "search done") else "left")
    for job in page["data"]:
        table.add_row(str(job["id"]), job["state"], job["kernel"], _problem(job), job["strategy"], _progress(job), _best(job),
                      job["created_at"][:19].replace("T", " "))  # fmt: skip
    out.print(table)


@jobs_app.command("show")
@handles_errors
def jobs_show(
    job_id: int = JobArg,
    trials: int = typer.Option(20, "--trials", min=0, max=500, help="How many of its trials to list (0: none)"),
    url: str = UrlOpt,
    token: Optional[str] = TokenOpt,
) -> None:
    """Show one job: its settings, progress, best result, and its trials."""
    api = Api(url, token)
    job = api("GET", f"/jobs/{job_id}")
    out.print(f"job {job['id']}: {job['state']}; {job['kernel']} at {_problem(job)}"
              f"{' params ' + job['params'] if job['params'] else ''}; {job['strategy']} (seed {job['seed']}); "
              f"search {_progress(job)}; best {_best(job)}{'; device ' + job['device'] if job['device'] else ''}")  # fmt: skip
    if job.get("error"):
        out.print(f"error: {job['error']}")
    if not trials:
        return
    page = api("GET", f"/jobs/{job_id}/trials", params={"limit": trials})
    table = Table(title=f"trials ({len(page['data'])} of {page['count']})")
    for col in ("slot", "kind", "state", "status", "lowering", "TFLOP/s", "median ms", "params"):
        table.add_column(col, justify="right" if col in ("slot", "TFLOP/s", "median ms") else "left")
    for t in page["data"]:
        params = ",".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
        table.add_row("-" if t["slot"] is None else str(t["slot"]), t["kind"], t["state"], t["status"] or "-", t.get("lowering") or "-",
                      rate_text(t["tflops"]) if t["tflops"] else "-", f"{t['median_ms']:.4f}" if t["median_ms"] else "-", params)  # fmt: skip
    out.print(table)
    trials = [(t["status"], t["message"], f"[{t.get('lowering')}] " + ",".join(f"{k}={v}" for k, v in (t.get("params") or {}).items()), t.get("lowering"))
              for t in page["data"]]  # fmt: skip
    for line in failure_lines(trials):  # why the listed trials failed: the table has no room for it
        out.print(line)


@jobs_app.command("watch")
@handles_errors
def jobs_watch(
    job_id: int = JobArg,
    interval: float = typer.Option(2.0, "--interval", min=0.1, help="Seconds between looks"),
    url: str = UrlOpt,
    token: Optional[str] = TokenOpt,
) -> None:
    """Follow a job until it ends: a bar on a terminal, a line per change otherwise
    (exit 0: succeeded, 1: failed or cancelled)."""
    api = Api(url, token)
    job = api("GET", f"/jobs/{job_id}")
    last = None
    columns = (TextColumn("job {task.fields[id]} {task.fields[state]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("best {task.fields[best]}"))  # fmt: skip
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("job", total=job["progress"]["budget"], id=job_id, state=job["state"], best="-")
        while True:
            p = job["progress"]
            bar.update(task, completed=p["done"] + p["failed"], state=job["state"], best=_best(job))
            line = f"job {job_id} {job['state']}: search {_progress(job)}, {p['running']} running; best {_best(job)}"
            if line != last and not err.is_terminal:
                err.print(line)
            last = line
            if job["state"] in FINAL:
                break
            time.sleep(interval)
            job = api("GET", f"/jobs/{job_id}")
    out.print(f"job {job_id} {job['state']}: search {_progress(job)}; best {_best(job)}")
    if job["state"] != "succeeded":
        raise typer.Exit(EXIT_NOT_FOUND)


@jobs_app.command("cancel")
@handles_errors
def jobs_cancel(job_id: int = JobArg, url: str = UrlOpt, token: Optional[str] = TokenOpt) -> None:
    """Cancel a queued or running job (of this token; an admin token: any job); trials in flight finish and are kept."""
    job = Api(url, token)("POST", f"/jobs/{job_id}/cancel")
    out.print(f"job {job_id} {job['state']}: search {_progress(job)}")
