"""A tuning task: one kernel file at one problem, and what the stages need of it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from . import compiler
from .candidate import Candidate, Lowering, canonical_json
from .kernel import KernelFileError, KernelSpec, load_kernel
from .space import PointInfo, ScheduleSpace, SpaceConfig


_LOADED: dict[tuple[str, str, str], "Task"] = {}


@dataclass(frozen=True)
class Task:
    spec: KernelSpec
    problem: dict[str, Any]
    param_grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    space_config: SpaceConfig = field(default_factory=SpaceConfig)

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

    def primfunc(self, params: dict[str, Any]) -> Any:
        try:
            return self.spec.build(self.problem, params)
        except Exception as exc:  # noqa: BLE001 - user code
            raise compiler.CompilerError(f"{self.spec.name}.kernel({_fmt(params)}) failed: {compiler.one_line(exc)}") from exc

    def point_info(self, params: dict[str, Any]) -> PointInfo:
        func = self.primfunc(params)
        prepared, seed = compiler.prepare(func)
        return PointInfo(
            seed=seed,
            shared_bytes={b.name: b.bytes for b in compiler.shared_buffers(prepared)},
            op_buffers=compiler.op_buffers(prepared),
        )

    @functools.cached_property
    def _space(self) -> ScheduleSpace:
        return ScheduleSpace(
            param_grid=self.param_grid,
            point_info=self.point_info,
            check=lambda params, schedule: self.spec.check(self.problem, params, schedule),
            config=self.space_config,
        )

    def space(self) -> ScheduleSpace:
        """The schedule space of this task (built once: it caches the seeds it has derived)."""
        return self._space

    def lowered(self, candidate: Candidate) -> tuple[Any, dict[str, Any]]:
        """The PrimFunc (schedule attached) and pass configs that build the candidate."""
        func = self.primfunc(candidate.param_dict)
        return compiler.lower_for(func, candidate.lowering, candidate.schedule)

    def baselines(self, params: dict[str, Any]) -> list[Candidate]:
        """The kernel's seed schedule, tilelang's default lowering and role_based, at one point."""
        seed = self.space().seed_candidate(tuple(sorted(params.items())))
        out = [Candidate.make(params, None, Lowering.DEFAULT), Candidate.make(params, None, Lowering.ROLE_BASED)]
        return ([seed] if isinstance(seed, Candidate) else []) + out


def _fmt(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(params.items()))
