"""The space at one seed: the seed's role layouts, pipeline layouts, stage
choices and own point, and the small types the space is made of.

``SeedShape`` is one kernel-parameter point's seed, seen through its
``Variants`` (shared by every point whose seed and ops are the same). Warp
ranges come from a ``Split``: consumer roles (they write register fragments)
get whole warpgroups, every other role one warp, two (where a light role
gathers: ``SeedShape.gathering``) or one warpgroup, placed before or after
them; "seed" where the seed's own ranges are none of these.
Every label of a decision names some layout at every seed (an alias where
two coincide), so a sampler sees one choice list per decision name.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import tomllib
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Iterator, Sequence

from .candidate import ParamsKey
from .rules import FILL, fill_budgets
from .schedule import WARPS_PER_GROUP, OpAccess, Role, Schedule, whole_warpgroups
from .seed import MERGED, SEED, SEPARATE
from .variant import Plan, Variants

SMEM_LIMIT = 227 * 1024  # opt-in dynamic shared memory per block on sm_90
# Warps per light role. Two: a gather by cp.async issues from more threads, and two such roles
# still share one warpgroup (DeepSeek-V4's Load role, 2 warps beside a Store role: 351.6 TFLOP/s,
# one warp 277.1; 3 warps, a partition that does not divide the tile, 99.4. H200 run 34).
LIGHT_WARPS = {"warp": 1, "pair": 2, "warpgroup": WARPS_PER_GROUP}


@dataclass(frozen=True)
class PointInfo:
    """What the compiler reports about the kernel at one kernel-parameter point."""

    seed: Schedule | None  # None: no seed to vary, for the reason in no_seed
    shared_bytes: dict[str, int]  # shared buffers the kernel uses: bytes of one version
    accesses: dict[str, OpAccess]  # op or loop id -> what it reads and writes
    buffer_kinds: dict[str, str] = field(default_factory=dict)  # allocated buffer -> "shared", "fragment", "local", ...
    no_seed: str = ""
    rewritten: bool = False  # ws-tune's rewrites change how the kernel moves data (compiler.rewritten)
    trips: dict[str, int] = field(default_factory=dict)  # loop op id -> trip count, where constant
    program: str = ""  # compiler.scheduled_program: equal at two points, a schedule builds one kernel at both
    plain_program: str = ""  # the same digest of the kernel before any seed, so a seedless point has one too
    schedule_sets: frozenset[int] = frozenset()  # the values of what the schedule sets instead (num_stages, threads)
    budgets: bool = True  # False: the kernel opts out of setmaxnreg (T.no_set_max_nreg): its seed sets no budget
    orders_pipeline: bool = False  # compiler.orders_its_pipeline: a plan of its own that only no_ws follows


@dataclass(frozen=True)
class SpaceConfig:
    consumer_warpgroups: tuple[int, ...] = (1, 2, 3)
    producer_kinds: tuple[str, ...] = ("warp", "pair", "warpgroup")
    producer_first: tuple[bool, ...] = (False, True)
    layouts: tuple[str, ...] = (MERGED, SEPARATE)  # "seed" is added where the seed is neither
    depths: tuple[int, ...] = (1, 2, 3, 4, 5)
    max_stage_offset: int = 2
    # 0: no setmaxnreg. Under tilelang 0.1.15's rule (rules.raises_budget) a producer with a
    # budget beside consumers without one is raised to it, which is undefined: "none at all"
    # is then the only choice, and at 8 warps (a thread starts with 248) the only one.
    producer_nreg: tuple[int, ...] = (0, 24, 40, 56)
    # 256: setmaxnreg takes it, ptxas does not. FILL: what the pool leaves them (rules.fill_budgets).
    consumer_nreg: tuple[int, ...] = (0, 160, 184, 208, 232, 240, FILL)
    # A light role's choices where it gathers moved loads through registers (Movable.feeds),
    # beside none at all: sparse MLA's Load warpgroup ran 317-337 TFLOP/s at 72-136, 177 at
    # 40, 309 without budgets (H200 run 29); DeepSeek-V4's one-warp Load role, first, 95.7 at
    # 24 and 219.5 without (run 31). A producer's smaller budgets are no choice for gatherers.
    loader_nreg: tuple[int, ...] = (72, 104, 136)
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
        if FILL in self.producer_nreg + self.loader_nreg:
            raise ValueError("a fill budget (-1) is a consumer's choice only")
        for n in self.producer_nreg + self.consumer_nreg + self.loader_nreg:
            if n and n != FILL and (n % 8 or not 24 <= n <= 256):
                raise ValueError(f"setmaxnreg budgets are 0, multiples of 8 in [24, 256], or -1 (a consumer's fill), got {n}")
        object.__setattr__(self, "consumer_nreg", tuple(FILL if n == FILL else n for n in self.consumer_nreg))  # a TOML -1 prints as "fill"
        if not self.depths or min(self.depths) < 1:
            raise ValueError("pipeline depths must be >= 1")
        if any(kind not in LIGHT_WARPS for kind in self.producer_kinds):
            raise ValueError(f"producer kinds are {', '.join(LIGHT_WARPS)}")


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
                pos = whole_warpgroups(pos)
            ranges[role] = (pos, pos + sizes[role])
            pos += sizes[role]
        return ranges, max(WARPS_PER_GROUP, whole_warpgroups(pos))


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
    asynchronous: tuple[str, ...] = ()  # gathers whose element-wise copies go by cp.async (SeedShape.asyncable)


@dataclass
class SpaceCount:
    total: float = 0  # fractional while counting a sample, whole points once scaled()
    kept: float = 0
    pruned: Counter = field(default_factory=Counter)  # reason kind -> count
    examples: dict[str, str] = field(default_factory=dict)  # reason kind -> one full message
    params_counted: int = 0  # kernel-parameter points counted ...
    params_total: int = 0  # ... of the grid's (fewer: an estimate, scaled to the grid)
    stages_sampled: int = 0  # plans whose stage choices were counted at a sample, scaled
    # A sample draws whole groups of points that differ only in parameters a schedule sets
    # (ScheduleSpace.param_groups): a group holds the points that build its kernels.
    kept_by_group: list[float] = field(default_factory=list)  # kept in each counted group (0: all pruned)
    groups_total: int = 0  # the grid's groups (as many as its points where no parameter is set by a schedule)
    grouped_by: tuple[str, ...] = ()  # the parameters a group's points differ in
    kept_margin: int = 0  # half-width of the 95% interval of a scaled ``kept`` over which groups were drawn
    # Points whose candidates another point builds (ScheduleSpace.representative): counted
    # there, in neither total nor pruned, so that "before pruning" counts distinct kernels.
    same_points: float = 0
    seeded_points: int = 0  # points counted that have a seed (0: no schedule space)
    # Points with no candidates at all, by reason kind ("seed": none to vary; "kernel": its
    # check() refuses the point): counted as points, not as candidates they never had.
    points_pruned: Counter = field(default_factory=Counter)
    # reason kind -> the parameter values all such points share and no other counted point has
    # ("load=parallel": a user sees which points lack candidates, not only how many)
    points_pruned_where: dict[str, str] = field(default_factory=dict)
    _pruned_at: dict[str, list[tuple]] = field(default_factory=dict, repr=False)

    def prune(self, reason: str, n: float = 1) -> None:
        kind = reason.split(":", 1)[0]
        self.pruned[kind] += n
        self.examples.setdefault(kind, reason)

    def prune_point(self, reason: str, params: tuple = ()) -> None:
        kind = reason.split(":", 1)[0]
        self.points_pruned[kind] += 1
        self.examples.setdefault(kind, reason)
        self._pruned_at.setdefault(kind, []).append(params)

    def say_where(self, counted: list[tuple]) -> None:
        """Fill ``points_pruned_where`` for the points of ``counted`` pruned so far."""
        for kind, points in self._pruned_at.items():
            pruned = set(points)
            others = [p for p in counted if p not in pruned]
            apart = [kv for kv in sorted(set(points[0]).intersection(*points[1:])) if others and all(kv not in p for p in others)]
            if apart:
                self.points_pruned_where[kind] = ", ".join(f"{k}={v}" for k, v in apart)

    @property
    def estimated(self) -> bool:
        return self.params_counted < self.params_total or self.stages_sampled > 0

    def scaled(self) -> SpaceCount:
        """The counts of a sample of the grid's kernel-parameter points, scaled to all of
        them, in whole points."""
        n, N = self.params_counted, self.params_total
        f = N / n if n else 1
        pruned = Counter({kind: round(k * f) for kind, k in self.pruned.items()})
        margin = 0.0
        g, G = len(self.kept_by_group), self.groups_total  # groups are of one size: g / G is n / N
        if 1 < g < G:  # the standard error of a sample's total, drawn without replacement
            margin = 1.96 * G * math.sqrt(statistics.variance(self.kept_by_group) / g * (1 - g / G))
        return SpaceCount(round(self.total * f), round(self.kept * f), pruned, self.examples, n, N, self.stages_sampled,
                          list(self.kept_by_group), G, self.grouped_by, round(margin), round(self.same_points * f), self.seeded_points,
                          Counter({kind: round(k * f) for kind, k in self.points_pruned.items()}), dict(self.points_pruned_where))  # fmt: skip

    @property
    def groups_with_candidates(self) -> int:
        """Counted groups that keep any candidate: an estimate that rests on few of them
        (most pruned) is rough, whatever its interval."""
        return sum(1 for k in self.kept_by_group if k)


class SeedShape:
    """The seed at one kernel-parameter point: its analysis (shared by every
    point with the same seed and ops), role layouts and the seed's own point."""

    def __init__(self, info: PointInfo, variants: Variants, config: SpaceConfig):
        self.info, self.variants, self.config = info, variants, config
        self.analysis = variants.seed
        self.seed = info.seed
        self.split_alias: dict[str, str] = {}  # every label -> the one of its warp ranges
        self.split_keys: dict[str, tuple] = {}  # distinct label -> its warp ranges and warp count
        self.splits: dict[str, Split | None] = self._splits()  # distinct warp ranges, by label

    @property
    def limits(self) -> list[str]:
        return self.analysis.limits

    @property
    def movable(self) -> tuple[str, ...]:
        return tuple(m.op for m in self.analysis.movable) if self.config.own_roles else ()

    def layouts(self) -> tuple[str, ...]:
        """Distinct pipeline layouts to enumerate."""
        alias = self.analysis.layout_alias
        return tuple(dict.fromkeys(alias[label] for label in (SEED, *self.config.layouts)))

    def layout_labels(self) -> tuple[str, ...]:
        """The choices of the "pipelines" decision: the same for every seed."""
        return (SEED, *(label for label in self.config.layouts if label != SEED))

    @property
    def roles_decision(self) -> str:
        """The name of the warp-range decision: its labels depend on the number of consumer
        roles and on the warpgroup counts offered (``warpgroup_choices``)."""
        n = len(self.analysis.heavy)
        name = "roles" if n == 1 else f"roles.{n}"
        wgs = self.warpgroup_choices
        return name if set(wgs) == set(self.config.consumer_warpgroups) else f"{name}.wg{''.join(map(str, wgs))}"

    @functools.cached_property
    def warpgroup_choices(self) -> tuple[int, ...]:
        """Warpgroups a consumer role may take: the configured counts, and the seed's own (a
        512-thread GEMM's four, tilelang's default lowering's fastest point of the MXFP4 GEMM)."""
        own = {r.warps // WARPS_PER_GROUP for r in self.seed.roles if r.name in self.analysis.heavy and r.warps % WARPS_PER_GROUP == 0}
        return tuple(sorted({*self.config.consumer_warpgroups, *own}))

    def canonical(self, point: Point) -> Point:
        """The point with its labels resolved to the layouts they name for this seed."""
        return replace(point, roles=self.split_alias.get(point.roles, point.roles), layout=self.analysis.layout_alias.get(point.layout, point.layout))

    def plan(self, layout: str, moved: tuple[str, ...] = ()) -> Plan:
        return self.variants.plan(layout, moved)

    def nreg_decision(self, role: str, plan: Plan) -> tuple[str, tuple[int, ...]]:
        """The name of a role's budget decision in ``plan`` and its choices. A role that
        gathers moved loads takes ``loader_nreg`` or none, under a name of its own: a name
        keeps one list of choices (Optuna refuses a categorical whose choices change). The
        other light roles of such a plan take either list: one that shares the gatherers'
        warpgroup must take their budget."""
        c = self.config
        if role in self.analysis.heavy:
            return f"nreg.{role}", c.consumer_nreg
        gatherers = self.gatherers(plan)
        if role in gatherers:
            return f"nreg.{role}.gathers", (0, *c.loader_nreg)
        if gatherers:  # it may share a warpgroup with them, whose budget it must then match (rules: alignment)
            return f"nreg.{role}.beside", tuple(sorted({*c.producer_nreg, *c.loader_nreg}))
        return f"nreg.{role}", c.producer_nreg

    def gatherers(self, plan: Plan) -> frozenset[str]:
        """The roles that gather element by element in ``plan``: those that take moved loads,
        and the seed's light roles with loads of their own (``Seed.loads``)."""
        seeds = {role for op in self.analysis.loads for role in self.analysis.placements(op)}
        return frozenset(m.new_role for m in self.analysis.movable if m.feeds and m.op in plan.moved) | seeds

    def asyncable(self, moved: Sequence[str]) -> tuple[str, ...]:
        """The loads that can issue their copies by cp.async: the element-wise loads of the
        seed's light roles (``Seed.loads``) and the moves among ``moved`` that are loads with
        element-wise loops (gathers), where a loop copies global memory as it is. Through registers, a one-warp Load role fed DeepSeek-V4's
        sparse attention at 253.8 TFLOP/s; by cp.async 277.1, and two warps at 72 registers
        351.6, against tilelang's default's 331.6 (H200 run 34)."""
        moves = tuple(m.op for m in self.analysis.movable if m.feeds and m.op in moved)
        return tuple(op for op in self.analysis.loads + moves if self._async_ops(op))

    def _async_ops(self, load: str) -> tuple[str, ...]:
        """The element-wise loops of a load of ``asyncable`` that copy global memory into shared
        memory as it is: what cp.async issues (a loop that scales its elements stays as it is,
        and a candidate asking otherwise would be its twin)."""
        ops = next((m.ops for m in self.analysis.movable if m.op == load), (load,))
        return tuple(op for op in ops if self.analysis.access(op).global_copies)

    @property
    def feeds(self) -> tuple[str, ...]:
        """The loads the space may move out of their role (``Movable.feeds``), by move name."""
        return tuple(m.op for m in self.analysis.movable if m.feeds) if self.config.own_roles else ()

    @property
    def gathering(self) -> bool:
        """Whether a light role can gather element by element: the seed's or a moved load."""
        return bool(self.analysis.loads or self.feeds)

    def move_choices(self) -> Iterator[tuple[tuple[str, ...], tuple[str, ...]]]:
        """Every (moved, asynchronous) pair: each movable op kept or moved, each moved load
        that can go by cp.async through registers or by cp.async."""
        for flags in itertools.product((False, True), repeat=len(self.movable)):
            moved = tuple(op for op, on in zip(self.movable, flags) if on)
            can = self.asyncable(moved)
            for picks in itertools.product((False, True), repeat=len(can)):
                yield moved, tuple(op for op, on in zip(can, picks) if on)

    def _splits(self) -> dict[str, Split | None]:
        c, heavy = self.config, self.analysis.heavy
        consumers = [r.name for r in self.seed.roles if r.name in heavy]
        out: dict[str, Split | None] = {}
        seen: dict[tuple, str] = {}
        own = (tuple(sorted((r.name, (r.warp_lo, r.warp_hi)) for r in self.seed.roles)), self.seed.num_warps)
        gathers = self.gathering
        for wgs in itertools.product(self.warpgroup_choices, repeat=len(consumers)):
            for kind, first in itertools.product(c.producer_kinds, c.producer_first):
                label = Split(wgs, kind, first).label
                # Two warps per light role only help a gather; elsewhere "pair" names the one-warp layout.
                split = Split(wgs, "warp" if kind == "pair" and not gathers else kind, first)
                layout = split.place(self.analysis.role_names, heavy)
                key = (tuple(sorted(layout[0].items())), layout[1])
                if key not in seen:
                    seen[key] = label
                    out[label] = split
                self.split_alias[label] = seen[key]
        if own not in seen:
            out = {SEED: None, **out}
            seen[own] = SEED
        self.split_keys = {label: key for key, label in seen.items()}
        self.seed_split = self.split_alias[SEED] = seen[own]
        return out

    def roles(self, label: str, plan: Plan, nregs: Sequence[int]) -> tuple[tuple[Role, ...], int]:
        """The plan's roles at a split's warp ranges and these budgets, and the warp count."""
        split = self.splits[label]
        if split is None:  # the seed's ranges; new roles take the next warps, one each
            ranges = {r.name: (r.warp_lo, r.warp_hi) for r in self.seed.roles}
            end = max(hi for _, hi in ranges.values())
            for i, name in enumerate(plan.roles[len(self.seed.roles) :]):
                ranges[name] = (end + i, end + i + 1)
            num_warps = max(self.seed.num_warps, whole_warpgroups(end + len(plan.roles) - len(self.seed.roles)))
        else:  # gathering roles first among the light ones: tilelang vectorises a one-warp gather at warp 0 only (rules.gather_reason)
            gatherers = self.gatherers(plan)
            ranges, num_warps = split.place(sorted(plan.roles, key=lambda r: r not in gatherers), self.analysis.heavy)
        return fill_budgets([Role(name, *ranges[name], nreg) for name, nreg in zip(plan.roles, nregs)], num_warps), num_warps

    def seed_point(self, params: ParamsKey) -> Point:
        plan = self.plan(self.analysis.seed_layout)
        depth = {p.name: p.depth for p in self.seed.pipelines}
        return Point(
            params, self.seed_split, plan.layout, tuple(depth[p] for p in plan.varied),
            self.variants.seed_stages(plan), tuple(r.max_nreg for r in self.seed.roles),
        )  # fmt: skip

    def lowering_layouts(self) -> tuple[str, ...]:
        """The pipeline layouts of the lowering starts. tilelang's default lowering waits
        for a stage's loads on one barrier where the same ops read them (MERGED) and gives
        buffers read by other ops barriers of their own (SEPARATE). One barrier for all of
        a channel's buffers ran as fast or faster at every point measured (H200 run 24,
        +0-4%: 556 against the default's 544 TFLOP/s on a SwiGLU gate/up), so it comes
        first; the default's own structure too where it differs."""
        return (MERGED, SEPARATE) if self.analysis.readers_differ() else (MERGED,)

    def lowering_packings(self) -> tuple[str, ...]:
        """How the lowering starts place the light roles (producers, a Store role): a
        warpgroup each, as the default's producer; and, where there are several, a warp
        each in one warpgroup, the default's thread count (a warpgroup each for a
        producer and a Store role is 512 threads, whose launch registers cannot hold a
        wide MMA, and one warpgroup more to schedule); where they can gather (``gathering``),
        two warps each, still one warpgroup. ``lowering_points`` packs a gather by cp.async
        in two warps or a warpgroup, one through registers in one warp or a warpgroup: by
        cp.async DeepSeek-V4's ran 277.1 TFLOP/s from one warp and 351.6 from two (H200 run
        34), through registers two warps gained 6% on one (run 33). Each packing multiplies
        the starts at every point they go to: linear attention's 4 points with starts made
        256 before this pairing (128 before gathers by cp.async)."""
        light = [r for r in self.seed.roles if r.name not in self.analysis.heavy]
        if len(light) < 2:
            return ("warpgroup",)
        return ("warpgroup", "warp", "pair") if self.gathering else ("warpgroup", "warp")

    def lowering_moves(self) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
        """The (moved, asynchronous) pairs of the lowering starts: nothing moved, and, where the
        seed leaves loads with its consumers (element-wise gathers), those loads given to the
        producer, as tilelang's default lowering gives a producer warpgroup every load it can
        issue: each through registers, and, where it gathers (the seed's light roles or the
        moved loads), by cp.async as tilelang issues a gather."""
        out: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        for moved in ((), self.feeds) if self.feeds else ((),):
            can = self.asyncable(moved)
            out += [(moved, ()), *([(moved, can)] if can else [])]
        return tuple(out)

    def lowering_points(self, params: ParamsKey, pipelines: str = MERGED, packing: str = "warpgroup", moved: tuple[str, ...] = (), asynchronous: tuple[str, ...] = ()) -> list[Point]:
        """The structure tilelang's default warp specialization gives a pipelined loop,
        as points of this space: the seed's consumer warpgroups after one producer
        warpgroup (or the light roles packed as ``packing`` says: ``lowering_packings``),
        then before it,
        the buffers in the ``pipelines`` layout at the seed's depth (each pipeline
        released after the last op that reads it), the seed's stages, producers
        at the smallest register budget and consumers at each budget, largest first (the
        largest that the register rules allow is the lowering's), then no budgets at all.
        With ``moved`` loads, their new pipeline is double-buffered; a role that gathers
        (``gatherers``) takes the largest ``loader_nreg`` that fits first, then no budgets:
        register-staged loads at a TMA producer's budget ran 1.3-1.7x slower than without
        budgets, and 1.09x faster at 136 (sparse MLA's gathers, H200 runs 28-29). A
        search seeded only by role_based's guess may not come near it (5x slower seeds
        seen where role_based's budget spills). Empty where the space cannot express it."""
        heavy = [r for r in self.seed.roles if r.name in self.analysis.heavy]
        wgs = tuple(r.warps // WARPS_PER_GROUP for r in heavy)
        # Producers first, then last: tilelang renumbers the consumers' thread index, the space does not,
        # so a kernel that reads it (an MXFP4 dequant by thread) keeps its consumers on the seed's warps.
        labels = [label for first in (True, False) if (label := self.split_alias.get(Split(wgs, packing, first).label))]
        layout = self.analysis.layout_alias.get(pipelines)
        # A gather by cp.async in two warps, one through registers in one (``lowering_packings``).
        if not labels or layout is None or any(r.warps % WARPS_PER_GROUP for r in heavy) or (packing != "warpgroup" and (packing == "pair") != bool(asynchronous)):
            return []
        plan = self.plan(layout, moved)
        if plan.infeasible:
            return []
        depth = {b: p.depth for p in self.seed.pipelines for b in p.buffers}
        depth.update({b: 2 for m in self.analysis.movable if m.op in moved for b in m.buffers})
        buffers = {p.name: p.buffers for p in plan.pipelines}
        depths = tuple(max((depth[b] for b in buffers[name] if b in depth), default=1) for name in plan.varied)
        stages = self.variants.seed_stages(plan)
        c = self.config
        light = min((n for n in c.producer_nreg if n), default=0)
        consumers = sorted(c.consumer_nreg, key=lambda n: (n != FILL, -n))  # the pool filled first: role_based's rule
        gatherers = self.gatherers(plan)
        budgets = [(nreg, light, light) for nreg in consumers]  # (consumers, gatherers, other light roles)
        if 0 in c.producer_nreg and 0 in c.consumer_nreg:
            unbudgeted = (0, 0, 0)  # no setmaxnreg: where the rules allow no budget (8 warps)
            budgets = [unbudgeted, *budgets] if gatherers else [*budgets, unbudgeted]
        if gatherers:  # the other light roles at the gatherers' budget too: they may share its warpgroup
            budgets = [(nreg, loader, other) for loader in sorted(c.loader_nreg, reverse=True) for nreg in consumers if nreg for other in (light, loader)] + budgets

        def nreg(role: str, budget: tuple[int, int, int]) -> int:
            return budget[0] if role in self.analysis.heavy else budget[1] if role in gatherers else budget[2]

        return [Point(params, label, layout, depths, stages, tuple(nreg(r, b) for r in plan.roles), moved, asynchronous) for label in labels for b in budgets]

    @staticmethod
    def stage_choices(plan: Plan) -> Iterator[tuple[int, ...]]:
        """Every decided group's stage, over the choices of each body that keep the seed's dependences."""
        for combo in itertools.product(*(c.options for c in plan.stage_choices)):
            yield tuple(itertools.chain.from_iterable(combo))

    @staticmethod
    def stage_count(plan: Plan) -> int:
        return math.prod(len(c.options) for c in plan.stage_choices)

    @staticmethod
    def stage_choice(plan: Plan, index: int) -> tuple[int, ...]:
        """The ``index``-th of ``stage_choices(plan)``, without walking to it."""
        combo = []
        for choice in reversed(plan.stage_choices):
            index, at = divmod(index, len(choice.options))
            combo.append(choice.options[at])
        return tuple(itertools.chain.from_iterable(reversed(combo)))

    def schedule(self, point: Point) -> Schedule | str:
        point = self.canonical(point)
        plan = self.plan(point.layout, point.moved)
        roles, num_warps = self.roles(point.roles, plan, point.nregs)
        schedule = self.variants.schedule_for(plan, point.depths, point.stages, roles, num_warps)
        copies = tuple(op for move in point.asynchronous for op in self._async_ops(move))
        return schedule.with_(async_copies=copies) if copies and not isinstance(schedule, str) else schedule
