"""The compiler, behind one module: every use of tilelang and its TVM is here.

It converts between ``schedule.Schedule`` and ``T.WSSchedule``, derives the
seed schedule of a kernel (its own annotation, or tilelang's role_based
scheduler for a plain kernel), attaches a candidate's schedule, verifies it
with MaterializeWSSchedule, and compiles.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import functools
import hashlib
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import tilelang
import tilelang.language as T
import tvm_ffi
from tilelang import tvm
from tvm.tirx import stmt_functor

from .candidate import Lowering
from . import rules
from .schedule import SYNC_KINDS, THREADS_PER_WARP, WARPS_PER_GROUP, Mma, OpAccess, Pipeline, Role, Schedule, Scope, Sync, whole_warpgroups

# tilelang logs every compile at INFO; a tuner compiles thousands.
logging.getLogger("tilelang").setLevel(logging.WARNING)
# Its parser logs a kernel function it cannot build with the whole generated source (80-odd
# lines on stdout) before it raises; the raise is reported, in one line.
logging.getLogger("tilelang.language.eager.builder").setLevel(logging.CRITICAL + 1)


def _keep_ctrl_c() -> None:
    """A Ctrl-C must reach Python as KeyboardInterrupt, wherever TVM is when it lands.

    TVM's analyzer falls back to Z3, and every Z3 solver check installs its own
    SIGINT handler for its duration: a Ctrl-C landing then only cancels that one
    check (a tuning ran on to its end), and Z3's handler takes a lock that the
    interrupted thread may hold (the process hangs). Z3's global ``ctrl_c=false``
    turns that handler off; it must reach the copy of libz3 TVM loaded, found in
    this process's maps. And tvm-ffi re-raises an error from a Python callback by
    its type's registered name: KeyboardInterrupt is not registered, so one raised
    in a callback (``post_order_visit`` below, tilelang's own) came back as a
    RuntimeError and read as a rejected schedule.
    """
    tvm_ffi.register_error("KeyboardInterrupt", KeyboardInterrupt)
    with open("/proc/self/maps") as maps:
        loaded = {path for path in (line.split()[-1] for line in maps) if os.path.basename(path).startswith("libz3.so")}
    for path in loaded:
        ctypes.CDLL(path).Z3_global_param_set(b"ctrl_c", b"false")


_keep_ctrl_c()

ARCH = "sm_90a"
WS_ANNOTATION = "tl.ws_schedule"
ROLE_BASED_CONFIG = {"tl.enable_auto_warp_specialization": "role_based"}
NO_WS_CONFIG = {"tl.disable_warp_specialized": True}
# What ws-tune sets per lowering, so a kernel file's PASS_CONFIGS may not.
LOWERING_CONFIGS = frozenset(ROLE_BASED_CONFIG) | frozenset(NO_WS_CONFIG)
# The scheduler of TileLang's own CUDA pipeline names its block this.
ROOT_BLOCK = "tilelang_root"


class CompilerError(Exception):
    """A kernel or schedule the compiler refused; the message is one line."""


# role_based seeds no kernel that leaves MMAs in flight; a seed written for it is varied
IN_FLIGHT_NEEDS_SEED = ("a kernel that leaves MMAs in flight (T.wgmma_gemm, T.wait_wgmma) needs a seed schedule of its own, "
                        "T.annotate_ws_schedule (examples/attention.py and examples/gemm.py, mma=async)")


class NoSeed(CompilerError):
    """A plain kernel that tilelang's role_based scheduler does not specialize: no
    seed schedule, so nothing to vary (tilelang's own lowerings may still build it)."""


class ScheduleRejected(CompilerError):
    """MaterializeWSSchedule's verifier refused the schedule."""


@dataclass(frozen=True)
class SharedBuffer:
    name: str
    bytes: int  # one version


@functools.cache
def target() -> Any:
    # 0.1.15 rejects the string "cuda -arch=sm_90a"; the dict form works.
    return tvm.target.Target({"kind": "cuda", "arch": ARCH})


# --- TVM <-> plain schedule -------------------------------------------------


def schedule_from_tvm(ws: Any) -> Schedule:
    def instr(i: Any) -> str | Sync:
        if isinstance(i, T.WSOpRef):
            return str(i.id)
        return Sync(str(i.kind).rsplit(".", 1)[-1], str(i.pipeline), int(i.stage))

    return Schedule(
        num_warps=int(ws.num_warps),
        roles=tuple(Role(str(r.name), int(r.warp_lo), int(r.warp_hi), int(r.max_nreg)) for r in ws.roles),
        pipelines=tuple(Pipeline(str(p.name), tuple(str(b.name) for b in p.buffers), int(p.depth)) for p in ws.pipelines),
        scopes=tuple(
            Scope(str(s.id), tuple((str(role), tuple(instr(i) for i in body)) for role, body in s.bodies.items()))
            for s in ws.scopes
        ),
    )


def schedule_to_tvm(schedule: Schedule, buffers: dict[str, Any]) -> Any:
    def instr(i: str | Sync) -> Any:
        return i if isinstance(i, str) else getattr(T.WSSync, SYNC_KINDS[i.kind])(i.pipeline, stage=i.stage)

    missing = [b for p in schedule.pipelines for b in p.buffers if b not in buffers]
    if missing:
        raise CompilerError(f"schedule names buffers the kernel does not allocate: {', '.join(sorted(set(missing)))}")
    if schedule.num_warps <= 0 or schedule.num_warps % 4:
        raise CompilerError(f"num_warps must be a positive multiple of 4, got {schedule.num_warps}")
    return T.WSSchedule(
        num_warps=schedule.num_warps,
        roles=[T.WSRole(r.name, warps_lo=r.warp_lo, warps_hi=r.warp_hi, max_nreg=r.max_nreg) for r in schedule.roles],
        pipelines=[T.WSPipeline(p.name, [buffers[b] for b in p.buffers], depth=p.depth) for p in schedule.pipelines],
        scopes=[T.WSScope(s.id, {role: [instr(i) for i in body] for role, body in s.bodies}) for s in schedule.scopes],
    )


# --- PrimFunc surgery -------------------------------------------------------


def unwritten_params(func: Any, indices: tuple[int, ...]) -> list[str]:
    """The parameters among ``indices`` that the kernel never writes: no store, no tile
    op region it writes, no call (an atomic, a raw pointer) that is handed them. An output
    is filled with NaN before each correctness check, so one the kernel only reads (a
    kernel file's OUTPUTS naming an input) makes every lowering WRONG."""
    buffers = [func.buffer_map[p] for p in func.params if p in func.buffer_map]
    written: set[Any] = set()

    def visit(node: Any) -> None:
        name = getattr(getattr(node, "op", None), "name", "")
        if isinstance(node, tvm.tirx.BufferStore):
            written.add(node.buffer.data)
        elif name == "tl.region":
            if int(node.args[1]) & 2:
                written.add(node.args[0].buffer.data)
        elif isinstance(node, tvm.tirx.Call) and (not name.startswith("tirx.") or name in _HANDS_OVER):
            for arg in node.args:
                if isinstance(arg, tvm.ir.PrimExpr) and not _is_region(arg):
                    written.update(_referenced_vars(tvm.tirx.Evaluate(arg)))

    stmt_functor.post_order_visit(func.body, visit)
    return [str(buffers[i].name) for i in indices if -len(buffers) <= i < len(buffers) and buffers[i].data not in written]


# CUDA's largest grid: blockIdx.x to 2^31 - 1, y and z to 65535 each
GRID_LIMITS = {"blockIdx.x": 2**31 - 1, "blockIdx.y": 65535, "blockIdx.z": 65535}


def grid_reason(func: Any) -> str | None:
    """Why the kernel's grid cannot launch (an extent over CUDA's limit), or None: no
    lowering of it runs, so its point has nothing to build."""
    over: list[str] = []

    def visit(node: Any) -> None:
        tag, extent = None, None
        if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == "thread_extent":
            tag, extent = node.node.thread_tag, node.value
        elif isinstance(node, tvm.tirx.For) and node.kind == tvm.tirx.ForKind.THREAD_BINDING:
            tag, extent = node.thread_binding.thread_tag, node.extent
        if tag in GRID_LIMITS and isinstance(extent, tvm.tirx.IntImm) and int(extent) > GRID_LIMITS[tag]:
            over.append(f"{tag} extent {int(extent)} is over CUDA's limit of {GRID_LIMITS[tag]}")

    stmt_functor.post_order_visit(func.body, visit)
    return f"the grid cannot launch: {'; '.join(over)}" if over else None


# dtypes named alike by torch and TVM; others (fp8, packed fp4) are compared by their bits
_SAME_NAMES = frozenset({"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"})


def argument_mismatch(func: Any, args: list[Any]) -> str | None:
    """Why the kernel cannot take ``args`` (a kernel file's ``inputs``, made on torch's meta
    device): their count, or a tensor's rank, static sizes or dtype against its buffer's;
    None where they fit. Caught here, it is one line before anything is built, not a
    launch error of every candidate on the GPU."""
    params = list(func.params)
    if len(args) != len(params):
        names = [str(func.buffer_map[p].name) if p in func.buffer_map else str(p) for p in params]
        return f"inputs() gives {len(args)} arguments, the kernel takes {len(params)} ({', '.join(names)})"
    for i, (param, arg) in enumerate(zip(params, args)):
        buf = func.buffer_map.get(param)
        if buf is None:  # a scalar argument (an int32 length): a Python number
            if getattr(arg, "ndim", 0):
                return f"inputs()[{i}] is a tensor of shape {list(arg.shape)}, the kernel's {param} a scalar {param.dtype}"
            continue
        sizes = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in buf.shape]
        wanted = f"the kernel's {buf.name} is {buf.dtype} {['?' if d is None else d for d in sizes]}"
        if not hasattr(arg, "shape") or not hasattr(arg, "dtype"):
            return f"inputs()[{i}] is a {type(arg).__name__}, {wanted}"
        dtype, bits = str(arg.dtype).removeprefix("torch."), arg.element_size() * 8
        have = tvm.DataType(str(buf.dtype))
        wrong_type = dtype != str(buf.dtype) if dtype in _SAME_NAMES and str(buf.dtype) in _SAME_NAMES else bits != have.bits * have.lanes
        wrong_shape = len(arg.shape) != len(sizes) or any(d is not None and d != n for d, n in zip(sizes, arg.shape))
        if wrong_type or wrong_shape:
            return f"inputs()[{i}] is {dtype} {list(arg.shape)}, {wanted}"
    return None


# TVM's own calls are arithmetic (exp2, max, ...) but for these, which hand what they are
# given to code that may write it; tilelang's (atomics, tile ops) may write theirs.
_HANDS_OVER = frozenset({"tirx.address_of", "tirx.tvm_access_ptr", "tirx.call_extern", "tirx.call_intrin", "tirx.call_packed"})


def _is_region(expr: Any) -> bool:
    return getattr(getattr(expr, "op", None), "name", "") == "tl.region"


def _annotated_block(func: Any) -> Any | None:
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, tvm.tirx.SBlock) and (WS_ANNOTATION in node.annotations or node.name_hint == ROOT_BLOCK):
            found.append(node)

    stmt_functor.post_order_visit(func.body, visit)
    with_ws = [b for b in found if WS_ANNOTATION in b.annotations]
    return (with_ws or found or [None])[0]


def _set_annotation(func: Any, value: Any | None) -> Any:
    """Replace (or, with None, remove) the WSSchedule annotation of the kernel's block."""
    target_block = _annotated_block(func)
    if target_block is None:
        raise CompilerError("kernel has no tilelang_root block to attach a schedule to (is it a T.Kernel?)")

    ann = {k: v for k, v in target_block.annotations.items() if k != WS_ANNOTATION}
    if value is not None:
        ann[WS_ANNOTATION] = value
    return _with_block(func, target_block, annotations=ann)


def _block_with(block: Any, **fields: Any) -> Any:
    """``block`` with some of its fields replaced (TVM nodes are immutable)."""
    names = ("iter_vars", "reads", "writes", "name_hint", "body", "init", "alloc_buffers", "match_buffers", "annotations")
    return tvm.tirx.SBlock(**{name: fields.get(name, getattr(block, name)) for name in names})


def _with_block(func: Any, block: Any, **fields: Any) -> Any:
    """``func`` with ``block``, one of its blocks, given some fields anew (``_block_with``)."""
    replaced = _block_with(block, **fields)
    return func.with_body(stmt_functor.ir_transform(func.body, None, lambda s: replaced if s.same_as(block) else None, ["tirx.SBlock"]))


def _writes_whole(region: Any, buf: Any) -> bool:
    """Whether a tile op's region argument writes all of ``buf``, a buffer of static shape."""
    return int(region.args[1]) == 2 and _covers(region, buf)


def _covers(region: Any, buf: Any) -> bool:
    """Whether a tile op's region argument spans all of ``buf``, a buffer of static shape."""
    shape = [getattr(d, "value", None) for d in buf.shape]
    return (
        None not in shape and all(isinstance(i, tvm.tirx.IntImm) and i.value == 0 for i in region.args[0].indices)
        and [getattr(e, "value", None) for e in region.args[2:]] == shape
    )  # fmt: skip


def own_schedule(func: Any) -> Schedule | None:
    block = _annotated_block(func)
    if block is None or WS_ANNOTATION not in block.annotations:
        return None
    return schedule_from_tvm(block.annotations[WS_ANNOTATION])


def strip(func: Any) -> Any:
    return _set_annotation(func, None) if own_schedule(func) else func


def shared_buffers(func: Any) -> list[SharedBuffer]:
    """Shared-memory buffers the kernel uses, one version each (for static pruning).

    Allocations nothing references are left out: tilelang drops them too.
    """
    block = _annotated_block(func)
    if block is None:
        return []
    used = _referenced_vars(block.body)
    out = []
    for buf in block.alloc_buffers:
        scope = buf.scope()
        if scope.startswith("shared") and "barrier" not in scope and buf.data in used:
            elems = 1
            for dim in buf.shape:
                elems *= int(dim)
            out.append(SharedBuffer(str(buf.name), elems * tvm.DataType(buf.dtype).bits // 8))
    return out


def buffer_kinds(func: Any) -> dict[str, str]:
    """Block-allocated buffer -> "shared", "fragment", "local" or its raw storage scope."""
    block = _annotated_block(func)
    if block is None:
        return {}
    kinds = {"shared.dyn": "shared", "shared": "shared", "local.fragment": "fragment", "local": "local", "local.var": "local"}
    return {str(b.name): kinds.get(b.scope(), b.scope()) for b in block.alloc_buffers}


# What a schedule decides instead of the kernel: a pipelined loop's depth (num_stages, none
# at 0) and the block's threads. Kernel parameters that set only these build the same
# warp-specialized kernels (tests/engine/test_space.py checks the generated code).
_SCHEDULE_SETS = re.compile(r'"num_stages": (\d+)(, )?|"tl\.launch_threads": \[(\d+)|launch_thread\("threadIdx\.x", (\d+)\)')


def scheduled_program(prepared: Any) -> tuple[str, frozenset[int]]:
    """A digest of the kernel as a schedule lowers it (op ids included; its own schedule, a
    loop's num_stages and the block's threads left out), and the values those two took."""
    text = strip(prepared).script()
    # 0 too: a loop at num_stages=0 carries no annotation
    values = frozenset({0} | {int(v) for m in _SCHEDULE_SETS.finditer(text) for v in m.groups() if v and v.isdigit()})
    bare = _SCHEDULE_SETS.sub(lambda m: "" if m.group(1) else m.group(0).replace(m.group(3) or m.group(4), "_"), text)
    bare = bare.replace(", annotations={})", ")")
    return hashlib.sha256(bare.encode()).hexdigest()[:24], values


def loop_trips(func: Any) -> dict[str, int]:
    """Loop op id -> how many times its body runs in one block: its trip count times those
    of the loops around it (a persistent kernel's tile loop), where all are constants."""
    # Not the grid's loops (a block runs one blockIdx); a while loop (a persistent kernel's
    # tile scheduler) runs an unknown count.
    loops: list[Any] = []
    stmt_functor.post_order_visit(func.body, lambda n: loops.append(n) if isinstance(n, tvm.tirx.While) or (isinstance(n, tvm.tirx.For) and n.kind != tvm.tirx.ForKind.THREAD_BINDING) else None)
    inner: dict[Any, set[Any]] = {}
    for loop in loops:
        found: set[Any] = set()
        stmt_functor.post_order_visit(loop.body, lambda n: found.add(n) if isinstance(n, tvm.tirx.For) else None)
        inner[loop] = found
    trips: dict[str, int] = {}
    for loop in loops:
        op = _op_of(loop)
        around = [outer for outer in loops if loop in inner[outer]] + [loop]
        if op is not None and all(isinstance(getattr(o, "extent", None), tvm.tirx.IntImm) for o in around):
            trips[op[0]] = math.prod(int(o.extent.value) for o in around)
    return trips


# The MMA tile ops and their argument slots: (A region, C region, first of M, N, K,
# policy). A sparse gemm's regions are A, E (its metadata), B, C, then three transposes.
MMA_SLOTS = {
    "tl.tileop.gemm": (0, 2, 5),
    "tl.tileop.wgmma_gemm": (0, 2, 5),
    "tl.tileop.gemm_sp": (0, 3, 7),
    "tl.tileop.wgmma_gemm_sp": (0, 3, 7),
}
# Hopper MMAs return before they finish (T.gemm and T.gemm_sp only with wg_wait != 0), and
# the ops that retire them.
ASYNC_ISSUE_OPS = frozenset(MMA_SLOTS)
SYNC_UNLESS_WAIT = frozenset({"tl.tileop.gemm", "tl.tileop.gemm_sp"})
ASYNC_RETIRE_OPS = frozenset({"tl.wait_wgmma"})


def op_accesses(func: Any) -> dict[str, OpAccess]:
    """Op id (loops included) -> what it reads and writes, and its async role.

    Buffers are the block-allocated ones, by name; scalar variables that ops
    bind (``bm = tiles.m_idx``) are "$name", so that a use stays after its
    definition. A tile op's region says read, write or both; a raw pointer
    (``access_ptr``) counts as both. The schedule space keeps these
    dependences when it moves spans, and uses them to regroup pipelines.
    """
    block = _annotated_block(func)
    if block is None:
        return {}
    allocated = {b.data: str(b.name) for b in block.alloc_buffers}
    bound: dict[Any, str] = {}
    named: Counter = Counter()

    def bind(node: Any) -> None:
        if isinstance(node, tvm.tirx.Bind) and node.var not in bound:  # two ``idx = ...`` are two variables: $idx, $idx.1
            name = "$" + str(node.var.name)
            bound[node.var] = f"{name}.{named[name]}" if named[name] else name
            named[name] += 1

    stmt_functor.post_order_visit(block.body, bind)
    # An op inside an ``if`` runs under its condition: the schedule places the guard with
    # the op, so the op reads what the condition reads (a scalar that an op of the loop
    # binds, ``i_s = BlockIndices[...]``, must then sit at the op's stage).
    # So does one under a condition on the thread index (MaterializeWSSchedule leaves it the
    # block's: see rules.thread_index_reason).
    guards: dict[str, set[str]] = {}
    conditions: dict[str, set[str]] = {}

    def guard(node: Any) -> None:
        if isinstance(node, tvm.tirx.IfThenElse):
            reads = _access(tvm.tirx.Evaluate(node.condition), allocated, bound).reads
            for op_id in _guarded_ops(node):
                guards.setdefault(op_id, set()).update(reads)
                conditions.setdefault(op_id, set()).add(str(node.condition))

    stmt_functor.post_order_visit(block.body, guard)
    by_thread = _thread_dependent(func)
    by_thread_guard = _thread_guarded(func, by_thread)
    out: dict[str, OpAccess] = {}

    def visit(node: Any) -> None:
        found = _op_of(node)
        if found is not None:
            op_id, body = found
            acc = _access(body, allocated, bound)
            loop = isinstance(body, tvm.tirx.While) or (isinstance(body, tvm.tirx.For) and body.kind == tvm.tirx.ForKind.SERIAL)
            bounds = ([body.condition] if isinstance(body, tvm.tirx.While) else [body.min, body.extent]) if loop else []
            steers = frozenset().union(*(_access(tvm.tirx.Evaluate(e), allocated, bound).reads for e in bounds))
            thread_index = bool(_referenced_vars(body) & by_thread) or op_id in by_thread_guard
            out[op_id] = replace(acc, reads=acc.reads | guards.get(op_id, set()), loop=loop, steers=steers, thread_index=thread_index,
                                 conditions=frozenset(conditions.get(op_id, ())))

    stmt_functor.post_order_visit(block.body, visit)
    # A variable that an op binds for itself alone (``idx = Indices[i]`` inside a gather's
    # loop) is no dependence: without it, the gather can move to a producer role.
    read = {v for acc in out.values() for v in acc.reads}
    return {op_id: replace(acc, writes=frozenset(v for v in acc.writes if not v.startswith("$") or v in read)) for op_id, acc in out.items()}


def _guarded_ops(node: Any) -> set[str]:
    """The op ids under an ``if``, in either branch."""
    return _op_ids(node.then_case) | (_op_ids(node.else_case) if node.else_case is not None else set())


def _thread_guarded(func: Any, by_thread: set[Any] | None = None) -> set[str]:
    """The op ids (loops included) under a condition on the thread index (``by_thread``:
    ``_thread_dependent(func)``, where the caller has it)."""
    by_thread = _thread_dependent(func) if by_thread is None else by_thread
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, tvm.tirx.IfThenElse) and _referenced_vars(tvm.tirx.Evaluate(node.condition)) & by_thread:
            found.update(_guarded_ops(node))

    stmt_functor.post_order_visit(func.body, visit)
    return found


def _thread_dependent(func: Any) -> set[Any]:
    """The thread index variables (threadIdx.x/y/z), and the scalars bound from them."""
    found: set[Any] = set()

    def launch(node: Any) -> None:
        if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == "thread_extent" and str(node.node.thread_tag).startswith("threadIdx"):
            found.add(node.node.var)

    def bind(node: Any) -> None:  # in program order: a scalar bound from one bound before
        if isinstance(node, tvm.tirx.Bind) and _referenced_vars(tvm.tirx.Evaluate(node.value)) & found:
            found.add(node.var)

    stmt_functor.post_order_visit(func.body, launch)
    stmt_functor.post_order_visit(func.body, bind)
    return found


def _op_of(node: Any) -> tuple[str, Any] | None:
    """(op id, its statement) where ``node`` carries an op id: an attribute, or a tile op's
    or loop's annotation."""
    if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == "tl.ws_op_id":
        return _text(node.value), node.body
    if isinstance(node, (tvm.tirx.Evaluate, tvm.tirx.For)):
        ann = node.value.annotations if isinstance(node, tvm.tirx.Evaluate) and hasattr(node.value, "annotations") else getattr(node, "annotations", {})
        if ann and "tl.ws_op_id" in ann:
            return _text(ann["tl.ws_op_id"]), node
    return None


def _op_ids(stmt: Any) -> set[str]:
    ids: set[str] = set()
    stmt_functor.post_order_visit(stmt, lambda n: ids.add(found[0]) if (found := _op_of(n)) else None)
    return ids


def _access(stmt: Any, allocated: dict[Any, str], bound: dict[Any, str]) -> OpAccess:
    reads: set[str] = set()
    writes: set[str] = set()
    issues = retires = tma_reduce = False
    mmas: list[Mma] = []
    through_region: set[int] = set()  # loads that name a tile op's region, not a read
    calls: list[Any] = []
    stmt_functor.post_order_visit(stmt, lambda n: calls.append(n) if isinstance(n, tvm.tirx.Call) else None)
    own: set[Any] = set()  # variables bound inside the op: reading them reads nothing outside it
    stmt_functor.post_order_visit(stmt, lambda n: own.add(n.var) if isinstance(n, tvm.tirx.Bind) else None)
    for call in calls:
        name = getattr(call.op, "name", "")
        if name == "tl.region":
            load, mode = call.args[0], int(call.args[1])
            through_region.add(load.__chandle__())
            name = allocated.get(load.buffer.data)
            if name and mode & 1:
                reads.add(name)
            if name and mode & 2:
                writes.add(name)
        elif name in ASYNC_ISSUE_OPS:
            wait = int(dict(getattr(call, "annotations", {}) or {}).get("wg_wait", 0))
            issues = issues or wait != 0 or name not in SYNC_UNLESS_WAIT
            retires = retires or wait > 0
            mmas += _mma(call, allocated)
        elif name in ASYNC_RETIRE_OPS:
            retires = True
        if getattr(call.op, "name", "").startswith("tl.tileop.atomic") and "use_tma" in dict(getattr(call, "annotations", None) or {}):
            tma_reduce = True

    def visit(node: Any) -> None:
        if isinstance(node, tvm.tirx.BufferStore) and node.buffer.data in allocated:
            writes.add(allocated[node.buffer.data])
        elif isinstance(node, tvm.tirx.BufferLoad) and node.buffer.data in allocated and node.__chandle__() not in through_region:
            reads.add(allocated[node.buffer.data])
        elif isinstance(node, tvm.tirx.Bind):
            writes.add(bound[node.var])
        elif isinstance(node, tvm.tirx.Var):
            if node in allocated:  # a raw pointer: read and write
                reads.add(allocated[node])
                writes.add(allocated[node])
            elif node in bound and node not in own:
                reads.add(bound[node])

    stmt_functor.post_order_visit(stmt, visit)
    elements = _parallel_elements(stmt)
    return OpAccess(frozenset(reads), frozenset(writes), issues, retires, tuple(mmas), elements, tma_reduce=tma_reduce,
                    global_copies=bool(elements) and _copies_global(stmt))  # fmt: skip


def _copies_global(stmt: Any) -> bool:
    """Whether a loop nest stores an element of global memory into shared memory as it is
    (or zero where a condition fails): the store InjectPTXAsyncCopy makes a cp.async of."""
    def loaded(value: Any) -> Any:
        if isinstance(value, tvm.tirx.Call) and getattr(value.op, "name", "") == "tirx.if_then_else" and _is_zero(value.args[2]):
            return loaded(value.args[1])
        return value if isinstance(value, tvm.tirx.BufferLoad) else None

    stores = _nodes(stmt, lambda n: isinstance(n, tvm.tirx.BufferStore) and n.buffer.scope().startswith("shared"))
    return any((load := loaded(n.value)) is not None and load.buffer.scope() == "global" and load.buffer.dtype == n.buffer.dtype for n in stores)


def _is_zero(value: Any) -> bool:
    value = value.value if isinstance(value, tvm.tirx.Broadcast) else value
    return isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) and value.value == 0


def _parallel_elements(stmt: Any) -> int:
    """The iterations of a T.Parallel loop nest (its perfectly nested parallel loops), where
    its extents are constant; 0 for anything else."""
    n = 0
    while isinstance(stmt, tvm.tirx.For) and stmt.kind == tvm.tirx.ForKind.PARALLEL:
        if not isinstance(stmt.extent, tvm.tirx.IntImm):
            return 0
        n, stmt = max(n, 1) * stmt.extent.value, stmt.body
    return n


def _mma(call: Any, allocated: dict[Any, str]) -> list[Mma]:
    """The MMA of a gemm call (its slots: ``MMA_SLOTS``), where its tile is static and its
    accumulator a fragment."""
    a_slot, c_slot, m_slot = MMA_SLOTS[call.op.name]
    args = call.args
    if len(args) < m_slot + 4 or not (_is_region(args[a_slot]) and _is_region(args[c_slot])) or "fragment" not in args[c_slot].args[0].buffer.scope():
        return []
    ints = [getattr(a, "value", None) for a in args[m_slot : m_slot + 4]]
    if not all(isinstance(v, int) for v in ints):
        return []
    rows, cols, _, policy = ints
    a, c = args[a_slot].args[0].buffer, args[c_slot].args[0].buffer
    operand = allocated.get(a.data) if "fragment" in a.scope() else None
    size, bits = [getattr(d, "value", None) for d in c.shape], tvm.DataType(c.dtype).bits
    words = math.prod(size) * bits // 32 if all(isinstance(d, int) for d in size) else 0
    return [Mma(rows, cols, policy, allocated.get(c.data, str(c.name)), operand, words, bits)]


def _text(value: Any) -> str:
    return str(getattr(value, "value", value))


def _referenced_vars(stmt: Any) -> set[Any]:
    seen: set[Any] = set()

    def visit(node: Any) -> None:
        if isinstance(node, tvm.tirx.Var):
            seen.add(node)
        elif isinstance(node, (tvm.tirx.BufferLoad, tvm.tirx.BufferStore)):
            seen.add(node.buffer.data)

    stmt_functor.post_order_visit(stmt, visit)
    return seen


def _prologue(func: Any) -> Any:
    mod = tvm.IRModule({"main": func})
    mod = tvm.tirx.transform.BindTarget(target())(mod)
    return tilelang.transform.MaterializeKernelLaunch(lower_thread_binding=True, default_threads=128)(mod)


def prepare(func: Any) -> tuple[Any, Schedule]:
    """The kernel with op ids, and its seed schedule.

    A kernel with its own ``T.annotate_ws_schedule`` is its own seed. A plain
    kernel goes through tilelang's role_based scheduler, which adds op ids
    (``tl_tileop_copy_0``, ``loop_0``, ...) and its schedule; the result compiles
    like a user-annotated kernel (MaterializeKernelLaunch is idempotent).
    """
    func = _zero_based(func)
    seed = own_schedule(func)
    if seed is not None:
        return _unbudgeted(func, _safe(func, seed))
    if _hand_specialized(func):
        raise NoSeed("the kernel is warp-specialized by hand (T.ws blocks and its own barriers), which no WSSchedule describes: annotate one with T.annotate_ws_schedule to have it varied")
    prepared, seed, skipped = _role_based_seed(func)
    if seed is None and (narrow := _seed_narrow(func)) is not None:
        if isinstance(narrow, str):  # and why not at whole warpgroups, which says more than "a multiple of 128"
            skipped = ["; ".join([*skipped[:1], narrow])]
        else:
            prepared, seed = narrow
    if seed is None:
        why = f"skipped the kernel: {skipped[0]}" if skipped else "found nothing to specialize"
        if _leaves_mmas_in_flight(func):  # role_based's words are wg_wait's, which T.wgmma_gemm does not take
            why += f"; {IN_FLIGHT_NEEDS_SEED}"
        raise NoSeed(f"kernel has no WS schedule and tilelang's role_based scheduler {why}")
    try:  # role_based may schedule what MaterializeWSSchedule refuses: then every candidate is refused
        verify(prepared)
    except ScheduleRejected as exc:
        raise NoSeed(f"MaterializeWSSchedule rejects tilelang's role_based schedule: {exc}") from exc
    return _unbudgeted(prepared, _safe(prepared, seed), derived=True)


def sets_max_nreg(func: Any) -> bool:
    """Whether the kernel lets its roles have register budgets: not where it opts out with
    ``T.no_set_max_nreg()``, as Mamba-2's chunk scan does."""
    return not _nodes(func.body, lambda n: isinstance(n, tvm.tirx.Call) and getattr(n.op, "name", "") == "tl.no_set_max_nreg")


def orders_its_pipeline(func: Any) -> bool:
    """Whether the kernel plans a pipelined loop itself (``T.Pipelined(..., order=, stage=)``):
    tilelang's lowering without warp specialization follows that plan; warp-specialized
    ones (role_based's, the seed's and its variants) stage the loop by roles instead."""
    planned = ("tl_pipeline_order", "tl_pipeline_stage", "software_pipeline_order", "software_pipeline_stage")
    return bool(_nodes(func.body, lambda n: isinstance(n, tvm.tirx.For) and any(k in n.annotations for k in planned)))


# tilelang's default lowering honours T.no_set_max_nreg(); role_based gives the seed's roles
# budgets regardless (136 and 24 on Mamba-2's chunk scan). The seed of a kernel that opts
# out has none, as written; its candidates vary them within the register rules, as
# role_based does: on the MXFP4 GEMM at 512 threads, role_based's 112/24 ran 1.08x the
# seed's structure without budgets (H100, run 38).
#
# role_based's own budgets may break the register rules: GDN's WY backward (a 128-thread
# Worker beside a Load warp: a block of 256) gets Worker 104 or 136 and Load 24, and tilelang
# sets the Worker's by setmaxnreg.inc (it is above the mean) from the 248 registers a thread
# starts with, which is undefined (roles died with "illegal instruction" on the H200). A seed
# derived from role_based then sets none; its variants vary them within the rules.
# tilelang's role_based baseline keeps them: it is tilelang's.
def _unbudgeted(prepared: Any, seed: Schedule, *, derived: bool = False) -> tuple[Any, Schedule]:
    undefined = derived and (rules.register_reason(seed) or "").startswith(("nreg:", "registers:"))
    if (sets_max_nreg(prepared) and not undefined) or all(r.max_nreg == 0 for r in seed.roles):
        return prepared, seed
    seed = seed.with_(roles=tuple(replace(r, max_nreg=0) for r in seed.roles))
    return attach(prepared, seed), seed


# A role's pipeline barriers count all of its threads, and MaterializeWSSchedule puts its
# waits and arrives in the loop that the pipeline synchronizes. Where that loop runs under
# a condition on the thread index (DeepSeek's mHC pre-mixing: warp 0 runs the Sinkhorn
# iterations, the others the pipelined loop, an if-else that role_based is shown as two
# guarded ifs), the threads the condition leaves out never arrive, and the kernel hangs;
# the verifier does not see it. No schedule varies such a seed soundly.
def _safe(func: Any, seed: Schedule) -> Schedule:
    guarded = sorted(_thread_guarded(func) & {s.id for s in seed.scopes})
    if guarded:
        raise NoSeed(f"the seed's pipelined loop {guarded[0]!r} runs under a condition on the thread index: "
                     "its pipeline barriers would wait for threads that the condition leaves out")  # fmt: skip
    return seed


def _role_based(func: Any) -> tuple[Any, list[str]]:
    """``func`` as tilelang's role_based scheduler leaves it, shown it through
    ``_FOR_ROLE_BASED``, and the reasons it gives where it skips it."""
    try:
        with role_based_skips() as skipped, tvm.transform.PassContext(config=ROLE_BASED_CONFIG):
            shown = func
            for rewrite in _FOR_ROLE_BASED:
                shown = rewrite(shown)
            # tilelang's own order: a legacy (v1) reducer, which role_based cannot parse,
            # becomes reducer_init / reducer_update / finalize_reducer_v2 first
            mod = tilelang.transform.CanonicalizeLegacyReducer()(tilelang.transform.InjectAssumes()(_prologue(shown)))
            mod = tilelang.cuda.transform.AutoWarpSpecialization()(mod)
    except Exception as exc:  # noqa: BLE001 - TVM raises many kinds
        raise NoSeed(f"tilelang's role_based scheduler failed: {one_line(exc)}") from exc
    return _restore_atomics(mod["main"]), skipped


# ``with T.ws(...)`` blocks: a kernel that specializes its own warps and synchronizes them by
# its own barriers. role_based finds nothing in it to schedule, and its roles are no schedule's.
def _leaves_mmas_in_flight(func: Any) -> bool:
    """Whether the kernel issues MMAs that return before they finish, or waits for them itself."""
    in_flight = (ASYNC_ISSUE_OPS - SYNC_UNLESS_WAIT) | ASYNC_RETIRE_OPS
    return bool(_nodes(func.body, lambda n: isinstance(n, tvm.tirx.Call) and getattr(n.op, "name", None) in in_flight))


def _hand_specialized(func: Any) -> bool:
    return bool(_nodes(func.body, lambda n: isinstance(n, tvm.tirx.AttrStmt) and n.attr_key == "warp_specialize"))


# MaterializeWSSchedule moves a span by stages only in a loop from 0 ("stage offsets require
# 0-based loops"); sliding-window attention's key loop starts at the block's window.
# ``for k in range(lo, hi)`` is ``for k in range(hi - lo)`` with lo + k in its body (op ids
# and annotations kept), so the space's stage offsets apply to every loop.
def _zero_based(func: Any) -> Any:
    def shift(loop: Any) -> Any:
        if loop.kind != tvm.tirx.ForKind.SERIAL or (isinstance(loop.min, tvm.tirx.IntImm) and loop.min.value == 0):
            return None
        var = tvm.tirx.Var(loop.loop_var.name, loop.loop_var.dtype)
        body = stmt_functor.substitute(loop.body, {loop.loop_var: var + loop.min})
        zero = tvm.tirx.IntImm(loop.loop_var.dtype, 0)
        return tvm.tirx.For(var, zero, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations, loop.step)

    return func.with_body(stmt_functor.ir_transform(func.body, None, shift, ["tirx.For"]))


# A loop that runs no trips (stream-K's whole-tile wave when every tile is shared out) is
# dropped by tilelang's simplifier after role_based has scheduled its ops, and the build
# then fails ("op 'pid_m_1' is scheduled but no statement in the kernel carries this
# id"). It is dead code: the scheduler does not see it.
def _drop_empty_loops(func: Any) -> Any:
    def empty(stmt: Any) -> bool:
        return isinstance(stmt, tvm.tirx.For) and isinstance(stmt.extent, tvm.tirx.IntImm) and stmt.extent.value <= 0

    def drop(seq: Any) -> Any:
        kept = [stmt for stmt in seq.seq if not empty(stmt)]
        if len(kept) == len(seq.seq):
            return None
        return tvm.tirx.SeqStmt(kept) if len(kept) != 1 else kept[0]

    return func.with_body(stmt_functor.ir_transform(func.body, None, drop, ["tirx.SeqStmt"]))


# role_based gives each shared buffer one owner per stretch of a loop body, handed between
# two roles; a buffer the kernel reuses for unrelated values breaks that (RMSNorm's x tile,
# loaded again by a second loop: "ownership moves inside the consumer's span"; a tile
# written twice in one loop body: "the body ends in the producer's span"). A statement
# that overwrites the whole buffer before reading it ends the value before it, so each
# stretch of a sequence between two such statements gets a buffer of its own, as a
# compiler's live-range splitting would (the last stretch keeps the buffer: what follows
# the sequence, or the loop's next trip, may read it). The shared memory it costs is
# priced by the space's rule. Buffers with an annotated layout keep their one buffer.
def _split_reuse(func: Any) -> Any:
    block = _annotated_block(func)
    if block is None:
        return func
    laid_out = set(dict(block.annotations).get("layout_map", {}))
    datas = [b.data for b in block.alloc_buffers]
    reused = [
        b for b in block.alloc_buffers
        if b.scope().startswith("shared") and "barrier" not in b.scope() and b.data not in laid_out and datas.count(b.data) == 1
    ]  # fmt: skip
    added: list[Any] = []

    def split(seq: Any) -> Any:
        stmts, before = list(seq.seq), len(added)
        for buf in reused:
            kills = [i for i, stmt in enumerate(stmts) if _first_access(stmt, buf) == "kill"]
            for lo, hi in zip(kills, kills[1:]):
                added.append(tvm.tirx.decl_buffer(buf.shape, buf.dtype, f"{buf.name}_v{len(added) + 1}", scope=buf.scope()))
                stmts[lo:hi] = [_rebuffer(stmt, buf, added[-1]) for stmt in stmts[lo:hi]]
        return tvm.tirx.SeqStmt(stmts) if len(added) > before else None

    body = stmt_functor.ir_transform(func.body, None, split, ["tirx.SeqStmt"])
    if not added:
        return func

    def allocate(stmt: Any) -> Any:
        return _block_with(stmt, alloc_buffers=[*stmt.alloc_buffers, *added]) if stmt.name_hint == block.name_hint else None

    return func.with_body(stmt_functor.ir_transform(body, None, allocate, ["tirx.SBlock"]))


def _first_access(stmt: Any, buf: Any) -> str | None:
    """How ``stmt`` first touches ``buf`` on every run of it: None (not at all), "kill" (a
    tile op that writes all of it and reads none), or "use". Each statement is visited
    once: a sequence or loop asks its parts, and only a leaf is searched for the buffer."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return next((a for s in stmt.seq if (a := _first_access(s, buf))), None)
    if isinstance(stmt, tvm.tirx.For):
        if buf.data in _referenced_vars(tvm.tirx.Evaluate(stmt.min)) | _referenced_vars(tvm.tirx.Evaluate(stmt.extent)):
            return "use"
        first = _first_access(stmt.body, buf)
        runs = isinstance(stmt.extent, tvm.tirx.IntImm) and stmt.extent.value > 0 and stmt.kind in (tvm.tirx.ForKind.SERIAL, tvm.tirx.ForKind.UNROLLED)
        return first if runs or first is None else "use"
    if buf.data not in _referenced_vars(stmt):
        return None
    call = stmt.value if isinstance(stmt, tvm.tirx.Evaluate) else None
    if not isinstance(call, tvm.tirx.Call) or not getattr(call.op, "name", "").startswith("tl.tileop."):
        return "use"
    regions = [a for a in call.args if _is_region(a) and a.args[0].buffer.same_as(buf)]
    rest = [a for a in call.args if not any(a.same_as(r) for r in regions)]
    whole = all(_writes_whole(r, buf) for r in regions)
    touched_elsewhere = any(buf.data in _referenced_vars(tvm.tirx.Evaluate(a)) for a in rest if isinstance(a, tvm.ir.PrimExpr))
    return "kill" if regions and whole and not touched_elsewhere else "use"


def _rebuffer(stmt: Any, old: Any, new: Any) -> Any:
    def swap(node: Any) -> Any:
        if isinstance(node, tvm.tirx.BufferLoad) and node.buffer.same_as(old):
            return tvm.tirx.BufferLoad(new, node.indices, node.predicate)
        if isinstance(node, tvm.tirx.BufferStore) and node.buffer.same_as(old):
            return tvm.tirx.BufferStore(new, node.value, node.indices, node.predicate)
        return None

    swapped = stmt_functor.ir_transform(stmt, None, swap, ["tirx.BufferLoad", "tirx.BufferStore"])
    return stmt_functor.substitute(swapped, {old.data: new.data})  # raw pointers (access_ptr)


# Neither role_based nor MaterializeWSSchedule takes an else branch ("if-else branches are
# not supported"); a stream-K GEMM writes a tile whole or adds it by atomics under one.
# ``if c: A else: B`` is ``if c: A`` then ``if not c: B`` when A does not touch a buffer c
# loads (TIR variables are bound once: only c's buffer loads could change, and only A
# could change them), so the scheduler sees two guarded branches and places each op with
# its own guard. Otherwise it is left as written, and role_based says why it skips.
def _split_else(func: Any) -> Any:
    def split(stmt: Any) -> Any:
        if stmt.else_case is None:
            return None
        read = {load.buffer.data for load in _loads(stmt.condition)}
        if read & _referenced_vars(stmt.then_case):
            return None
        otherwise = tvm.tirx.IfThenElse(tvm.tirx.Not(stmt.condition), stmt.else_case, None)
        return tvm.tirx.SeqStmt([tvm.tirx.IfThenElse(stmt.condition, stmt.then_case, None), otherwise])

    return func.with_body(stmt_functor.ir_transform(func.body, None, split, ["tirx.IfThenElse"]))


# A kernel that picks one of two tiles of an input by a condition writes ``if c: copy(X[a],
# s) else: copy(X[b], s)`` (a diffusion LLM's block-causal attention takes K from the noisy or
# the clean half). As two guarded writes the destination is "written under a guard", and
# role_based refuses to version it. Both branches write all of it, so it is one copy from
# X[c ? a : b]: unguarded, versionable, and still one TMA load (its coordinates are values).
def _join_branch_copies(func: Any) -> Any:
    def join(stmt: Any) -> Any:
        pair = [s.value if isinstance(s, tvm.tirx.Evaluate) else None for s in (stmt.then_case, stmt.else_case)]
        if not all(isinstance(c, tvm.tirx.Call) and getattr(c.op, "name", "") == "tl.tileop.copy" for c in pair):
            return None
        (then, other), read = pair, {load.buffer.data for load in _loads(stmt.condition)}
        if len(then.args) != len(other.args) or not _is_region(then.args[1]) or then.args[1].args[0].buffer.data in read:
            return None
        args = [_join_regions(stmt.condition, a, b) for a, b in zip(then.args, other.args)]
        if any(a is None for a in args) or not _writes_whole(args[1], args[1].args[0].buffer):
            return None
        return tvm.tirx.Evaluate(tvm.tirx.Call(then.dtype, then.op, args, then.span))

    return func.with_body(stmt_functor.ir_transform(func.body, None, join, ["tirx.IfThenElse"]))


def _join_regions(cond: Any, a: Any, b: Any) -> Any | None:
    """``a`` where ``b`` is the same; a region of one buffer and extents that starts where
    ``cond`` picks; otherwise None."""
    if tvm.ir.structural_equal(a, b):
        return a
    if not (_is_region(a) and _is_region(b)) or not tvm.ir.structural_equal(a.args[1:], b.args[1:]):
        return None
    start_a, start_b = a.args[0], b.args[0]
    if not start_a.buffer.same_as(start_b.buffer):
        return None
    indices = [i if tvm.ir.structural_equal(i, j) else tvm.tirx.if_then_else(cond, i, j) for i, j in zip(start_a.indices, start_b.indices)]
    return tvm.tirx.Call(a.dtype, a.op, [tvm.tirx.BufferLoad(start_a.buffer, indices), *a.args[1:]], a.span)


# A scalar bound inside an ``if`` from index arithmetic (KDA's intra-chunk backward:
# ``if i_i < NC - 1: chunk_last_idx = T.min(S, i_ti + BC) - 1``, then a copy at that row) is
# a definition under a guard, which MaterializeWSSchedule refuses to let any other op use:
# role_based scheduled it, and every schedule was rejected. It reads no buffer, so its uses
# take the expression itself, as a user could write it; a bind that reads memory stays.
def _inline_guarded_binds(func: Any) -> Any:
    def inline(seq: Any) -> Any:
        out, values = [], {}
        for stmt in seq.seq:
            stmt = stmt_functor.substitute(stmt, values) if values else stmt
            if isinstance(stmt, tvm.tirx.Bind) and not _loads(stmt.value):
                values[stmt.var] = stmt.value
            else:
                out.append(stmt)
        return None if not values else out[0] if len(out) == 1 else tvm.tirx.SeqStmt(out)

    def branches(node: Any) -> Any:
        then = stmt_functor.ir_transform(node.then_case, None, inline, ["tirx.SeqStmt"])
        other = None if node.else_case is None else stmt_functor.ir_transform(node.else_case, None, inline, ["tirx.SeqStmt"])
        if then.same_as(node.then_case) and (other is None or other.same_as(node.else_case)):
            return None
        return tvm.tirx.IfThenElse(node.condition, then, other)

    return func.with_body(stmt_functor.ir_transform(func.body, branches, None, ["tirx.IfThenElse"]))


# A scan that picks values under a condition (a grouped GEMM finds its group: ``if bx * bm >=
# padded: group = g; first = starts[g] + ...``) writes local variables under a guard, which
# role_based keeps in one role, and a bind there would not be visible outside the branch. Each
# such store is a bind of ``if_then_else(cond, value, old value)`` (which evaluates only the
# branch taken, so a guarded read stays guarded) and a store of it, in the same order; the
# condition must not read what the stores write.
def _unguard_local_stores(func: Any) -> Any:
    def unguard(stmt: Any) -> Any:
        stores = list(stmt.then_case.seq) if isinstance(stmt.then_case, tvm.tirx.SeqStmt) else [stmt.then_case]
        if stmt.else_case is not None or not all(isinstance(s, tvm.tirx.BufferStore) and s.buffer.scope() == "local.var" for s in stores):
            return None
        if {s.buffer.data for s in stores} & {load.buffer.data for load in _loads(stmt.condition)}:
            return None
        out = []
        for store in stores:
            value = tvm.tirx.Var(f"{store.buffer.name}_value", store.value.dtype)
            old = tvm.tirx.BufferLoad(store.buffer, store.indices)
            out += [tvm.tirx.Bind(value, tvm.tirx.if_then_else(stmt.condition, store.value, old)), tvm.tirx.BufferStore(store.buffer, value, store.indices)]
        return tvm.tirx.SeqStmt(out)

    return func.with_body(stmt_functor.ir_transform(func.body, None, unguard, ["tirx.IfThenElse"]))


# role_based keeps a statement that writes a local variable (``T.alloc_var``) in one role
# when it reads global memory (``k_lo = min(k_lo, KS[q0 + q])``): no other role can compute
# the variable, and a loop whose bounds read it has no Load role (DeepSeek-V3.2's lightning
# indexer reduces its key range so). Read into a scalar first (``ks = KS[q0 + q]``), as a
# user would write it, the global read is a bind every role can run, and the store reads
# private values only. Not under an ``if``: a bind in a branch is not visible outside it,
# and MaterializeWSSchedule rejects every schedule that places its users apart (a grouped
# GEMM's scan for its group).
def _bind_global_reads(func: Any) -> Any:
    guarded: set[Any] = set()

    def under_if(node: Any) -> None:
        if isinstance(node, tvm.tirx.IfThenElse):
            for case in (node.then_case, node.else_case):
                if case is not None:
                    stmt_functor.post_order_visit(case, lambda n: guarded.add(n) if isinstance(n, tvm.tirx.BufferStore) else None)

    stmt_functor.post_order_visit(func.body, under_if)

    def bind(stmt: Any) -> Any:
        if stmt.buffer.scope() != "local.var" or stmt in guarded:
            return None
        reads = [load for load in _loads(stmt.value) if load.buffer.scope() == "global"]
        if not reads:
            return None
        binds = {load: tvm.tirx.Var(f"{load.buffer.name}_value", load.dtype) for load in reads}
        value = stmt_functor.ir_transform(tvm.tirx.Evaluate(stmt.value), None, lambda n: binds.get(n), ["tirx.BufferLoad"]).value
        return tvm.tirx.SeqStmt([*(tvm.tirx.Bind(v, load) for load, v in binds.items()), tvm.tirx.BufferStore(stmt.buffer, value, stmt.indices)])

    return func.with_body(stmt_functor.ir_transform(func.body, None, bind, ["tirx.BufferStore"]))


def _loads(expr: Any) -> list[Any]:
    return _nodes(expr, lambda n: isinstance(n, tvm.tirx.BufferLoad))


def _nodes(node: Any, wanted: Callable[[Any], bool]) -> list[Any]:
    """The nodes under ``node`` (itself included) that are ``wanted``, in post order."""
    found: list[Any] = []
    stmt_functor.post_order_visit(node, lambda n: found.append(n) if wanted(n) else None)
    return found


# role_based skips any kernel with an atomic op ("cannot schedule atomic op"), yet
# MaterializeWSSchedule lowers an atomic statement in a role as it lowers any other (a
# split-K GEMM's or FlashAttention backward's atomics stay with the MMA's role). So the
# scheduler sees each atomic statement as a stand-in with the same operands: a tile op as
# a copy of the same regions, an element op as an opaque call; the seed's kernel gets
# its atomics back at the op ids the stand-ins were given. Atomics whose value is used
# (``return_prev``) are expressions, not statements: role_based still says why it skips.
# A tile atomic by TMA (``use_tma``: cp.reduce.async.bulk) stands in as an opaque call, which
# role_based keeps with the role that writes its shared tile: as a copy it went to a Store
# role, and MaterializeWSSchedule, which fences a TMA store's tile from the writer's
# generic-proxy stores before the handoff, does not fence an atomic's (a race on the
# reduced values; a GQA backward's dQ, dK and dV).
_STAND_IN = "ws_tune_atomic"  # the annotation that marks a stand-in with the atomic's op name


def _stand_in_atomics(func: Any) -> Any:
    def stand_in(stmt: Any) -> Any:
        call = stmt.value
        if not (isinstance(call, tvm.tirx.Call) and "atomic" in getattr(call.op, "name", "")):
            return None
        marks = {**dict(call.annotations), _STAND_IN: call.op.name}
        if call.op.name.startswith("tl.tileop.") and "use_tma" not in marks:
            op, args = tvm.ir.Op.get("tl.tileop.copy"), call.args
        else:
            op, args = tvm.ir.Op.get("tirx.call_extern"), [tvm.tirx.StringImm(_STAND_IN), *call.args]
        return tvm.tirx.Evaluate(tvm.tirx.Call(call.dtype, op, args, annotations=marks))

    return func.with_body(stmt_functor.ir_transform(func.body, stand_in, None, ["tirx.Evaluate"]))


def _restore_atomics(func: Any) -> Any:
    def restore(stmt: Any) -> Any:
        call = stmt.value
        marks = dict(getattr(call, "annotations", None) or {})
        if _STAND_IN not in marks:
            return None
        atomic = tvm.ir.Op.get(str(marks.pop(_STAND_IN)))
        # the operands as the passes left them (their variables may be renamed); the op id kept
        args = call.args[1:] if call.op.name == "tirx.call_extern" else call.args
        return tvm.tirx.Evaluate(tvm.tirx.Call(call.dtype, atomic, args, annotations=marks))

    return func.with_body(stmt_functor.ir_transform(func.body, None, restore, ["tirx.Evaluate"]))


# A kernel may copy a slice of a read-only input into registers once and steer its loads
# by it: block-sparse attention guards each key block's loads by its row of the block mask.
# A producer warp cannot read the consumers' registers, so role_based refuses the load
# ("'copy_5' needs op 'copy_1' in role Load, but that op is fixed to role Worker"). Where
# that copy is the buffer's only write, runs once before any read (a statement of the
# kernel's top level), and the buffer steers control or addressing (a guard, a loop
# bound, an index), each read is taken from the input itself and the copy dropped.
def _unstage_inputs(func: Any) -> Any:
    block = _annotated_block(func)
    if block is None:
        return func
    read_only = _read_only_inputs(func)
    top = list(block.body.seq) if isinstance(block.body, tvm.tirx.SeqStmt) else [block.body]
    steering = _steering_loads(block.body)
    for at, stmt in enumerate(top):
        staged = _staged_copy(stmt, read_only)
        if staged is None:
            continue
        src, buf = staged
        if buf.data not in steering or any(buf.data in _referenced_vars(s) for s in top[:at]):
            continue
        after = top[at + 1 :]
        if not after:
            continue
        rest = _reread(tvm.tirx.SeqStmt(after) if len(after) > 1 else after[0], buf, src)
        if buf.data in _referenced_vars(rest):  # written or handed over elsewhere: keep it
            continue
        body = tvm.tirx.SeqStmt([*top[:at], rest]) if at else rest
        kept = [b for b in block.alloc_buffers if not b.same_as(buf)]
        return _unstage_inputs(_with_block(func, block, body=body, alloc_buffers=kept))  # the next one, in the new body
    return func


# role_based keeps a load into registers with the MMA that reads it: the consumers wait on
# global memory every iteration and no producer prefetches it (tilelang's fused-MoE example
# reads its token rows straight into the MMA's register operand). A fragment that copies of
# an input fill whole and that MMAs only read as their first operand serves them as well
# from shared memory, as a GEMM's operands are: it becomes a shared buffer, which a
# producer loads and a pipeline versions. Anything else touching it keeps it as written.
_OPERAND_READERS = frozenset(MMA_SLOTS)


def _stage_operands(func: Any) -> Any:
    block = _annotated_block(func)
    if block is None:
        return func
    read_only = _read_only_inputs(func)
    body, allocs = block.body, list(block.alloc_buffers)
    for i, buf in enumerate(allocs):
        if buf.scope() == "local.fragment" and _only_an_operand(body, buf, read_only):
            allocs[i] = tvm.tirx.decl_buffer(buf.shape, buf.dtype, buf.name, scope="shared.dyn")
            body = _rebuffer(body, buf, allocs[i])
    return func if body.same_as(block.body) else _with_block(func, block, body=body, alloc_buffers=allocs)


# A kernel whose loops copy their inputs straight into registers hands nothing on chip from
# one warp to another, and role_based finds nothing to pipeline ("no cross-role on-chip
# handoff"): tilelang's online softmax, whose two passes read each block of x into a
# fragment. Where role_based so gives no seed, each such whole copy in a sequential loop goes
# through a shared tile of its own (in the input's type; the copy into registers converts):
# a producer loads that tile ahead, and the consumers copy it into their fragment. Only then,
# so that no kernel role_based seeds as written is seeded otherwise.
def _stage_register_loads(func: Any) -> Any:
    block = _annotated_block(func)
    if block is None:
        return func
    read_only = _read_only_inputs(func)
    staged: list[Any] = []

    def stage(stmt: Any) -> Any:
        copy = _input_copy(stmt, read_only)
        if copy is None or not copy[1].args[0].buffer.scope().startswith("local"):
            return None
        src, dst = copy
        into = dst.args[0].buffer
        tile = tvm.tirx.decl_buffer(into.shape, src.args[0].buffer.dtype, f"{into.name}_shared{f'_{len(staged)}' if staged else ''}", scope="shared.dyn")
        staged.append(tile)
        call = stmt.value
        whole = [tvm.tirx.IntImm("int32", 0)] * len(into.shape)

        def region(mode: int) -> Any:
            return tvm.tirx.Call("handle", tvm.ir.Op.get("tl.region"), [tvm.tirx.BufferLoad(tile, whole), mode, *dst.args[2:]])

        load = tvm.tirx.Call(call.dtype, call.op, [src, region(2), *call.args[2:]], annotations=call.annotations)
        convert = tvm.tirx.Call(call.dtype, call.op, [region(1), dst, *call.args[2:]], annotations=call.annotations)
        return tvm.tirx.SeqStmt([tvm.tirx.Evaluate(load), tvm.tirx.Evaluate(convert)])

    def in_loop(loop: Any) -> Any:
        if loop.kind != tvm.tirx.ForKind.SERIAL:
            return None
        body = stmt_functor.ir_transform(loop.body, None, stage, ["tirx.Evaluate"])
        return None if body.same_as(loop.body) else tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations, loop.step)

    body = stmt_functor.ir_transform(block.body, None, in_loop, ["tirx.For"])
    return func if not staged else _with_block(func, block, body=body, alloc_buffers=[*block.alloc_buffers, *staged])


# A recurrent kernel carries its state in registers across a loop and hands it to an MMA
# through a shared tile written from the fragment, which the trip also stores to global memory
# (Gated DeltaNet's chunk recurrence writes the tile last in a trip, and the next stores it as
# that chunk's state, then reads it in W @ S; its backward writes, stores and reads it in one
# trip). role_based gives the store to a Store role, beside the Worker that writes the tile and
# reads it, and refuses a tile three roles share. Where, at that store, the tile holds the
# fragment's values (``_held_by``), the store is taken from the fragment: the Worker runs it,
# and the tile has two owners. Only a tile read again after the store (a third role's), and
# exact only where the fragment holds the tile's values exactly (the same type, or fp32 of a
# 16-bit float tile) and the store's destination is of the tile's type.
def _forward_state_stores(func: Any) -> Any:
    def forward(seq: Any) -> Any:
        stmts, changed = list(seq.seq), False
        for k, loop in enumerate(stmts):
            if not (isinstance(loop, tvm.tirx.For) and loop.kind == tvm.tirx.ForKind.SERIAL and isinstance(loop.body, tvm.tirx.SeqStmt)):
                continue
            body = list(loop.body.seq)
            for i, stmt in enumerate(body):
                regions = _copy_regions(stmt)
                tile = regions[0].args[0].buffer if regions else None
                if tile is None or not tile.scope().startswith("shared") or not _read_again(body, i, tile):
                    continue
                frag = _held_by(body, i, tile, stmts[:k])
                if frag is not None:
                    body[i] = _stored_from(stmt, tile, frag) or stmt
            if any(not a.same_as(b) for a, b in zip(body, loop.body.seq)):
                stmts[k] = tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tvm.tirx.SeqStmt(body), loop.thread_binding, loop.annotations, loop.step)
                changed = True
        return tvm.tirx.SeqStmt(stmts) if changed else None

    return func.with_body(stmt_functor.ir_transform(func.body, None, forward, ["tirx.SeqStmt"]))


def _held_by(body: list[Any], i: int, tile: Any, before: list[Any]) -> Any | None:
    """The fragment whose values ``tile`` holds at ``body[i]`` of a loop's body, or None: its
    last write is a whole copy from the fragment, earlier in the trip or, wrapping, at the end of
    the last trip (and so before the loop, ``before``), and the fragment is not written since."""
    earlier = [n for n in range(i) if _writes(body[n], tile)]
    later = [n for n in range(i + 1, len(body)) if _writes(body[n], tile)]
    at = earlier[-1] if earlier else later[-1] if later else None
    pair = None if at is None else _whole_copy(body[at])
    if pair is None or not pair[1].same_as(tile) or not _holds_exactly(*pair):
        return None
    frag = pair[0]
    since = body[at + 1 : i] if at < i else body[at + 1 :] + body[:i]
    if any(_writes(x, frag) for x in since) or (at > i and not _equal_before(before, frag, tile)):
        return None
    return frag


def _read_again(body: list[Any], i: int, tile: Any) -> bool:
    """Whether another statement reads what ``body[i]`` reads of ``tile`` before the tile is
    next written whole (later in the trip or, wrapping, in the next one)."""
    for stmt in body[i + 1 :] + body[:i]:
        first = _first_access(stmt, tile)
        if first is not None:
            return first == "use"
    return False


def _copy_regions(stmt: Any) -> tuple[Any, Any] | None:
    """(source region, destination region) where ``stmt`` is a tile copy."""
    call = stmt.value if isinstance(stmt, tvm.tirx.Evaluate) else None
    if isinstance(call, tvm.tirx.Call) and getattr(call.op, "name", "") == "tl.tileop.copy" and len(call.args) >= 2 and all(_is_region(a) for a in call.args[:2]):
        return call.args[0], call.args[1]
    return None


def _whole_copy(stmt: Any) -> tuple[Any, Any] | None:
    """(fragment, shared tile) where ``stmt`` copies all of a fragment into all of a shared
    buffer of its shape."""
    regions = _copy_regions(stmt)
    if regions is None:
        return None
    src, dst = (r.args[0].buffer for r in regions)
    if src.scope() == "local.fragment" and dst.scope().startswith("shared") and _covers(regions[0], src) and _writes_whole(regions[1], dst):
        return src, dst
    return None


def _holds_exactly(frag: Any, tile: Any) -> bool:
    return frag.dtype == tile.dtype or (str(frag.dtype) == "float32" and str(tile.dtype) in ("float16", "bfloat16"))


def _writes(stmt: Any, buf: Any) -> bool:
    """Whether ``stmt`` may write ``buf``: a store, a tile op's region with write access, or
    its data handed to a call as a pointer."""
    found: list[bool] = []

    def visit(node: Any) -> None:
        if isinstance(node, tvm.tirx.BufferStore) and node.buffer.data.same_as(buf.data):
            found.append(True)
        elif _is_region(node) and node.args[0].buffer.data.same_as(buf.data):
            found.append(bool(int(node.args[1]) & 2))
        elif isinstance(node, tvm.tirx.Var) and node.same_as(buf.data):
            found.append(True)

    stmt_functor.post_order_visit(stmt, visit)
    return any(found)


def _equal_before(stmts: list[Any], frag: Any, tile: Any) -> bool:
    """Whether, after ``stmts``, the tile holds the fragment's values: the last of them to
    write either is a whole copy between the two."""
    for stmt in reversed(stmts):
        if _writes(stmt, frag) or _writes(stmt, tile):
            if _whole_copy(stmt) == (frag, tile):
                return True
            regions = _copy_regions(stmt)  # else the tile copied into the fragment
            return regions is not None and regions[0].args[0].buffer.same_as(tile) and regions[1].args[0].buffer.same_as(frag) and _writes_whole(regions[1], frag)
    return False


def _stored_from(stmt: Any, tile: Any, frag: Any) -> Any | None:
    """``stmt``, a copy of all of ``tile`` to global memory of its type, copying ``frag`` instead."""
    regions = _copy_regions(stmt)
    if regions is None:
        return None
    src, dst = regions
    if not (src.args[0].buffer.same_as(tile) and _covers(src, tile) and dst.args[0].buffer.scope() == "global" and dst.args[0].buffer.dtype == tile.dtype):
        return None
    call = stmt.value
    whole = tvm.tirx.Call("handle", src.op, [tvm.tirx.BufferLoad(frag, list(src.args[0].indices)), 1, *src.args[2:]])
    return tvm.tirx.Evaluate(tvm.tirx.Call(call.dtype, call.op, [whole, *call.args[1:]], annotations=call.annotations))


# What role_based is shown of a plain kernel that it gives no seed as written: each alone,
# in this order, and only then, so that no kernel it seeds as written is seeded otherwise.
_WHERE_UNSEEDED = (
    (_stage_register_loads, "a loop's copy of an input into registers goes through a shared tile (the kernel hands nothing on chip otherwise)"),
    (_forward_state_stores, "a loop's store of a state's shared tile is taken from the fragment the tile was written from (three roles shared the tile otherwise)"),
)


@dataclass(frozen=True)
class _Otherwise:
    func: Any  # the kernel rewritten
    prepared: Any  # as role_based leaves it, with its schedule
    what: str
    rewrite: Callable[[Any], Any]


def _role_based_seed(func: Any) -> tuple[Any, Schedule | None, list[str]]:
    """role_based's result for ``func`` (else for the first rewrite of ``_WHERE_UNSEEDED``
    it seeds), its seed if any, and why role_based skipped the kernel as written."""
    prepared, skipped = _role_based(func)
    seed = own_schedule(prepared)
    if seed is None and (otherwise := _seed_otherwise(func)) is not None:
        prepared, seed = otherwise.prepared, own_schedule(otherwise.prepared)
    return prepared, seed, skipped


def _seed_otherwise(func: Any) -> _Otherwise | None:
    """The first rewrite of ``_WHERE_UNSEEDED`` that changes ``func`` and that role_based
    then seeds."""
    for rewrite, what in _WHERE_UNSEEDED:
        new = rewrite(func)
        if tvm.ir.structural_equal(new, func):  # a rewrite may rebuild what it leaves as it was
            continue
        try:
            prepared, _ = _role_based(new)
        except NoSeed:
            continue
        if own_schedule(prepared) is not None:
            return _Otherwise(new, prepared, what, rewrite)
    return None


def _narrow_otherwise(func: Any) -> _Otherwise | None:
    """``_seed_otherwise`` for a kernel of fewer threads than a warpgroup, decided where
    ``_seed_narrow`` seeds it (launched with whole warpgroups), applied to the kernel as
    launched."""
    wide = _whole_group_threads(func)
    otherwise = _seed_otherwise(_with_threads(func, wide)) if wide is not None else None
    return replace(otherwise, func=otherwise.rewrite(func)) if otherwise is not None else None


# tilelang's role_based scheduler specializes only blocks of whole warpgroups ("worker
# threads must be a multiple of 128 so issuer warps start a fresh warpgroup", where
# setmaxnreg can budget them), so kernels written for 32 or 64 threads (NSA's backward as
# its example launches it) had no seed. A schedule is op ids and warp ranges: role_based
# schedules the kernel launched with whole warpgroups, and the kernel as written takes that
# schedule with its Worker on its own warps and the other roles on the warps right after,
# without register budgets (setmaxnreg is per warpgroup).
# None: not a kernel of whole warps short of a warpgroup; a string: why role_based seeds it
# at whole warpgroups neither.
def _seed_narrow(func: Any) -> tuple[Any, Schedule] | str | None:
    wide = _whole_group_threads(func)
    if wide is None:
        return None
    threads = _launch_threads(func)
    at_wide = f"launched with {wide} threads (whole warpgroups, which it needs)"
    try:
        prepared, seed, skipped = _role_based_seed(_with_threads(func, wide))
    except NoSeed as exc:
        return f"{at_wide}: {exc}"
    if seed is None:
        return f"{at_wide}: {skipped[0]}" if skipped else f"{at_wide}, it found nothing to specialize"
    narrow = _narrowed(seed, wide // THREADS_PER_WARP, threads // THREADS_PER_WARP)
    return (attach(_with_threads(prepared, threads), narrow), narrow) if narrow is not None else None


def _whole_group_threads(func: Any) -> int | None:
    """The threads of whole warpgroups that a kernel of whole warps, not of whole
    warpgroups, is seeded at; None for any other kernel."""
    threads = _launch_threads(func)
    if threads is None or threads % THREADS_PER_WARP or (threads // THREADS_PER_WARP) % WARPS_PER_GROUP == 0:
        return None
    return whole_warpgroups(threads // THREADS_PER_WARP) * THREADS_PER_WARP


def _narrowed(seed: Schedule, wide: int, warps: int) -> Schedule | None:
    """``seed``, scheduled over ``wide`` worker warps, with its one worker role on the kernel's
    ``warps`` and every other role moved down to follow them (MaterializeWSSchedule counts
    warps in whole warpgroups: the block's last is filled with idle warps, as role_based's)."""
    workers = [r for r in seed.roles if r.warp_lo < wide]
    if [(r.warp_lo, r.warp_hi) for r in workers] != [(0, wide)]:
        return None
    shift = wide - warps
    roles = tuple(replace(r, warp_hi=warps, max_nreg=0) if r.warp_lo < wide else replace(r, warp_lo=r.warp_lo - shift, warp_hi=r.warp_hi - shift, max_nreg=0) for r in seed.roles)
    return seed.with_(roles=roles, num_warps=whole_warpgroups(max(r.warp_hi for r in roles)))


def _launch_threads(func: Any) -> int | None:
    """The block's threads where it launches them along x alone (``T.Kernel(..., threads=n)``)."""
    block = _annotated_block(func)
    launch = [int(n) for n in block.annotations.get("tl.launch_threads", [])] if block is not None else []
    return launch[0] if len(launch) == 3 and launch[1:] == [1, 1] else None


def _with_threads(func: Any, threads: int) -> Any:
    """``func`` launched with ``threads`` threads: its block's launch annotation and, once
    MaterializeKernelLaunch has bound them, its threadIdx.x."""
    def launch(node: Any) -> Any:
        if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == "thread_extent" and node.node.thread_tag == "threadIdx.x":
            bound = tvm.tirx.IterVar(tvm.ir.Range(0, threads), node.node.var, node.node.iter_type, node.node.thread_tag)
            return tvm.tirx.AttrStmt(bound, node.attr_key, tvm.tirx.IntImm("int32", threads), node.body)
        return None

    func = func.with_body(stmt_functor.ir_transform(func.body, None, launch, ["tirx.AttrStmt"]))
    block = _annotated_block(func)
    return _with_block(func, block, annotations={**block.annotations, "tl.launch_threads": [threads, 1, 1]})


def _read_only_inputs(func: Any) -> set[Any]:
    """The data variables of the kernel's buffer parameters that it never writes."""
    params = [func.buffer_map[p] for p in func.params if p in func.buffer_map]
    unwritten = set(unwritten_params(func, tuple(range(len(params)))))  # one walk of the kernel, not one per parameter
    return {b.data for b in params if str(b.name) in unwritten}


def _only_an_operand(body: Any, buf: Any, read_only: set[Any]) -> bool:
    """Whether every access to ``buf`` is a copy of a read-only input into all of it or an
    MMA reading it as its first operand, and there is at least one of each."""
    accesses, copies, reads = 0, 0, 0

    def visit(node: Any) -> None:
        nonlocal accesses, copies, reads
        if (isinstance(node, (tvm.tirx.BufferLoad, tvm.tirx.BufferStore)) and node.buffer.same_as(buf)) or (isinstance(node, tvm.tirx.Var) and node.same_as(buf.data)):
            accesses += 1
        copy = _input_copy(node, read_only)
        call = node.value if isinstance(node, tvm.tirx.Evaluate) else None
        if copy is not None and copy[1].args[0].buffer.same_as(buf):
            copies += 1
        elif getattr(getattr(call, "op", None), "name", "") in _OPERAND_READERS and call.args and _is_region(call.args[0]) and call.args[0].args[0].buffer.same_as(buf):
            reads += 1

    stmt_functor.post_order_visit(body, visit)
    return copies > 0 and reads > 0 and accesses == copies + reads  # each region holds one load of its buffer


def _steering_loads(stmt: Any) -> set[Any]:
    """The buffers whose elements a guard, a loop bound or an index reads."""
    exprs: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, (tvm.tirx.IfThenElse, tvm.tirx.While)):
            exprs.append(node.condition)
        elif isinstance(node, tvm.tirx.For):
            exprs.extend([node.min, node.extent])
        elif isinstance(node, (tvm.tirx.BufferLoad, tvm.tirx.BufferStore)):
            exprs.extend(node.indices)

    stmt_functor.post_order_visit(stmt, visit)
    return {load.buffer.data for expr in exprs for load in _loads(expr)}


def _input_copy(stmt: Any, read_only: set[Any]) -> tuple[Any, Any] | None:
    """(source region, destination region) when ``stmt`` is a tile copy from a read-only
    input into the whole of a buffer."""
    regions = _copy_regions(stmt)
    if regions is None:
        return None
    src, dst = regions
    if src.args[0].buffer.data not in read_only or not _writes_whole(dst, dst.args[0].buffer):
        return None
    return src, dst


def _staged_copy(stmt: Any, read_only: set[Any]) -> tuple[Any, Any] | None:
    """(source region, destination buffer) when ``stmt`` copies a slice of a read-only
    input into the whole of a register buffer, its other extents all 1."""
    copy = _input_copy(stmt, read_only)
    if copy is None:
        return None
    src, buf = copy[0], copy[1].args[0].buffer
    if not buf.scope().startswith("local"):
        return None
    extents = [getattr(e, "value", None) for e in src.args[2:]]
    if [e for e in extents if e != 1] != [d for d in (int(d) for d in buf.shape) if d != 1]:
        return None
    return src, buf


def _reread(stmt: Any, buf: Any, src: Any) -> Any:
    """``stmt`` with each read of ``buf`` taken from the source region it was copied from."""
    start, extents = src.args[0], [getattr(e, "value", None) for e in src.args[2:]]
    spread = [d for d, e in enumerate(extents) if e != 1]  # the source's axes ``buf``'s long axes run along

    def swap(node: Any) -> Any:
        if not (isinstance(node, tvm.tirx.BufferLoad) and node.buffer.same_as(buf)):
            return None
        long_axes = [i for i, d in zip(node.indices, buf.shape) if int(d) != 1]
        indices = list(start.indices)
        for axis, index in zip(spread, long_axes):
            indices[axis] = indices[axis] + index
        load = tvm.tirx.BufferLoad(start.buffer, indices)
        return load if load.dtype == node.dtype else tvm.tirx.Cast(node.dtype, load)

    return stmt_functor.ir_transform(stmt, None, swap, ["tirx.BufferLoad"])


# What role_based is shown of a plain kernel, in this order (each keeps what it computes):
# dead loops out, register copies of inputs read in place, register MMA operands loaded
# through shared memory, reused buffers split, a choice of two tiles as one copy, else
# branches as guards, local variables picked under a guard as selects, global reads into
# local variables bound first, atomics as stand-ins.
_FOR_ROLE_BASED = (_drop_empty_loops, _inline_guarded_binds, _unstage_inputs, _stage_operands, _split_reuse, _join_branch_copies, _split_else, _unguard_local_stores, _bind_global_reads, _stand_in_atomics)


# Those of them that change how the kernel moves data serve tilelang's default lowering as
# well: with fused MoE's token rows staged through shared memory it is right (as written it
# is WRONG) and as fast as the best schedule; with block-causal attention's K and V joined into
# one copy each, 1.45x faster (H200 run 30). ws-tune measures that lowering as a candidate
# of its own wherever they change the kernel; each is named as a user would make it by hand.
_MOVES_DATA = (
    (_unstage_inputs, "a register copy of an input that steers loads is read from the input in place"),
    (_stage_operands, "an MMA operand loaded into registers goes through shared memory"),
    (_join_branch_copies, "a copy of one of two tiles, chosen by a condition, is one copy with the condition in its index"),
)


def rewritten(func: Any) -> Any:
    """The kernel with ws-tune's rewrites of how it moves data (structurally equal where none applies)."""
    return rewrites(func)[0]


def rewrites(func: Any) -> tuple[Any, list[str]]:
    """``rewritten(func)``, and what it changes: one line per rewrite that applies."""
    changes = []
    for rewrite, what in _MOVES_DATA:
        new = rewrite(func)
        if not tvm.ir.structural_equal(new, func):
            changes.append(what)
        func = new
    if any(not tvm.ir.structural_equal(rewrite(func), func) for rewrite, _ in _WHERE_UNSEEDED) and _unseeded(func):  # as prepare rewrites it
        otherwise = _seed_otherwise(func) or _narrow_otherwise(func)
        if otherwise is not None:
            func = otherwise.func
            changes.append(otherwise.what)
    return func, changes


def _unseeded(func: Any) -> bool:
    """Whether role_based gives a plain kernel no schedule, without failing."""
    try:
        return own_schedule(_role_based(func)[0]) is None
    except NoSeed:
        return False


_SKIPPED = "AutoWarpSpecialization skipped:"
# role_based names an op by its repr ('ir.Op(span=None, ..., name="tl.sync_grid", ...)'): by its name
_OP_REPR = re.compile(r"'ir\.Op\([^']*?name=\"([^\"]+)\"[^']*'")
_LOGGED_PREFIX = 60  # characters of an error's message that identify tilelang's log line of it
_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _stderr_lines() -> Iterator[list[str]]:
    """What is written to stderr in the block (by C++ code too: file descriptor 2, which no
    Python hook sees), as a list of lines filled when the block ends."""
    lines: list[str] = []
    with _stderr_lock, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines += sink.read().decode(errors="replace").splitlines()


def _unsaid(lines: list[str], error: str = "") -> list[str]:
    """A compile's stderr lines but those ws-tune says itself: role_based's skip reason (the
    seed said it, in prepare; not again per build) and tilelang's log line of ``error``,
    which it writes ("Fatal: ...") before raising it."""
    logged = error[:_LOGGED_PREFIX]
    return [line for line in lines if _SKIPPED not in line and not (logged and logged in line)]


# What tilelang logs of a kernel (a buffer read before it is written) it logs again at every
# build of every candidate: each text is passed on once per process, whatever its time stamp.
_TIME_STAMP = re.compile(r"^\[\d\d:\d\d:\d\d\] ")
_passed_on: set[str] = set()
_held: list[list[str]] | None = None  # while ``held_log`` keeps what is passed on


def pass_on(lines: Sequence[str]) -> None:
    if _held is not None:
        if lines:
            _held.append(list(lines))
        return
    text = "\n".join(_TIME_STAMP.sub("", line) for line in lines)
    if lines and text not in _passed_on:
        _passed_on.add(text)
        sys.stderr.write("\n".join(lines) + "\n")


@contextlib.contextmanager
def held_log() -> Iterator[list[list[str]]]:
    """What the block's compiles would pass on, kept for the caller to ``pass_on``: a compile
    worker's log goes to the tuning's process, which says each text once for all workers."""
    global _held
    outer, _held = _held, []
    try:
        yield _held
    finally:
        _held = outer


@contextlib.contextmanager
def role_based_skips() -> Iterator[list[str]]:
    """The reasons tilelang's role_based scheduler gives for skipping a kernel, in a
    list filled when the block ends. It gives them only as C++ warnings on stderr (no
    Python hook), once per point of a space and again per role_based build: ws-tune
    says it once, in its own one-line message. Whatever else is written goes through."""
    reasons: list[str] = []
    try:
        with _stderr_lines() as lines:
            yield reasons
    finally:
        other = []
        for line in lines:
            _, skip, reason = line.partition(_SKIPPED)
            reasons.append(_OP_REPR.sub(r"\1", reason.strip())) if skip else other.append(line)
        pass_on(other)


def attach(func: Any, schedule: Schedule) -> Any:
    block = _annotated_block(func)
    if block is None:
        raise CompilerError("kernel has no tilelang_root block to attach a schedule to (is it a T.Kernel?)")
    buffers = {str(b.name): b for b in block.alloc_buffers}
    try:
        ws = schedule_to_tvm(schedule, buffers)
    except CompilerError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise CompilerError(f"cannot build T.WSSchedule: {one_line(exc)}") from exc
    return _set_annotation(func, ws)


def _prefer_async(func: Any, ops: tuple[str, ...]) -> Any:
    """The element-wise loops ``ops`` marked as ``T.Parallel(..., prefer_async=True)`` marks
    them: tilelang's LowerTileOp then issues their global-to-shared copies by cp.async, and
    commits and waits for them before the role's next sync."""
    if not ops:
        return func
    found: set[str] = set()

    def prefer(loop: Any) -> Any:
        return tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, loop.thread_binding, {**loop.annotations, "parallel_prefer_async": True})

    def mark(node: Any) -> Any:  # the loop carries the op id, or a ``with T.ws_op(...)`` around it does
        op = _op_of(node)
        loop = node if isinstance(node, tvm.tirx.For) else getattr(node, "body", None)
        if op is None or op[0] not in ops or not isinstance(loop, tvm.tirx.For) or loop.kind != tvm.tirx.ForKind.PARALLEL:
            return None
        found.add(op[0])
        return prefer(node) if node is loop else tvm.tirx.AttrStmt(node.node, node.attr_key, node.value, prefer(loop))

    marked = func.with_body(stmt_functor.ir_transform(func.body, None, mark, ["tirx.For", "tirx.AttrStmt"]))
    missing = sorted(set(ops) - found)
    if missing:
        raise CompilerError(f"async copies: {', '.join(missing)} is no element-wise (T.Parallel) loop of the kernel")
    return marked


def verify(func: Any) -> None:
    """Run MaterializeWSSchedule alone: milliseconds, and it catches broken schedules."""
    try:
        tilelang.cuda.transform.MaterializeWSSchedule()(_prologue(func))
    except Exception as exc:  # noqa: BLE001
        raise ScheduleRejected(one_line(exc)) from exc


def lower_for(func: Any, lowering: Lowering, schedule: Schedule | None) -> tuple[Any, dict[str, Any]]:
    """The PrimFunc and pass configs that give the requested lowering."""
    if lowering is Lowering.WS:
        assert schedule is not None
        prepared, _ = prepare(func)
        return _with_role_order(_prefer_async(attach(prepared, schedule), schedule.async_copies), schedule), {}
    if lowering is Lowering.REFERENCE:
        raise CompilerError("the reference is the kernel file's own Python function; there is nothing to compile")
    if lowering is Lowering.REWRITTEN:
        return rewritten(strip(func)), {}
    configs = {Lowering.ROLE_BASED: ROLE_BASED_CONFIG, Lowering.NO_WS: NO_WS_CONFIG}
    return strip(func), configs.get(lowering, {})


def pass_configs_refusal(configs: dict[str, Any]) -> str | None:
    """Why a kernel file may not set these pass configs, or None: a name tilelang lacks, one
    ws-tune sets, or a value of the wrong type (found now, not in every build)."""
    known = tvm.transform.PassContext.list_configs()
    for key in configs:
        if key in LOWERING_CONFIGS:
            return f"{key!r} chooses the warp-specialization lowering, which ws-tune sets for each baseline and candidate"
        if key not in known:
            near = difflib.get_close_matches(key, list(known), n=1)
            return f"tilelang has no pass config {key!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
    try:
        tvm.transform.PassContext(config=configs)
    except Exception as exc:  # noqa: BLE001 - TVM checks each value's type here
        return one_line(exc).removeprefix("Check failed: (value != nullptr) is false: ")
    return None


def compile_kernel(func: Any, pass_configs: dict[str, Any] | None = None) -> Any:
    order = func.attrs.get(ROLE_ORDER_ATTR) if func.attrs is not None else None
    _planned.order = None if order is None else [(int(lo), int(hi)) for lo, hi in order]
    _planned.compiling = True  # the passes put in tilelang's pipeline below act on ws-tune's compiles only
    lines: list[str] = []
    try:
        with _stderr_lines() as lines:
            kernel = tilelang.compile(func, target=target(), pass_configs=pass_configs or None)
    except Exception as exc:  # noqa: BLE001
        message = one_line(exc)
        pass_on(_unsaid(lines, message))
        raise CompilerError(message) from exc
    finally:
        _planned.order, _planned.compiling = None, False
    pass_on(_unsaid(lines))
    _record_shared_memory(kernel)
    clash = barrier_clash(kernel.get_kernel_source())
    if clash:
        raise CompilerError(clash)
    return kernel


# tilelang 0.1.15 runs ThreadSync("shared") and ThreadSync("shared.dyn") as two passes, and each
# numbers the named barriers of its partial syncs from the same first id: two roles can then wait
# at one barrier, with different thread counts, which faults on the GPU ("an illegal instruction
# was encountered", H200 run 33: a gather by cp.async in a one-warp role beside a 256-thread
# Worker) and leaves the context unusable. Where the two passes' numbers meet, the first pass's
# barriers take ids above the second's (one pass numbers apart the thread ranges it syncs);
# ``barrier_clash`` refuses what is left.
_PARTIAL_SYNC = re.compile(r"__sync_thread_partial\((\d+), (\d+)\)")
NAMED_BARRIERS = 16  # bar.sync ids 0-15 on sm_90
_thread_sync = tilelang.transform.ThreadSync


def _partial_sync(node: Any) -> tuple[str, int] | None:
    """(scope, barrier id) of a partial sync that ThreadSync inserted, else None (a kernel's own
    sync at a barrier it computes, as a warpgroup's turn, is not one)."""
    if (isinstance(node, tvm.tirx.Call) and getattr(node.op, "name", "") == "tirx.tvm_storage_sync" and len(node.args) == 3
            and isinstance(node.args[1], tvm.tirx.IntImm)):  # fmt: skip
        return str(node.args[0].value), int(node.args[1])
    return None


def _renumber_barriers(func: Any, mod: Any, ctx: Any) -> Any:
    if not getattr(_planned, "compiling", False):
        return func
    ids: dict[str, set[int]] = {}
    stmt_functor.post_order_visit(func.body, lambda n: ids.setdefault(sync[0], set()).add(sync[1]) if (sync := _partial_sync(n)) else None)
    first, second = ids.get("shared", set()), ids.get("shared.dyn", set())
    if not first & second or max(second) + len(first) >= NAMED_BARRIERS:
        return func
    fresh = {old: max(second) + 1 + i for i, old in enumerate(sorted(first))}

    def renumber(node: Any) -> Any:
        sync = _partial_sync(node)
        if sync is None or sync[0] != "shared":
            return None
        return tvm.tirx.Call(node.dtype, node.op, [node.args[0], tvm.tirx.const(fresh[sync[1]], "int32"), node.args[2]])

    return func.with_body(stmt_functor.ir_transform(func.body, None, renumber, ["tirx.Call"]))


def _thread_sync_apart(storage_scope: str) -> Any:
    if storage_scope != "shared.dyn":
        return _thread_sync(storage_scope)
    renumber = tvm.tirx.transform.prim_func_pass(_renumber_barriers, opt_level=0, name="ws_tune.RenumberBarriers")
    return tvm.transform.Sequential([_thread_sync(storage_scope), renumber])


# tilelang's CUDA pipeline looks the pass up when it runs: the second sync pass, then the numbers.
tilelang.transform.ThreadSync = _thread_sync_apart


def barrier_clash(source: str) -> str | None:
    """Why a kernel's partial syncs cannot run (one named barrier, two thread counts), or None."""
    counts: dict[int, set[int]] = {}
    for barrier, threads in _PARTIAL_SYNC.findall(source):
        counts.setdefault(int(barrier), set()).add(int(threads))
    clashes = {b: sorted(n) for b, n in counts.items() if len(n) > 1}
    if not clashes:
        return None
    barrier, threads = min(clashes.items())
    return f"named barrier {barrier} synchronizes {' and '.join(map(str, threads))} threads (tilelang's two ThreadSync passes number barriers apart): it would fault on the GPU"


# --- shared memory across roles -------------------------------------------------
# MaterializeWSSchedule emits the roles as a chain of ``if threadIdx.x < ...`` branches, which
# tilelang's MergeSharedMemoryAllocations reads as one statement touching every buffer: no two
# buffers of a warp-specialized kernel shared space, where tilelang's default lowering puts an
# epilogue's staging tile over dead pipeline tiles (DeepSeek-V4's sparse attention, MLA decoding:
# H200 runs 25, 31). Inside a kWarpSpecializationScope, which tilelang's own producer/consumer
# pass emits, the planner reads the branches one after another. Where rules.shared_order finds
# an order of the roles in which that reading is sound, the branches are put in that order (each
# for the same threads) and marked so, just before the planner runs.
ROLE_ORDER_ATTR = "ws_tune.role_order"  # the roles' thread ranges, in the planner's order
WS_SCOPE = "kWarpSpecializationScope"
_planned = threading.local()  # what this thread's compile_kernel call asks of the passes below
_merge_shared_memory = tilelang.transform.MergeSharedMemoryAllocations


def _with_role_order(func: Any, schedule: Schedule) -> Any:
    """The kernel with the order in which the planner is to read its roles, where one is sound."""
    shared = frozenset(b.name for b in shared_buffers(func))
    order = rules.shared_order(rules.shared_uses(schedule, op_accesses(func), shared))
    if order is None:
        return func
    ranges = [[schedule.role(r).warp_lo * THREADS_PER_WARP, schedule.role(r).warp_hi * THREADS_PER_WARP] for r in order]
    return func.with_attr(ROLE_ORDER_ATTR, ranges)


def _role_branches(stmt: Any, lo: int, hi: int) -> list[tuple[int, int, Any]] | None:
    """The (first thread, end, body) of each branch of MaterializeWSSchedule's role chain
    over threads [lo, hi), or None where the chain has another form."""
    if not isinstance(stmt, tvm.tirx.IfThenElse):
        return [(lo, hi, stmt)]
    cond = stmt.condition
    if isinstance(cond, tvm.tirx.LT) and isinstance(cond.b, tvm.tirx.IntImm):  # tx < c: then, else the rest
        cut = int(cond.b.value)
        rest = [] if stmt.else_case is None else _role_branches(stmt.else_case, cut, hi)
        return None if rest is None else [(lo, cut, stmt.then_case), *rest]
    if isinstance(cond, tvm.tirx.LE) and isinstance(cond.a, tvm.tirx.IntImm) and stmt.else_case is None:  # c <= tx: idle below
        return [(int(cond.a.value), hi, stmt.then_case)]
    return None


def _idle(stmt: Any) -> bool:
    """A branch of warps that no role has: at most a register budget, no memory touched."""
    found = _nodes(stmt, lambda n: isinstance(n, (tvm.tirx.BufferLoad, tvm.tirx.BufferStore, tvm.tirx.Call)))
    return all(isinstance(n, tvm.tirx.Call) and getattr(n.op, "name", "").endswith("set_max_nreg") for n in found)


def _order_roles(func: Any, mod: Any, ctx: Any) -> Any:
    order = getattr(_planned, "order", None)
    if not order:  # a compile that asked for no order (every one outside compile_kernel, too)
        return func
    extents: dict[str, int] = {}
    stmt_functor.post_order_visit(func.body, lambda n: extents.setdefault(str(n.node.var.name), int(n.value)) if isinstance(n, tvm.tirx.AttrStmt) and n.attr_key == "thread_extent" and isinstance(n.value, tvm.tirx.IntImm) else None)

    def reorder(stmt: Any) -> Any:
        if not (isinstance(stmt, tvm.tirx.AttrStmt) and stmt.attr_key == "kCustomWarpSpecialization"):
            return None
        chain = stmt.body
        cond = chain.condition if isinstance(chain, tvm.tirx.IfThenElse) else None
        tx = cond.a if isinstance(cond, tvm.tirx.LT) else cond.b if isinstance(cond, tvm.tirx.LE) else None
        threads = extents.get(str(getattr(tx, "name", "")))
        branches = _role_branches(chain, 0, threads) if isinstance(tx, tvm.tirx.Var) and threads else None
        if branches is None:
            return None
        body = {(lo, hi): b for lo, hi, b in branches}
        rest = [(lo, hi) for lo, hi, b in branches if (lo, hi) not in order]
        if not set(order) <= set(body) or not all(_idle(body[r]) for r in rest):
            return None  # not the chain the order was planned for: left as it is, nothing shared
        rebuilt = None
        for lo, hi in reversed(order + rest):
            bounds = [c for c in (tvm.tirx.LE(tvm.tirx.const(lo, tx.dtype), tx) if lo else None, tvm.tirx.LT(tx, tvm.tirx.const(hi, tx.dtype)) if hi < threads else None) if c is not None]
            test = tvm.tirx.And(*bounds) if len(bounds) == 2 else bounds[0] if bounds else tvm.tirx.const(True, "bool")
            rebuilt = tvm.tirx.AttrStmt(tvm.tirx.const(0, "int32"), WS_SCOPE, 0, tvm.tirx.IfThenElse(test, body[(lo, hi)], rebuilt))
        return tvm.tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, rebuilt)

    return func.with_body(stmt_functor.ir_transform(func.body, None, reorder, ["tirx.AttrStmt"]))


def _merge_in_role_order(*args: Any, **kwargs: Any) -> Any:
    order = tvm.tirx.transform.prim_func_pass(_order_roles, opt_level=0, name="ws_tune.OrderRoles")
    return tvm.transform.Sequential([order, _merge_shared_memory(*args, **kwargs)])


# tilelang's CUDA pipeline looks the pass up when it runs: the order goes in just before it.
tilelang.transform.MergeSharedMemoryAllocations = _merge_in_role_order


# A static shared array of the generated code: its alignment, element type and length (the
# pipelines' mbarriers, ``__shared__ __align__(16) uint64_t smem_full_mem[3];``).
_STATIC_SHARED = re.compile(r"^\s*__shared__\s+__align__\((\d+)\)\s+(\w+)\s+\w+\[(\d+)\];", re.M)
_C_BYTES = {"uint64_t": 8, "int64_t": 8, "double": 8, "float": 4, "int": 4, "uint": 4, "int32_t": 4, "uint32_t": 4,
            "half_t": 2, "bfloat16_t": 2, "half": 2, "short": 2, "uchar": 1, "char": 1, "int8_t": 1, "uint8_t": 1}  # fmt: skip


# tilelang's cache keeps a kernel's code, not the lowered module that says how much shared
# memory its planner gave the block: ws-tune keeps that beside the code, in the cache entry.
# (A seed compiled first by the runner, as the anchor, came to the builder from the cache,
# and a 354 KB block reached the GPU: H100 run 42.)
SHARED_MEMORY_RECORD = "ws_tune_shared_memory"


def shared_memory(kernel: Any) -> int | None:
    """Bytes of shared memory a compiled kernel launches with: the dynamic buffer tilelang's
    planner sized, and the static arrays of its code (CUDA holds both to the 227 KB: a
    dynamic buffer of exactly 227 KB beside the mbarriers failed to launch, H100 run 42).
    From tilelang's cache, what ws-tune recorded when it compiled the kernel; None where
    neither says (another backend, a cache entry written without ws-tune)."""
    planned = _planned_shared_memory(kernel)
    if planned is not None:
        return planned
    record = _shared_memory_record(kernel)
    try:
        return int(record.read_text()) if record is not None else None
    except (OSError, ValueError):
        return None


def _planned_shared_memory(kernel: Any) -> int | None:
    try:
        sizes = [f.attrs.get("dyn_shared_memory_buf") for f in kernel.artifact.device_mod.functions.values() if f.attrs is not None]
    except Exception:  # noqa: BLE001 - loaded from the cache, or another backend
        return None
    dynamic = max((int(s) for s in sizes if s is not None), default=None)
    if dynamic is None:
        return None
    static = 0
    for align, kind, length in _STATIC_SHARED.findall(kernel.get_kernel_source()):
        static = -(-static // int(align)) * int(align) + _C_BYTES.get(kind, 8) * int(length)  # unknown types as the widest
    return dynamic + static


def _shared_memory_record(kernel: Any) -> Path | None:
    entry = getattr(kernel, "_tilelang_cache_path", None)  # tilelang 0.1.15's cache entry of this kernel
    return Path(entry) / SHARED_MEMORY_RECORD if entry else None


def _record_shared_memory(kernel: Any) -> None:
    planned, record = _planned_shared_memory(kernel), _shared_memory_record(kernel)
    if planned is not None and record is not None and record.parent.is_dir():
        with contextlib.suppress(OSError):  # a read-only cache: the builder then knows less, as before
            record.write_text(str(planned))


def code_hash(kernel: Any) -> str | None:
    """sha256 of a compiled kernel's generated device and host code: two candidates
    with equal hashes are one kernel (a parameter the schedule overrides), measured once."""
    try:
        text = kernel.get_kernel_source() + "\n// host\n" + kernel.get_host_source()
    except Exception:  # noqa: BLE001 - a backend without sources: no sharing, never a failure
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def one_line(exc: BaseException, limit: int = 600) -> str:
    """The informative line of a TVM / nvcc error (they come with backtraces and
    warnings): a failed check or error line, else the headline, where one ends
    with ":" to introduce the dump that follows (a layout conflict's fragments),
    else the last line."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pattern in (r"Check failed", r"\bfatal\b", r"\berror\b"):
        hits = [ln for ln in lines if re.search(pattern, ln, re.I) and "warning" not in ln.lower() and not ln.startswith("Compilation error")]
        if hits:
            return re.sub(r"^.*?(Check failed: )", r"\1", hits[0])[:limit]
    if len(lines) > 1 and lines[0].endswith(":"):
        return lines[0].rstrip(":")[:limit]
    return lines[-1][:limit]


# --- versions ---------------------------------------------------------------


def tilelang_version() -> str:
    return str(tilelang.__version__)


@functools.cache
def cuda_version() -> str:
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    for cmd in (nvcc, "nvcc"):
        try:
            out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        match = re.search(r"release (\d+\.\d+)", out)
        if match:
            return match.group(1)
    return "unknown"
