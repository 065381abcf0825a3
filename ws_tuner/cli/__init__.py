"""The ``ws-tune`` command line (typer + rich).

    ws-tune FILE --shape M=4096,N=4096,K=4096 [--budget N] [--compile-only] [--db URL] [--jobs N]
    ws-tune new FILE                    a kernel file to start from (docs/kernel-files.md)
    ws-tune space FILE --shape ...      the axes, and the counts before and after pruning
    ws-tune best FILE --shape ...       the best stored schedule, as TileLang code and JSON
    ws-tune export FILE --shape ...     the JSON artifact of a tuning
    ws-tune db upgrade|current          the database schema
    ws-tune serve [--host H --port P]   the tuning service (REST API; an embedded worker on SQLite)
    ws-tune worker [--gpu N]            a worker running the service's jobs on one GPU
    ws-tune token create|list|revoke    API tokens of the service
    ws-tune jobs list|show|watch|cancel the service's jobs (--url, --token)

Bad input is one line on stderr and exit code 2; never a traceback.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

# The commands register themselves on the app as their modules load.
from . import dashboard, jobs, new, results, schema, service, tuning  # noqa: F401
from .common import EXIT_BAD_INPUT, app, print_error

app.info.help = __doc__
__all__ = ["app", "main"]


def _commands() -> list[str]:
    named = [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands]
    return sorted({*named, *(g.name for g in app.registered_groups if g.name)})


def main(argv: list[str] | None = None) -> None:
    """``ws-tune FILE ...`` is short for ``ws-tune tune FILE ...``; a word that is
    neither a command nor a kernel file is a mistyped command, not a tuning."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    if args and not args[0].startswith("-") and args[0] not in commands:
        word = args[0]
        if Path(word).suffix != ".py" and not Path(word).exists():
            close = difflib.get_close_matches(word, commands, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else f" (commands: {', '.join(commands)}; or a kernel FILE.py to tune)"
            print_error(f"unknown command {word!r}{hint}")
            raise SystemExit(EXIT_BAD_INPUT)
        args.insert(0, "tune")
    app(args=args, prog_name="ws-tune")
