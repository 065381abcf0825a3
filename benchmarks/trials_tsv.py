"""A tuning database's trials as a tab-separated table small enough to commit, one row per
trial: workload, status, role (search, baseline or warm start), lowering, params, TFLOP/s,
ratio, the search's ratio, confirmed, the schedule in short, and the message (a WRONG trial's
error, a failure's reason). A confirmed trial's ratio is the final tournament's, in its own
steady state, and does not rank with the others' search ratios; its search ratio, which put
it in the tournament, does.

    python benchmarks/trials_tsv.py OUT/k/fused_moe/fused_moe.db [--delete]

Writes <db stem>-trials.tsv beside the database; ``--delete`` removes the database after.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from ws_tuner.candidate import Candidate
from ws_tuner.schedule import Schedule
from ws_tuner.store.models import TABLE_PREFIX

QUERY = f"""
SELECT t.workload_id, t.status, t.info, c.lowering, c.params, t.tflops, t.ratio, t.confirmed, c.schedule, t.message
FROM {TABLE_PREFIX}trials t JOIN {TABLE_PREFIX}candidates c ON c.id = t.candidate_id ORDER BY t.id
"""


def short(schedule: str | None) -> str:
    """The roles and pipelines of ``Candidate.describe``, without the params (a column of their own)."""
    if not schedule:
        return ""
    return Candidate.make({}, Schedule.from_json(json.loads(schedule))).describe().split(" | ", 1)[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db", type=Path)
    ap.add_argument("--delete", action="store_true")
    args = ap.parse_args()
    out = args.db.with_name(f"{args.db.stem}-trials.tsv")
    rows = [["workload", "status", "role", "lowering", "params", "tflops", "ratio", "search_ratio", "confirmed", "schedule", "message"]]
    conn = sqlite3.connect(args.db)
    for wl, status, info, lowering, params, tflops, ratio, confirmed, schedule, message in conn.execute(QUERY):
        params = json.dumps(json.loads(params), separators=(",", ":"), sort_keys=True)
        info = json.loads(info or "{}")
        search_ratio = info.get("search_ratio", ratio) if confirmed else ratio
        rows.append([wl, status, info.get("role", ""), lowering, params, "" if tflops is None else tflops, "" if ratio is None else ratio,
                     "" if search_ratio is None else search_ratio, int(confirmed), short(schedule), " ".join((message or "").split())])  # fmt: skip
    conn.close()
    out.write_text("".join("\t".join(map(str, row)) + "\n" for row in rows))  # no quoting: JSON stays readable
    if args.delete:
        args.db.unlink()
    print(out)


if __name__ == "__main__":
    main()
