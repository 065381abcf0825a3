"""A plain-Python mirror of TileLang's ``T.WSSchedule``.

The tuner enumerates, hashes, stores and prints schedules without touching
TVM objects: those need the kernel's buffers and a loaded compiler, and they
cannot be pickled across the process pool. ``compiler.py`` is the one place
that converts between this model and ``T.WSSchedule``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Union

ROOT_SCOPE = "tl.ws_scope_root"
WARPS_PER_GROUP = 4
THREADS_PER_WARP = 32


def whole_warpgroups(warps: int) -> int:
    """``warps`` rounded up to whole warpgroups (MaterializeWSSchedule counts a block's warps so)."""
    return -(-warps // WARPS_PER_GROUP) * WARPS_PER_GROUP


# WSSyncKind names, in TileLang's spelling; the value is the classmethod name.
SYNC_KINDS = {
    "PRODUCER_ACQUIRE": "producer_acquire",
    "PRODUCER_COMMIT": "producer_commit",
    "CONSUMER_WAIT": "consumer_wait",
    "CONSUMER_RELEASE": "consumer_release",
}
PRODUCER_SYNCS = ("PRODUCER_ACQUIRE", "PRODUCER_COMMIT")
CONSUMER_SYNCS = ("CONSUMER_WAIT", "CONSUMER_RELEASE")


@dataclass(frozen=True)
class Role:
    name: str
    warp_lo: int
    warp_hi: int
    max_nreg: int = 0

    @property
    def warps(self) -> int:
        return self.warp_hi - self.warp_lo

    def warpgroups(self) -> range:
        return range(self.warp_lo // WARPS_PER_GROUP, (self.warp_hi - 1) // WARPS_PER_GROUP + 1)


@dataclass(frozen=True)
class Pipeline:
    name: str
    buffers: tuple[str, ...]
    depth: int


@dataclass(frozen=True)
class Sync:
    kind: str  # a key of SYNC_KINDS
    pipeline: str
    stage: int = 0

    @property
    def is_producer(self) -> bool:
        return self.kind in PRODUCER_SYNCS


@dataclass(frozen=True)
class Mma:
    """One MMA call: the rows x columns of the tile it accumulates, tilelang's
    GemmWarpPolicy (0 square, 1 full row, 2 full column), the accumulator's name
    and its words (32-bit registers) and, where its A operand is read from
    registers, that fragment's name; ``bits`` per accumulator element."""

    rows: int
    cols: int
    policy: int = 0
    accumulator: str = ""
    operand: str | None = None
    words: int = 0
    bits: int = 32


@dataclass(frozen=True)
class OpAccess:
    """What one op (or loop) of the kernel reads and writes: allocated buffers
    by name, scalar variables it binds as "$name". ``issues_async``: it starts
    work that finishes later (an async MMA); ``retires_async``: it waits for
    such work of its role to finish. ``mmas``: the MMA calls in it (its role's
    warps must split their tiles). ``elements``: the iterations of an element-wise
    loop nest, which its role's threads share out. ``loop``: a sequential loop;
    ``steers``: the variables its bounds (a while loop: its condition) read.
    ``thread_index``: it reads the thread index (``T.get_thread_binding``), directly, by a
    scalar bound from it, or by its guard. ``tma_reduce``: a tile atomic by TMA
    (``use_tma``), which stays in the role that writes its shared tile. ``global_copies``: an
    element-wise loop that stores elements of global memory into shared memory as they are
    (or zero), which cp.async can issue (tilelang's InjectPTXAsyncCopy takes nothing else).
    ``conditions``: the ``if`` conditions it runs under, as the kernel writes them."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    issues_async: bool = False
    retires_async: bool = False
    mmas: tuple[Mma, ...] = ()
    elements: int = 0  # an element-wise (T.Parallel) loop nest: its iterations, where constant; else 0
    loop: bool = False  # a sequential loop (its accesses are its body's)
    steers: frozenset[str] = frozenset()  # a loop's: what its bounds or condition read, which every role that runs it must hold
    thread_index: bool = False  # MaterializeWSSchedule leaves it the block's, not renumbered for the role
    tma_reduce: bool = False  # a tile atomic by TMA: MaterializeWSSchedule fences its tile only in the writer's role
    global_copies: bool = False  # elements copied global -> shared as they are: what cp.async can issue
    conditions: frozenset[str] = frozenset()  # the ``if`` conditions it runs under, as written

    @property
    def touched(self) -> frozenset[str]:
        return self.reads | self.writes


Instr = Union[str, Sync]  # a plain string is an op or child-scope id


@dataclass(frozen=True)
class Scope:
    id: str
    bodies: tuple[tuple[str, tuple[Instr, ...]], ...]  # (role, instrs), in role order

    def body(self, role: str) -> tuple[Instr, ...]:
        return dict(self.bodies).get(role, ())


@dataclass(frozen=True)
class Schedule:
    num_warps: int
    roles: tuple[Role, ...]
    pipelines: tuple[Pipeline, ...]
    scopes: tuple[Scope, ...] = field(default_factory=tuple)
    # Element-wise loops (op ids) whose global-to-shared copies are issued by cp.async
    # (``T.Parallel(..., prefer_async=True)``): not part of T.WSSchedule, but how its
    # producer roles load what they cannot load by TMA (gathers).
    async_copies: tuple[str, ...] = ()

    @property
    def threads(self) -> int:
        return self.num_warps * THREADS_PER_WARP

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def pipeline(self, name: str) -> Pipeline:
        return next(p for p in self.pipelines if p.name == name)

    def producer_of(self, pipeline: str) -> str | None:
        return self._role_with(pipeline, producer=True)

    def consumer_of(self, pipeline: str) -> str | None:
        return self._role_with(pipeline, producer=False)

    def _role_with(self, pipeline: str, *, producer: bool) -> str | None:
        for scope in self.scopes:
            for role, body in scope.bodies:
                if any(isinstance(i, Sync) and i.pipeline == pipeline and i.is_producer == producer for i in body):
                    return role
        return None

    def consumer_stages(self, scope_id: str) -> dict[str, int]:
        """Buffer -> the software-pipeline stage at which consumers wait for it in one
        scope (what a kernel file's check() reads to keep its own ops' order valid)."""
        buffers = {p.name: p.buffers for p in self.pipelines}
        return {
            buf: instr.stage
            for scope in self.scopes if scope.id == scope_id
            for _, body in scope.bodies
            for instr in body if isinstance(instr, Sync) and instr.kind == "CONSUMER_WAIT"
            for buf in buffers.get(instr.pipeline, ())
        }  # fmt: skip

    def nreg_per_warpgroup(self) -> dict[int, int]:
        """setmaxnreg value of each warpgroup; idle warps adopt their group's value."""
        out: dict[int, int] = {}
        for role in self.roles:
            for wg in role.warpgroups():
                out[wg] = max(out.get(wg, 0), role.max_nreg)
        return out

    def with_(self, **changes: Any) -> "Schedule":
        return replace(self, **changes)

    # --- JSON ---------------------------------------------------------------
    def summary(self) -> str:
        """Roles (warps and budget) and pipelines (depth) in one short line."""
        roles = ",".join(f"{r.name}:{r.warp_lo}-{r.warp_hi}@{r.max_nreg}" for r in self.roles)
        pipes = ",".join(f"{p.name}x{p.depth}" for p in self.pipelines)
        copies = f" | cp.async:{','.join(self.async_copies)}" if self.async_copies else ""
        return f"{roles} | {pipes}{copies}"

    def to_json(self) -> dict[str, Any]:
        extra = {"async_copies": list(self.async_copies)} if self.async_copies else {}  # absent when empty: stored hashes stay
        return {
            **extra,
            "num_warps": self.num_warps,
            "roles": [[r.name, r.warp_lo, r.warp_hi, r.max_nreg] for r in self.roles],
            "pipelines": [[p.name, list(p.buffers), p.depth] for p in self.pipelines],
            "scopes": [
                [s.id, [[role, [_instr_to_json(i) for i in body]] for role, body in s.bodies]]
                for s in self.scopes
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Schedule":
        try:
            return cls(
                num_warps=int(data["num_warps"]),
                roles=tuple(Role(str(n), int(lo), int(hi), int(nreg)) for n, lo, hi, nreg in data["roles"]),
                pipelines=tuple(Pipeline(str(n), tuple(map(str, b)), int(d)) for n, b, d in data["pipelines"]),
                scopes=tuple(
                    Scope(str(sid), tuple((str(role), tuple(_instr_from_json(i) for i in body)) for role, body in bodies))
                    for sid, bodies in data["scopes"]
                ),
                async_copies=tuple(map(str, data.get("async_copies", ()))),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed schedule JSON: {exc}") from exc

    # --- TileLang source ----------------------------------------------------
    def to_source(self, buffer_expr: dict[str, str] | None = None, indent: str = "") -> str:
        """The schedule as ``T.annotate_ws_schedule(...)`` code to paste into the kernel
        (and, as comments, the loops to write with ``prefer_async=True``)."""
        buffer_expr = buffer_expr or {}
        i1, i2, i3, i4 = (indent + "    " * n for n in range(1, 5))
        lines = [f"{indent}# and write loop {op!r} as T.Parallel(..., prefer_async=True): its copies by cp.async" for op in self.async_copies]
        lines += [f"{indent}T.annotate_ws_schedule(", f"{i1}T.WSSchedule(", f"{i2}num_warps={self.num_warps},", f"{i2}roles=["]
        lines += [f"{i3}T.WSRole({r.name!r}, warps_lo={r.warp_lo}, warps_hi={r.warp_hi}, max_nreg={r.max_nreg})," for r in self.roles]
        lines += [f"{i2}],", f"{i2}pipelines=["]
        for p in self.pipelines:
            bufs = ", ".join(buffer_expr.get(b, b) for b in p.buffers)
            lines.append(f"{i3}T.WSPipeline({p.name!r}, [{bufs}], depth={p.depth}),")
        lines += [f"{i2}],", f"{i2}scopes=["]
        for s in self.scopes:
            sid = "T.WSScope.ROOT" if s.id == ROOT_SCOPE else repr(s.id)
            lines.append(f"{i3}T.WSScope({sid}, {{")
            for role, body in s.bodies:
                lines.append(f"{i4}{role!r}: [{', '.join(_instr_source(i) for i in body)}],")
            lines.append(f"{i3}}}),")
        lines += [f"{i2}],", f"{i1})", f"{indent})"]
        return "\n".join(lines)


def _instr_to_json(instr: Instr) -> Any:
    return instr if isinstance(instr, str) else [instr.kind, instr.pipeline, instr.stage]


def _instr_from_json(data: Any) -> Instr:
    if isinstance(data, str):
        return data
    kind, pipeline, stage = data
    if kind not in SYNC_KINDS:
        raise ValueError(f"unknown sync kind {kind!r}")
    return Sync(str(kind), str(pipeline), int(stage))


def _instr_source(instr: Instr) -> str:
    if isinstance(instr, str):
        return repr(instr)
    return f"T.WSSync.{SYNC_KINDS[instr.kind]}({instr.pipeline!r}, stage={instr.stage})"
