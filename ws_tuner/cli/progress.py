"""Progress of a tuning and of counting a space: a rich bar on a terminal
(total, ETA, the best TileLang kernel so far), plain log lines otherwise (batch logs, pipes), and
the line an interrupted tuning ends with."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from ..candidate import Candidate, Lowering
from ..result import Status, TrialResult
from .common import speed_text

SEARCH, BASELINE = "search", "baseline"  # pipeline's, without importing the pipeline (and optuna) to draw a bar
LOG_INTERVAL = 10.0  # seconds between plain progress lines of a long count


class TuneProgress:
    """Listens to a Tuner: search candidates count against the budget; baselines and
    warm starts are measured on top and counted apart."""

    def __init__(self, console: Console, budget: int, gbps: Callable[[float], float | None] | None = None,
                 describe: Callable[[Candidate], str] = Candidate.describe) -> None:  # fmt: skip
        self.console, self.budget = console, budget
        self.gbps = gbps  # median ms -> GB/s, where the kernel file says what a call moves
        self.describe = describe  # a candidate's label (Task.describe: the parameters its schedule replaces shown so)
        self.searched = self.others = 0
        self.best: TrialResult | None = None
        self.live = console.is_terminal
        self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[best]}"),
                            console=console, transient=True, disable=not self.live)  # fmt: skip
        self.task = self.bar.add_task("tuning", total=budget, best="")

    def __enter__(self) -> "TuneProgress":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def _best_text(self) -> str:
        if self.best is None:
            return "no timing yet"
        return "best so far " + speed_text(self.best.tflops, self.gbps(self.best.timing.median_ms) if self.gbps and self.best.timing else None)

    def __call__(self, event: str, record: Any) -> None:
        if event in ("anchor", "confirm"):
            phase = "timing the anchor" if event == "anchor" else "final tournament of the leaders"
            self.bar.update(self.task, description=phase)
            if not self.live:
                self.console.print(phase)
            return
        if record.role == SEARCH:
            self.searched += 1
        else:
            self.others += 1
        r = record.result
        # The best kernel ws-tune can hand over: a vendor library's reading (a baseline
        # to beat, in the final table) is not one.
        ours = record.candidate.lowering is not Lowering.REFERENCE
        if ours and r.tflops is not None and r.status is Status.OK and (self.best is None or r.tflops > self.best.tflops):
            self.best = r
        # tilelang's lowerings are tagged by describe(); the seed schedule, a baseline too, here
        seed = "[seed] " if record.role == BASELINE and record.candidate.lowering is Lowering.WS else ""
        label = self.describe(record.candidate)
        what = f"{r.status.value:>13} {_clip(seed + label, 70)}"
        self.bar.update(self.task, completed=min(self.searched, self.budget), description=what, best=self._best_text())
        if not self.live:
            role = "search" if record.role == SEARCH else record.role
            reused = ", reused" if record.cached else ""
            self.console.print(f"[{self.searched}/{self.budget} search, {self.others} baseline/warm] {role}{reused}: "
                               f"{r.status.value} {seed}{label}; {self._best_text()}", markup=False, highlight=False)  # fmt: skip

    @staticmethod
    def interrupted_line(stored: int) -> str:
        return f"interrupted: {stored} stored, re-run to resume"


def _clip(text: str, width: int) -> str:
    """At most ``width`` characters, marked where cut (a cut label, "B_sx" for "B_sx5", reads as another schedule)."""
    return text if len(text) <= width else text[: width - 1] + "…"


@contextmanager
def counting(console: Console, what: str, interval: float = LOG_INTERVAL) -> Iterator[Callable[[int, int], None]]:
    """A ticker for a long count: ``tick(seen, kept)`` as candidates are walked; the
    running counts on a terminal, a line every ``interval`` seconds otherwise."""
    live = console.is_terminal
    with Progress(TextColumn(what), TextColumn("{task.fields[seen]:,} seen, {task.fields[kept]:,} kept"), TimeElapsedColumn(),
                  console=console, transient=True, disable=not live) as bar:  # fmt: skip
        task = bar.add_task(what, total=None, seen=0, kept=0)
        last = [time.monotonic()]

        def tick(seen: int, kept: int) -> None:
            bar.update(task, seen=seen, kept=kept)
            now = time.monotonic()
            if not live and now - last[0] >= interval:
                last[0] = now
                console.print(f"{what}: {seen:,} seen, {kept:,} kept so far", markup=False, highlight=False)  # not the result

        yield tick
