"""A tuning task: one kernel file at one problem, and what the stages need of it."""

from __future__ import annotations

import dataclasses
import difflib
import functools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import compiler
from .candidate import TILELANG_LOWERINGS, Candidate, Lowering, ParamsKey, canonical_json
from .kernel import KernelFileError, KernelSpec, load_kernel
from .sandbox import spawn_context
from .space import PointInfo, ScheduleSpace, SpaceConfig


_LOADED: dict[tuple[str, str, str], "Task"] = {}
PRIMFUNCS_KEPT = 64  # parameter points whose PrimFunc a task keeps


def params_key(params: dict[str, Any]) -> ParamsKey:
    """A parameter point as a hashable key (and as the space names its points)."""
    return tuple(sorted(params.items()))


@dataclass(frozen=True)
class Recorded:
    """The answers a kernel file's own code gave the schedule space (its seeds
    and its ``check``), computed in another process, so that a process that must
    not run that code (a service worker, for uploaded kernels) can still search."""

    infos: dict[ParamsKey, PointInfo | Exception]
    checks: dict[tuple[ParamsKey, str | None], str | None]
    vendors: tuple[str, ...] = ()

    def info(self, params: dict[str, Any]) -> PointInfo:
        found = self.infos[params_key(params)]
        if isinstance(found, Exception):
            raise found
        return found

    def check(self, params: dict[str, Any], schedule: Any) -> str | None:
        return self.checks[(params_key(params), canonical_json(schedule.to_json()) if schedule else None)]


@dataclass(frozen=True)
class Task:
    spec: KernelSpec
    problem: dict[str, Any]
    param_grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    space_config: SpaceConfig = field(default_factory=SpaceConfig)
    recorded: Recorded | None = None  # set by ``isolated``: the kernel file's code is not run here

    @classmethod
    def make(
        cls,
        spec: KernelSpec,
        problem: dict[str, Any],
        param_grid: dict[str, tuple[Any, ...]] | None = None,
        space_config: SpaceConfig | None = None,
    ) -> "Task":
        return cls(spec, problem, dict(param_grid or spec.params), space_config or SpaceConfig())

    @classmethod
    def load(cls, kernel_path: str, source_hash: str, problem: dict[str, Any]) -> "Task":
        """The task of a kernel file, loaded once per process (builder and runner workers).

        The file must still be the one the tuner hashed: a kernel edited while
        tuning would otherwise be measured under the old one's key.
        """
        key = (kernel_path, source_hash, canonical_json(problem))
        if key not in _LOADED:
            spec = load_kernel(kernel_path)
            if spec.source_hash != source_hash:
                raise KernelFileError(f"{kernel_path} changed while tuning; start again")
            _LOADED[key] = cls.make(spec, problem)
        return _LOADED[key]

    @classmethod
    def isolated(cls, kernel_path: str, problem: dict[str, Any] | str, params: str | None = None, space_config: SpaceConfig | None = None) -> "Task":
        """The task, with every call into the kernel file made in a spawned
        process (with a clean environment: sandbox.py): importing it, parsing
        the problem, its seeds and its checks."""
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn_context()) as pool:
            return pool.submit(_record, kernel_path, problem, params, space_config).result()

    def pinned(self) -> dict[str, tuple[Any, ...]]:
        """The kernel parameters this task narrows from the kernel file's grid (``--param``)."""
        return {k: v for k, v in self.param_grid.items() if tuple(v) != tuple(self.spec.params.get(k, ()))}

    def holds(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` lies in this task's kernel-parameter grid: a tuning pinned
        with ``--param`` shares its workload's store with runs of the whole grid, whose
        other points are not its results."""
        return all(value in self.param_grid[name] for name, value in candidate.param_dict.items() if name in self.param_grid)

    def primfunc(self, params: dict[str, Any]) -> Any:
        """The kernel file's PrimFunc at a parameter point, kept (least recently used
        out): building it runs the kernel's Python through tilelang's parser (about a
        second for the attention example), and every candidate at the point starts
        from it. TVM IR is immutable: attaching a schedule makes a new function."""
        return self._built(params_key(params))

    @functools.cached_property
    def _built(self) -> Callable[[ParamsKey], Any]:
        @functools.lru_cache(maxsize=PRIMFUNCS_KEPT)  # per task: a failed build is not kept, and raises again
        def build(key: ParamsKey) -> Any:
            try:
                func = self.spec.build(self.problem, dict(key))
            except Exception as exc:  # noqa: BLE001 - user code
                raise compiler.CompilerError(f"{self.spec.name}.kernel({_fmt(dict(key))}) failed: {compiler.one_line(exc)}") from exc
            unwritten = compiler.unwritten_params(func, self.spec.outputs)
            if unwritten:
                raise KernelFileError(f"{self.spec.path.name}: OUTPUTS {list(self.spec.outputs)} names {', '.join(unwritten)}, which the kernel never writes")
            mismatch = compiler.argument_mismatch(func, self._meta_inputs) if self._meta_inputs is not None else None
            if mismatch:
                raise KernelFileError(f"{self.spec.path.name}: {mismatch} (at {self.spec.name}.kernel({_fmt(dict(key))}))")
            return func

        return build

    @functools.cached_property
    def _meta_inputs(self) -> list[Any] | None:
        """The kernel file's ``inputs`` made on torch's meta device (shapes and dtypes, no
        memory), to hold against the kernel's arguments; None where its code needs real
        values (lengths it reads back, a sort on the CPU) or there is no torch."""
        try:
            return self.spec.inputs(self.problem, "meta")
        except Exception:  # noqa: BLE001 - user code: the GPU run checks what this cannot
            return None

    def point_info(self, params: dict[str, Any]) -> PointInfo:
        if self.recorded is not None:
            return self.recorded.info(params)
        func = self.primfunc(params)
        plain = compiler.strip(func)
        rewritten = bool(compiler.rewrites(plain)[1])
        plain_program = compiler.scheduled_program(plain)[0]
        try:
            prepared, seed = compiler.prepare(func)
        except compiler.NoSeed as exc:  # still a kernel: its baselines are measured
            return PointInfo(seed=None, shared_bytes={}, accesses={}, no_seed=str(exc), rewritten=rewritten, plain_program=plain_program)
        program, schedule_sets = compiler.scheduled_program(prepared)
        return PointInfo(
            seed=seed,
            shared_bytes={b.name: b.bytes for b in compiler.shared_buffers(prepared)},
            accesses=compiler.op_accesses(prepared),
            buffer_kinds=compiler.buffer_kinds(prepared),
            rewritten=rewritten,
            trips=compiler.loop_trips(prepared),
            program=program,
            plain_program=plain_program,
            schedule_sets=schedule_sets,
            budgets=compiler.sets_max_nreg(prepared),
            orders_pipeline=compiler.orders_its_pipeline(func),
        )

    @functools.cached_property
    def _space(self) -> ScheduleSpace:
        return ScheduleSpace(
            param_grid=self.param_grid,
            point_info=self.point_info,
            check=self.check,
            config=self.space_config,
            check_candidates=self.recorded is None,
        )

    def check(self, params: dict[str, Any], schedule: Any) -> str | None:
        if self.recorded is not None:
            return self.recorded.check(params, schedule)
        reason = self.spec.check(self.problem, params, schedule)
        if reason or schedule is not None:
            return reason
        try:  # a point whose grid CUDA cannot launch: refused as the kernel's check() would
            return compiler.grid_reason(self.primfunc(params))
        except (compiler.CompilerError, KernelFileError):  # said where the point is built
            return None

    def space(self) -> ScheduleSpace:
        """The schedule space of this task (built once: it caches the seeds it has derived)."""
        return self._space

    def describe(self, candidate: Candidate) -> str:
        """``candidate.describe()``, with the parameters its schedule replaces shown so."""
        scheduled = self._space.set_by_schedule(candidate.params) if candidate.schedule is not None else ()
        return candidate.describe(scheduled)

    def lowered(self, candidate: Candidate) -> tuple[Any, dict[str, Any]]:
        """The PrimFunc (schedule attached) and pass configs that build the candidate: the
        kernel file's own, and what the lowering sets."""
        func, configs = compiler.lower_for(self.primfunc(candidate.param_dict), candidate.lowering, candidate.schedule)
        return func, {**self.spec.pass_configs, **configs}

    def source(self, candidate: Candidate) -> str | None:
        """What to write to build the candidate without ws-tune: its schedule as TileLang
        code. The ``rewritten`` lowering has none: what ws-tune changed in the kernel, as a
        diff of its TVMScript at the candidate's parameters (the kernel file's Python is
        edited the same way; tilelang's default lowering then builds it). None for
        tilelang's own lowerings and the reference: the kernel file as it is."""
        if candidate.schedule is not None:
            return candidate.schedule.to_source()
        if candidate.lowering is not Lowering.REWRITTEN:
            return None
        func = compiler.strip(self.primfunc(candidate.param_dict))
        new, changes = compiler.rewrites(func)
        diff = difflib.unified_diff(func.script().splitlines(), new.script().splitlines(), "as written", "as ws-tune rewrote it", n=1, lineterm="")
        listed = "".join(f"#   - {what}\n" for what in changes)
        return f"# tilelang's default lowering of the kernel with ws-tune's changes, at {_fmt(candidate.param_dict)}:\n{listed}" + "\n".join(diff)

    def anchors(self, points: list[tuple[tuple[str, Any], ...]]) -> list[Candidate]:
        """Anchor choices, best first: the seed schedule (a kernel of the same family and
        cost as the candidates) at the first point where the static rules keep it, else at
        the first point that has one (a seed that spills or overflows shared memory may still
        run), else the reference."""
        space = self.space()
        first = next((c for c in map(space.seed_candidate, points) if isinstance(c, Candidate)), None)
        kept = next((c for p in points if not isinstance(point := space.seed_point(p), str) and isinstance(c := space.candidate(point), Candidate)), None)
        return list(dict.fromkeys(c for c in (kept, first) if c is not None)) + [Candidate.make({}, None, Lowering.REFERENCE)]

    def vendor_baselines(self) -> list[Candidate]:
        """The vendor libraries to time (the kernel file's ``vendors``), else its reference."""
        names = self.recorded.vendors if self.recorded is not None else self.spec.vendor_names(self.problem)
        return [Candidate.make({"vendor": n}, None, Lowering.REFERENCE) for n in names] or [Candidate.make({}, None, Lowering.REFERENCE)]

    def lowering_starts(self, points: Iterable[ParamsKey], *, default_wrong: frozenset[ParamsKey] = frozenset()) -> list[Candidate]:
        """The schedule shaped as tilelang's default warp specialization
        (``ScheduleSpace.lowering_candidates``), where the space holds it, and tilelang's
        default lowering of the kernel as ws-tune rewrites it, where that differs from the
        kernel as written: measured after the seed's baselines, as warm starts, so that a
        search seeded by role_based's guess starts no worse than those lowerings.

        ``points`` come fastest first (``pipeline.start_points``): the first that has a
        start gets every layout, packing and move; the others every layout and packing
        with nothing moved. The moves multiply the starts (chunked linear attention: 4
        structures, 12 starts a point) and pay where the seed runs best (H200 runs 33-35: the best start
        was at the seed's fastest point or, where elsewhere, a structure without moves).
        The rewritten kernel is not tried at ``default_wrong``, the points where tilelang's
        default lowering of the kernel as written was WRONG: it goes through the same
        pipeline planner (Gated DeltaNet's backward past 0 stages, H200 run 36: both WRONG)."""
        space, out, lead = self.space(), [], True
        for params in points:
            starts = space.lowering_candidates(params, moving=lead)
            lead = lead and not starts
            out += starts
            if not self.spec.needs_schedule(dict(params)) and params not in default_wrong and self._rewritten(params):
                out.append(Candidate.make(dict(params), None, Lowering.REWRITTEN))
        return list({c.hash: c for c in out}.values())  # points that share a seed may share a start

    def _rewritten(self, params: ParamsKey) -> bool:
        try:
            return self.point_info(dict(params)).rewritten
        except compiler.CompilerError:  # the kernel does not build here: nothing to rewrite
            return False

    def seed_points(self, points: Iterable[ParamsKey]) -> dict[ParamsKey, str]:
        """Each point's seed schedule (its candidate's hash), where the space has one.
        Points that differ only in a kernel parameter the schedule overrides (a thread
        count) share one seed, yet not their lowering starts."""
        space = self.space()
        return {p: c.hash for p in points if isinstance(c := space.seed_candidate(p), Candidate)}

    def measured_points(self, *, timed: bool) -> list[ParamsKey]:
        """Where the baselines are measured, and the lowering starts chosen from
        (``pipeline.start_points``): every point the kernel serves, or, compile-only (that
        they build is all it shows), the first with a seed schedule and the file's first
        (NSA's backward has no seed at its first, 32 threads, and its seed went unbuilt; the
        wgmma backward lists its unseeded async form first, and that went unbuilt)."""
        space = self.space()
        points = space.served_points()
        if timed or not points:
            return points
        seeded = next((p for p in points if isinstance(space.seed_candidate(p), Candidate)), points[0])
        return list(dict.fromkeys((seeded, points[0])))

    def baselines_at(self, points: Iterable[ParamsKey], *, timed: bool) -> list[Candidate]:
        """``baselines`` at each point, the seed schedules first (the lowering starts wait
        for them: pipeline.start_points), then the vendors (timed only: they do not compile)."""
        out = [c for params in points for c in self.baselines(dict(params))]
        return sorted(out, key=lambda c: c.lowering is not Lowering.WS) + (self.vendor_baselines() if timed else [])

    def baselines(self, params: dict[str, Any]) -> list[Candidate]:
        """The kernel's seed schedule, tilelang's default lowering, the same without warp
        specialization, and role_based, at one point (tilelang's own lowerings only where the
        kernel is right in any order)."""
        seed = self.space().seed_candidate(params_key(params))
        lowerings = () if self.spec.needs_schedule(params) else TILELANG_LOWERINGS
        out = [Candidate.make(params, None, lowering) for lowering in lowerings]
        return ([seed] if isinstance(seed, Candidate) else []) + out


def _record(kernel_path: str, problem: dict[str, Any] | str, params: str | None, space_config: SpaceConfig | None) -> Task:
    """In the spawned process: load the kernel file and ask it everything the space will ask."""
    spec = load_kernel(kernel_path)
    task = Task.make(spec, spec.parse_problem(problem), spec.parse_params(params), space_config)
    infos: dict[ParamsKey, PointInfo | Exception] = {}
    checks: dict[tuple[ParamsKey, str | None], str | None] = {}

    def info(params: dict[str, Any]) -> PointInfo:
        key = params_key(params)
        try:
            infos[key] = task.point_info(params)
        except Exception as exc:  # noqa: BLE001 - recorded, raised again where it is looked up
            infos[key] = compiler.CompilerError(str(exc))
            raise
        return infos[key]  # type: ignore[return-value]

    def check(params: dict[str, Any], schedule: Any) -> str | None:
        key = (params_key(params), canonical_json(schedule.to_json()) if schedule else None)
        checks[key] = task.check(params, schedule)
        return checks[key]

    space = ScheduleSpace(param_grid=task.param_grid, point_info=info, check=check, config=task.space_config)
    for point in space.param_points():
        try:
            shape = space.shape(point)
        except compiler.CompilerError:
            continue
        if not isinstance(shape, str):
            for split in space.splits(shape):
                space.split_reason(point, shape, split)
    recorded = Recorded(infos, checks, tuple(spec.vendor_names(task.problem)))
    return dataclasses.replace(task, spec=dataclasses.replace(spec, module=None), recorded=recorded)


def _fmt(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(params.items()))
