"""Where the lowering starts would have gone: replays ``pipeline.start_points`` on the
trials tables of past GPU runs (``trials_tsv.py``; runs up to 34 measured a start at every
kernel-parameter point), and says for each tuning how many of its starts the chosen points
keep, whether its best start (by search ratio) is among them, and whether it is at the
lead point (the first chosen that has starts: the only one whose starts move loads,
``Task.lowering_starts``; elsewhere the best start's schedule is printed, to be read for
moves, which the tables' short form does not name).

    python benchmarks/starts_replay.py benchmarks/results/h200-run3[345]/call*/*/*/*-trials.tsv
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.pipeline import BASELINE, WARM, TrialRecord, start_points
from ws_tuner.result import Status, TrialResult


def records(rows: list[dict[str, str]]) -> list[TrialRecord]:
    """The rows as the tuning held them before its tournament: every ratio the search's."""
    out = []
    for row in rows:
        ratio = row.get("search_ratio") or row["ratio"]
        # The table keeps a schedule's short form only: a bare candidate carries what start_points reads.
        candidate = Candidate(tuple(sorted(json.loads(row["params"]).items())), None, Lowering(row["lowering"]))
        result = TrialResult(candidate.hash, Status(row["status"]), ratio=float(ratio) if ratio not in ("", "None") else None)
        out.append(TrialRecord(candidate, result, row["role"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tables", nargs="+", type=Path)
    args = ap.parse_args()
    print("tuning\tpoints\tchosen\tstarts\tkept\tbest start kept\tat the lead point")
    for path in args.tables:
        rows = list(csv.DictReader(path.open(), delimiter="\t"))
        if not rows or "role" not in rows[0]:
            continue  # a table from before the role column
        for workload in sorted({r["workload"] for r in rows}):
            table = [r for r in rows if r["workload"] == workload]
            recs = records(table)
            points = list(dict.fromkeys(r.candidate.params for r in recs if r.role == BASELINE and r.candidate.params))
            starts = [(r, row["schedule"]) for r, row in zip(recs, table) if r.role == WARM and r.candidate.params in points]
            timed = [(r, schedule) for r, schedule in starts if r.result.status is Status.OK and r.result.ratio is not None]
            if not timed:
                continue
            baselines = [r for r in recs if r.role == BASELINE]
            # The tables name a seed and a start by the parameters of their candidates, not by the
            # points they were planned for (a thread count the schedule sets): compared there.
            seeds = {(r.candidate.params, r.candidate.hash): r.candidate.hash for r in baselines if r.candidate.lowering is Lowering.WS}
            chosen = list(dict.fromkeys(params for params, _ in start_points(baselines, seeds)))
            has_starts = {r.candidate.params for r, _ in starts}
            lead = next((p for p in chosen if p in has_starts), None)
            best, schedule = min(timed, key=lambda t: t[0].result.ratio)
            kept = sum(r.candidate.params in chosen for r, _ in starts)
            where = "yes" if best.candidate.params == lead else f"no: {schedule}"
            print(f"{path.parent.name}/{workload}\t{len(points)}\t{len(chosen)}\t{len(starts)}\t{kept}\t{best.candidate.params in chosen}\t{where}")

if __name__ == "__main__":
    main()
