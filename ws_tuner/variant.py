"""Variants of a seed: the schedules a ``Plan`` and a few numbers describe.

A plan fixes, for one pipeline layout and one set of ops moved to roles of
their own, which pipelines exist (names from the seed where it has them),
which depths are decisions, which span groups of each loop body move
together and which stage tuples they may take: those that keep the seed's
dependences (order.py), the seed's own among them. Numbers complete it:
depths, stages, and the roles' warp ranges and budgets (the space's).

Each rebuilt role body holds the seed's entries in the seed's order unless a
new stage forces a move. A pipeline's wait and release count as writes of
its buffers, so the ops reading them move with the span; an async MMA wait,
modelled as touching everything its role's async MMAs touch, stays before
the release of what they read. The seed's own plan and numbers give back
its schedule exactly, names and hash included.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Sequence

from .order import CLOSE_OF, EVENT_KINDS, DeadlockModel, Item, flatten_events, order_edge, stable_order, verifier_trips
from .schedule import CONSUMER_SYNCS, PRODUCER_SYNCS, Instr, Pipeline, Role, Schedule, Scope, Sync
from .seed import BodyKey, Movable, Seed


@dataclass(frozen=True)
class Group:
    """Pipelines of one loop body whose spans share a stage (an op touches several)."""

    scope: str
    role: str
    pipelines: tuple[str, ...]
    base: int  # the seed body's lowest stage: stage offsets count from it
    fixed: int | None = None  # its stage, where it may not move


@dataclass(frozen=True)
class StageChoice:
    """A loop body whose span groups can sit at several stages: the stage tuples
    (one per group) that keep the seed's dependences, the seed's own among them."""

    groups: tuple[Group, ...]
    options: tuple[tuple[int, ...], ...]
    complete: bool = True  # every offset combination keeps the dependences
    refused: str | None = None  # why some offset combination does not (the first reason)

    def label(self, option: tuple[int, ...]) -> str:
        return ",".join(str(stage - g.base) for g, stage in zip(self.groups, option))

    @property
    def name(self) -> str:
        """Names the choices too where the seed allows only some of them, so that
        one name never offers two lists (samplers keep one list per name)."""
        g = self.groups[0]
        base = f"stage.{g.role}.{'/'.join('+'.join(x.pipelines) for x in self.groups)}"
        return base if self.complete else f"{base}[{' '.join(self.label(o) for o in self.options)}]"


@dataclass(frozen=True, eq=False)  # one object per (layout, moved) of a seed: hashed by identity, cheaply
class Plan:
    """The structure of a variant: pipelines and the bodies that change, without the numbers."""

    layout: str
    moved: tuple[str, ...]
    pipelines: tuple[Pipeline, ...]  # every pipeline, in order, at the seed's depth (1 for new ones)
    varied: tuple[str, ...]  # pipelines whose depth is a decision
    tied: tuple[tuple[str, str], ...]  # pipeline -> the varied one whose depth it shares
    groups: tuple[Group, ...]  # span groups whose stage is a decision, body after body
    stage_choices: tuple[StageChoice, ...]  # the bodies those groups belong to
    roles: tuple[str, ...]  # the seed's roles, then the moved ops' roles
    pipe_of: tuple[tuple[str, str], ...]  # buffer -> pipeline, for the varied and new pipelines
    producer: tuple[tuple[str, str], ...]  # varied or new pipeline -> its producer role
    body_groups: tuple[tuple[BodyKey, tuple[Group, ...]], ...]  # the rebuilt bodies and their span groups
    infeasible: str | None = None  # why no stage choice of some body keeps the seed's dependences

    def depth_of(self, depths: Sequence[int]) -> dict[str, int]:
        """Every pipeline's depth at these decisions."""
        return dict(zip((p.name for p in self.pipelines), self.depth_vector(depths)))

    def depth_vector(self, depths: Sequence[int]) -> tuple[int, ...]:
        """Every pipeline's depth at these decisions, in pipeline order."""
        return tuple(depths[slot] if slot >= 0 else p.depth for p, slot in zip(self.pipelines, self._slots))

    @functools.cached_property
    def _slots(self) -> tuple[int, ...]:
        """Per pipeline, the index of the depth decision it takes, or -1 (its own)."""
        leader = dict(self.tied)
        return tuple(self.varied.index(leader.get(p.name, p.name)) if leader.get(p.name, p.name) in self.varied else -1 for p in self.pipelines)


class Variants:
    """The plans and variants of one analysed seed (cached: plans are built once)."""

    def __init__(self, seed: Seed, max_stage_offset: int = 2, deadlocks: DeadlockModel | None = None):
        self.seed = seed
        self.max_stage_offset = max_stage_offset
        self.deadlocks = deadlocks or DeadlockModel()
        # bodies whose stages the dependences pin to one choice, and why: kept as in the seed
        self.pinned: dict[BodyKey, str] = {}

    # --- plans --------------------------------------------------------------
    def plan(self, layout: str, moved: tuple[str, ...] = ()) -> Plan:
        return self._plan(self.seed.layout_alias.get(layout, layout), moved)

    @functools.cache
    def _plan(self, layout: str, moved: tuple[str, ...]) -> Plan:
        varied_pipes = self.seed.layouts[layout]
        moves = [m for m in self.seed.movable if m.op in moved]
        pipe_of = {b: name for name, bufs in varied_pipes for b in bufs}
        pipe_of.update({b: m.pipeline for m in moves for b in m.buffers})
        producer = {pipe_of[b]: self.seed.where[self.seed.pipe_of[b]][1] for name, bufs in varied_pipes for b in bufs}
        producer.update({m.pipeline: m.new_role if m.feeds else m.role for m in moves})
        pipelines: list[Pipeline] = []
        for p in self.seed.schedule.pipelines:
            if p.name in self.seed.frozen:
                pipelines.append(p)
                continue
            for name, bufs in varied_pipes:
                if name not in {q.name for q in pipelines} and set(bufs) & set(p.buffers):
                    same = self.seed.pipelines.get(name)
                    pipelines.append(Pipeline(name, bufs, same.depth if same is not None and same.buffers == bufs else p.depth))
        pipelines += [Pipeline(m.pipeline, m.buffers, 1) for m in moves]
        tied = []
        for (scope, prod, cons), pipes in self.seed.channels.items():
            if (scope, prod, cons) in self.seed.guarded:  # the guard and what it guards keep one depth
                names = [name for name, bufs in varied_pipes if set(bufs) <= {b for p in pipes for b in p.buffers}]
                tied += [(name, names[0]) for name in names[1:]]
        held = {(scope, prod) for (scope, prod, _) in self.seed.guarded}
        keys = sorted({(scope, role) for (scope, prod, cons) in self.seed.channels for role in (prod, cons) if role} | {(m.scope, m.role) for m in moves}, key=self._body_order)
        body_groups, choices, infeasible = [], [], None
        for key in keys:
            groups = self._groups(key, pipe_of, moves, fixed=key in held)
            choice, reason = self._stage_choice(key, groups, pipe_of, producer, moves)
            if choice is not None and len(choice.options) == 1:  # one way: pin it, no decision
                groups = [replace(g, fixed=stage) for g, stage in zip(groups, choice.options[0])]
                if choice.refused:  # no axis, so say why (a loop's scalar that both spans read)
                    self.pinned[key] = f"{key[1]}'s stages in {key[0]}: one choice keeps the seed's dependences ({choice.refused})"
            elif choice is not None:
                choices.append(choice)
            infeasible = infeasible or reason
            body_groups.append((key, tuple(groups)))
        varied = tuple(name for name, _ in varied_pipes if name not in dict(tied)) + tuple(m.pipeline for m in moves)
        return Plan(layout, tuple(m.op for m in moves), tuple(pipelines), varied, tuple(tied), tuple(g for c in choices for g in c.groups), tuple(choices),
                    self.seed.role_names + tuple(dict.fromkeys(m.new_role for m in moves if m.new_role not in self.seed.role_names)),
                    tuple(pipe_of.items()), tuple(producer.items()), tuple(body_groups), infeasible)  # fmt: skip

    def _stage_choice(self, key: BodyKey, groups: list[Group], pipe_of: dict[str, str], producer: dict[str, str],
                      moves: Sequence[Movable]) -> tuple[StageChoice | None, str | None]:  # fmt: skip
        """The stage tuples of a body's groups that keep the seed's dependences:
        offsets up to max_stage_offset, lowest at the body's base, and the seed's
        own; or why there is none."""
        if not groups:
            return None, None
        if len(groups) < 2 or any(g.fixed is not None for g in groups):  # one way only: does it work?
            body = self._rebuild(key, pipe_of, producer, moves, {p: g.base if g.fixed is None else g.fixed for g in groups for p in g.pipelines})
            return None, body if isinstance(body, str) else None
        everything = [o for o in itertools.product(range(self.max_stage_offset + 1), repeat=len(groups)) if min(o) == 0]
        options = list(everything)
        seed_stage = {i.pipeline: i.stage for i in self.seed.body(*key) if isinstance(i, Sync)}
        if all(p in seed_stage and self.seed.keeps(p, pipe_of) for g in groups for p in g.pipelines):
            own = tuple(seed_stage[g.pipelines[0]] - g.base for g in groups)  # the seed's, even past max_stage_offset
            options += [own] if own not in options else []
        feasible, reason = [], None
        for offsets in options:
            stage = {p: g.base + x for g, x in zip(groups, offsets) for p in g.pipelines}
            body = self._rebuild(key, pipe_of, producer, moves, stage)
            if isinstance(body, str):
                reason = reason or body
            else:
                feasible.append(tuple(g.base + x for g, x in zip(groups, offsets)))
        if not feasible:
            return None, reason
        return StageChoice(tuple(groups), tuple(feasible), complete=len(feasible) == len(options) == len(everything), refused=reason), None

    def _body_order(self, key: BodyKey) -> tuple[int, int]:
        scope, role = key
        return [s.id for s in self.seed.schedule.scopes].index(scope), self.seed.role_names.index(role)

    def _candidate_pipes(self, key: BodyKey, pipe_of: dict[str, str], moves: Sequence[Movable]) -> list[str]:
        """Pipelines the rebuilt body synchronizes, in the order their spans first appear."""
        scope, role = key
        seen: list[str] = []
        for i in self.seed.body(scope, role):
            names = [pipe_of[b] for b in self.seed.pipelines[i.pipeline].buffers] if isinstance(i, Sync) else []
            names += [m.pipeline for m in moves if (m.scope, m.role) == key and isinstance(i, str) and i in self._partners(m)]
            seen += [n for n in dict.fromkeys(names) if n not in seen]  # a pipeline of several buffers counts once
        return seen

    def _partners(self, move: Movable) -> list[str]:
        """The entries of the moved op's old body on the other side of its new pipeline."""
        return [e for e in self.seed.body(move.scope, move.role) if isinstance(e, str) and e not in move.ops and set(self.seed.entry_access(move.role, e)[2]) & set(move.buffers)]

    def _groups(self, key: BodyKey, pipe_of: dict[str, str], moves: Sequence[Movable], fixed: bool = False) -> list[Group]:
        """The body's span groups; ``fixed``: each at the seed's stage of its buffers."""
        scope, role = key
        pipes = self._candidate_pipes(key, pipe_of, moves)
        parent = {p: p for p in pipes}

        def find(p: str) -> str:
            while parent[p] != p:
                p = parent[p]
            return p

        for e in self.seed.body(scope, role):
            if isinstance(e, str):
                touched = [p for p in pipes if any(pipe_of.get(b) == p for b in self.seed.entry_access(role, e)[2])]
                for p in touched[1:]:
                    parent[find(p)] = find(touched[0])
        base = min((i.stage for i in self.seed.body(scope, role) if isinstance(i, Sync)), default=0)
        out: dict[str, list[str]] = {}
        for p in pipes:
            out.setdefault(find(p), []).append(p)
        seed_stage = {self.seed.pipelines[i.pipeline].buffers[0]: i.stage for i in self.seed.body(scope, role) if isinstance(i, Sync)}
        first = {p: next(b for b, q in pipe_of.items() if q == p) for p in pipes}
        return [Group(scope, role, tuple(ps), base, seed_stage.get(first[ps[0]], base) if fixed else None) for ps in out.values()]

    def seed_stages(self, plan: Plan) -> tuple[int, ...]:
        """The seed's stage of each decided group, in any layout: that of the seed
        body's first sync on a buffer of the group's pipelines."""
        pipe_of = dict(plan.pipe_of)
        seed_pipes = self.seed.pipelines

        def stage(g: Group) -> int:
            buffers = {b for b, p in pipe_of.items() if p in g.pipelines} | {b for p in g.pipelines if p in seed_pipes for b in seed_pipes[p].buffers}
            syncs = (i for i in self.seed.body(g.scope, g.role) if isinstance(i, Sync) and buffers & set(seed_pipes[i.pipeline].buffers))
            return next((i.stage for i in syncs), g.base)

        return tuple(stage(g) for g in plan.groups)

    # --- building a variant --------------------------------------------------
    def schedule_for(self, plan: Plan, depths: Sequence[int], stages: Sequence[int], roles: Sequence[Role], num_warps: int) -> Schedule | str:
        """The variant's schedule (``roles``: one per plan role, in order), or why it is refused."""
        bodies = self.bodies(plan, tuple(stages))
        if isinstance(bodies, str):
            return bodies
        depth_of = plan.depth_of(depths)
        pipelines = tuple(Pipeline(p.name, p.buffers, depth_of[p.name]) for p in plan.pipelines)
        scopes = []
        for s in self.seed.schedule.scopes:
            own = {role: bodies.get((s.id, role), body) for role, body in s.bodies}
            for role, body in self._new_bodies(plan, s.id):  # a role that has a body here runs the moved ops after it
                own[role] = own.get(role, ()) + tuple(e for e in body if e not in own.get(role, ()))
            scopes.append(Scope(s.id, tuple(own.items())))
        return Schedule(num_warps, tuple(roles), pipelines, tuple(scopes))

    def _new_bodies(self, plan: Plan, scope: str) -> tuple[tuple[str, tuple[Instr, ...]], ...]:
        """Bodies of the roles that moved ops run in: loop control, and the op in its span."""
        out = []
        for m in self.seed.movable:
            if m.op not in plan.moved or scope not in self.seed.path(m.scope):
                continue
            body: list[Instr] = []
            opening, closing = PRODUCER_SYNCS if m.feeds else CONSUMER_SYNCS
            for e in self.seed.body(scope, m.role):
                if e in m.ops:  # one span around the moved ops, in the seed's order
                    body += [Sync(opening, m.pipeline)] * (e == m.ops[0]) + [e] + [Sync(closing, m.pipeline)] * (e == m.ops[-1])
                elif isinstance(e, str) and (e in self.seed.path(m.scope) or e in m.follows or (e not in self.seed.scopes and len(self.seed.placements(e)) > 1)):
                    body.append(e)
            out.append((m.new_role, tuple(body)))
        return tuple(out)

    @functools.cache
    def bodies(self, plan: Plan, stages: tuple[int, ...]) -> dict[BodyKey, tuple[Instr, ...]] | str:
        """The rebuilt bodies at these group stages, or why the stages break a dependence."""
        decided = dict(zip(plan.groups, stages))
        pipe_of = dict(plan.pipe_of)
        producer = dict(plan.producer)
        moves = [m for m in self.seed.movable if m.op in plan.moved]
        out: dict[BodyKey, tuple[Instr, ...]] = {}
        for key, groups in plan.body_groups:
            stage = {p: decided.get(g, g.base if g.fixed is None else g.fixed) for g in groups for p in g.pipelines}
            body = self._rebuild(key, pipe_of, producer, moves, stage)
            if isinstance(body, str):
                return body
            out[key] = body
        return out

    def _rebuild(self, key: BodyKey, pipe_of: dict[str, str], producer: dict[str, str], moves: Sequence[Movable], stage: dict[str, int]) -> tuple[Instr, ...] | str:
        scope, role = key
        seed_body = self.seed.body(scope, role)
        moved_here = {op for m in moves if (m.scope, m.role) == key for op in m.ops}
        syncs = [i for i in seed_body if isinstance(i, Sync)]
        if not moved_here and all(self.seed.keeps(i.pipeline, pipe_of) and stage[i.pipeline] == i.stage for i in syncs):
            return seed_body  # the seed's own spans at the seed's stages: its body, unchanged
        seed_delta = self.seed.deltas(role, seed_body, self.seed.pipe_of)
        items = self._items(key, seed_delta, pipe_of, producer, moves, moved_here)
        s_min = min(stage.values())
        delta: dict[object, int] = {}
        for it in items:
            if isinstance(it.key, tuple):
                delta[it.key] = stage[it.key[1]] - s_min
            else:
                touched = {stage[pipe_of[b]] for b in self.seed.entry_access(role, it.key)[2] if pipe_of.get(b) in stage}
                delta[it.key] = (min(touched) - s_min) if touched else 0
        shift = max(delta.values(), default=0)
        after: dict[int, set[int]] = {i: set() for i in range(len(items))}
        for i, j in itertools.combinations(range(len(items)), 2):
            edge = order_edge(items[i], items[j], delta[items[i].key], delta[items[j].key], shift)
            if isinstance(edge, str):
                return f"order: in {role}'s body of {scope}, {edge}"
            if edge:
                after[i if edge > 0 else j].add(j if edge > 0 else i)
        order = stable_order(items, after)
        if order is None:
            return f"order: in {role}'s body of {scope}, these stages need a cycle of moves"
        return tuple(Sync(it.key[0], it.key[1], stage[it.key[1]]) if isinstance(it.key, tuple) else it.key for it in order)

    def _items(self, key: BodyKey, seed_delta: list[int], pipe_of: dict[str, str], producer: dict[str, str], moves: Sequence[Movable], moved_here: set[str]) -> list[Item]:
        scope, role = key
        seed_body = self.seed.body(scope, role)
        items: list[Item] = []
        touching: dict[str, list[int]] = {}
        for pos, entry in enumerate(seed_body):
            if isinstance(entry, Sync) or entry in moved_here:
                continue
            reads, writes, touched = self.seed.entry_access(role, entry)
            ref = (seed_delta[pos], float(pos))
            items.append(Item(entry, (float(pos), 1, 0), reads, writes, tuple((r, ref) for r in reads | writes)))
            for p in {pipe_of[b] for b in touched if b in pipe_of}:
                touching.setdefault(p, []).append(pos)
        seed_syncs = {(i.kind, b): (seed_delta[pos], float(pos)) for pos, i in enumerate(seed_body) if isinstance(i, Sync) for b in self.seed.pipelines[i.pipeline].buffers}
        for index, p in enumerate(self._candidate_pipes(key, pipe_of, moves)):
            bufs = [b for b, q in pipe_of.items() if q == p]
            opening = PRODUCER_SYNCS[0] if producer[p] == role else CONSUMER_SYNCS[0]
            kept = self.seed.pipelines.get(p) is not None and self.seed.keeps(p, pipe_of)
            span = touching.get(p, [])
            if not kept and not span:
                return []  # unreachable: a pipeline no entry touches is frozen
            for kind in (opening, CLOSE_OF[opening]):
                is_open = kind == opening
                seed_pos = next((q for q, i in enumerate(seed_body) if kept and isinstance(i, Sync) and i.pipeline == p and i.kind == kind), None)
                where = float(seed_pos) if seed_pos is not None else (min(span) - 0.5 if is_open else max(span) + 0.5)
                made_up = (seed_delta[min(span)] if is_open else seed_delta[max(span)], where) if span else (0, where)
                ref = tuple((b, seed_syncs.get((kind, b), made_up)) for b in bufs)
                items.append(Item((kind, p), (where, 1 if is_open else 0, index), frozenset(bufs), frozenset(bufs), ref))
        return sorted(items, key=lambda it: it.order)

    # --- the verifier's deadlock model ---------------------------------------
    def deadlock(self, plan: Plan, stages: tuple[int, ...], depths: tuple[int, ...], extra_trips: int = 0) -> str | None:
        """MaterializeWSSchedule's deadlock check, made sound: every role's sync
        events under the mbarrier parity model, each loop at max depth + 1 trips
        (the verifier's count) plus the stage spread. An entry ``s`` iterations
        behind its body's first holds its pipeline ``s`` stages longer, so a
        cycle can take that many more trips to close: the verifier's count
        passed a producer that loads V two stages behind K, at depth 1 each,
        against a consumer that waits for V at K's stage (it hung on an H200).
        ``extra_trips``: longer loops, for tests (no verdict may change)."""
        depth = plan.depth_vector(depths)
        key, events, trips = self._events(plan, stages, verifier_trips(depth) + extra_trips)
        blocked = self.deadlocks.blocked(key, events, depth)
        if not blocked:
            return None
        where = ", ".join(f"{plan.roles[r]} at {EVENT_KINDS[code].lower()}({plan.pipelines[p].name})" for r, (code, p) in blocked)
        return f"deadlock: {where} (mbarrier parity model, every loop simulated for {trips} trips, more than its pipelines are deep, whatever its own count)"

    @functools.cache
    def _events(self, plan: Plan, stages: tuple[int, ...], trips: int) -> tuple[int, tuple[tuple[tuple[int, int], ...], ...], int]:
        """Each role's sync events in emitted order (FlattenRoleEvents), as (kind,
        pipeline index), their id, and the trips (``trips`` plus the stage spread)."""
        roles = tuple(Role(name, 0, 1) for name in plan.roles)
        schedule = self.schedule_for(plan, [1] * len(plan.varied), stages, roles, 4)
        assert not isinstance(schedule, str)
        scopes = {s.id: s for s in schedule.scopes}
        pipe_of = {b: p.name for p in schedule.pipelines for b in p.buffers}
        deltas = {(s.id, role): self.seed.deltas(role, body, pipe_of) for s in schedule.scopes for role, body in s.bodies}
        trips += max((d for body in deltas.values() for d in body), default=0)

        index = {p.name: i for i, p in enumerate(plan.pipelines)}
        events = []
        for role in plan.roles:
            flat = flatten_events(scopes, role, deltas, trips)
            events.append(tuple((EVENT_KINDS.index(e.kind), index[e.pipeline]) for e in flat))
        return self.deadlocks.intern(tuple(events)), tuple(events), trips


