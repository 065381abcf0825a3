"""The schedule space: variants of a seed schedule, crossed with kernel parameters.

Four schedule axes, each a dimension a ``Point`` fixes:
- role split: consumer warpgroups (1-3), producer as one warp or a whole
  warpgroup, producer before or after the consumers;
- pipelines: all buffers of a producer/consumer pair in one pipeline
  ("merged") or one pipeline per buffer ("separate"), and each one's depth;
- setmaxnreg budget of each role (one value per warpgroup);
- sync stage offsets: the stage of each producer span relative to the first.

Static rules prune a point before anything is built and say why. Pruning is
hierarchical so that counting a space of 10^5 points takes a second: a rule
that fails for a kernel-parameter point fails for everything under it.

This module is pure Python: what it needs from the compiler (the seed, shared
buffer sizes, which op touches which buffer) arrives as a ``PointInfo``.
"""

from __future__ import annotations

import itertools
import tomllib
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .candidate import Candidate
from .schedule import (
    CONSUMER_SYNCS,
    PRODUCER_SYNCS,
    THREADS_PER_WARP,
    WARPS_PER_GROUP,
    Instr,
    Pipeline,
    Role,
    Schedule,
    Scope,
    Sync,
)

REGISTER_FILE = 64 * 1024  # 32-bit registers per SM, and so per block
SMEM_LIMIT = 227 * 1024  # opt-in dynamic shared memory per block on sm_90
MAX_THREADS = 1024
PTXAS_MAX_NREG = 255  # setmaxnreg accepts 256, ptxas does not (TILELANG-WS.md)
BARRIER_BYTES = 16  # a full and an empty mbarrier per version

MERGED, SEPARATE = "merged", "separate"


@dataclass(frozen=True)
class PointInfo:
    """What the compiler reports about the kernel at one kernel-parameter point."""

    seed: Schedule
    shared_bytes: dict[str, int]  # shared buffers the kernel uses: bytes of one version
    op_buffers: dict[str, frozenset[str]]  # op id -> buffers it touches


@dataclass(frozen=True)
class SpaceConfig:
    consumer_warpgroups: tuple[int, ...] = (1, 2, 3)
    producer_kinds: tuple[str, ...] = ("warp", "warpgroup")
    producer_first: tuple[bool, ...] = (False, True)
    layouts: tuple[str, ...] = (MERGED, SEPARATE)
    depths: tuple[int, ...] = (1, 2, 3, 4, 5)
    max_stage_offset: int = 2
    producer_nreg: tuple[int, ...] = (24, 40, 56)
    consumer_nreg: tuple[int, ...] = (0, 160, 184, 208, 232, 240, 256)
    smem_limit: int = SMEM_LIMIT

    @classmethod
    def from_toml(cls, path: str | Path) -> "SpaceConfig":
        """Axis values from a TOML file (see configs/); unknown keys are an error."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read space config {path}: {exc}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown space setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})

    def __post_init__(self) -> None:
        for n in self.producer_nreg + self.consumer_nreg:
            if n and (n % 8 or not 24 <= n <= 256):
                raise ValueError(f"setmaxnreg budgets are 0 or multiples of 8 in [24, 256], got {n}")
        if not self.depths or min(self.depths) < 1:
            raise ValueError("pipeline depths must be >= 1")


@dataclass(frozen=True)
class RoleSplit:
    consumer_warpgroups: int
    producer: str  # "warp" or "warpgroup"
    producer_first: bool

    @property
    def label(self) -> str:
        where = "first" if self.producer_first else "last"
        return f"{self.consumer_warpgroups}xWG+{self.producer}@{where}"

    @property
    def num_warps(self) -> int:
        return WARPS_PER_GROUP * (self.consumer_warpgroups + 1)

    def ranges(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(consumer, producer) warp ranges."""
        pw = 1 if self.producer == "warp" else WARPS_PER_GROUP
        cw = WARPS_PER_GROUP * self.consumer_warpgroups
        if self.producer_first:
            return (WARPS_PER_GROUP, WARPS_PER_GROUP + cw), (0, pw)
        return (0, cw), (cw, cw + pw)


@dataclass(frozen=True)
class Point:
    params: tuple[tuple[str, Any], ...]
    split: RoleSplit | None  # None: the seed's own roles
    layout: str
    depths: tuple[int, ...]  # one per pipeline of the layout
    stages: tuple[int, ...]  # one per producer span after the first
    nregs: tuple[int, ...]  # consumer, producer


@dataclass
class SpaceCount:
    total: int = 0
    kept: int = 0
    pruned: Counter = field(default_factory=Counter)  # reason kind -> count
    examples: dict[str, str] = field(default_factory=dict)  # reason kind -> one full message

    def prune(self, reason: str, n: int = 1) -> None:
        kind = reason.split(":", 1)[0]
        self.pruned[kind] += n
        self.examples.setdefault(kind, reason)


class SeedShape:
    """The seed schedule, understood: which role produces, which consumes,
    which buffers are protected, and the op order of each role's loop body."""

    def __init__(self, info: PointInfo):
        seed = info.seed
        self.info = info
        self.seed = seed
        pipelines = {p.name: p for p in seed.pipelines}
        producers = {seed.producer_of(p) for p in pipelines} - {None}
        consumers = {seed.consumer_of(p) for p in pipelines} - {None}
        if len(producers) != 1 or len(consumers) != 1 or producers == consumers:
            raise ValueError("the space varies seeds with one producer and one consumer role")
        self.producer, self.consumer = producers.pop(), consumers.pop()
        self.fixed_roles = tuple(r for r in seed.roles if r.name not in (self.producer, self.consumer))
        self.buffers = tuple(b for p in seed.pipelines for b in p.buffers)
        self.merged_name = seed.pipelines[0].name if len(seed.pipelines) == 1 else "smem"
        synced = [s for s in seed.scopes if any(isinstance(i, Sync) for _, body in s.bodies for i in body)]
        if len(synced) != 1:
            raise ValueError("the space varies seeds whose pipelines live in one loop scope")
        self.loop = synced[0]
        self.producer_spans = len(self._spans(self.loop.body(self.producer), SEPARATE))

    def pipeline_names(self, layout: str) -> tuple[str, ...]:
        return (self.merged_name,) if layout == MERGED else self.buffers

    def pipeline_of(self, layout: str) -> dict[str, str]:
        return {b: (self.merged_name if layout == MERGED else b) for b in self.buffers}

    def _touched(self, op: str, layout: str) -> tuple[str, ...]:
        mapping = self.pipeline_of(layout)
        names = {mapping[b] for b in self.info.op_buffers.get(op, ()) if b in mapping}
        return tuple(n for n in self.pipeline_names(layout) if n in names)

    def _spans(self, body: Sequence[Instr], layout: str) -> list[tuple[tuple[str, ...], list[str]] | str]:
        """Ops grouped into spans: runs of consecutive ops touching the same pipelines."""
        out: list[tuple[tuple[str, ...], list[str]] | str] = []
        for op in (i for i in body if isinstance(i, str)):
            pipes = self._touched(op, layout)
            if not pipes:
                out.append(op)
            elif out and not isinstance(out[-1], str) and out[-1][0] == pipes:
                out[-1][1].append(op)
            else:
                out.append((pipes, [op]))
        return out

    def body(self, role: str, layout: str, stages: Sequence[int]) -> tuple[Instr, ...]:
        acquire, commit = PRODUCER_SYNCS if role == self.producer else CONSUMER_SYNCS
        out: list[Instr] = []
        span_index = 0
        for item in self._spans(self.loop.body(role), layout):
            if isinstance(item, str):
                out.append(item)
                continue
            pipes, ops = item
            stage = stages[span_index - 1] if (role == self.producer and span_index) else 0
            span_index += 1
            out += [Sync(acquire, p, stage) for p in pipes] + ops + [Sync(commit, p, stage) for p in pipes]
        return tuple(out)

    def schedule(self, point: Point) -> Schedule:
        seed = self.seed
        roles = {r.name: r for r in seed.roles}
        c_nreg, p_nreg = point.nregs
        if point.split is None:
            consumer = Role(self.consumer, roles[self.consumer].warp_lo, roles[self.consumer].warp_hi, c_nreg)
            producer = Role(self.producer, roles[self.producer].warp_lo, roles[self.producer].warp_hi, p_nreg)
            num_warps = seed.num_warps
        else:
            (clo, chi), (plo, phi) = point.split.ranges()
            consumer, producer = Role(self.consumer, clo, chi, c_nreg), Role(self.producer, plo, phi, p_nreg)
            num_warps = point.split.num_warps
        order = {self.consumer: consumer, self.producer: producer}
        new_roles = tuple(order.get(r.name, r) for r in seed.roles)
        pipelines = tuple(
            Pipeline(name, tuple(b for b, p in self.pipeline_of(point.layout).items() if p == name), depth)
            for name, depth in zip(self.pipeline_names(point.layout), point.depths)
        )
        scopes = []
        for scope in seed.scopes:
            if scope.id != self.loop.id:
                scopes.append(scope)
                continue
            bodies = tuple(
                (role, self.body(role, point.layout, point.stages) if role in (self.producer, self.consumer) else body)
                for role, body in scope.bodies
            )
            scopes.append(Scope(scope.id, bodies))
        return Schedule(num_warps, new_roles, pipelines, tuple(scopes))

    def seed_point(self, params: tuple[tuple[str, Any], ...]) -> Point:
        layout = MERGED if len(self.seed.pipelines) == 1 and len(self.buffers) > 1 else SEPARATE
        roles = {r.name: r for r in self.seed.roles}
        loop_stages = [i.stage for i in self.loop.body(self.producer) if isinstance(i, Sync) and i.kind == PRODUCER_SYNCS[0]]
        stages = tuple(s - loop_stages[0] for s in loop_stages[1:]) if layout == SEPARATE else ()
        return Point(
            params,
            None,
            layout,
            tuple(p.depth for p in self.seed.pipelines),
            stages,
            (roles[self.consumer].max_nreg, roles[self.producer].max_nreg),
        )


class ScheduleSpace:
    """Enumerates, samples and prunes the points of one tuning problem."""

    def __init__(
        self,
        *,
        param_grid: dict[str, Sequence[Any]],
        point_info: Callable[[dict[str, Any]], PointInfo],
        check: Callable[[dict[str, Any], Schedule | None], str | None] = lambda params, schedule: None,
        config: SpaceConfig = SpaceConfig(),
    ):
        self.param_grid = {k: tuple(v) for k, v in param_grid.items()}
        self.config = config
        self._point_info = point_info
        self._check = check
        self._shapes: dict[tuple[tuple[str, Any], ...], SeedShape | str] = {}

    # --- structure ----------------------------------------------------------
    def param_points(self) -> Iterator[tuple[tuple[str, Any], ...]]:
        keys = sorted(self.param_grid)
        for values in itertools.product(*(self.param_grid[k] for k in keys)):
            yield tuple(zip(keys, values))

    def shape(self, params: tuple[tuple[str, Any], ...]) -> SeedShape | str:
        """The seed at a kernel-parameter point, or why that point is out."""
        if params not in self._shapes:
            reason = self._check(dict(params), None)
            if reason:
                self._shapes[params] = f"kernel: {reason}"
            else:
                self._shapes[params] = SeedShape(self._point_info(dict(params)))
        return self._shapes[params]

    def splits(self, shape: SeedShape) -> tuple[RoleSplit | None, ...]:
        if shape.fixed_roles:  # extra roles keep their warps; only the seed's split fits
            return (None,)
        c = self.config
        return tuple(RoleSplit(*s) for s in itertools.product(c.consumer_warpgroups, c.producer_kinds, c.producer_first))

    def axes(self) -> dict[str, tuple[Any, ...]]:
        c = self.config
        return {
            **{f"param.{k}": v for k, v in self.param_grid.items()},
            "roles": tuple(RoleSplit(*s).label for s in itertools.product(c.consumer_warpgroups, c.producer_kinds, c.producer_first)),
            "pipelines": c.layouts,
            "depth": c.depths,
            "stage_offset": tuple(range(c.max_stage_offset + 1)),
            "nreg.consumer": c.consumer_nreg,
            "nreg.producer": c.producer_nreg,
        }

    def _depth_choices(self, shape: SeedShape, layout: str) -> Iterator[tuple[int, ...]]:
        return itertools.product(self.config.depths, repeat=len(shape.pipeline_names(layout)))

    def _stage_choices(self, shape: SeedShape, layout: str) -> Iterator[tuple[int, ...]]:
        spans = len(shape._spans(shape.loop.body(shape.producer), layout))
        return itertools.product(range(self.config.max_stage_offset + 1), repeat=max(spans - 1, 0))

    # --- enumeration --------------------------------------------------------
    def walk(self, count: SpaceCount | None = None) -> Iterator[tuple[Point, SeedShape]]:
        """Every surviving point; pruned ones are tallied into ``count``."""
        c = self.config
        count = count if count is not None else SpaceCount()
        nregs = tuple(itertools.product(c.consumer_nreg, c.producer_nreg))
        split_reasons: dict[tuple[Any, ...], str | None] = {}
        register_reasons: dict[tuple[Any, ...], str | None] = {}
        pruned_params: list[str] = []
        reference: SeedShape | None = None
        for params in self.param_points():
            shape = self.shape(params)
            if isinstance(shape, str):
                pruned_params.append(shape)
                continue
            reference = reference or shape
            splits = self.splits(shape)
            for layout in c.layouts:
                for depths in self._depth_choices(shape, layout):
                    stage_sets = tuple(self._stage_choices(shape, layout))
                    per_stage = len(splits) * len(nregs)
                    count.total += len(stage_sets) * per_stage
                    reason = self._smem_reason(shape, layout, depths)
                    if reason:
                        count.prune(reason, len(stage_sets) * per_stage)
                        continue
                    for stages in stage_sets:
                        reason = _stage_reason(stages, depths)
                        if reason:
                            count.prune(reason, per_stage)
                            continue
                        for split in splits:
                            key = (params, split)
                            if key not in split_reasons:
                                split_reasons[key] = self._split_reason(params, shape, split)
                            for nreg in nregs:
                                point = Point(params, split, layout, depths, stages, nreg)
                                rkey = (split, nreg, params if split is None else None)
                                if rkey not in register_reasons:
                                    register_reasons[rkey] = self._register_reason(shape, point)
                                reason = split_reasons[key] or register_reasons[rkey]
                                if reason:
                                    count.prune(reason)
                                    continue
                                count.kept += 1
                                yield point, shape
        # A pruned kernel-parameter point hides the whole schedule space under it.
        under = self._points_under(reference) if reference else 1
        for reason in pruned_params:
            count.total += under
            count.prune(reason, under)

    def _points_under(self, shape: SeedShape) -> int:
        c = self.config
        per_layout = sum(
            len(c.depths) ** len(shape.pipeline_names(layout)) * len(tuple(self._stage_choices(shape, layout)))
            for layout in c.layouts
        )
        return per_layout * len(self.splits(shape)) * len(c.consumer_nreg) * len(c.producer_nreg)

    def count(self) -> SpaceCount:
        count = SpaceCount()
        for _ in self.walk(count):
            pass
        return count

    def candidates(self) -> Iterator[Candidate]:
        for point, shape in self.walk():
            yield Candidate.make(dict(point.params), shape.schedule(point))

    def candidate(self, point: Point) -> Candidate | str:
        """The candidate at a point, or why the point is pruned."""
        shape = self.shape(point.params)
        if isinstance(shape, str):
            return shape
        reason = (
            self._smem_reason(shape, point.layout, point.depths)
            or _stage_reason(point.stages, point.depths)
            or self._split_reason(point.params, shape, point.split)
            or self._register_reason(shape, point)
        )
        return reason or Candidate.make(dict(point.params), shape.schedule(point))

    def seed_candidate(self, params: tuple[tuple[str, Any], ...]) -> Candidate | str:
        shape = self.shape(params)
        return shape if isinstance(shape, str) else Candidate.make(dict(params), shape.seed)

    def sample(self, choose: Callable[[str, Sequence[Any]], Any]) -> Point:
        """A point picked one decision at a time (define-by-run, for Optuna).

        Names and choice lists are fixed, so samplers see a stable space.
        """
        c = self.config
        params = tuple(sorted((k, choose(f"param.{k}", v)) for k, v in self.param_grid.items()))
        shape = self.shape(params)
        if isinstance(shape, str):  # pruned kernel parameters: nothing below them to decide
            return Point(params, None, MERGED, (), (), (0, 0))
        labels = {s.label if s else "seed": s for s in self.splits(shape)}
        split = labels[choose("roles", tuple(labels))]
        layout = choose("pipelines", c.layouts)
        depths = tuple(choose(f"depth.{i}", c.depths) for i in range(len(shape.pipeline_names(layout))))
        nspans = len(shape._spans(shape.loop.body(shape.producer), layout))
        stages = tuple(choose(f"stage.{i}", tuple(range(c.max_stage_offset + 1))) for i in range(1, nspans))
        nregs = (choose("nreg.consumer", c.consumer_nreg), choose("nreg.producer", c.producer_nreg))
        return Point(params, split, layout, depths, stages, nregs)

    # --- static rules -------------------------------------------------------
    def _smem_reason(self, shape: SeedShape, layout: str, depths: tuple[int, ...]) -> str | None:
        sizes = shape.info.shared_bytes
        mapping = shape.pipeline_of(layout)
        depth_of = dict(zip(shape.pipeline_names(layout), depths))
        total = sum(size * (depth_of[mapping[b]] if b in mapping else 1) for b, size in sizes.items())
        total += BARRIER_BYTES * sum(depths)
        if total > self.config.smem_limit:
            return f"smem: {total / 1024:.0f} KB > {self.config.smem_limit // 1024} KB per block"
        return None

    def _split_reason(self, params: tuple[tuple[str, Any], ...], shape: SeedShape, split: RoleSplit | None) -> str | None:
        if split is None:
            return None
        if split.num_warps * THREADS_PER_WARP > MAX_THREADS:
            return f"threads: {split.num_warps * THREADS_PER_WARP} > {MAX_THREADS} per block"
        (clo, chi), _ = split.ranges()
        if clo % WARPS_PER_GROUP or (chi - clo) % WARPS_PER_GROUP:
            return f"alignment: consumer warps [{clo},{chi}) are not whole warpgroups (wgmma)"
        reason = self._check(dict(params), shape.schedule(Point(params, split, MERGED, (1,), (), (0, 0))))
        return f"kernel: {reason}" if reason else None

    def _register_reason(self, shape: SeedShape, point: Point) -> str | None:
        return register_reason(shape.schedule(point) if point.split is None else _roles_only(shape, point))


def _stage_reason(stages: tuple[int, ...], depths: tuple[int, ...]) -> str | None:
    bad = next((s for s in stages if s >= min(depths)), None)
    return None if bad is None else f"stage: producer span offset {bad} >= pipeline depth {min(depths)}"


def _roles_only(shape: SeedShape, point: Point) -> Schedule:
    """Enough of the schedule to check registers, without rebuilding scope bodies."""
    (clo, chi), (plo, phi) = point.split.ranges()  # type: ignore[union-attr]
    c_nreg, p_nreg = point.nregs
    roles = (Role(shape.consumer, clo, chi, c_nreg), Role(shape.producer, plo, phi, p_nreg)) + shape.fixed_roles
    return Schedule(point.split.num_warps, roles, ())  # type: ignore[union-attr]


def register_reason(schedule: Schedule) -> str | None:
    """Static register rules of a schedule: alignment of budgets, the ptxas cap, the register file."""
    per_wg: dict[int, set[int]] = {}
    for role in schedule.roles:
        if role.warp_lo < 0 or role.warp_hi > schedule.num_warps or role.warp_lo >= role.warp_hi:
            return f"alignment: role {role.name} warps [{role.warp_lo},{role.warp_hi}) outside [0,{schedule.num_warps})"
        if role.max_nreg > PTXAS_MAX_NREG:
            return f"nreg: {role.name} max_nreg {role.max_nreg} > {PTXAS_MAX_NREG} (ptxas rejects it)"
        for wg in role.warpgroups():
            per_wg.setdefault(wg, set()).add(role.max_nreg)
    mixed = next((wg for wg, values in per_wg.items() if len(values) > 1), None)
    if mixed is not None:
        return f"alignment: roles sharing warpgroup {mixed} ask for different max_nreg {sorted(per_wg[mixed])}"
    default = REGISTER_FILE // schedule.threads  # what a warpgroup keeps without setmaxnreg
    groups = schedule.num_warps // WARPS_PER_GROUP
    budget = sum((next(iter(per_wg.get(wg, {0}))) or default) for wg in range(groups)) * WARPS_PER_GROUP * THREADS_PER_WARP
    if budget > REGISTER_FILE:
        return f"registers: sum of nreg x threads = {budget} > {REGISTER_FILE}"
    return None
