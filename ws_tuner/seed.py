"""The seed schedule, understood, and the variants built from it.

A variant differs from the seed in what a ``Plan`` and a few numbers say:
how each producer -> consumer channel of a loop groups its buffers into
pipelines (the seed's grouping, all merged, or all separate), which ops run
in a role of their own, each pipeline's depth, and the stage of each span
group of a loop body. Warp ranges and register budgets are the space's.

What a variant keeps is the seed's dependences. Each rebuilt role body holds
the seed's ops in the seed's order unless a new stage forces a move, and two
entries of one role that touch one resource (a buffer, a scalar, the role's
queue of asynchronous MMAs, a pipeline's slot) run in the same order at every
iteration distance as they do in the seed. A pipeline's wait and release
count as writes of its buffers, so the ops reading them move with the span,
and an async MMA wait, which is modelled as touching everything its role's
async MMAs touch, stays before the release of what they read. A variant that
cannot keep them is refused with the reason and never built; so is one that
deadlocks under the mbarrier parity model MaterializeWSSchedule verifies.

The seed itself is a variant: its own plan and numbers give back its
schedule exactly. Whatever the seed does that this module cannot vary is
kept as it is, and ``Seed.limits`` says what and why.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

from .schedule import CONSUMER_SYNCS, PRODUCER_SYNCS, ROOT_SCOPE, Instr, OpAccess, Pipeline, Role, Schedule, Scope, Sync

SEED, MERGED, SEPARATE = "seed", "merged", "separate"
OPENS = (PRODUCER_SYNCS[0], CONSUMER_SYNCS[0])
CLOSE_OF = {PRODUCER_SYNCS[0]: PRODUCER_SYNCS[1], CONSUMER_SYNCS[0]: CONSUMER_SYNCS[1]}
BodyKey = tuple[str, str]  # (scope id, role)


@dataclass(frozen=True)
class Movable:
    """An op that can run in a role of its own: it reads shared buffers that
    only its role writes, in the same loop body, and writes no on-chip buffer
    (a store to global memory). The new role receives the buffers through a
    new pipeline and replays the loop-control ops the seed already runs in
    several roles."""

    op: str
    role: str  # the role that places it in the seed
    scope: str
    buffers: tuple[str, ...]  # what it reads from the role, through the new pipeline
    new_role: str
    pipeline: str


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

    def label(self, option: tuple[int, ...]) -> str:
        return ",".join(str(stage - g.base) for g, stage in zip(self.groups, option))

    @property
    def name(self) -> str:
        """Names the choices too where the seed allows only some of them, so that
        one name never offers two lists (samplers keep one list per name)."""
        g = self.groups[0]
        base = f"stage.{g.role}.{'/'.join('+'.join(x.pipelines) for x in self.groups)}"
        return base if self.complete else f"{base}[{' '.join(self.label(o) for o in self.options)}]"

    complete: bool = True  # every offset combination keeps the dependences


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
        out = {p.name: p.depth for p in self.pipelines}
        out.update(zip(self.varied, depths))
        out.update({follower: out[leader] for follower, leader in self.tied})
        return out


@dataclass(frozen=True)
class _Item:
    """One entry of a body being rebuilt, with what the dependence rule needs."""

    key: str | tuple[str, str]  # an op or scope id, or (sync kind, pipeline)
    order: tuple[float, int, int]  # sort key when nothing forces a move: seed position first
    reads: frozenset[str]
    writes: frozenset[str]
    seed_ref: tuple[tuple[str, tuple[int, float]], ...]  # resource -> (delta, position) of the seed event it stands for


class Seed:
    """A seed schedule and the kernel's op accesses, analysed once."""

    def __init__(self, schedule: Schedule, accesses: dict[str, OpAccess], buffer_kinds: dict[str, str], max_stage_offset: int = 2):
        self.schedule = schedule
        self.max_stage_offset = max_stage_offset
        self.accesses = accesses
        self.kinds = buffer_kinds
        self.limits: list[str] = []
        self.scopes = {s.id: s for s in schedule.scopes}
        self.parent = {entry: s.id for s in schedule.scopes for _, body in s.bodies for entry in body if isinstance(entry, str) and entry in self.scopes}
        self.role_names = tuple(r.name for r in schedule.roles)
        self._pipelines = {p.name: p for p in schedule.pipelines}
        self._seed_pipe_of = {b: p.name for p in schedule.pipelines for b in p.buffers}
        self.heavy = frozenset(r for r in self.role_names if any(self.kinds.get(b) == "fragment" for op in self._ops_of(r) for b in self._access(op).writes))
        self._find_channels()
        self.movable = self._find_movable()
        self.layouts = self._layouts()

    # --- the seed's structure ---------------------------------------------
    def body(self, scope: str, role: str) -> tuple[Instr, ...]:
        return self.scopes[scope].body(role) if scope in self.scopes else ()

    def _access(self, op: str) -> OpAccess:
        return self.accesses.get(op, OpAccess())

    def _ops_of(self, role: str) -> Iterator[str]:
        for scope in self.schedule.scopes:
            yield from (e for e in scope.body(role) if isinstance(e, str) and e not in self.scopes)

    def _placements(self, op: str) -> set[str]:
        return {role for s in self.schedule.scopes for role, body in s.bodies if op in body}

    @functools.cached_property
    def _async_resources(self) -> dict[str, frozenset[str]]:
        """Per role: what its asynchronous MMAs touch until a wait retires them."""
        return {r: frozenset().union(*(self._access(op).touched for op in self._ops_of(r) if self._access(op).issues_async)) for r in self.role_names}

    @functools.cache
    def entry_access(self, role: str, entry: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        """(reads, writes, buffers really touched) of a body entry as seen by ``role``:
        a child scope is what the role does inside it; an async MMA or wait also
        touches its role's queue, and a wait everything the role's MMAs touch."""
        if entry in self.scopes:
            parts = [self.entry_access(role, e) for e in self.body(entry, role) if isinstance(e, str)]
            return tuple(frozenset().union(*(p[i] for p in parts)) for i in range(3))  # type: ignore[return-value]
        acc = self._access(entry)
        reads, writes = set(acc.reads), set(acc.writes)
        if acc.issues_async or acc.retires_async:
            reads.add(f"async@{role}")
            writes.add(f"async@{role}")
        if acc.retires_async:
            reads |= self._async_resources[role]
            writes |= self._async_resources[role]
        return frozenset(reads), frozenset(writes), acc.touched

    def _spans(self, scope: str, role: str, pipeline: str) -> int:
        return sum(isinstance(i, Sync) and i.pipeline == pipeline and i.kind in OPENS for i in self.body(scope, role))

    def _find_channels(self) -> None:
        """Which seed pipelines the space may regroup and deepen, by channel."""
        where: dict[str, tuple[str, str | None, str | None]] = {}
        for p in self.schedule.pipelines:
            scope = next((s.id for s in self.schedule.scopes if any(isinstance(i, Sync) and i.pipeline == p.name for _, b in s.bodies for i in b)), ROOT_SCOPE)
            where[p.name] = (scope, self.schedule.producer_of(p.name), self.schedule.consumer_of(p.name))
        frozen: dict[str, str] = {}
        owners: dict[str, list[str]] = {}
        for p in self.schedule.pipelines:
            for b in p.buffers:
                owners.setdefault(b, []).append(p.name)
        for p in self.schedule.pipelines:
            scope, producer, consumer = where[p.name]
            if scope == ROOT_SCOPE:
                frozen[p.name] = f"pipeline {p.name!r} synchronizes the root scope (it runs once)"
            elif not any(set(p.buffers) & a.touched for op, a in self.accesses.items() if op not in self.scopes):
                frozen[p.name] = f"pipeline {p.name!r} protects no buffer an op touches (a token)"
            elif any(len(owners[b]) > 1 for b in p.buffers):
                frozen[p.name] = f"pipeline {p.name!r} shares a buffer with a nested pipeline"
            elif producer is None or consumer is None or self._spans(scope, producer, p.name) != 1 or self._spans(scope, consumer, p.name) != 1:
                frozen[p.name] = f"pipeline {p.name!r} has other than one span per iteration in its producer or consumer"
        self.guarded: dict[tuple[str, str | None, str | None], str] = {}
        for key, pipes in self._group_channels(where, frozen).items():
            early = self._early_release(key, pipes)
            if early is None:
                continue
            if len({p.depth for p in pipes}) > 1:
                for p in pipes:
                    frozen[p.name] = f"pipeline {p.name!r} belongs to a channel guarded against an early release, at unequal depths"
            else:
                self.guarded[key] = early
                self.limits.append(f"pipeline {early!r} is released before the async MMA that reads it is retired: the producer keeps "
                                   f"the seed's stages and {', '.join(repr(p.name) for p in pipes)} share one depth")  # fmt: skip
        changed = True
        while changed:  # a body that holds a frozen pipeline's span is kept whole: freeze its other pipelines too
            changed = False
            for p, (scope, producer, consumer) in where.items():
                if p in frozen:
                    continue
                for role in (producer, consumer):
                    blocker = next((i.pipeline for i in self.body(scope, role or "") if isinstance(i, Sync) and i.pipeline in frozen), None)
                    if blocker is not None and p not in frozen:
                        frozen[p] = f"pipeline {p!r} shares a loop body with {blocker!r}, which is kept"
                        changed = True
        self.frozen = frozenset(frozen)
        self.limits += [msg for msg in frozen.values() if "root scope" not in msg]
        self.channels = self._group_channels(where, frozen)
        self.guarded = {key: p for key, p in self.guarded.items() if key in self.channels}
        self._where = where
        if not self.channels:
            self.limits.append("pipeline layout, depths and stages: no pipeline synchronizes a loop")

    def _group_channels(self, where: dict[str, tuple[str, str | None, str | None]], frozen: dict[str, str]) -> dict[tuple[str, str | None, str | None], tuple[Pipeline, ...]]:
        channels: dict[tuple[str, str | None, str | None], list[Pipeline]] = {}
        for p in self.schedule.pipelines:
            if p.name not in frozen:
                channels.setdefault(where[p.name], []).append(p)
        return {key: tuple(ps) for key, ps in channels.items()}

    def _early_release(self, key: tuple[str, str | None, str | None], pipes: tuple[Pipeline, ...]) -> str | None:
        """A pipeline the consumer releases after issuing an async MMA that reads
        its buffers but before any wait: some other pipeline of the channel (a
        token released after the wait) must be what keeps the producer off its slots."""
        scope, _, consumer = key
        body = self.body(scope, consumer or "")
        delta = self._deltas(consumer or "", body, self._seed_pipe_of)
        at = [(delta[q], q) for q in range(len(body))]  # when each entry runs, for one iteration
        issues = {q: self._access(e).reads for q, e in enumerate(body) if isinstance(e, str) and self._access(e).issues_async}
        retires = [at[q] for q, e in enumerate(body) if isinstance(e, str) and self._access(e).retires_async]
        for pos, i in enumerate(body):
            if isinstance(i, Sync) and i.kind == CONSUMER_SYNCS[1] and i.pipeline in {p.name for p in pipes}:
                for q, reads in issues.items():
                    if set(self._pipelines[i.pipeline].buffers) & reads and at[q] < at[pos] and not any(at[q] < r < at[pos] for r in self._next_after(at[q], retires)):
                        return i.pipeline
        return None

    @staticmethod
    def _next_after(event: tuple[int, int], entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Each entry's first run after ``event``, as (step, position), whatever its iteration."""
        step, pos = event
        return [(step + (0 if p > pos else 1), p) for _, p in entries]

    def _find_movable(self) -> tuple[Movable, ...]:
        replicated = {op for s in self.schedule.scopes for _, body in s.bodies for op in body if isinstance(op, str) and op not in self.scopes and len(self._placements(op)) > 1}
        protected = set(self._seed_pipe_of)
        out: list[Movable] = []
        for scope in self.schedule.scopes:
            if scope.id == ROOT_SCOPE:
                continue
            for role, body in scope.bodies:
                if any(isinstance(i, Sync) and i.pipeline in self.frozen for i in body):
                    continue
                for op in (e for e in body if isinstance(e, str) and e not in self.scopes):
                    found = self._movable(scope.id, role, op, replicated, protected)
                    if found:
                        out.append(found)
        return tuple(out)

    def _movable(self, scope: str, role: str, op: str, replicated: set[str], protected: set[str]) -> Movable | None:
        acc = self._access(op)
        shared = sorted(b for b in acc.reads if self.kinds.get(b) == "shared")
        on_chip = [b for b in acc.touched if not b.startswith("$")]
        if acc.issues_async or acc.retires_async or not shared or set(on_chip) != set(shared) or protected & set(shared):
            return None
        if self._placements(op) != {role}:
            return None
        body = self.body(scope, role)
        before = body[: body.index(op)]
        for b in shared:  # written only here, before the op, in this role; touched by nothing else
            users = [o for o, a in self.accesses.items() if b in a.touched and o not in self.scopes and o != op]
            if not users or any(self._placements(o) != {role} or o not in before or b in self._access(o).reads for o in users):
                return None
        path = self._path(scope)
        control = [e for s in path for e in self.body(s, role) if isinstance(e, str) and e not in self.scopes and e != op]
        locals_written = [e for e in control if any(self.kinds.get(b) == "local" or b.startswith("$") for b in self._access(e).writes)]
        if any(e not in replicated for e in locals_written):  # the new role could not follow the loop
            return None
        defined = {v for e in control if e in replicated for v in self._access(e).writes if v.startswith("$")}
        if any(v.startswith("$") and v not in defined for v in acc.reads):
            return None
        taken = set(self.role_names)
        new_role = op if op not in taken else f"{op}_role"
        pipeline = "_".join(shared)
        while pipeline in self._pipelines:
            pipeline += "_"
        return Movable(op, role, scope, tuple(shared), new_role, pipeline)

    def _path(self, scope: str) -> list[str]:
        """Scopes from the root down to ``scope``."""
        path = [scope]
        while path[-1] in self.parent:
            path.append(self.parent[path[-1]])
        return path[::-1]

    # --- pipeline layouts ---------------------------------------------------
    def _groupings(self, pipes: tuple[Pipeline, ...]) -> dict[str, tuple[tuple[str, tuple[str, ...]], ...]]:
        """The channel's buffers as pipelines (name, buffers), per layout."""
        buffers = [b for p in pipes for b in p.buffers]
        seed = tuple((p.name, p.buffers) for p in pipes)
        merged = ((self._name_for(buffers, pipes), tuple(buffers)),)
        parent = {b: b for b in buffers}

        def find(b: str) -> str:
            while parent[b] != b:
                b = parent[b]
            return b

        for op, acc in self.accesses.items():  # an op's writes complete one pipeline: keep them together
            if op in self.scopes:
                continue
            written = [b for b in buffers if b in acc.writes]
            for b in written[1:]:
                parent[find(b)] = find(written[0])
        parts: dict[str, list[str]] = {}
        for b in buffers:
            parts.setdefault(find(b), []).append(b)
        separate = tuple((self._name_for(part, pipes), tuple(part)) for part in parts.values())
        return {SEED: seed, MERGED: merged, SEPARATE: separate}

    @staticmethod
    def _name_for(buffers: Sequence[str], pipes: tuple[Pipeline, ...]) -> str:
        """A seed pipeline's name where it holds exactly these buffers; else made from its parts."""
        exact = next((p.name for p in pipes if set(p.buffers) == set(buffers)), None)
        if exact:
            return exact
        whole = [p.name for p in pipes if set(p.buffers) <= set(buffers)]
        if sum(len(p.buffers) for p in pipes if p.name in whole) == len(buffers):
            return "_".join(whole)
        return "_".join(buffers)

    def _layouts(self) -> dict[str, tuple[tuple[str, tuple[str, ...]], ...]]:
        """Layout label -> the varied pipelines (name, buffers), channel after channel."""
        per = [self._groupings(pipes) for pipes in self.channels.values()]
        flat = {label: tuple(itertools.chain.from_iterable(g[label] for g in per)) for label in (SEED, MERGED, SEPARATE)}
        out: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {}
        for label in (MERGED, SEPARATE):
            if flat[label] not in out.values():
                out[label] = flat[label]
        if flat[SEED] not in out.values():
            out = {SEED: flat[SEED], **out}
        # Every label names some layout of every seed, so samplers see one choice list.
        self.layout_alias = {label: next(k for k, v in out.items() if v == flat[label]) for label in (SEED, MERGED, SEPARATE)}
        return out

    @property
    def seed_layout(self) -> str:
        return self.layout_alias[SEED]

    # --- plans --------------------------------------------------------------
    def plan(self, layout: str, moved: tuple[str, ...] = ()) -> Plan:
        return self._plan(self.layout_alias.get(layout, layout), moved)

    @functools.cache
    def _plan(self, layout: str, moved: tuple[str, ...]) -> Plan:
        varied_pipes = self.layouts[layout]
        moves = [m for m in self.movable if m.op in moved]
        pipe_of = {b: name for name, bufs in varied_pipes for b in bufs}
        pipe_of.update({b: m.pipeline for m in moves for b in m.buffers})
        producer = {pipe_of[b]: self._where[self._seed_pipe_of[b]][1] for name, bufs in varied_pipes for b in bufs}
        producer.update({m.pipeline: m.role for m in moves})
        pipelines: list[Pipeline] = []
        for p in self.schedule.pipelines:
            if p.name in self.frozen:
                pipelines.append(p)
                continue
            for name, bufs in varied_pipes:
                if name not in {q.name for q in pipelines} and set(bufs) & set(p.buffers):
                    same = self._pipelines.get(name)
                    pipelines.append(Pipeline(name, bufs, same.depth if same is not None and same.buffers == bufs else p.depth))
        pipelines += [Pipeline(m.pipeline, m.buffers, 1) for m in moves]
        tied = []
        for (scope, prod, cons), pipes in self.channels.items():
            if (scope, prod, cons) in self.guarded:  # the guard and what it guards keep one depth
                names = [name for name, bufs in varied_pipes if set(bufs) <= {b for p in pipes for b in p.buffers}]
                tied += [(name, names[0]) for name in names[1:]]
        held = {(scope, prod) for (scope, prod, _) in self.guarded}
        keys = sorted({(scope, role) for (scope, prod, cons) in self.channels for role in (prod, cons) if role} | {(m.scope, m.role) for m in moves}, key=self._body_order)
        body_groups, choices, infeasible = [], [], None
        for key in keys:
            groups = self._groups(key, pipe_of, moves, fixed=key in held)
            choice, reason = self._stage_choice(key, groups, pipe_of, producer, moves)
            if choice is not None and len(choice.options) == 1:  # one way: pin it, no decision
                groups = [replace(g, fixed=stage) for g, stage in zip(groups, choice.options[0])]
            elif choice is not None:
                choices.append(choice)
            infeasible = infeasible or reason
            body_groups.append((key, tuple(groups)))
        varied = tuple(name for name, _ in varied_pipes if name not in dict(tied)) + tuple(m.pipeline for m in moves)
        return Plan(layout, tuple(m.op for m in moves), tuple(pipelines), varied, tuple(tied), tuple(g for c in choices for g in c.groups), tuple(choices),
                    self.role_names + tuple(m.new_role for m in moves), tuple(pipe_of.items()), tuple(producer.items()), tuple(body_groups), infeasible)  # fmt: skip

    def _stage_choice(self, key: BodyKey, groups: list[Group], pipe_of: dict[str, str], producer: dict[str, str],
                      moves: Sequence[Movable]) -> tuple[StageChoice | None, str | None]:  # fmt: skip
        """The stage tuples of a body's groups that keep the seed's dependences:
        offsets up to max_stage_offset, lowest at the body's base, and the seed's
        own; or why there is none."""
        if len(groups) < 2 or any(g.fixed is not None for g in groups):
            return None, None
        everything = [o for o in itertools.product(range(self.max_stage_offset + 1), repeat=len(groups)) if min(o) == 0]
        options = list(everything)
        seed_stage = {i.pipeline: i.stage for i in self.body(*key) if isinstance(i, Sync)}
        if all(p in seed_stage and self._keeps(p, pipe_of) for g in groups for p in g.pipelines):
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
        return StageChoice(tuple(groups), tuple(feasible), complete=len(feasible) == len(options) == len(everything)), None

    def _body_order(self, key: BodyKey) -> tuple[int, int]:
        scope, role = key
        return [s.id for s in self.schedule.scopes].index(scope), self.role_names.index(role)

    def _candidate_pipes(self, key: BodyKey, pipe_of: dict[str, str], moves: Sequence[Movable]) -> list[str]:
        """Pipelines the rebuilt body synchronizes, in the order their spans first appear."""
        scope, role = key
        seen: list[str] = []
        for i in self.body(scope, role):
            names = [pipe_of[b] for b in self._pipelines[i.pipeline].buffers] if isinstance(i, Sync) else []
            names += [m.pipeline for m in moves if (m.scope, m.role) == key and isinstance(i, str) and i in self._writers(m)]
            seen += [n for n in names if n not in seen]
        return seen

    def _writers(self, move: Movable) -> list[str]:
        return [e for e in self.body(move.scope, move.role) if isinstance(e, str) and set(self.entry_access(move.role, e)[1]) & set(move.buffers)]

    def _groups(self, key: BodyKey, pipe_of: dict[str, str], moves: Sequence[Movable], fixed: bool = False) -> list[Group]:
        """The body's span groups; ``fixed``: each at the seed's stage of its buffers."""
        scope, role = key
        pipes = self._candidate_pipes(key, pipe_of, moves)
        parent = {p: p for p in pipes}

        def find(p: str) -> str:
            while parent[p] != p:
                p = parent[p]
            return p

        for e in self.body(scope, role):
            if isinstance(e, str):
                touched = [p for p in pipes if any(pipe_of.get(b) == p for b in self.entry_access(role, e)[2])]
                for p in touched[1:]:
                    parent[find(p)] = find(touched[0])
        base = min((i.stage for i in self.body(scope, role) if isinstance(i, Sync)), default=0)
        out: dict[str, list[str]] = {}
        for p in pipes:
            out.setdefault(find(p), []).append(p)
        seed_stage = {self._pipelines[i.pipeline].buffers[0]: i.stage for i in self.body(scope, role) if isinstance(i, Sync)}
        first = {p: next(b for b, q in pipe_of.items() if q == p) for p in pipes}
        return [Group(scope, role, tuple(ps), base, seed_stage.get(first[ps[0]], base) if fixed else None) for ps in out.values()]

    def seed_stages(self, plan: Plan) -> tuple[int, ...]:
        """The seed's stage of each decided group (of the seed's own plan)."""
        return tuple(next(i.stage for i in self.body(g.scope, g.role) if isinstance(i, Sync) and i.pipeline in g.pipelines) for g in plan.groups)

    # --- building a variant --------------------------------------------------
    def schedule_for(self, plan: Plan, depths: Sequence[int], stages: Sequence[int], roles: Sequence[Role], num_warps: int) -> Schedule | str:
        """The variant's schedule (``roles``: one per plan role, in order), or why it is refused."""
        bodies = self.bodies(plan, tuple(stages))
        if isinstance(bodies, str):
            return bodies
        depth_of = plan.depth_of(depths)
        pipelines = tuple(Pipeline(p.name, p.buffers, depth_of[p.name]) for p in plan.pipelines)
        scopes = tuple(
            Scope(s.id, tuple((role, bodies.get((s.id, role), body)) for role, body in s.bodies) + self._new_bodies(plan, s.id))
            for s in self.schedule.scopes
        )
        return Schedule(num_warps, tuple(roles), pipelines, scopes)

    def _new_bodies(self, plan: Plan, scope: str) -> tuple[tuple[str, tuple[Instr, ...]], ...]:
        """Bodies of the roles that moved ops run in: loop control, and the op in its span."""
        out = []
        for m in self.movable:
            if m.op not in plan.moved or scope not in self._path(m.scope):
                continue
            body: list[Instr] = []
            for e in self.body(scope, m.role):
                if e == m.op:
                    body += [Sync(CONSUMER_SYNCS[0], m.pipeline), e, Sync(CONSUMER_SYNCS[1], m.pipeline)]
                elif isinstance(e, str) and (e in self._path(m.scope) or (e not in self.scopes and len(self._placements(e)) > 1)):
                    body.append(e)
            out.append((m.new_role, tuple(body)))
        return tuple(out)

    @functools.cache
    def bodies(self, plan: Plan, stages: tuple[int, ...]) -> dict[BodyKey, tuple[Instr, ...]] | str:
        """The rebuilt bodies at these group stages, or why the stages break a dependence."""
        decided = dict(zip(plan.groups, stages))
        pipe_of = dict(plan.pipe_of)
        producer = dict(plan.producer)
        moves = [m for m in self.movable if m.op in plan.moved]
        out: dict[BodyKey, tuple[Instr, ...]] = {}
        for key, groups in plan.body_groups:
            stage = {p: decided.get(g, g.base if g.fixed is None else g.fixed) for g in groups for p in g.pipelines}
            body = self._rebuild(key, pipe_of, producer, moves, stage)
            if isinstance(body, str):
                return body
            out[key] = body
        return out

    def _keeps(self, seed_pipeline: str, pipe_of: dict[str, str]) -> bool:
        """Whether the variant has this seed pipeline as it is (name and buffers)."""
        bufs = self._pipelines[seed_pipeline].buffers
        return all(pipe_of.get(b) == seed_pipeline for b in bufs) and sum(p == seed_pipeline for p in pipe_of.values()) == len(bufs)

    def _rebuild(self, key: BodyKey, pipe_of: dict[str, str], producer: dict[str, str], moves: Sequence[Movable], stage: dict[str, int]) -> tuple[Instr, ...] | str:
        scope, role = key
        seed_body = self.body(scope, role)
        moved_here = {m.op for m in moves if (m.scope, m.role) == key}
        syncs = [i for i in seed_body if isinstance(i, Sync)]
        if not moved_here and all(self._keeps(i.pipeline, pipe_of) and stage[i.pipeline] == i.stage for i in syncs):
            return seed_body  # the seed's own spans at the seed's stages: its body, unchanged
        seed_delta = self._deltas(role, seed_body, self._seed_pipe_of)
        items = self._items(key, seed_delta, pipe_of, producer, moves, moved_here)
        s_min = min(stage.values())
        delta: dict[object, int] = {}
        for it in items:
            if isinstance(it.key, tuple):
                delta[it.key] = stage[it.key[1]] - s_min
            else:
                touched = {stage[pipe_of[b]] for b in self.entry_access(role, it.key)[2] if pipe_of.get(b) in stage}
                delta[it.key] = (min(touched) - s_min) if touched else 0
        shift = max(delta.values(), default=0)
        after: dict[int, set[int]] = {i: set() for i in range(len(items))}
        for i, j in itertools.combinations(range(len(items)), 2):
            edge = _order(items[i], items[j], delta[items[i].key], delta[items[j].key], shift)
            if isinstance(edge, str):
                return f"order: in {role}'s body of {scope}, {edge}"
            if edge:
                after[i if edge > 0 else j].add(j if edge > 0 else i)
        order = _stable_topological(items, after)
        if order is None:
            return f"order: in {role}'s body of {scope}, these stages need a cycle of moves"
        return tuple(Sync(it.key[0], it.key[1], stage[it.key[1]]) if isinstance(it.key, tuple) else it.key for it in order)

    def _items(self, key: BodyKey, seed_delta: list[int], pipe_of: dict[str, str], producer: dict[str, str], moves: Sequence[Movable], moved_here: set[str]) -> list[_Item]:
        scope, role = key
        seed_body = self.body(scope, role)
        items: list[_Item] = []
        touching: dict[str, list[int]] = {}
        for pos, entry in enumerate(seed_body):
            if isinstance(entry, Sync) or entry in moved_here:
                continue
            reads, writes, touched = self.entry_access(role, entry)
            ref = (seed_delta[pos], float(pos))
            items.append(_Item(entry, (float(pos), 1, 0), reads, writes, tuple((r, ref) for r in reads | writes)))
            for p in {pipe_of[b] for b in touched if b in pipe_of}:
                touching.setdefault(p, []).append(pos)
        seed_syncs = {(i.kind, b): (seed_delta[pos], float(pos)) for pos, i in enumerate(seed_body) if isinstance(i, Sync) for b in self._pipelines[i.pipeline].buffers}
        for index, p in enumerate(self._candidate_pipes(key, pipe_of, moves)):
            bufs = [b for b, q in pipe_of.items() if q == p]
            opening = PRODUCER_SYNCS[0] if producer[p] == role else CONSUMER_SYNCS[0]
            kept = self._pipelines.get(p) is not None and self._keeps(p, pipe_of)
            span = touching.get(p, [])
            if not kept and not span:
                return []  # unreachable: a pipeline no entry touches is frozen
            for kind in (opening, CLOSE_OF[opening]):
                is_open = kind == opening
                seed_pos = next((q for q, i in enumerate(seed_body) if kept and isinstance(i, Sync) and i.pipeline == p and i.kind == kind), None)
                where = float(seed_pos) if seed_pos is not None else (min(span) - 0.5 if is_open else max(span) + 0.5)
                made_up = (seed_delta[min(span)] if is_open else seed_delta[max(span)], where) if span else (0, where)
                ref = tuple((b, seed_syncs.get((kind, b), made_up)) for b in bufs)
                items.append(_Item((kind, p), (where, 1 if is_open else 0, index), frozenset(bufs), frozenset(bufs), ref))
        return sorted(items, key=lambda it: it.order)

    def _deltas(self, role: str, body: Sequence[Instr], pipe_of: dict[str, str]) -> list[int]:
        """Each entry's iteration offset, as MaterializeWSSchedule plans it (PlanStages)."""
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
            touched = {open_stage[p] for p in {pipe_of.get(b) for b in self.entry_access(role, entry)[2]} if p in open_stage}
            out.append(min(touched) - s_min if touched else 0)
        return out

    # --- the verifier's deadlock model ---------------------------------------
    @functools.cache
    def deadlock(self, plan: Plan, stages: tuple[int, ...], depths: tuple[int, ...]) -> str | None:
        """MaterializeWSSchedule's deadlock check: every role's sync events under
        the mbarrier parity model, each loop modelled at max depth + 1 trips."""
        depth_of = plan.depth_of(depths)
        depth = [depth_of[p.name] for p in plan.pipelines]
        trips = max([2] + [d + 1 for d in depth])
        events = self._events(plan, stages, trips)
        blocked = _simulate(events, depth)
        if not blocked:
            return None
        where = ", ".join(f"{plan.roles[r]} at {_KINDS[code].lower()}({plan.pipelines[p].name})" for r, (code, p) in blocked)
        return f"deadlock: {where} (mbarrier parity model, loops at {trips} trips)"

    @functools.cache
    def _events(self, plan: Plan, stages: tuple[int, ...], trips: int) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Each role's sync events in emitted order (FlattenRoleEvents), as (kind, pipeline index)."""
        roles = tuple(Role(name, 0, 1) for name in plan.roles)
        schedule = self.schedule_for(plan, [1] * len(plan.varied), stages, roles, 4)
        assert not isinstance(schedule, str)
        scopes = {s.id: s for s in schedule.scopes}
        pipe_of = {b: p.name for p in schedule.pipelines for b in p.buffers}
        deltas = {(s.id, role): self._deltas(role, body, pipe_of) for s in schedule.scopes for role, body in s.bodies}

        def flatten(scope_id: str, role: str, out: list[Sync]) -> None:
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
                        flatten(entry, role, out)

        index = {p.name: i for i, p in enumerate(plan.pipelines)}
        events = []
        for role in plan.roles:
            flat: list[Sync] = []
            flatten(ROOT_SCOPE, role, flat)
            events.append(tuple((_KINDS.index(e.kind), index[e.pipeline]) for e in flat))
        return tuple(events)


def _order(a: _Item, b: _Item, da: int, db: int, shift: int) -> int | str:
    """+1: ``a`` must come before ``b`` in the body; -1: after; 0: free; or why neither works.

    Event (x, iteration i) runs at step i + delta_x, position pos_x. ``a`` at
    iteration i precedes ``b`` at i + k iff k >= T, T = -(db - da) when a sits
    before b, one more when after. The seed's T must hold in the variant.
    """
    conflict = (a.writes & (b.reads | b.writes)) | (b.writes & a.reads)
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


def _label(item: _Item) -> str:
    if isinstance(item.key, tuple):
        return f"{item.key[0].lower()}({item.key[1]})"
    return repr(item.key)


def _stable_topological(items: list[_Item], after: dict[int, set[int]]) -> list[_Item] | None:
    """Items in dependence order, each as early as its seed position allows."""
    indegree = {i: 0 for i in after}
    for succ in after.values():
        for j in succ:
            indegree[j] += 1
    ready = [(items[i].order, i) for i, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    out: list[_Item] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(items[i])
        for j in after[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, (items[j].order, j))
    return out if len(out) == len(items) else None


_KINDS = (CONSUMER_SYNCS[0], PRODUCER_SYNCS[0], PRODUCER_SYNCS[1], CONSUMER_SYNCS[1])  # event codes 0-3
_WAIT, _ACQUIRE, _COMMIT = 0, 1, 2


def _simulate(events: tuple[tuple[tuple[int, int], ...], ...], depth: list[int]) -> list[tuple[int, tuple[int, int]]]:
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
