"""The schedule space: variants of a seed schedule, crossed with kernel parameters.

A point fixes one choice per decision; names and choice lists depend only on
the seed, so samplers see a stable space:
- ``param.<name>``: the kernel's parameters;
- ``roles``: warp ranges. Roles that write register fragments (consumers)
  get whole warpgroups each, the others one warp, two (gathers only) or one
  warpgroup, placed before or after them; "seed" where the seed's ranges are
  none of these;
- ``own_role.<op>``: run an op in a role of its own where the seed allows
  it (a store from shared memory: the next loop iteration overlaps it);
- ``async.<op>``: a gather's element-wise copies (a light role's own load, or
  a moved one) issued by cp.async rather than through registers;
- ``pipelines``: each loop channel's buffers as the seed groups them, all
  merged or all separate;
- ``depth.<pipeline>``: each loop pipeline's depth (``depth``: one for all, where more
  than ``MAX_VARIED_DEPTHS`` pipelines vary);
- ``stage.<role>.<pipelines>``: the stage of each span group of a loop body
  with several (one pipeline's wait/release some iterations behind
  another's; producer and consumer side alike);
- ``nreg.<role>``: each role's setmaxnreg budget.

Static rules prune a point before anything is built and say why: the
kernel's ``check``, shared memory, the seed's dependences and deadlock
freedom (see seed.py), threads per block, and (rules.py) whether each
role's warps can split its MMA accumulators, setmaxnreg alignment, the
64K-register pool, and whether its accumulators and MMA instructions fit
its registers. Pruning is hierarchical, and counting multiplies instead of
enumerating the register budgets, so a space of 10^6 points counts in
seconds.

This module is pure Python: what it needs from the compiler (the seed,
buffer sizes, what each op reads and writes) arrives as a ``PointInfo``.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any, Callable, Iterable, Iterator, Sequence

from .candidate import Candidate
from .order import DeadlockModel
from .rules import FILL, MAX_THREADS, SharedUse, gather_reason, kb_over, loop_reason, mma_reason, register_reason, shared_bytes, shared_order, shared_uses, spill_reason, thread_index_reason
from .schedule import THREADS_PER_WARP, Role, Schedule
from .seed import MERGED, SEED, SEPARATE, Seed
from .shape import ParamsKey, Point, PointInfo, SeedShape, SpaceConfig, SpaceCount, Split
from .variant import Plan, Variants

# Each varied pipeline's depth is a decision of its own, and the walk and the count take
# their product: 5^n depth sets. A fused kernel of KDA with 11 loop pipelines made 48.8
# million of them per layout, and `ws-tune space` did not finish. Beyond this many (no
# kernel file has more than 5), one depth serves every pipeline of the plan.
MAX_VARIED_DEPTHS = 6
# A plan's stage choices are the product of each loop body's: KDA's intra-chunk backward
# has 54,860 per plan, each a deadlock check of ~2 ms, and counting its space took over an
# hour. A count walks this many of them, drawn at random, where a plan has more.
STAGE_SAMPLE = 256
# Points probed, in a random order, for one with a seed, which says what groups a sampled
# count draws (ScheduleSpace.param_groups); where none has one, points are drawn alone.
GROUP_PROBES = 8
# Depth sets a random draw tries before it lists every set the rules keep (to tell "few" from "none").
DEPTH_DRAWS = 16


def _one_depth(plan: Plan) -> bool:
    """Whether one depth decision serves every varied pipeline of the plan (past ``MAX_VARIED_DEPTHS``)."""
    return len(plan.varied) > MAX_VARIED_DEPTHS

__all__ = ["MERGED", "SEED", "SEPARATE", "Point", "PointInfo", "ScheduleSpace", "SeedShape", "SpaceConfig", "SpaceCount", "Split", "register_reason"]

BARRIER_BYTES = 16  # a full and an empty mbarrier per version


class ScheduleSpace:
    """Enumerates, samples and prunes the points of one tuning problem."""

    def __init__(
        self,
        *,
        param_grid: dict[str, Sequence[Any]],
        point_info: Callable[[dict[str, Any]], PointInfo],
        check: Callable[[dict[str, Any], Schedule | None], str | None] = lambda params, schedule: None,
        config: SpaceConfig = SpaceConfig(),
        check_candidates: bool = True,
    ):
        """``check``: the kernel's check. It is asked about kernel parameters and
        role layouts while enumerating, and, with ``check_candidates``, about each
        whole candidate before it is handed out (a recorded check cannot be)."""
        self.param_grid = {k: tuple(v) for k, v in param_grid.items()}
        self.config = config
        self._point_info = point_info
        self._check = check
        self._check_candidates = check_candidates
        self._shapes: dict[ParamsKey, SeedShape | str] = {}
        self._seedless: dict[ParamsKey, PointInfo] = {}  # served by the kernel, but without a seed to vary
        self._seeds: dict[tuple, Variants] = {}
        self._deadlocks = DeadlockModel()  # shared: the seeds of different kernel parameters often deadlock alike
        self._split_reasons: dict[tuple[ParamsKey, str], str | None] = {}
        self._register_reasons: dict[tuple, str | None] = {}
        self._survivors: dict[tuple, tuple[tuple, int]] = {}
        self._fitting: dict[tuple, list[tuple[int, ...]]] = {}
        self._notes: set[str] = set()  # limits met while enumerating, beside the seeds'
        self._representatives: dict[tuple[ParamsKey, tuple | None], ParamsKey] = {}
        self._own: dict[ParamsKey, frozenset[str] | None] = {}
        self._set_keys: dict[ParamsKey, frozenset[str]] = {}
        self._uses: dict[tuple, dict[str, SharedUse]] = {}

    # --- structure ----------------------------------------------------------
    def param_points(self) -> Iterator[ParamsKey]:
        keys = sorted(self.param_grid)
        for values in itertools.product(*(self.param_grid[k] for k in keys)):
            yield tuple(zip(keys, values))

    def param_sample(self, n: int | None, seed: int = 0) -> list[ParamsKey]:
        """About ``n`` kernel-parameter points drawn at random, in whole groups
        (``param_groups``); all of them if ``n`` is None or more."""
        return [params for group in self._drawn_groups(n, seed)[0] for params in group]

    def param_groups(self, seed: int = 0) -> tuple[list[list[ParamsKey]], tuple[str, ...]]:
        """The grid's points in groups that differ only in the parameters a schedule sets
        instead (``set_by_schedule``: a block's threads, a loop's num_stages), and those
        parameters. A group's points build one another's warp-specialized kernels
        (``representative``), so a sample of whole groups counts each kernel where it is
        built: one of single points mostly draws points that build none and misses the few
        that build them all. The parameters are read at the first point, in a random order,
        that has a seed; groups are of one size (the product of those parameters' values)."""
        grid = list(self.param_points())
        keys: frozenset[str] = frozenset()
        for params in random.Random(seed).sample(grid, min(len(grid), GROUP_PROBES)):
            try:
                if not isinstance(self.shape(params), str):
                    keys = self.set_by_schedule(params)
                    break
            except Exception:  # noqa: BLE001 - a point whose kernel does not build says nothing here
                continue
        groups: dict[ParamsKey, list[ParamsKey]] = {}
        for params in grid:
            groups.setdefault(tuple(kv for kv in params if kv[0] not in keys), []).append(params)
        return list(groups.values()), tuple(sorted(keys))

    def _drawn_groups(self, n: int | None, seed: int) -> tuple[list[list[ParamsKey]], int, tuple[str, ...]]:
        """The groups a sample of about ``n`` points draws (every point alone where ``n`` is
        None or more), how many the grid has, and the parameters a group spans."""
        grid = list(self.param_points())
        if n is None or n >= len(grid):
            return [[params] for params in grid], len(grid), ()
        groups, keys = self.param_groups(seed)
        drawn = random.Random(seed).sample(groups, max(1, min(len(groups), round(n / len(groups[0])))))
        return drawn, len(groups), keys

    def shape(self, params: ParamsKey) -> SeedShape | str:
        """The seed at a kernel-parameter point, or why that point is out."""
        if params not in self._shapes:
            reason = self._check(dict(params), None)
            if reason:
                self._shapes[params] = f"kernel: {reason}"
            else:
                info = self._point_info(dict(params))
                if info.seed is None:
                    self._seedless[params] = info
                    self._shapes[params] = f"seed: {info.no_seed}"
                    return self._shapes[params]
                key = (info.seed, tuple(sorted(info.accesses.items())), tuple(sorted(info.buffer_kinds.items())))
                if key not in self._seeds:
                    self._seeds[key] = Variants(Seed(info.seed, info.accesses, info.buffer_kinds), self.config.max_stage_offset, self._deadlocks)
                self._shapes[params] = SeedShape(info, self._seeds[key], self.config)
        return self._shapes[params]

    def serves(self, params: ParamsKey) -> bool:
        """Whether the kernel serves these parameters (its check passes), with a seed
        to vary or without one: the points where baselines are measured."""
        return not isinstance(self.shape(params), str) or params in self._seedless

    def served_points(self) -> list[ParamsKey]:
        """Every kernel-parameter point the kernel serves (``serves``), in grid order."""
        return [p for p in self.param_points() if self.serves(p)]

    def splits(self, shape: SeedShape) -> tuple[str, ...]:
        return tuple(shape.splits)

    def limits(self) -> list[str]:
        """What the space keeps as in the seed, and why (every seed seen so far)."""
        seeds = [variants.seed for variants in self._seeds.values()]
        # what only the kernel can change, where no seed of it has it (the GEMM example's sync seeds beside its async ones say nothing)
        kernel_side = [msg for key, msg in seeds[0].kernel_side.items() if all(key in s.kernel_side for s in seeds)] if seeds else []
        pinned = [msg for variants in self._seeds.values() for msg in variants.pinned.values()]  # met while enumerating
        notes = [msg for seed in seeds for msg in seed.limits] + kernel_side + pinned + sorted(self._notes)
        if any(not isinstance(shape, str) and shape.info.orders_pipeline for shape in self._shapes.values()):
            notes.append("software pipeline: the kernel's own order and stages of a T.Pipelined loop are followed by tilelang's "
                         "no_ws lowering only; warp-specialized kernels (the seed, its variants, tilelang's default) stage the loop by roles and pipelines")  # fmt: skip
        return list(dict.fromkeys(notes))

    def widened(self) -> list[str]:
        """What candidates vary though the seed leaves it out, and why (every seed seen so far)."""
        shapes = [shape for shape in self._shapes.values() if not isinstance(shape, str)]
        if not (unbudgeted := sum(not shape.info.budgets for shape in shapes)):
            return []
        where = "" if unbudgeted == len(shapes) else f" at {unbudgeted} of the {len(shapes)} points seen"
        return [f"register budgets: none in the seed{where}, as the kernel asks (T.no_set_max_nreg or T.disable_warp_group_reg_alloc); "
                "candidates vary them, as tilelang's role_based does, within the register rules"]

    def axes(self, grid: Iterable[ParamsKey] | None = None) -> dict[str, tuple[Any, ...]]:
        """Every decision and its choices, over the seeds of all kernel-parameter points
        (or of those of ``grid``)."""
        out: dict[str, tuple[Any, ...]] = {f"param.{k}": v for k, v in self.param_grid.items()}
        for params in self.param_points() if grid is None else grid:
            shape = self.shape(params)
            if not isinstance(shape, str):
                self._decisions(shape, lambda name, options: out.setdefault(name, tuple(options))[0], every=True)
        return out

    # --- enumeration --------------------------------------------------------
    def walk(self, count: SpaceCount | None = None) -> Iterator[tuple[Point, SeedShape]]:
        """Every surviving point; pruned ones are tallied into ``count``."""
        count = count if count is not None else SpaceCount()
        for params, shape, plan, asynchronous, depths, stages, survivors, _ in self._structures(count, self.param_points()):
            for label, nregs in survivors:
                yield Point(params, label, plan.layout, depths, stages, nregs, plan.moved, asynchronous), shape

    def count(self, tick: Callable[[int, int], None] | None = None, *, sample: int | None = None, seed: int = 0, stages: int | None = STAGE_SAMPLE,
              at: Sequence[ParamsKey] | None = None) -> SpaceCount:
        """Sizes before and after pruning; register budgets are counted, not enumerated.
        ``tick(total, kept)`` hears the running counts (a count can take a minute).
        ``sample``: count only about that many kernel-parameter points, drawn at random in
        whole groups (``param_groups``), and scale to the whole grid (an estimate,
        ``estimated``): deriving the seed of every point of a large grid takes minutes
        (each is a tilelang PrimFunc). ``stages``:
        where a structure has more stage choices than that, count a random sample of
        them and scale (None: every one). ``at``: count these points only, as if the grid
        held no others."""
        drawn, groups, grouped_by = self._drawn_groups(sample, seed) if at is None else ([[params] for params in at], len(at), ())
        chosen = [params for group in drawn for params in group]
        count = SpaceCount(params_counted=len(chosen), params_total=len(chosen) if at is not None else sum(1 for _ in self.param_points()),
                           groups_total=groups, grouped_by=grouped_by)  # fmt: skip
        rng = random.Random(seed)
        by_point: Counter = Counter()
        for params, *_, survivors, weight in self._structures(count, chosen, stages, rng):
            count.kept += len(survivors) * weight
            by_point[params] += len(survivors) * weight
            if tick is not None:
                tick(round(count.total), round(count.kept))
        count.kept_by_group = [sum(by_point[p] for p in group) for group in drawn]
        count.say_where(chosen)
        return count.scaled()

    def _structures(self, count: SpaceCount, grid: Iterable[ParamsKey], stage_sample: int | None = None, rng: random.Random | None = None) -> Iterator[tuple[ParamsKey, SeedShape, Plan, tuple[str, ...], tuple[int, ...], tuple[int, ...], list[tuple[str, tuple[int, ...]]], float]]:
        """Everything but warp ranges and budgets, each with its surviving (split, nregs)
        and the weight it counts with: 1, or, where only a sample of ``stage_sample`` of a
        plan's stage choices is walked, the choices each stands for."""
        for params in grid:
            shape = self.shape(params)
            if isinstance(shape, str) and (twin := self._seeded_twin(params)) is not None:
                count.same_points += 1  # a seedless point whose kernels a seeded one builds
                count.examples.setdefault("same", self._same_reason(params, twin))
                continue
            if isinstance(shape, str):
                count.prune_point(shape, params)
                continue
            count.seeded_points += 1
            if self._own_splits(params, shape) == frozenset():  # its candidates are another point's
                count.same_points += 1
                if "same" not in count.examples:  # probes its neighbours: once
                    count.examples["same"] = self._same_reason(params)
                continue
            for moved, asynchronous in shape.move_choices():
                survivors, below = self._role_survivors(params, shape, moved)
                for layout in shape.layouts():
                    plan = shape.plan(layout, moved)
                    depth_sets = self._depth_sets(plan)
                    n_stages = shape.stage_count(plan)
                    count.total += n_stages * len(depth_sets) * below
                    if plan.infeasible:  # no stages of some body keep the seed's dependences
                        count.prune(plan.infeasible, n_stages * len(depth_sets) * below)
                        continue
                    fitting = []  # depths within shared memory; the rest are pruned under every stage choice
                    for depths in depth_sets:
                        reason = self._depths_reason(shape, plan, depths)
                        if reason:
                            count.prune(reason, below * n_stages)
                        else:
                            fitting.append(depths)
                    if stage_sample is not None and n_stages > stage_sample:
                        count.stages_sampled += 1
                        picked = sorted((rng or random.Random()).sample(range(n_stages), stage_sample))
                        stage_sets, weight = [shape.stage_choice(plan, i) for i in picked], n_stages / stage_sample
                    else:
                        stage_sets, weight = list(shape.stage_choices(plan)), 1.0
                    for stages in stage_sets:
                        reason = self._order_reason(shape, plan, stages)
                        if reason:
                            count.prune(reason, len(fitting) * below * weight)
                            continue
                        for depths in fitting:
                            reason = shape.variants.deadlock(plan, stages, depths)
                            if reason:
                                count.prune(reason, below * weight)
                                continue
                            for kind, n in survivors[1].items():
                                count.prune(survivors[2][kind], n * weight)
                            yield params, shape, plan, asynchronous, depths, stages, survivors[0], weight

    def _nreg_choices(self, shape: SeedShape, plan: Plan) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(shape.nreg_decision(r, plan)[1] for r in plan.roles))

    def _role_survivors(self, params: ParamsKey, shape: SeedShape, moved: tuple[str, ...]) -> tuple[tuple, int]:
        """The (split, nregs) pairs that survive, the prune tallies of one pass over
        them, and how many there are in all (the points below one structure). Once per
        point and moves: a load's cp.async choice leaves its roles as they are."""
        key = (params, moved)
        if key not in self._survivors:
            self._survivors[key] = self._pass_over_roles(params, shape, moved)
        return self._survivors[key]

    def _pass_over_roles(self, params: ParamsKey, shape: SeedShape, moved: tuple[str, ...]) -> tuple[tuple, int]:
        plan = shape.plan(shape.layouts()[0], moved)
        kept: list[tuple[str, tuple[int, ...]]] = []
        pruned: Counter = Counter()
        examples: dict[str, str] = {}
        total = 0
        own = self._own_splits(params, shape)
        for label in shape.splits:
            if own is not None and label not in own:  # the representative's candidates: counted at its point
                continue
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

    def candidates(self) -> Iterator[Candidate]:
        for point, _ in self.walk():
            cand = self.candidate(point)
            if isinstance(cand, Candidate):  # the kernel's check on the whole schedule may still refuse it
                yield cand

    def candidate(self, point: Point) -> Candidate | str:
        """The candidate at a point, or why the point is pruned."""
        shape = self.shape(point.params)
        if isinstance(shape, str):
            return shape
        point = shape.canonical(point)
        reason = self._malformed(shape, point)
        if reason:
            return reason
        plan = shape.plan(point.layout, point.moved)
        reason = (
            plan.infeasible
            or self._depths_reason(shape, plan, point.depths)
            or self._order_reason(shape, plan, point.stages)
            or shape.variants.deadlock(plan, tuple(point.stages), tuple(point.depths))
            or self.split_reason(point.params, shape, point.roles)
            or self._register_reason(shape, point.roles, plan, point.nregs)
        )
        if reason:
            return reason
        schedule = shape.schedule(point)
        if isinstance(schedule, str):
            return schedule
        params = self._layout_home(point.params, shape, point.roles)
        reason = self._check(dict(point.params), schedule) if self._check_candidates else None
        if not reason and params != point.params and self._check_candidates:
            reason = self._check(dict(params), schedule)
        return f"kernel: {reason}" if reason else Candidate.make(dict(params), schedule)

    def representative(self, params: ParamsKey, offering: tuple | None = None) -> ParamsKey:
        """The kernel parameters that stand for ``params`` in warp-specialized candidates.
        A parameter that sets only what a schedule decides instead (a loop's num_stages, the
        block's threads: ``PointInfo.program``) takes its first value in the grid that builds
        the same program, so that one kernel is one candidate, not one per value of a setting
        the schedule overrides (the seed and tilelang's lowerings keep their own points).
        ``offering``: among the points whose seed offers this warp layout (a split key)."""
        if (params, offering) in self._representatives:
            return self._representatives[params, offering]
        found = params
        for key, value in self._schedule_settable(params):
            found = self._twin(found, key, itertools.takewhile(lambda v, value=value: v != value, self.param_grid[key]), offering) or found
        self._representatives[params, offering] = found
        return found

    def set_by_schedule(self, params: ParamsKey) -> frozenset[str]:
        """The kernel parameters whose value a warp-specialized candidate's schedule
        replaces at this point (a block's threads, a loop's num_stages): another value
        of theirs builds the same kernel. Shown as such, not as the stored value."""
        if params not in self._set_keys:
            self._set_keys[params] = frozenset(key for key, value in self._schedule_settable(params)
                                               if self._twin(params, key, (v for v in self.param_grid[key] if v != value)))  # fmt: skip
        return self._set_keys[params]

    def _schedule_settable(self, params: ParamsKey) -> list[tuple[str, int]]:
        """The parameters whose value is one the schedule sets instead (``PointInfo.schedule_sets``)."""
        shape = self.shape(params)
        if isinstance(shape, str) or not shape.info.program:
            return []
        return [(k, v) for k, v in params if isinstance(v, int) and not isinstance(v, bool) and v in shape.info.schedule_sets]

    def _twin(self, params: ParamsKey, key: str, values: Iterable[Any], offering: tuple | None = None) -> ParamsKey | None:
        """``params`` with ``key`` at the first of ``values`` that builds the same program
        (and whose seed offers the warp layout ``offering``), or None."""
        program = self.shape(params).info.program  # a point with settable parameters has a shape
        return self._seeded_probe(params, key, values, lambda near: near.info.program == program and (offering is None or offering in near.split_keys.values()))

    def _seeded_probe(self, params: ParamsKey, key: str, values: Iterable[Any], fits: Callable[[SeedShape], bool]) -> ParamsKey | None:
        """``params`` with ``key`` at the first of ``values`` whose point has a seed that ``fits``, or None."""
        for other in values:
            probe = tuple((k, other if k == key else v) for k, v in params)
            try:
                near = self.shape(probe)
            except Exception:  # noqa: BLE001 - a point whose kernel does not build stands for none
                continue
            if not isinstance(near, str) and fits(near):
                return probe
        return None

    def _layout_home(self, params: ParamsKey, shape: SeedShape, label: str) -> ParamsKey:
        """The kernel parameters a candidate of this point and warp layout is stored under:
        the representative's where its seed offers the layout; else the first point on the
        way to it that does (four consumer warpgroups at threads=512, not at 256: the point
        at num_stages=3 and 512 threads stores them under num_stages=2's)."""
        same = self.representative(params)
        key = shape.split_keys[shape.split_alias.get(label, label)]
        if same == params or key in self.shape(same).split_keys.values():  # a representative has a shape
            return same
        return self.representative(params, key)

    def _own_splits(self, params: ParamsKey, shape: SeedShape) -> frozenset[str] | None:
        """The warp layouts (split labels) whose candidates this point stores under its own
        parameters, where another point stands for it (``representative``): the seed's own
        warpgroup count is among each point's choices. None: it stands for itself."""
        if params not in self._own:
            same = self.representative(params)
            self._own[params] = None if same == params else frozenset(label for label in shape.split_keys if self._layout_home(params, shape, label) == params)
        return self._own[params]

    def _same_reason(self, params: ParamsKey, seeded_twin: ParamsKey | None = None) -> str:
        same = seeded_twin or self.representative(params)
        theirs, ours = (", ".join(f"{k}={v}" for k, v in p if dict(params)[k] != dict(same)[k]) for p in (same, params))
        sets = " and ".join(sorted(self.set_by_schedule(params) if seeded_twin is None else (k for k, _ in set(params) - set(same))))
        unseeded = "" if seeded_twin is None else f"; {ours} has no seed of its own: {self._seedless[params].no_seed}"
        return f"same: the warp-specialized kernels of {ours} are those of {theirs}, built and counted there (a schedule sets {sets or 'the pipeline depths and threads'}){unseeded}"

    def _seeded_twin(self, params: ParamsKey) -> ParamsKey | None:
        """For a point without a seed, one with a seed whose kernel differs from its own only in
        what a schedule sets (a loop's num_stages, the block's threads): that point's
        candidates are this point's kernels, deeper pipelines included."""
        info = self._seedless.get(params)
        if info is None or not info.plain_program:
            return None
        for key, value in params:
            twin = self._seeded_probe(params, key, (v for v in self.param_grid[key] if v != value), lambda near: near.info.plain_program == info.plain_program)
            if twin is not None:
                return twin
        return None

    def seed_point(self, params: ParamsKey) -> Point | str:
        shape = self.shape(params)
        return shape if isinstance(shape, str) else shape.seed_point(params)

    def seed_candidate(self, params: ParamsKey) -> Candidate | str:
        shape = self.shape(params)
        return shape if isinstance(shape, str) else Candidate.make(dict(self._layout_home(params, shape, shape.seed_split)), shape.seed)

    def lowering_candidates(self, params: ParamsKey, *, moving: bool = True) -> list[Candidate]:
        """The structure of tilelang's default warp specialization at these kernel
        parameters, in each of ``SeedShape.lowering_layouts`` and
        ``SeedShape.lowering_packings``, each schedule once; with each of
        ``SeedShape.lowering_moves``, or (``moving=False``) with nothing moved."""
        shape = self.shape(params)
        found: dict[str, Candidate] = {}
        moves = () if isinstance(shape, str) else shape.lowering_moves() if moving else shape.lowering_moves()[:1]
        ways = [] if isinstance(shape, str) else itertools.product(shape.lowering_layouts(), shape.lowering_packings(), moves)
        for layout, packing, (moved, asynchronous) in ways:
            cand = self.lowering_candidate(params, layout, packing, moved, asynchronous)
            if cand is not None:
                found.setdefault(cand.hash, cand)
        return list(found.values())

    def lowering_candidate(self, params: ParamsKey, layout: str, packing: str = "warpgroup", moved: tuple[str, ...] = (), asynchronous: tuple[str, ...] = ()) -> Candidate | None:
        """That structure in one pipeline layout, packing and moves (``SeedShape.lowering_points``):
        the first of its points that no rule prunes, or None."""
        shape = self.shape(params)
        points = [] if isinstance(shape, str) else shape.lowering_points(params, layout, packing, moved, asynchronous)
        return next((c for c in map(self.candidate, points) if isinstance(c, Candidate)), None)

    def sample(self, choose: Callable[[str, Sequence[Any]], Any]) -> Point:
        """A point picked one decision at a time (define-by-run, for Optuna).

        Names and choice lists depend only on the seed, so samplers see a stable space.
        """
        params = tuple(sorted((k, choose(f"param.{k}", v)) for k, v in self.param_grid.items()))
        shape = self.shape(params)
        if isinstance(shape, str):  # pruned kernel parameters: nothing below them to decide
            return Point(params)
        return self._decisions(shape, choose, params=params)

    def random_point(self, rng: random.Random, tries: int = 200, within: Sequence[ParamsKey] | None = None) -> Point | None:
        """A point that passes every static rule, drawn level by level among the
        choices that survive (for exploring a space where most random decisions
        are pruned); None if ``tries`` draws found none. ``within``: at these
        kernel-parameter points only (the grid's by default)."""
        grid = list(within) if within is not None else list(self.param_points())
        for _ in range(tries):
            params = self._random_params(rng, grid)
            if params is None:
                return None
            shape = self.shape(params)
            assert not isinstance(shape, str)
            moved = tuple(op for op in shape.movable if rng.random() < 0.5)
            asynchronous = tuple(op for op in shape.asyncable(moved) if rng.random() < 0.5)
            kept = self._role_survivors(params, shape, moved)[0][0]
            plan = shape.plan(rng.choice(shape.layouts()), moved)
            depths = None if not kept or plan.infeasible else self._random_depths(rng, shape, plan)
            if depths is None:
                continue
            stages = tuple(itertools.chain.from_iterable(rng.choice(c.options) for c in plan.stage_choices))
            label, nregs = rng.choice(kept)
            point = Point(params, label, plan.layout, depths, stages, nregs, moved, asynchronous)
            if isinstance(self.candidate(point), Candidate):
                return point
        return None

    def _random_params(self, rng: random.Random, grid: list[ParamsKey]) -> ParamsKey | None:
        """A point of ``grid`` with a seed, uniformly: drawn from the whole grid and
        redrawn while pruned, so that only the seeds of drawn points are derived (each is
        a tilelang PrimFunc: a grid of hundreds takes minutes)."""
        for _ in range(4 * len(grid)):
            params = rng.choice(grid)
            if not isinstance(self.shape(params), str):
                return params
        valid = [p for p in grid if not isinstance(self.shape(p), str)]  # few valid: look at all
        return rng.choice(valid) if valid else None

    def decisions(self, point: Point) -> dict[str, Any]:
        """The sampler's decisions that give this point (``sample`` in reverse)."""
        shape = self.shape(point.params)
        wanted = dict(point.params)
        made: dict[str, Any] = {}

        def choose(name: str, options: Sequence[Any]) -> Any:
            options = tuple(options)
            if name.startswith("param."):
                value = wanted[name[len("param.") :]]
            elif name.startswith("roles"):
                value = point.roles
            elif name == "pipelines":
                value = point.layout
            elif name.startswith("own_role."):
                value = name[len("own_role.") :] in point.moved
            elif name.startswith("async."):
                value = name[len("async.") :] in point.asynchronous
            else:
                value = self._numbers(shape, point)[name]
            made[name] = value if value in options else options[0]
            return made[name]

        self.sample(choose)
        return made

    @staticmethod
    def _numbers(shape: SeedShape | str, point: Point) -> dict[str, Any]:
        """Depth, stage and budget decisions of a point, by name."""
        assert not isinstance(shape, str)
        plan = shape.plan(point.layout, point.moved)
        out: dict[str, Any] = {"depth": point.depths[0]} if _one_depth(plan) else {f"depth.{p}": d for p, d in zip(plan.varied, point.depths)}
        out.update({shape.nreg_decision(r, plan)[0]: n for r, n in zip(plan.roles, point.nregs)})
        stages = iter(point.stages)
        for choice in plan.stage_choices:
            out[choice.name] = choice.label(tuple(next(stages) for _ in choice.groups))
        return out

    def _random_depths(self, rng: random.Random, shape: SeedShape, plan: Plan) -> tuple[int, ...] | None:
        """Depths the static rules keep, drawn uniformly among them, or None if none is kept:
        drawn among every set and redrawn while refused (the same law as a choice among the kept
        ones), so that the kept ones, each sized by the shared-memory packer, are listed only
        where the draws find none (listing them was over half of a drawn point's time)."""
        if (id(shape), plan) not in self._fitting:
            sets = self._depth_sets(plan)
            for _ in range(DEPTH_DRAWS):
                depths = rng.choice(sets)
                if not self._depths_reason(shape, plan, depths):
                    return depths
        fitting = self._fitting_depths(shape, plan)
        return rng.choice(fitting) if fitting else None

    def _fitting_depths(self, shape: SeedShape, plan: Plan) -> list[tuple[int, ...]]:
        key = (id(shape), plan)
        if key not in self._fitting:
            self._fitting[key] = [d for d in self._depth_sets(plan) if not self._depths_reason(shape, plan, d)]
        return self._fitting[key]

    def _depth_sets(self, plan: Plan) -> tuple[tuple[int, ...], ...]:
        """The depths of the plan's varied pipelines: every combination, or one depth for all
        beyond ``MAX_VARIED_DEPTHS`` of them."""
        n, depths = len(plan.varied), self.config.depths
        if not _one_depth(plan):
            return tuple(itertools.product(depths, repeat=n))
        self._notes.add(f"pipeline depths: one for all {n} pipelines of a plan (over {MAX_VARIED_DEPTHS}: {len(depths)}^{n} sets)")
        return tuple((d,) * n for d in depths)

    def _decisions(self, shape: SeedShape, choose: Callable[[str, Sequence[Any]], Any], params: ParamsKey = (), every: bool = False) -> Point:
        """The decisions below the kernel parameters, in a fixed order. ``every``:
        offer every name of every plan (to list the axes), not one path."""
        c = self.config
        roles = shape.split_alias[choose(shape.roles_decision, tuple(shape.split_alias))]
        moved = tuple(op for op in shape.movable if choose(f"own_role.{op}", (False, True)))
        asynchronous = tuple(op for op in shape.asyncable(shape.movable if every else moved) if choose(f"async.{op}", (False, True)))
        layout = shape.analysis.layout_alias[choose("pipelines", shape.layout_labels())]
        plans = [shape.plan(lo, mv) for lo in shape.layouts() for mv, _ in shape.move_choices()] if every else [shape.plan(layout, moved)]
        for plan in plans:
            if _one_depth(plan):
                depths = (choose("depth", c.depths),) * len(plan.varied)
            else:
                depths = tuple(choose(f"depth.{p}", c.depths) for p in plan.varied)
            stages: tuple[int, ...] = ()
            for choice in plan.stage_choices:
                by_label = {choice.label(o): o for o in choice.options}
                stages += by_label[choose(choice.name, tuple(by_label))]
            nregs = tuple(choose(*shape.nreg_decision(r, plan)) for r in plan.roles)
        return Point(params, roles, layout, depths, stages, nregs, moved, asynchronous)

    # --- static rules -------------------------------------------------------
    def _malformed(self, shape: SeedShape, point: Point) -> str | None:
        if point.roles not in shape.splits or point.layout not in shape.analysis.layouts or not set(point.moved) <= {m.op for m in shape.analysis.movable}:
            return f"point: unknown roles {point.roles!r}, pipelines {point.layout!r} or moved ops {point.moved} for this seed"
        if not set(point.asynchronous) <= set(shape.asyncable(point.moved)):
            return f"point: cp.async for {point.asynchronous}, where this seed and moves have gathers {shape.asyncable(point.moved)} only"
        plan = shape.plan(point.layout, point.moved)
        if (len(point.depths), len(point.stages), len(point.nregs)) != (len(plan.varied), len(plan.groups), len(plan.roles)):
            return "point: its depths, stages or budgets do not match its plan"
        return None

    def _depths_reason(self, shape: SeedShape, plan: Plan, depths: tuple[int, ...]) -> str | None:
        return self._trips_reason(shape, plan, depths) or self._smem_reason(shape, plan, depths)

    def _trips_reason(self, shape: SeedShape, plan: Plan, depths: tuple[int, ...]) -> str | None:
        """A pipeline deeper than the times its loop body runs in a block (and than the seed
        has it) holds versions that are never filled: the same kernel, more shared memory."""
        seed_depth = {b: p.depth for p in shape.seed.pipelines for b in p.buffers}
        for pipe, depth in zip(plan.pipelines, plan.depth_vector(depths)):
            scope = shape.analysis.scope_of(pipe.buffers[0])
            runs = shape.info.trips.get(scope or "")
            if runs is not None and depth > max(runs, *(seed_depth.get(b, 1) for b in pipe.buffers)):
                return f"depth: pipeline {pipe.name!r} is {depth} deep, but its loop body runs {runs}x per block"
        return None

    def _smem_reason(self, shape: SeedShape, plan: Plan, depths: tuple[int, ...]) -> str | None:
        depth_of = plan.depth_of(depths)
        depth = {b: depth_of[p.name] for p in plan.pipelines for b in p.buffers}
        sizes = {b: size * depth.get(b, 1) for b, size in shape.info.shared_bytes.items()}
        uses = self._shared_uses(shape, plan)
        total = shared_bytes(sizes, uses) + BARRIER_BYTES * sum(depth_of.values())
        if total > self.config.smem_limit:
            shares = "tiles over dead ones, as tilelang's planner packs them" if shared_order(uses) else "no buffer shares space: no order of the roles is safe for tilelang's planner"
            return f"smem: {kb_over(total, self.config.smem_limit)} per block ({shares})"
        return None

    def _shared_uses(self, shape: SeedShape, plan: Plan) -> dict[str, SharedUse]:
        """What each role of the plan does with shared memory (the same at every stage and
        depth: they move spans, not ops between roles)."""
        key = (id(shape), plan.layout, plan.moved)
        if key not in self._uses:
            schedule = shape.variants.schedule_for(plan, [1] * len(plan.varied), (), [Role(r, 0, 0) for r in plan.roles], 0)
            shared = frozenset(shape.info.shared_bytes)
            self._uses[key] = {} if isinstance(schedule, str) else shared_uses(schedule, shape.info.accesses, shared)
        return self._uses[key]

    def _order_reason(self, shape: SeedShape, plan: Plan, stages: tuple[int, ...]) -> str | None:
        bodies = shape.variants.bodies(plan, tuple(stages))
        return bodies if isinstance(bodies, str) else None

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
        reason = mma_reason(roles, shape.analysis.mma_tiles)
        if reason:
            return reason
        reason = self._check(dict(params), shape.seed.with_(num_warps=num_warps, roles=roles))
        return f"kernel: {reason}" if reason else None

    def _register_reason(self, shape: SeedShape, label: str, plan: Plan, nregs: tuple[int, ...]) -> str | None:
        key = (id(shape.analysis), label, plan.roles, plan.moved, nregs, shape.seed.num_warps if label == SEED else 0)
        if key not in self._register_reasons:
            roles, num_warps = shape.roles(label, plan, nregs)
            schedule = Schedule(num_warps, roles, ())
            analysis = shape.analysis
            # a fill that comes to a choice of the role's own (none, 240) is that choice's candidate
            dup = next((f"nreg: {r.name}'s fill comes to {r.max_nreg}, a choice of its own" for r, n in zip(roles, nregs)
                        if n == FILL and r.max_nreg in shape.nreg_decision(r.name, plan)[1]), None)  # fmt: skip
            self._register_reasons[key] = (dup or register_reason(schedule) or spill_reason(schedule, analysis.accumulator_words, analysis.mma_tiles)
                                           or gather_reason(schedule, shape.gatherers(plan)) or loop_reason(schedule, analysis.loop_elements(plan.moved))
                                           or thread_index_reason(schedule, analysis.thread_indexed(plan.moved), shape.seed))  # fmt: skip
        return self._register_reasons[key]
