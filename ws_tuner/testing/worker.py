"""A service worker made of test doubles, as a process: the test-only entry point.

    python -m ws_tuner.testing.worker --db URL [--builder fake|verify-only] [--runner dummy|none]
        [--space fake|kernel] [--runner-delay S] [--heartbeat S] [--grace S] [--poll S]
        [--drain-timeout S] [--exit-when-idle]

The reliability tests kill, stop and restart these like real workers; the
production ``ws-tune worker`` cannot be given any of the doubles.
"""

from __future__ import annotations

import argparse

from ..server.config import load_settings
from ..server.process import run_worker
from ..server.stages import WorkerOptions
from .service import test_stages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ws_tuner.testing.worker")
    ap.add_argument("--db")
    ap.add_argument("--builder", default="fake")
    ap.add_argument("--runner", default="dummy")
    ap.add_argument("--space", default="fake")
    ap.add_argument("--runner-delay", type=float, default=0.0)
    ap.add_argument("--jobs", type=int, default=1)
    for name in ("heartbeat", "grace", "poll", "drain-timeout"):
        ap.add_argument(f"--{name}", type=float)
    ap.add_argument("--exit-when-idle", action="store_true")
    args = ap.parse_args(argv)
    settings = load_settings(db=args.db, drain_timeout=args.drain_timeout, heartbeat_interval=args.heartbeat,
                             grace_period=args.grace, poll_interval=args.poll)  # fmt: skip
    options = WorkerOptions(jobs=args.jobs, exit_when_idle=args.exit_when_idle)
    stages = test_stages(builder=args.builder, runner=args.runner, space=args.space, runner_delay=args.runner_delay, options=options)
    run_worker(settings, options, stages=stages)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
