"""Execution order in a warp-specialized schedule: how MaterializeWSSchedule
plans and checks it, and the rule that keeps a seed's.

- ``stage_deltas``: each entry of a role body runs ``delta`` iterations
  behind the body's first (PlanStages): a sync at its stage, an op at the
  stage of the open spans of the pipelines it touches, anything else at 0.
- ``flatten_events`` and ``simulate``: every role's sync events in emitted
  order, loops unrolled, run under the mbarrier parity model
  (FlattenRoleEvents and VerifyDeadlockFree).
- ``order_edge`` and ``stable_order``: event (x, iteration i) runs at step
  i + delta_x, position pos_x, so two entries that touch one resource keep
  their order at every iteration distance only if the variant's deltas and
  positions give the same threshold as the seed's; ``stable_order`` places
  every entry as early as its seed position allows.

Pure Python: ``Item`` describes an entry by what it reads and writes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Sequence

from .schedule import CONSUMER_SYNCS, PRODUCER_SYNCS, ROOT_SCOPE, Instr, Scope, Sync

OPENS = (PRODUCER_SYNCS[0], CONSUMER_SYNCS[0])
CLOSE_OF = {PRODUCER_SYNCS[0]: PRODUCER_SYNCS[1], CONSUMER_SYNCS[0]: CONSUMER_SYNCS[1]}


def stage_deltas(body: Sequence[Instr], touched: Callable[[str], set[str]]) -> list[int]:
    """Each entry's iteration offset (PlanStages); ``touched``: an entry's pipelines."""
    stages = [i.stage for i in body if isinstance(i, Sync)]
    if not stages:
        return [0] * len(body)
    s_min, open_stage, out = min(stages), {}, []
    for entry in body:
        if isinstance(entry, Sync):
            out.append(entry.stage - s_min)
            if entry.kind in OPENS:
                open_stage[entry.pipeline] = entry.stage
            else:
                open_stage.pop(entry.pipeline, None)
            continue
        covering = {open_stage[p] for p in touched(entry) if p in open_stage}
        out.append(min(covering) - s_min if covering else 0)
    return out


def flatten_events(scopes: dict[str, Scope], role: str, deltas: dict[tuple[str, str], list[int]], trips: int) -> list[Sync]:
    """A role's sync events in emitted order (FlattenRoleEvents): each loop at
    ``trips`` iterations, an entry at delta d running in steps d .. d + trips - 1."""
    out: list[Sync] = []

    def emit(scope_id: str) -> None:
        body = scopes[scope_id].body(role)
        delta = deltas.get((scope_id, role), [])
        root = scope_id == ROOT_SCOPE
        for t in range(1 if root else trips + max(delta, default=0)):
            for entry, d in zip(body, delta):
                if not root and not d <= t < d + trips:
                    continue
                if isinstance(entry, Sync):
                    out.append(entry)
                elif entry in scopes:
                    emit(entry)

    emit(ROOT_SCOPE)
    return out


EVENT_KINDS = (CONSUMER_SYNCS[0], PRODUCER_SYNCS[0], PRODUCER_SYNCS[1], CONSUMER_SYNCS[1])  # event codes 0-3
_WAIT, _ACQUIRE, _COMMIT = 0, 1, 2


def simulate(events: tuple[tuple[tuple[int, int], ...], ...], depth: list[int]) -> list[tuple[int, tuple[int, int]]]:
    """Run the roles' events greedily: a wait needs a commit it has not seen, an
    acquire a free slot; commits and releases never block. The roles still
    blocked when nothing moves, with their event (VerifyDeadlockFree)."""
    cursors = [0] * len(events)
    commits = [0] * len(depth)
    releases = [0] * len(depth)
    taken = [[0] * len(depth) for _ in events]  # a role's waits, or acquires, per pipeline
    progressed = True
    while progressed:
        progressed = False
        for r, flat in enumerate(events):
            mine, cursor, end = taken[r], cursors[r], len(flat)
            while cursor < end:
                code, p = flat[cursor]
                if code == _WAIT:
                    if mine[p] >= commits[p]:
                        break
                    mine[p] += 1
                elif code == _ACQUIRE:
                    if mine[p] >= depth[p] + releases[p]:
                        break
                    mine[p] += 1
                elif code == _COMMIT:
                    commits[p] += 1
                else:
                    releases[p] += 1
                cursor += 1
            if cursor != cursors[r]:
                cursors[r] = cursor
                progressed = True
    return [(r, flat[cursors[r]]) for r, flat in enumerate(events) if cursors[r] < len(flat)]


def verifier_trips(depth: tuple[int, ...]) -> int:
    """The trips at which VerifyDeadlockFree runs each loop: max depth + 1, at least 2."""
    return max(2, max(depth, default=0) + 1)


class DeadlockModel:
    """``simulate`` with its verdicts remembered, for every seed of a space:
    plans of different seeds often flatten to the same events. Within one trip
    count (the events do not change), more depth never blocks what less did
    not, so a depth vector one step above a deadlock-free one is free without
    a run; vectors come in increasing order (itertools.product), so that step
    below is usually known.

    A space of many kernel-parameter points asks about millions of (events,
    depths) pairs, and a verdict is used again across its points (kept only
    recent ones, a count ran 15x slower): each is one int key (the events' id and
    the depths packed, 5 bits each) to a shared empty tuple or a short one, ~70
    bytes where a tuple key and a list took ~300 (a count of examples/attention.py
    reached 17 GB). Past ``max_verdicts`` the oldest go first."""

    max_verdicts = 16_000_000  # ~2 GB

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self._verdicts: dict[int, tuple[tuple[int, tuple[int, int]], ...]] = {}

    def intern(self, events: tuple[tuple[tuple[int, int], ...], ...]) -> int:
        return self._ids.setdefault(events, len(self._ids))

    def blocked(self, key: int, events: tuple[tuple[tuple[int, int], ...], ...], depth: tuple[int, ...]) -> tuple[tuple[int, tuple[int, int]], ...]:
        """The roles that block (each at its next event), or () if none does."""
        if len(depth) > _PACKED_DEPTHS or max(depth, default=0) >> _DEPTH_BITS:
            return tuple(simulate(events, list(depth)))  # beyond what a key packs: not remembered
        packed = key << _DEPTH_BITS * _PACKED_DEPTHS
        for i, d in enumerate(depth):
            packed |= d << _DEPTH_BITS * i
        found = self._verdicts.get(packed)
        if found is not None:
            return found
        trips = verifier_trips(depth)
        for i, d in enumerate(depth):
            lower = depth[:i] + (d - 1,) + depth[i + 1 :]
            if d > 1 and verifier_trips(lower) == trips and self._verdicts.get(packed - (1 << _DEPTH_BITS * i)) == ():
                found = ()
                break
        else:
            found = tuple(simulate(events, list(depth))) or ()
        if len(self._verdicts) >= self.max_verdicts:
            del self._verdicts[next(iter(self._verdicts))]  # dicts keep insertion order: the oldest
        self._verdicts[packed] = found
        return found


_DEPTH_BITS, _PACKED_DEPTHS = 5, 12  # a packed key holds up to 12 pipelines' depths, each below 32


@dataclass(frozen=True)
class Item:
    """One entry of a body being rebuilt, with what the dependence rule needs."""

    key: str | tuple[str, str]  # an op or scope id, or (sync kind, pipeline)
    order: tuple[float, int, int]  # sort key when nothing forces a move: seed position first
    reads: frozenset[str]
    writes: frozenset[str]
    seed_ref: tuple[tuple[str, tuple[int, float]], ...]  # resource -> (delta, position) of the seed event it stands for


def order_edge(a: Item, b: Item, da: int, db: int, shift: int) -> int | str:
    """+1: ``a`` must come before ``b`` in the body; -1: after; 0: free; or why neither works.

    Event (x, iteration i) runs at step i + delta_x, position pos_x. ``a`` at
    iteration i precedes ``b`` at i + k iff k >= T, T = -(db - da) when a sits
    before b, one more when after. The seed's T must hold in the variant.
    """
    conflict = (a.writes & (b.reads | b.writes)) | (b.writes & a.reads)  # read-read never orders
    if not conflict:
        return 0
    ref_a, ref_b = dict(a.seed_ref), dict(b.seed_ref)
    want = set()
    for r in conflict:
        (sa, pa), (sb, pb) = ref_a[r], ref_b[r]
        threshold = -(sb - sa) + (0 if pa < pb else 1)
        if r.startswith("$") and shift and da != db:
            return f"{_label(a)} and {_label(b)} share scalar {r[1:]} at different stages"
        if threshold == -(db - da):
            want.add(1)
        elif threshold == -(db - da) + 1:
            want.add(-1)
        else:
            return f"{_label(b)} would move {abs((db - da) + threshold)} iteration(s) against {_label(a)} ({r})"
    if len(want) > 1:
        return f"{_label(a)} and {_label(b)} would have to swap and not swap"
    return want.pop()


def _label(item: Item) -> str:
    if isinstance(item.key, tuple):
        return f"{item.key[0].lower()}({item.key[1]})"
    # an op id (tl_tileop_gemm_3) names no line of the kernel; what it writes and reads does
    touched = [f"{verb} {', '.join(sorted(r.lstrip('$') for r in names))}" for verb, names in (("writes", item.writes), ("reads", item.reads - item.writes)) if names]
    return f"{item.key!r} ({'; '.join(touched)})" if touched else repr(item.key)


def stable_order(items: list[Item], after: dict[int, set[int]]) -> list[Item] | None:
    """Items in dependence order, each as early as its seed position allows."""
    indegree = {i: 0 for i in after}
    for succ in after.values():
        for j in succ:
            indegree[j] += 1
    ready = [(items[i].order, i) for i, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    out: list[Item] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(items[i])
        for j in after[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (items[j].order, j))
    return out if len(out) == len(items) else None
