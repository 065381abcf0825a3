"""The schedule space: variants of a seed schedule, crossed with kernel parameters.

A point fixes one choice per decision; names and choice lists depend only on
the seed, so samplers see a stable space:
- ``param.<name>``: the kernel's parameters;
- ``roles``: warp ranges. Roles that write register fragments (consumers)
  get whole warpgroups each, the others one warp or one warpgroup, placed
  before or after them; "seed" where the seed's ranges are none of these;
- ``own_role.<op>``: run an op in a role of its own where the seed allows
  it (a store from shared memory: the next loop iteration overlaps it);
- ``pipelines``: each loop channel's buffers as the seed groups them, all
  merged or all separate;
- ``depth.<pipeline>``: each loop pipeline's depth;
- ``stage.<role>.<pipelines>``: the stage of each span group of a loop body
  with several (one pipeline's wait/release some iterations behind
  another's; producer and consumer side alike);
- ``nreg.<role>``: each role's setmaxnreg budget.

Static rules prune a point before anything is built and say why: the
kernel's ``check``, shared memory, the seed's dependences and deadlock
freedom (see seed.py), threads per block, setmaxnreg alignment and the
64K-register pool. Pruning is hierarchical, and counting multiplies instead
of enumerating the register budgets, so a space of 10^6 points counts in
seconds.

This module is pure Python: what it needs from the compiler (the seed,
buffer sizes, what each op reads and writes) arrives as a ``PointInfo``.
"""

from __future__ import annotations

import itertools
import tomllib
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .candidate import Candidate
from .schedule import THREADS_PER_WARP, WARPS_PER_GROUP, OpAccess, Role, Schedule
from .seed import MERGED, SEED, SEPARATE, Plan, Seed

__all__ = ["MERGED", "SEED", "SEPARATE", "Point", "PointInfo", "ScheduleSpace", "SeedShape", "SpaceConfig", "SpaceCount", "Split", "register_reason"]

REGISTER_FILE = 64 * 1024  # 32-bit registers per SM, and so per block
SMEM_LIMIT = 227 * 1024  # opt-in dynamic shared memory per block on sm_90
MAX_THREADS = 1024
PTXAS_MAX_NREG = 255  # setmaxnreg accepts 256, ptxas does not (TILELANG-WS.md)
BARRIER_BYTES = 16  # a full and an empty mbarrier per version
LIGHT_WARPS = {"warp": 1, "warpgroup": WARPS_PER_GROUP}

ParamsKey = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class PointInfo:
    """What the compiler reports about the kernel at one kernel-parameter point."""

    seed: Schedule
    shared_bytes: dict[str, int]  # shared buffers the kernel uses: bytes of one version
    accesses: dict[str, OpAccess]  # op or loop id -> what it reads and writes
    buffer_kinds: dict[str, str] = field(default_factory=dict)  # allocated buffer -> "shared", "fragment", "local", ...


@dataclass(frozen=True)
class SpaceConfig:
    consumer_warpgroups: tuple[int, ...] = (1, 2, 3)
    producer_kinds: tuple[str, ...] = ("warp", "warpgroup")
    producer_first: tuple[bool, ...] = (False, True)
    layouts: tuple[str, ...] = (MERGED, SEPARATE)  # "seed" is added where the seed is neither
    depths: tuple[int, ...] = (1, 2, 3, 4, 5)
    max_stage_offset: int = 2
    producer_nreg: tuple[int, ...] = (24, 40, 56)
    consumer_nreg: tuple[int, ...] = (0, 160, 184, 208, 232, 240, 256)
    own_roles: bool = True  # offer ops a role of their own where the seed allows it
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
        if any(kind not in LIGHT_WARPS for kind in self.producer_kinds):
            raise ValueError(f"producer kinds are {' or '.join(LIGHT_WARPS)}")


@dataclass(frozen=True)
class Split:
    """Warp ranges: each consumer role's warpgroups; the other roles' size and place."""

    consumer_warpgroups: tuple[int, ...]  # one per fragment-writing role, in seed order
    producer: str  # "warp" or "warpgroup": every other role
    producer_first: bool

    @property
    def label(self) -> str:
        heavy = ",".join(f"{n}xWG" for n in self.consumer_warpgroups)
        return f"{heavy}+{self.producer}@{'first' if self.producer_first else 'last'}"

    def place(self, roles: Sequence[str], heavy: frozenset[str]) -> tuple[dict[str, tuple[int, int]], int]:
        """Warp range per role and the warp count; consumers start at a warpgroup boundary."""
        sizes = dict(zip([r for r in roles if r in heavy], (WARPS_PER_GROUP * n for n in self.consumer_warpgroups)))
        light = [r for r in roles if r not in heavy]
        order = light + list(sizes) if self.producer_first else list(sizes) + light
        sizes.update({r: LIGHT_WARPS[self.producer] for r in light})
        ranges, pos = {}, 0
        for role in order:
            if sizes[role] % WARPS_PER_GROUP == 0:
                pos = -(-pos // WARPS_PER_GROUP) * WARPS_PER_GROUP
            ranges[role] = (pos, pos + sizes[role])
            pos += sizes[role]
        return ranges, max(WARPS_PER_GROUP, -(-pos // WARPS_PER_GROUP) * WARPS_PER_GROUP)


@dataclass(frozen=True)
class Point:
    """One point of the space. The tuples follow the point's plan (``SeedShape.plan``)."""

    params: ParamsKey
    roles: str = SEED  # a label of ``ScheduleSpace.splits``
    layout: str = SEED  # a pipeline layout label
    depths: tuple[int, ...] = ()  # one per varied pipeline
    stages: tuple[int, ...] = ()  # one per decided span group
    nregs: tuple[int, ...] = ()  # one per role
    moved: tuple[str, ...] = ()  # ops in a role of their own


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
    """The seed at one kernel-parameter point: its analysis (shared by every
    point with the same seed and ops), role layouts and the seed's own point."""

    def __init__(self, info: PointInfo, seed: Seed, config: SpaceConfig):
        self.info, self.analysis, self.config = info, seed, config
        self.seed = info.seed
        self.splits: dict[str, Split | None] = self._splits()

    @property
    def limits(self) -> list[str]:
        return self.analysis.limits

    @property
    def movable(self) -> tuple[str, ...]:
        return tuple(m.op for m in self.analysis.movable) if self.config.own_roles else ()

    def layouts(self) -> tuple[str, ...]:
        found = self.analysis.layouts
        return tuple(label for label in found if label == SEED or label in self.config.layouts) or (self.analysis.seed_layout,)

    def plan(self, layout: str, moved: tuple[str, ...] = ()) -> Plan:
        return self.analysis.plan(layout, moved)

    def nreg_choices(self, role: str) -> tuple[int, ...]:
        return self.config.consumer_nreg if role in self.analysis.heavy else self.config.producer_nreg

    def _splits(self) -> dict[str, Split | None]:
        c, heavy = self.config, self.analysis.heavy
        consumers = [r.name for r in self.seed.roles if r.name in heavy]
        out: dict[str, Split | None] = {}
        seen: dict[tuple, str] = {}
        for wgs in itertools.product(c.consumer_warpgroups, repeat=len(consumers)):
            for kind, first in itertools.product(c.producer_kinds, c.producer_first):
                split = Split(wgs, kind, first)
                layout = split.place(self.analysis.role_names, heavy)
                key = (tuple(sorted(layout[0].items())), layout[1])
                if key not in seen:
                    seen[key] = split.label
                    out[split.label] = split
        own = (tuple(sorted((r.name, (r.warp_lo, r.warp_hi)) for r in self.seed.roles)), self.seed.num_warps)
        if own not in seen:
            out = {SEED: None, **out}
        self.seed_split = seen.get(own, SEED)
        return out

    def roles(self, label: str, plan: Plan, nregs: Sequence[int]) -> tuple[tuple[Role, ...], int]:
        """The plan's roles at a split's warp ranges and these budgets, and the warp count."""
        split = self.splits[label]
        if split is None:  # the seed's ranges; new roles take the next warps, one each
            ranges = {r.name: (r.warp_lo, r.warp_hi) for r in self.seed.roles}
            end = max(hi for _, hi in ranges.values())
            for i, name in enumerate(plan.roles[len(self.seed.roles) :]):
                ranges[name] = (end + i, end + i + 1)
            num_warps = max(self.seed.num_warps, -(-(end + len(plan.roles) - len(self.seed.roles)) // WARPS_PER_GROUP) * WARPS_PER_GROUP)
        else:
            ranges, num_warps = split.place(plan.roles, self.analysis.heavy)
        return tuple(Role(name, *ranges[name], nreg) for name, nreg in zip(plan.roles, nregs)), num_warps

    def seed_point(self, params: ParamsKey) -> Point:
        plan = self.plan(self.analysis.seed_layout)
        depth = {p.name: p.depth for p in self.seed.pipelines}
        return Point(
            params, self.seed_split, plan.layout, tuple(depth[p] for p in plan.varied),
            self.analysis.seed_stages(plan), tuple(r.max_nreg for r in self.seed.roles),
        )  # fmt: skip

    def stage_choices(self, plan: Plan) -> Iterator[tuple[int, ...]]:
        """Group stages in canonical form: the lowest of each body at its seed base."""
        per_body = []
        for key, groups in plan.body_groups:
            if len(groups) < 2:
                continue
            offsets = [o for o in itertools.product(range(self.config.max_stage_offset + 1), repeat=len(groups)) if min(o) == 0]
            per_body.append([tuple(g.base + x for g, x in zip(groups, o)) for o in offsets])
        for combo in itertools.product(*per_body):
            yield tuple(itertools.chain.from_iterable(combo))

    def canonical_stages(self, plan: Plan, offsets: Sequence[int]) -> tuple[int, ...]:
        out, i = [], 0
        for _, groups in plan.body_groups:
            if len(groups) < 2:
                continue
            mine = offsets[i : i + len(groups)]
            out += [g.base + x - min(mine) for g, x in zip(groups, mine)]
            i += len(groups)
        return tuple(out)

    def schedule(self, point: Point) -> Schedule | str:
        plan = self.plan(point.layout, point.moved)
        roles, num_warps = self.roles(point.roles, plan, point.nregs)
        return self.analysis.schedule_for(plan, point.depths, point.stages, roles, num_warps)


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
        self._shapes: dict[ParamsKey, SeedShape | str] = {}
        self._seeds: dict[tuple, Seed] = {}
        self._split_reasons: dict[tuple[ParamsKey, str], str | None] = {}
        self._register_reasons: dict[tuple, str | None] = {}

    # --- structure ----------------------------------------------------------
    def param_points(self) -> Iterator[ParamsKey]:
        keys = sorted(self.param_grid)
        for values in itertools.product(*(self.param_grid[k] for k in keys)):
            yield tuple(zip(keys, values))

    def shape(self, params: ParamsKey) -> SeedShape | str:
        """The seed at a kernel-parameter point, or why that point is out."""
        if params not in self._shapes:
            reason = self._check(dict(params), None)
            if reason:
                self._shapes[params] = f"kernel: {reason}"
            else:
                info = self._point_info(dict(params))
                key = (info.seed, tuple(sorted(info.accesses.items())), tuple(sorted(info.buffer_kinds.items())))
                if key not in self._seeds:
                    self._seeds[key] = Seed(info.seed, info.accesses, info.buffer_kinds)
                self._shapes[params] = SeedShape(info, self._seeds[key], self.config)
        return self._shapes[params]

    def splits(self, shape: SeedShape) -> tuple[str, ...]:
        return tuple(shape.splits)

    def limits(self) -> list[str]:
        """What the space keeps as in the seed, and why (every seed seen so far)."""
        return list(dict.fromkeys(msg for seed in self._seeds.values() for msg in seed.limits))

    def axes(self) -> dict[str, tuple[Any, ...]]:
        """Every decision and its choices, over the seeds of all kernel-parameter points."""
        out: dict[str, tuple[Any, ...]] = {f"param.{k}": v for k, v in self.param_grid.items()}
        for params in self.param_points():
            shape = self.shape(params)
            if not isinstance(shape, str):
                self._decisions(shape, lambda name, options: out.setdefault(name, tuple(options))[0], every=True)
        return out

    # --- enumeration --------------------------------------------------------
    def walk(self, count: SpaceCount | None = None) -> Iterator[tuple[Point, SeedShape]]:
        """Every surviving point; pruned ones are tallied into ``count``."""
        count = count if count is not None else SpaceCount()
        for params, shape, plan, depths, stages, survivors in self._structures(count):
            for label, nregs in survivors:
                yield Point(params, label, plan.layout, depths, stages, nregs, plan.moved), shape

    def count(self) -> SpaceCount:
        """Sizes before and after pruning; register budgets are counted, not enumerated."""
        count = SpaceCount()
        for *_, survivors in self._structures(count):
            count.kept += len(survivors)
        return count

    def _structures(self, count: SpaceCount) -> Iterator[tuple[ParamsKey, SeedShape, Plan, tuple[int, ...], tuple[int, ...], list[tuple[str, tuple[int, ...]]]]]:
        """Everything but warp ranges and budgets, each with its surviving (split, nregs)."""
        pruned_params: list[str] = []
        reference: SeedShape | None = None
        for params in self.param_points():
            shape = self.shape(params)
            if isinstance(shape, str):
                pruned_params.append(shape)
                continue
            reference = reference or shape
            for moved in self._moved_choices(shape):
                survivors, below = self._role_survivors(params, shape, moved, count)
                for layout in shape.layouts():
                    plan = shape.plan(layout, moved)
                    stage_sets = tuple(shape.stage_choices(plan))
                    for depths in itertools.product(self.config.depths, repeat=len(plan.varied)):
                        count.total += len(stage_sets) * below
                        reason = self._smem_reason(shape, plan, depths)
                        if reason:
                            count.prune(reason, len(stage_sets) * below)
                            continue
                        for stages in stage_sets:
                            reason = self._body_reason(shape, plan, stages, depths)
                            if reason:
                                count.prune(reason, below)
                                continue
                            for kind, n in survivors[1].items():
                                count.prune(survivors[2][kind], n)
                            yield params, shape, plan, depths, stages, survivors[0]
        # A pruned kernel-parameter point hides the whole schedule space under it.
        under = self._points_under(reference) if reference else 1
        for reason in pruned_params:
            count.total += under
            count.prune(reason, under)

    def _moved_choices(self, shape: SeedShape) -> Iterator[tuple[str, ...]]:
        ops = shape.movable
        for flags in itertools.product((False, True), repeat=len(ops)):
            yield tuple(op for op, on in zip(ops, flags) if on)

    def _nreg_choices(self, shape: SeedShape, plan: Plan) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(shape.nreg_choices(r) for r in plan.roles))

    def _role_survivors(self, params: ParamsKey, shape: SeedShape, moved: tuple[str, ...], count: SpaceCount) -> tuple[tuple, int]:
        """The (split, nregs) pairs that survive, the prune tallies of one pass over
        them, and how many there are in all (the points below one structure)."""
        plan = shape.plan(shape.layouts()[0], moved)
        kept: list[tuple[str, tuple[int, ...]]] = []
        pruned: Counter = Counter()
        examples: dict[str, str] = {}
        total = 0
        for label in shape.splits:
            split_reason = self.split_reason(params, shape, label)
            for nregs in self._nreg_choices(shape, plan):
                total += 1
                reason = split_reason or self._register_reason(shape, label, plan, nregs)
                if reason:
                    kind = reason.split(":", 1)[0]
                    pruned[kind] += 1
                    examples.setdefault(kind, reason)
                else:
                    kept.append((label, nregs))
        return (kept, pruned, examples), total

    def _points_under(self, shape: SeedShape) -> int:
        n = 0
        for moved in self._moved_choices(shape):
            per_structure = len(shape.splits) * len(list(self._nreg_choices(shape, shape.plan(shape.layouts()[0], moved))))
            for layout in shape.layouts():
                plan = shape.plan(layout, moved)
                n += len(self.config.depths) ** len(plan.varied) * len(tuple(shape.stage_choices(plan))) * per_structure
        return n

    def candidates(self) -> Iterator[Candidate]:
        for point, shape in self.walk():
            schedule = shape.schedule(point)
            assert not isinstance(schedule, str), schedule
            yield Candidate.make(dict(point.params), schedule)

    def candidate(self, point: Point) -> Candidate | str:
        """The candidate at a point, or why the point is pruned."""
        shape = self.shape(point.params)
        if isinstance(shape, str):
            return shape
        reason = self._malformed(shape, point)
        if reason:
            return reason
        plan = shape.plan(point.layout, point.moved)
        reason = (
            self._smem_reason(shape, plan, point.depths)
            or self._body_reason(shape, plan, point.stages, point.depths)
            or self.split_reason(point.params, shape, point.roles)
            or self._register_reason(shape, point.roles, plan, point.nregs)
        )
        if reason:
            return reason
        schedule = shape.schedule(point)
        return schedule if isinstance(schedule, str) else Candidate.make(dict(point.params), schedule)

    def seed_point(self, params: ParamsKey) -> Point | str:
        shape = self.shape(params)
        return shape if isinstance(shape, str) else shape.seed_point(params)

    def seed_candidate(self, params: ParamsKey) -> Candidate | str:
        shape = self.shape(params)
        return shape if isinstance(shape, str) else Candidate.make(dict(params), shape.seed)

    def sample(self, choose: Callable[[str, Sequence[Any]], Any]) -> Point:
        """A point picked one decision at a time (define-by-run, for Optuna).

        Names and choice lists depend only on the seed, so samplers see a stable space.
        """
        params = tuple(sorted((k, choose(f"param.{k}", v)) for k, v in self.param_grid.items()))
        shape = self.shape(params)
        if isinstance(shape, str):  # pruned kernel parameters: nothing below them to decide
            return Point(params)
        return self._decisions(shape, choose, params=params)

    def _decisions(self, shape: SeedShape, choose: Callable[[str, Sequence[Any]], Any], params: ParamsKey = (), every: bool = False) -> Point:
        """The decisions below the kernel parameters, in a fixed order. ``every``:
        offer every name of every plan (to list the axes), not one path."""
        c = self.config
        roles = choose("roles", tuple(shape.splits))
        moved = tuple(op for op in shape.movable if choose(f"own_role.{op}", (False, True)))
        layout = choose("pipelines", shape.layouts())
        plans = [shape.plan(lo, mv) for lo in shape.layouts() for mv in self._moved_choices(shape)] if every else [shape.plan(layout, moved)]
        for plan in plans:
            depths = tuple(choose(f"depth.{p}", c.depths) for p in plan.varied)
            offsets = tuple(choose(g.name, tuple(range(c.max_stage_offset + 1))) for g in plan.groups)
            nregs = tuple(choose(f"nreg.{r}", shape.nreg_choices(r)) for r in plan.roles)
        return Point(params, roles, layout, depths, shape.canonical_stages(plans[-1], offsets), nregs, moved)

    # --- static rules -------------------------------------------------------
    def _malformed(self, shape: SeedShape, point: Point) -> str | None:
        if point.roles not in shape.splits or point.layout not in shape.analysis.layouts or not set(point.moved) <= {m.op for m in shape.analysis.movable}:
            return f"point: unknown roles {point.roles!r}, pipelines {point.layout!r} or moved ops {point.moved} for this seed"
        plan = shape.plan(point.layout, point.moved)
        if (len(point.depths), len(point.stages), len(point.nregs)) != (len(plan.varied), len(plan.groups), len(plan.roles)):
            return "point: its depths, stages or budgets do not match its plan"
        return None

    def _smem_reason(self, shape: SeedShape, plan: Plan, depths: tuple[int, ...]) -> str | None:
        depth_of = dict(zip(plan.varied, depths))
        depth = {b: depth_of.get(p.name, p.depth) for p in plan.pipelines for b in p.buffers}
        total = sum(size * depth.get(b, 1) for b, size in shape.info.shared_bytes.items())
        total += BARRIER_BYTES * sum(depth_of.get(p.name, p.depth) for p in plan.pipelines)
        if total > self.config.smem_limit:
            return f"smem: {total / 1024:.0f} KB > {self.config.smem_limit // 1024} KB per block"
        return None

    def _body_reason(self, shape: SeedShape, plan: Plan, stages: tuple[int, ...], depths: tuple[int, ...]) -> str | None:
        bodies = shape.analysis.bodies(plan, tuple(stages))
        if isinstance(bodies, str):
            return bodies
        return shape.analysis.deadlock(plan, tuple(stages), tuple(depths))

    def split_reason(self, params: ParamsKey, shape: SeedShape, label: str) -> str | None:
        """Why a role layout cannot serve these kernel parameters (threads, the kernel's check)."""
        key = (params, label)
        if key not in self._split_reasons:
            self._split_reasons[key] = self._split_reason(params, shape, label)
        return self._split_reasons[key]

    def _split_reason(self, params: ParamsKey, shape: SeedShape, label: str) -> str | None:
        if shape.splits.get(label) is None:
            return None
        roles, num_warps = shape.roles(label, shape.plan(shape.layouts()[0]), [r.max_nreg for r in shape.seed.roles])
        if num_warps * THREADS_PER_WARP > MAX_THREADS:
            return f"threads: {num_warps * THREADS_PER_WARP} > {MAX_THREADS} per block"
        reason = self._check(dict(params), shape.seed.with_(num_warps=num_warps, roles=roles))
        return f"kernel: {reason}" if reason else None

    def _register_reason(self, shape: SeedShape, label: str, plan: Plan, nregs: tuple[int, ...]) -> str | None:
        key = (id(shape.analysis), label, plan.roles, nregs, shape.seed.num_warps if label == SEED else 0)
        if key not in self._register_reasons:
            roles, num_warps = shape.roles(label, plan, nregs)
            self._register_reasons[key] = register_reason(Schedule(num_warps, roles, ()))
        return self._register_reasons[key]


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
