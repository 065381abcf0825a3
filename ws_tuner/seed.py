"""The seed schedule, understood: what a variant may change, and what it must keep.

Pipelines are grouped into channels (a producer role, a consumer role, a loop
scope); a channel's buffers may be regrouped into pipelines and deepened.
Pipelines in the root scope (they run once), tokens no op touches, nested
pipelines, and pipelines with other than one span per iteration are kept as
in the seed, with the others of their loop bodies, and ``limits`` says so. A
channel whose consumer releases a pipeline before the wait that retires the
async MMA reading it (a token released later guards it, as in CUTLASS's
order) keeps its producer's stages and one depth for all its pipelines.

An op that stores from shared memory in a loop, reading buffers only its
role writes there, is ``Movable``: it may run in a role of its own that
replays the loop control the seed already runs in several roles. So is an op
that loads shared buffers from global memory that only its role reads, after
it, in the same loop body (an element-wise gather, which role_based leaves
with the consumers): its role becomes their producer.

What each entry of a role body reads and writes (``entry_access``) is the
kernel's op accesses, a child scope's as the union of what the role does in
it, and, for async MMAs, the role's queue: a wait touches everything the
role's async MMAs touch, until it retires them.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

from .order import OPENS, stage_deltas
from .rules import MmaTile
from .schedule import CONSUMER_SYNCS, ROOT_SCOPE, Instr, OpAccess, Pipeline, Schedule, Sync

SEED, MERGED, SEPARATE = "seed", "merged", "separate"
BodyKey = tuple[str, str]  # (scope id, role)
Channel = tuple[str, "str | None", "str | None"]  # (loop scope, producer role, consumer role)


@dataclass(frozen=True)
class Movable:
    """An op that can leave its role: it reads shared buffers that only its role
    writes before it, in the same loop body, and writes no on-chip buffer (a
    store to global memory: it moves to a role of its own); or (``feeds``) it
    writes shared buffers that only its role reads after it there, and reads no
    on-chip buffer (a load from global memory: it moves to the Load role, or a
    role of its own where the seed has none). The buffers pass between the two
    roles through a new pipeline; the receiving role replays the loop-control
    ops the seed already runs in several roles, and ``follows``: the scalar binds
    of its old role that it needs besides (an index, a trip count read from global
    memory), run in both."""

    ops: tuple[str, ...]  # the first names the move; a body's loads move together, to one producer
    role: str  # the role that places it in the seed
    scope: str
    buffers: tuple[str, ...]  # what passes between the roles, through the new pipeline
    new_role: str  # a role of its own; for loads, the seed's Load role where it has one
    pipeline: str
    feeds: bool = False  # the new role produces the buffers (a load) rather than consuming them (a store)
    follows: tuple[str, ...] = ()  # scalar binds of ``role`` on the way down to the op, run by the new role too

    @property
    def op(self) -> str:
        return self.ops[0]


def _reach(start: str, flows: Sequence[tuple[frozenset[str], frozenset[str]]]) -> set[str]:
    """The buffers that data written to ``start`` reaches through ops of (reads, writes)."""
    seen, todo = {start}, [start]
    while todo:
        buffer = todo.pop()
        for reads, writes in flows:
            if buffer in reads:
                todo += [w for w in writes if w not in seen]
                seen |= writes
    return seen


class Seed:
    """A seed schedule and the kernel's op accesses, analysed once."""

    def __init__(self, schedule: Schedule, accesses: dict[str, OpAccess], buffer_kinds: dict[str, str]):
        self.schedule = schedule
        self.accesses = accesses
        self.kinds = buffer_kinds
        self.limits: list[str] = []
        self.scopes = {s.id: s for s in schedule.scopes}
        self.parent = {entry: s.id for s in schedule.scopes for _, body in s.bodies for entry in body if isinstance(entry, str) and entry in self.scopes}
        self.role_names = tuple(r.name for r in schedule.roles)
        self.pipelines = {p.name: p for p in schedule.pipelines}
        self.pipe_of = {b: p.name for p in schedule.pipelines for b in p.buffers}
        self.heavy = frozenset(r for r in self.role_names if any(self.kinds.get(b) == "fragment" for op in self._ops_of(r) for b in self.access(op).writes))
        self._find_channels()
        self.movable = self._find_movable()
        self.layouts = self._layouts()
        self.kernel_side = self._kernel_side()

    def _kernel_side(self) -> dict[str, str]:
        """What no schedule of this seed can do, only a change to the kernel, by name: said
        (where no seed of the kernel's has it), since it is where FlashAttention-3 and
        CUTLASS find much of their speed."""
        ops = [self.access(op) for role in self.role_names for op in self._ops_of(role)]
        if not any(a.mmas for a in ops):
            return {}
        out = {}
        if not any(a.issues_async for a in ops):
            out["overlap"] = ("MMA overlap: the kernel's MMAs wait for themselves (T.gemm is a wgmma and its wait, or an mma.sync), so no schedule "
                              "overlaps one with the next; a kernel that issues T.wgmma_gemm and T.wait_wgmma itself, with a seed "
                              "schedule of its own (T.annotate_ws_schedule), has their stages varied (examples/attention.py and "
                              "examples/gemm.py, mma=async)")  # fmt: skip
        if len([r for r in self.role_names if any(self.access(op).mmas for op in self._ops_of(r))]) == 1:
            out["consumers"] = ("consumers: one role runs the MMAs (its warps vary, cooperatively); ping-pong consumers need tiles "
                                "and pipelines of their own in the kernel (examples/attention.py and examples/gemm.py, consumers=pingpong)")  # fmt: skip
        return out

    # --- the seed's structure ---------------------------------------------
    def body(self, scope: str, role: str) -> tuple[Instr, ...]:
        return self.scopes[scope].body(role) if scope in self.scopes else ()

    def access(self, op: str) -> OpAccess:
        return self.accesses.get(op, OpAccess())

    def _ops_of(self, role: str) -> Iterator[str]:
        for scope in self.schedule.scopes:
            yield from (e for e in scope.body(role) if isinstance(e, str) and e not in self.scopes)

    def placements(self, op: str) -> set[str]:
        return {role for s in self.schedule.scopes for role, body in s.bodies if op in body}

    @functools.cached_property
    def mma_tiles(self) -> dict[str, frozenset[MmaTile]]:
        """Per role: the tiles its MMAs accumulate (its warps must split each),
        marked ``chained`` where an accumulator flows through the role's
        fragments into an MMA's register operand (attention's S into P @ V)."""
        out = {}
        for role in self.role_names:
            accesses = [self.access(op) for op in self._ops_of(role)]
            mmas = [m for a in accesses for m in a.mmas]
            # Only registers chain: a tile read back from shared memory takes whatever layout
            # its reader wants (MLA decoding's P goes through S_shared into a register operand).
            flows = [(self._in_registers(a.reads), self._in_registers(a.writes)) for a in accesses if not a.mmas]
            reached = {src: _reach(src.accumulator, flows) for src in mmas}
            chained = {x for src in mmas for m in mmas if m.operand in reached[src] for x in (src, m)}
            out[role] = frozenset(MmaTile(m.rows, m.cols, m.policy, m in chained, m.bits) for m in mmas)
        return out

    def _in_registers(self, buffers: frozenset[str]) -> frozenset[str]:
        return frozenset(b for b in buffers if self.kinds.get(b) != "shared")

    def _placed(self, moved: tuple[str, ...]) -> Iterator[tuple[str, str]]:
        """(role, op) for every op of every role, the ``moved`` ops in their new roles."""
        moves = {op: m.new_role for m in self.movable if m.op in moved for op in m.ops}
        for role in self.role_names:
            for op in self._ops_of(role):
                yield moves.get(op, role), op

    @functools.cache  # noqa: B019 - one Seed per analysed seed, kept as long as its space
    def loop_elements(self, moved: tuple[str, ...] = ()) -> dict[str, frozenset[int]]:
        """Per role: the iterations of its element-wise loops, with the ``moved`` ops'
        loops in their new roles."""
        out: dict[str, set[int]] = {}
        for role, op in self._placed(moved):
            if self.access(op).elements:
                out.setdefault(role, set()).add(self.access(op).elements)
        return {role: frozenset(n) for role, n in out.items()}

    @functools.cache  # noqa: B019 - as loop_elements
    def thread_indexed(self, moved: tuple[str, ...] = ()) -> frozenset[str]:
        """The roles that run an op of the kernel's own that reads the thread index, with
        the ``moved`` ops in their new roles."""
        return frozenset(role for role, op in self._placed(moved) if self.access(op).thread_index)

    @functools.cached_property
    def loads(self) -> tuple[str, ...]:
        """The element-wise loops of the seed's light roles that load shared buffers from
        global memory (a producer's gather: no TMA loads rows by index), in role order; a
        move's loads are not among them."""
        moving = {op for m in self.movable for op in m.ops}
        found = []
        for role in self.role_names:
            for op in self._ops_of(role) if role not in self.heavy else ():
                acc = self.access(op)
                on_chip = {b for b in acc.touched if not b.startswith("$")}
                if acc.elements and on_chip and on_chip <= set(acc.writes) and all(self.kinds.get(b) == "shared" for b in on_chip) and op not in moving:
                    found.append(op)
        return tuple(dict.fromkeys(found))

    @functools.cached_property
    def accumulator_words(self) -> dict[str, int]:
        """Per role: the 32-bit words of its MMAs' accumulators (each once), live
        in its registers across its loop."""
        return {r: sum({m.accumulator: m.words for op in self._ops_of(r) for m in self.access(op).mmas}.values()) for r in self.role_names}

    @functools.cached_property
    def async_resources(self) -> dict[str, frozenset[str]]:
        """Per role: what its asynchronous MMAs touch until a wait retires them."""
        return {r: frozenset().union(*(self.access(op).touched for op in self._ops_of(r) if self.access(op).issues_async)) for r in self.role_names}

    @functools.cache
    def entry_access(self, role: str, entry: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        """(reads, writes, buffers really touched) of a body entry as seen by ``role``:
        a child scope is what the role does inside it; an async MMA or wait also
        touches its role's queue, and a wait everything the role's MMAs touch."""
        if entry in self.scopes:
            parts = [self.entry_access(role, e) for e in self.body(entry, role) if isinstance(e, str)]
            return tuple(frozenset().union(*(p[i] for p in parts)) for i in range(3))  # type: ignore[return-value]
        acc = self.access(entry)
        reads, writes = set(acc.reads), set(acc.writes)
        if acc.issues_async or acc.retires_async:
            reads.add(f"async@{role}")
            writes.add(f"async@{role}")
        if acc.retires_async:
            reads |= self.async_resources[role]
            writes |= self.async_resources[role]
        return frozenset(reads), frozenset(writes), acc.touched

    def _spans(self, scope: str, role: str, pipeline: str) -> int:
        return sum(isinstance(i, Sync) and i.pipeline == pipeline and i.kind in OPENS for i in self.body(scope, role))

    def _find_channels(self) -> None:
        """Which seed pipelines the space may regroup and deepen, by channel."""
        where: dict[str, Channel] = {}
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
            elif (unguarded := self._read_past_a_skipped_write(p)) is not None:
                frozen[p.name] = unguarded
        self.guarded: dict[Channel, str] = {}
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
        self.where = where
        if not self.channels:
            self.limits.append("the seed's pipeline layout, depths and stages: none of its pipelines synchronizes a loop (a pipeline made by moving an op to a role of its own may still vary)")

    # A write under an ``if`` that skips it leaves the buffer's previous value, which a reader
    # outside that ``if`` still uses. With more than one version, the reader gets the version
    # of some earlier iteration instead (role_based refuses to version such a buffer).
    # Readers under the same condition skip with the write: NSA's and SeerAttention's loads
    # and MMAs under one mask bit deepen soundly.
    def _read_past_a_skipped_write(self, p: Pipeline) -> str | None:
        ops = [(op, a) for op, a in self.accesses.items() if not a.loop and op not in self.scopes]  # a loop's ops are listed themselves
        for buffer in p.buffers:
            for writer, w in ops:
                if buffer not in w.writes or not w.conditions:
                    continue
                reader = next((op for op, a in ops if buffer in a.reads and op != writer and not w.conditions <= a.conditions), None)
                if reader is not None:
                    return (f"pipeline {p.name!r}: {writer} writes {buffer!r} under a condition that {reader}, which reads it, "
                            "is not under (a skipped write leaves the previous value, which another version would not hold)")  # fmt: skip
        return None

    def _group_channels(self, where: dict[str, Channel], frozen: dict[str, str]) -> dict[Channel, tuple[Pipeline, ...]]:
        channels: dict[Channel, list[Pipeline]] = {}
        for p in self.schedule.pipelines:
            if p.name not in frozen:
                channels.setdefault(where[p.name], []).append(p)
        return {key: tuple(ps) for key, ps in channels.items()}

    def _early_release(self, key: Channel, pipes: tuple[Pipeline, ...]) -> str | None:
        """A pipeline the consumer releases after issuing an async MMA that reads
        its buffers but before any wait: some other pipeline of the channel (a
        token released after the wait) must be what keeps the producer off its slots."""
        scope, _, consumer = key
        body = self.body(scope, consumer or "")
        delta = self.deltas(consumer or "", body, self.pipe_of)
        at = [(delta[q], q) for q in range(len(body))]  # when each entry runs, for one iteration
        issues = {q: self.access(e).reads for q, e in enumerate(body) if isinstance(e, str) and self.access(e).issues_async}
        retires = [at[q] for q, e in enumerate(body) if isinstance(e, str) and self.access(e).retires_async]
        for pos, i in enumerate(body):
            if isinstance(i, Sync) and i.kind == CONSUMER_SYNCS[1] and i.pipeline in {p.name for p in pipes}:
                for q, reads in issues.items():
                    if set(self.pipelines[i.pipeline].buffers) & reads and at[q] < at[pos] and not any(at[q] < r < at[pos] for r in self._next_after(at[q], retires)):
                        return i.pipeline
        return None

    @staticmethod
    def _next_after(event: tuple[int, int], entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Each entry's first run after ``event``, as (step, position), whatever its iteration."""
        step, pos = event
        return [(step + (0 if p > pos else 1), p) for _, p in entries]

    def _find_movable(self) -> tuple[Movable, ...]:
        replicated = {op for s in self.schedule.scopes for _, body in s.bodies for op in body if isinstance(op, str) and op not in self.scopes and len(self.placements(op)) > 1}
        protected = set(self.pipe_of)
        out: list[Movable] = []
        for scope in self.schedule.scopes:
            if scope.id == ROOT_SCOPE:
                continue
            for role, body in scope.bodies:
                if any(isinstance(i, Sync) and i.pipeline in self.frozen for i in body):
                    continue
                found = [m for op in body if isinstance(op, str) and op not in self.scopes and (m := self._movable(scope.id, role, op, replicated, protected))]
                loads = [m for m in found if m.feeds]
                out += [m for m in found if not m.feeds] + ([self._together(loads)] if loads else [])
        return tuple(out)

    def _together(self, loads: list[Movable]) -> Movable:
        """A body's loads as one move: one producer role and one pipeline feed the body
        (sparse attention gathers its keys and their rotary tails by the same indices)."""
        if len(loads) == 1:
            return loads[0]
        first, buffers = loads[0], tuple(b for m in loads for b in m.buffers)
        follows = tuple(dict.fromkeys(e for m in loads for e in m.follows))
        return replace(first, ops=tuple(m.op for m in loads), buffers=buffers, pipeline=self._new_pipeline(buffers), follows=follows)

    def _new_pipeline(self, buffers: Sequence[str]) -> str:
        name = "_".join(buffers)
        while name in self.pipelines:
            name += "_"
        return name

    def _movable(self, scope: str, role: str, op: str, replicated: set[str], protected: set[str]) -> Movable | None:
        acc = self.access(op)
        read = sorted(b for b in acc.reads if self.kinds.get(b) == "shared")
        written = sorted(b for b in acc.writes if self.kinds.get(b) == "shared")
        feeds = bool(written) and not read  # a load into shared memory; else a store from it
        shared = written if feeds else read
        on_chip = [b for b in acc.touched if not b.startswith("$")]
        if acc.issues_async or acc.retires_async or acc.tma_reduce or not shared or set(on_chip) != set(shared) or protected & set(shared):
            return None
        if self.placements(op) != {role}:
            return None
        body = self.body(scope, role)
        at = body.index(op)
        partners = body[at + 1 :] if feeds else body[:at]
        for b in shared:  # the other side only: in this role, in this body, after a load or before a store; touched by nothing else
            users = [o for o, a in self.accesses.items() if b in a.touched and o not in self.scopes and o != op]
            crossing = (lambda o: b in self.access(o).writes) if feeds else (lambda o: b in self.access(o).reads)
            if not users or any(self.placements(o) != {role} or o not in partners or crossing(o) for o in users):
                return None
        path = self.path(scope)
        control = [e for s in path for e in self.body(s, role) if isinstance(e, str) and e not in self.scopes and e != op]
        # The new role runs the loops down to the op and the op: what steers those loops (bounds,
        # a while loop's counter) and what the op reads must be bound there too.
        follows = self._follows(control, acc.reads | frozenset().union(*(self.access(s).steers for s in path)), replicated)
        if follows is None:  # the new role could not follow the loop
            return None
        defined = {v for e in control if e in replicated or e in follows for v in self.access(e).writes if v.startswith("$")}
        if any(v.startswith("$") and v not in defined for v in acc.reads):
            return None
        loader = self._loader()
        new_role = loader if feeds and loader else op if op not in self.role_names else f"{op}_role"
        return Movable((op,), role, scope, tuple(shared), new_role, self._new_pipeline(shared), feeds, follows)

    def _follows(self, control: list[str], needed: frozenset[str], replicated: set[str]) -> tuple[str, ...] | None:
        """The ops of ``control`` (a role's, on the way down to an op) that bind what ``needed``
        reads, transitively, other than those every role runs: scalar binds of global values
        (``column_count = ColumnCount[b, h, x]``), which a second role can run as well. None
        where one of them touches more than scalars (a local variable, on-chip memory: the
        role's own state)."""
        out: list[str] = []
        want = {v for v in needed if v.startswith("$") or self.kinds.get(v) == "local"}
        for e in reversed(control):  # a bind comes before its uses: walking back closes over its inputs
            acc = self.access(e)
            if e in replicated or not acc.writes & want:
                continue
            if not all(v.startswith("$") for v in acc.touched):
                return None
            out.insert(0, e)
            want |= acc.reads
        return tuple(out)

    def _loader(self) -> str | None:
        """The seed's producer role that writes no fragments (its Load role), if it has
        one: loads moved out of a consumer join it rather than a role of their own. A
        role more is a warpgroup more where producers take warpgroups, and 512 threads
        launch with too few registers for a consumer's wide MMA (rules.register_reason)."""
        return next((r for r in self.role_names if r not in self.heavy and any(self.schedule.producer_of(p) == r for p in self.pipelines)), None)

    def scope_of(self, buffer: str) -> str | None:
        """The loop scope whose pipeline carries ``buffer``: the seed's, or a move's."""
        if buffer in self.pipe_of:
            return self.where[self.pipe_of[buffer]][0]
        return next((m.scope for m in self.movable if buffer in m.buffers), None)

    def path(self, scope: str) -> list[str]:
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

    def readers_differ(self) -> bool:
        """Whether some channel holds buffers that different ops read (tilelang's default
        lowering gives each of those a barrier of its own, one to all of them otherwise)."""
        for pipes in self.channels.values():
            buffers = [b for p in pipes for b in p.buffers]
            readers = {frozenset(o for o, a in self.accesses.items() if b in a.reads and o not in self.scopes) for b in buffers}
            if len(readers) > 1:
                return True
        return False

    @property
    def seed_layout(self) -> str:
        return self.layout_alias[SEED]

    def keeps(self, seed_pipeline: str, pipe_of: dict[str, str]) -> bool:
        """Whether the variant has this seed pipeline as it is (name and buffers)."""
        bufs = self.pipelines[seed_pipeline].buffers
        return all(pipe_of.get(b) == seed_pipeline for b in bufs) and sum(p == seed_pipeline for p in pipe_of.values()) == len(bufs)

    def deltas(self, role: str, body: Sequence[Instr], pipe_of: dict[str, str]) -> list[int]:
        """Each entry's iteration offset in a body of ``role``, pipelines by ``pipe_of`` (PlanStages)."""
        return stage_deltas(body, lambda entry: {pipe_of.get(b) for b in self.entry_access(role, entry)[2]} - {None})  # type: ignore[arg-type]
