"""Static rules about a block's resources, on a plain schedule: what the
verifier does not check and ptxas or the launch would refuse (or run badly).

- ``register_reason``: setmaxnreg budgets agree within a warpgroup, stay
  under ptxas' cap, move the way tilelang's instruction moves them (see
  ``launch_registers`` and ``raises_budget``), and fit the block's register pool (the
  sum over warps of max_nreg x 32 threads, within the launch's registers per thread x
  threads; a warp without a budget keeps its launch share);
- ``mma_reason``: each role's warps can split the accumulators its MMAs
  write, as tilelang's warp partition must, and split rows only where one
  MMA's accumulator feeds another's register operand;
- ``spill_reason``: each role's accumulators fit its registers per thread,
  and each warpgroup MMA instruction fits what the launch gives a thread;
- ``gather_reason``: a role of less than a warpgroup that gathers element by element
  starts at warp 0, where tilelang vectorises its gather;
- ``loop_reason``: each role's threads can share out its element-wise loops;
- ``shared_order`` and ``shared_bytes``: an order of the roles in which tilelang's
  shared-memory planner may read a warp-specialized kernel, and what the block then
  allocates (tilelang's linear scan: an epilogue's tiles over pipeline tiles dead by then).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from .schedule import ROOT_SCOPE, THREADS_PER_WARP, WARPS_PER_GROUP, OpAccess, Role, Schedule

REGISTER_FILE = 64 * 1024  # 32-bit registers per SM, and so per block
MAX_THREADS = 1024
PTXAS_MAX_NREG = 255  # setmaxnreg accepts 256, ptxas does not (TILELANG-WS.md)
WGMMA_MIN_ROWS = 64  # tilelang lowers a T.gemm of fewer rows to other MMAs
WGMMA_MAX_COLS = 256  # one wgmma instruction: m64 x n <= 256 per warpgroup
# Registers an m64nN wgmma needs beyond its accumulator: ptxas (C7602, "Insufficient
# registers (128) ... register target of 154 or higher") for m64n256 fp32 at 512 threads.
WGMMA_OVERHEAD = 26


SQUARE, FULL_ROW, FULL_COL = 0, 1, 2  # tilelang's GemmWarpPolicy


def kb_over(used: int, limit: int) -> str:
    """The comparison "X KB > Y KB", X with the decimals that tell it from Y (a block 300
    bytes over its 227 KB read "227 KB > 227 KB"), in bytes where none would."""
    for digits in (0, 1, 2):
        if round(used / 1024, digits) > limit / 1024:
            return f"{used / 1024:.{digits}f} KB > {limit // 1024} KB"
    return f"{used} bytes > {limit} bytes"


@dataclass(frozen=True, order=True)
class MmaTile:
    """The tile an MMA accumulates, its warp policy, and whether it is chained:
    its accumulator feeds a register operand, or its register operand is fed by
    an accumulator, through the role's fragments."""

    rows: int
    cols: int
    policy: int = SQUARE
    chained: bool = False
    bits: int = 32  # per accumulator element


def warp_partition(rows: int, cols: int, warps: int, policy: int = SQUARE, group: int = 1) -> tuple[int, int] | None:
    """(m, n) warps over rows and columns, as tilelang 0.1.15 picks them: each warp
    owning a multiple of 16 rows and 8 columns, m a multiple of ``group`` (4 for a
    warpgroup MMA: ComputeWgmmaWarpPartition; 1 for the others:
    ComputeDefaultWarpPartition); full row takes the largest m, full column the largest
    n, square the ratio nearest the tile's; None where none fits."""
    valid = [(m, warps // m) for m in range(group, warps + 1, group)
             if warps % m == 0 and rows % (16 * m) == 0 and cols % (8 * (warps // m)) == 0]  # fmt: skip
    if not valid:
        return None
    if policy == FULL_ROW:
        return max(valid)
    if policy == FULL_COL:
        return min(valid)
    return min(valid, key=lambda mn: abs(rows / (mn[0] * 16) / (cols / (mn[1] * 8)) - rows / cols))


def wgmma_partition(rows: int, cols: int, warps: int, policy: int = SQUARE) -> tuple[int, int] | None:
    return warp_partition(rows, cols, warps, policy, WARPS_PER_GROUP)


def is_wgmma(tile: MmaTile, warps: int) -> bool:
    """Whether tilelang lowers this MMA of a role of ``warps`` to warpgroup MMAs
    (under 64 rows, or with partial warpgroups, it uses other MMAs)."""
    return tile.rows >= WGMMA_MIN_ROWS and warps % WARPS_PER_GROUP == 0


def mma_reason(roles: Sequence[Role], tiles: dict[str, frozenset[MmaTile]]) -> str | None:
    """Whether each role's warps can split the accumulators its MMAs write
    (``warp_partition``), and, for chained MMAs, split rows only: an MMA reads its
    register operand's whole rows in each warp, so an accumulator whose columns are
    spread over warps cannot feed it (tilelang's layout inference reports a conflict;
    a 16-row MMA on more than one warp, as in sparse attention, has it too)."""
    for role in roles:
        warps = role.warps
        for tile in sorted(tiles.get(role.name, ())):
            wgmma = is_wgmma(tile, warps)
            split = warp_partition(tile.rows, tile.cols, warps, tile.policy, WARPS_PER_GROUP if wgmma else 1)
            if split is None:
                kind = "warpgroup MMA" if wgmma else "MMA"
                return f"mma: role {role.name}'s {warps} warps cannot split its {tile.rows}x{tile.cols} accumulator ({kind}: 16 rows x 8 columns per warp)"
            if tile.chained and split[1] > 1:
                across = "warpgroups" if wgmma else "warps"
                return (f"mma: role {role.name}'s {warps} warps would split its {tile.rows}x{tile.cols} accumulator {split[0]}x{split[1]}, "
                        f"columns across {across}, but it is chained to an MMA's register operand (rows only)")  # fmt: skip
    return None


def spill_reason(schedule: Schedule, words: dict[str, int], tiles: dict[str, frozenset[MmaTile]]) -> str | None:
    """Whether each role's MMA accumulators (``words`` of 32-bit registers per role) fit
    its budget per thread: its max_nreg, else what the launch gives. Past it ptxas
    spills the accumulator to local memory on every MMA (about 5x slower: TILELANG-WS.md);
    such a schedule runs, but never fast. And whether each warpgroup MMA instruction
    fits what the launch gives a thread: ptxas compiles every instruction within the
    launch bounds' registers, whatever setmaxnreg raises a role to later (C7602)."""
    start = launch_registers(schedule.threads)
    for role in schedule.roles:
        need = -(-words.get(role.name, 0) // (role.warps * THREADS_PER_WARP))
        budget = role.max_nreg or start
        if need > budget:
            return f"spill: role {role.name}'s accumulators take {need} registers per thread, more than its {budget}"
        for tile in sorted(tiles.get(role.name, ())):
            split = wgmma_partition(tile.rows, tile.cols, role.warps, tile.policy) if is_wgmma(tile, role.warps) else None
            cols = min(WGMMA_MAX_COLS, tile.cols // split[1]) if split else 0
            if cols and cols * tile.bits // 64 + WGMMA_OVERHEAD > start:
                return (f"registers: role {role.name}'s m64n{cols} MMA needs about {cols * tile.bits // 64 + WGMMA_OVERHEAD} registers per thread, "
                        f"more than the {start} that {schedule.threads} threads launch with")  # fmt: skip
    return None


def launch_registers(threads: int) -> int:
    """Registers per thread a kernel that uses setmaxnreg starts with: ptxas gives
    it all that ``__launch_bounds__(threads, 1)`` allows, in steps of 8 (168 at
    384 threads, as ptxas reports for such kernels)."""
    return min(PTXAS_MAX_NREG, REGISTER_FILE // threads) // 8 * 8


class _Fill(int):
    """The consumer budget choice ``FILL``: an int, so that it sits among the numbers of a
    decision's choices, named for what it stands for."""

    def __repr__(self) -> str:
        return "fill"

    __str__ = __repr__


# What the block's register pool leaves its consumers once the other warpgroups have their
# budgets: a number no fixed list holds where many warps share the pool. tilelang's
# role_based gives a 512-thread MXFP4 GEMM's four Worker warpgroups 112 so (beside a Load
# and Store warpgroup at 24, 640 threads starting at 96), and that ran 1.08x the same
# structure without budgets (H100, run 38); every choice of 160 and up overflows the pool.
FILL = _Fill(-1)
CONSUMER_MAX_NREG = 240  # the largest budget a fill gives: the largest fixed choice (SpaceConfig.consumer_nreg)


def fill_budgets(roles: Sequence[Role], num_warps: int) -> tuple[Role, ...]:
    """``roles`` with each ``FILL`` budget resolved: the warpgroups of such roles share, in
    equal parts, what the pool the block launches with leaves after the others' budgets (a
    warpgroup without one keeps what it starts with), down to a multiple of 8, at most
    ``CONSUMER_MAX_NREG``. A share no larger than the start is no budget at all (0)."""
    if all(r.max_nreg != FILL for r in roles):
        return tuple(roles)
    threads = num_warps * THREADS_PER_WARP
    start = launch_registers(threads)
    filled = {wg for r in roles if r.max_nreg == FILL for wg in r.warpgroups()}
    budgets = {wg: r.max_nreg for r in roles if r.max_nreg != FILL for wg in r.warpgroups()}
    others = sum(budgets.get(wg, 0) or start for wg in range(num_warps // WARPS_PER_GROUP) if wg not in filled)
    share = (start * threads - others * WARPS_PER_GROUP * THREADS_PER_WARP) // (len(filled) * WARPS_PER_GROUP * THREADS_PER_WARP) // 8 * 8
    nreg = min(share, CONSUMER_MAX_NREG) if share > start else 0
    return tuple(replace(r, max_nreg=nreg) if r.max_nreg == FILL else r for r in roles)


def raises_budget(budgets: dict[int, int], groups: int) -> tuple[int, dict[int, bool]]:
    """How tilelang 0.1.15's MaterializeWSSchedule moves each warpgroup's budget
    (``budgets``: warpgroup -> its roles' max_nreg, of ``groups`` warpgroups): up
    (setmaxnreg.inc) where it is at or above the mean over warpgroups, down (.dec)
    below it; a warpgroup of roles without a budget counts as 0, a warpgroup of no
    role takes the smallest budget (its avg_nreg_; later tilelang compares with a
    fixed 128 instead). Returns (mean, warpgroup -> raised)."""
    donor = min((n for n in budgets.values() if n), default=0)
    every = [budgets.get(wg, donor) for wg in range(groups)]
    mean = sum(every) // max(len(every), 1)
    return mean, {wg: nreg >= mean for wg, nreg in enumerate(every) if nreg}


def register_reason(schedule: Schedule) -> str | None:
    """Static register rules of a schedule: alignment of budgets, the ptxas cap, the direction
    setmaxnreg moves them, the register file."""
    asked: dict[int, set[int]] = {}  # warpgroup -> the budgets its roles ask for
    for role in schedule.roles:
        if role.warp_lo < 0 or role.warp_hi > schedule.num_warps or role.warp_lo >= role.warp_hi:
            return f"alignment: role {role.name} warps [{role.warp_lo},{role.warp_hi}) outside [0,{schedule.num_warps})"
        if role.max_nreg > PTXAS_MAX_NREG:
            return f"nreg: {role.name} max_nreg {role.max_nreg} > {PTXAS_MAX_NREG} (ptxas rejects it)"
        for wg in role.warpgroups():
            asked.setdefault(wg, set()).add(role.max_nreg)
    mixed = next((wg for wg, values in asked.items() if len(values) > 1), None)
    if mixed is not None:
        return f"alignment: roles sharing warpgroup {mixed} ask for different max_nreg {sorted(asked[mixed])}"
    budgets = {wg: next(iter(values)) for wg, values in asked.items()}
    groups = schedule.num_warps // WARPS_PER_GROUP
    start = launch_registers(schedule.threads)
    mean, raised = raises_budget(budgets, groups)
    for role in schedule.roles:
        # setmaxnreg.inc to fewer registers than a warp holds (or .dec to more) is
        # undefined: on the H200 such roles died with "illegal instruction".
        up = raised.get(role.warpgroups()[0])  # None: no budget, nothing moves
        if up is not None and (role.max_nreg < start if up else role.max_nreg > start):
            return (f"nreg: {role.name}'s max_nreg {role.max_nreg} is {'at or above' if up else 'below'} the mean budget {mean} of the block's "
                    f"warpgroups (one without a budget counts 0), so tilelang sets it by setmaxnreg.{'inc' if up else 'dec'}, which only "
                    f"{'raises' if up else 'lowers'}, but its threads start with {start} registers, {'more' if up else 'fewer'}: undefined")  # fmt: skip
    # The pool is what the block launched with, not the register file: setmaxnreg.inc waits
    # for registers that .dec has freed, so budgets over it hang (at 384 threads, 168 x 384
    # = 64512; 216/216/80 hung on the H200, run 29). A warp without a budget keeps its share.
    pool = start * schedule.threads
    budget = sum(budgets.get(warp // WARPS_PER_GROUP, 0) or start for warp in range(schedule.num_warps)) * THREADS_PER_WARP
    if budget > pool:
        return f"registers: sum of nreg x threads = {budget} > the {pool} the block launches with ({schedule.threads} threads x {start})"
    return None


def gather_reason(schedule: Schedule, gatherers: frozenset[str]) -> str | None:
    """Whether each role of less than a warpgroup that gathers loads element by element
    (through registers, into shared memory) starts at warp 0. Elsewhere tilelang 0.1.15
    keeps the warp's thread offset in the gather's swizzled shared-memory index, and at
    some layouts then vectorises nothing: 8 scalar loads and stores per 16 bytes where
    warp 0 issues one of each (the CUDA of sparse MLA's and DeepSeek-V4's gathers at head
    dim 512 from warps 1, 2, 8, 9 and 11; at dim 128, and for a warpgroup at warp 8, the
    accesses stay 16 bytes). DeepSeek-V4's ran 11x slower from warp 8 than from warp 0
    (19.9 against 217.7 TFLOP/s, H200 run 31). Warp 0 vectorised at every layout seen,
    and the schedule is otherwise the same, so nothing faster is lost."""
    for role in schedule.roles:
        if role.name in gatherers and role.warps < WARPS_PER_GROUP and role.warp_lo != 0:
            return (f"gather: role {role.name} gathers element by element in {role.warps} warp(s) from warp {role.warp_lo}; "
                    "tilelang vectorises such a gather at warp 0 only")  # fmt: skip
    return None


def loop_reason(schedule: Schedule, elements: dict[str, frozenset[int]]) -> str | None:
    """Whether each role's threads can share out its element-wise (T.Parallel) loops, of
    ``elements`` iterations per role. tilelang 0.1.15 lays a loop of E iterations over T
    threads where E <= T (one each, the rest idle) or T divides E; otherwise layout
    inference finds no layout ("no available layout found"). Seen in plain kernels: 512,
    640 and 8 x 1024 over 384 threads, 129 and 3 x 100 over 128, 160 over 96 fail; 8, 96,
    256, 768, 1152 over 384 and 100, 120, 384 over 128 build. RMSNorm's 12-warp Worker
    met it (stop 35's audit)."""
    for role in schedule.roles:
        threads = role.warps * THREADS_PER_WARP
        for n in sorted(elements.get(role.name, ())):
            if n > threads and n % threads:
                return f"loop: role {role.name}'s element-wise loop of {n} iterations: its {threads} threads neither cover nor divide them"
    return None


def thread_index_reason(schedule: Schedule, indexed: frozenset[str], seed: Schedule) -> str | None:
    """Whether each role that reads the thread index in the kernel's own code
    (``T.get_thread_binding``: a decode loop that picks its elements by thread) keeps
    the seed's warps. MaterializeWSSchedule places tilelang's tile ops on their role's
    threads, but leaves such a read the block's threadIdx: on other warps, or more of
    them, the code reads and writes outside its tiles (bitnet's 2-bit decode from warp
    8 read past its shared tile and never decoded the tile's start)."""
    warps = {r.name: (r.warp_lo, r.warp_hi) for r in seed.roles}
    for role in schedule.roles:
        if role.name in indexed and warps.get(role.name) != (role.warp_lo, role.warp_hi):
            where = f"the seed's warps {warps[role.name][0]}-{warps[role.name][1]}" if role.name in warps else "the seed's role"
            return (f"tid: role {role.name} reads the thread index in the kernel's own code, which the schedule does not renumber: "
                    f"it runs on warps {role.warp_lo}-{role.warp_hi}, not {where}")  # fmt: skip
    return None


@dataclass(frozen=True)
class SharedUse:
    """The shared buffers one role reads and writes, and ``steps``: those each statement of
    its root scope touches, in order, with whether the statement is a loop (a scope of its
    own, read through the role's body there)."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    steps: tuple[tuple[frozenset[str], bool], ...] = ()

    @property
    def touched(self) -> frozenset[str]:
        return self.reads | self.writes


def shared_uses(schedule: Schedule, accesses: dict[str, OpAccess], shared: frozenset[str]) -> dict[str, SharedUse]:
    """Each role's ``SharedUse``, from its ops in the root scope in order."""
    scopes = {s.id: s for s in schedule.scopes}

    def touched(role: str, instr: str) -> tuple[frozenset[str], frozenset[str]]:
        if instr in scopes and instr != ROOT_SCOPE:
            found = [touched(role, i) for i in scopes[instr].body(role) if isinstance(i, str)]
            return frozenset().union(*(r for r, _ in found)), frozenset().union(*(w for _, w in found))
        acc = accesses.get(instr, OpAccess())
        return acc.reads & shared, acc.writes & shared

    uses = {}
    for role in schedule.roles:
        body = [i for i in (scopes[ROOT_SCOPE].body(role.name) if ROOT_SCOPE in scopes else ()) if isinstance(i, str)]
        ops = [(i in scopes or accesses.get(i, OpAccess()).loop, *touched(role.name, i)) for i in body]
        uses[role.name] = SharedUse(
            reads=frozenset().union(*(r for _, r, _ in ops)),
            writes=frozenset().union(*(w for _, _, w in ops)),
            steps=tuple((r | w, loop) for loop, r, w in ops if r | w),
        )
    return uses


def shared_order(uses: dict[str, SharedUse]) -> tuple[str, ...] | None:
    """The roles in an order in which every shared buffer's accesses follow one another in
    time, or None: loaders (they only write, tiles the computing role reads), the one
    computing role, storers (they only read, tiles it writes).

    tilelang's MergeSharedMemoryAllocations reads a warp-specialized kernel's role branches
    one after another and lets two buffers share space where their spans of that reading do
    not meet. Branches run at once, so that is sound only in such an order: a loader's
    every write is waited for before the computing role's last read of it (pipelines hand
    over every version), and a storer reads only what that role wrote; what the computing
    role alone touches is in its program order. Roles that touch no shared memory come last."""
    loaders, computing, storers = _parts(uses)
    if len(computing) != 1:
        return None
    main = uses[computing[0]]
    if any(not uses[n].writes <= main.reads for n in loaders) or any(not uses[n].reads <= main.writes for n in storers):
        return None
    return (*loaders, computing[0], *storers, *(n for n in uses if not uses[n].touched))


def _parts(uses: dict[str, SharedUse]) -> tuple[list[str], list[str], list[str]]:
    """The roles that touch shared memory: loaders (write only), computing, storers (read only)."""
    active = [name for name, use in uses.items() if use.touched]
    loaders = [n for n in active if not uses[n].reads]
    storers = [n for n in active if not uses[n].writes]
    return loaders, [n for n in active if n not in loaders and n not in storers], storers


# tilelang's planner aligns each buffer (16 bytes; TMA tiles 1024, which their sizes keep).
SHARED_ALIGN, TILE_ALIGN = 16, 1024


def shared_bytes(sizes: dict[str, int], uses: dict[str, SharedUse] | None = None) -> int:
    """Shared memory the block allocates (``sizes``: bytes per buffer, versions included).

    Where the roles' ``uses`` have a ``shared_order``, as tilelang's MergeSharedMemoryAllocations
    plans it: each buffer live from the first to the last statement that touches it, in the
    roles' bodies read one after another (a loop is two statements, its start and its end),
    packed by ``_linear_scan``. So an epilogue's tiles go over pipeline tiles dead by then,
    adjacent ones joined. Elsewhere no two buffers share space."""
    order = shared_order(uses) if uses else None
    if order is None:
        return sum(sizes.values())
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    at = 0
    for role in order:
        for touched, loop in uses[role].steps:
            for buf in touched:
                first.setdefault(buf, at)
                last[buf] = at + loop + 1
            at += loop + 1
    # A buffer no op touches (code outside the ops) is taken as live throughout.
    intervals = [(first.get(b, 0), last.get(b, at + 1), size, b) for b, size in sizes.items()]
    return _linear_scan(intervals)


def _linear_scan(intervals: list[tuple[int, int, int, str]]) -> int:
    """The arena size of tilelang's LinearScanPack over (start, end, bytes, name) intervals:
    in order of start (larger first), each buffer takes the free block that wastes least once
    those ended by its start are freed (free blocks joined when adjacent), else extends a free
    block at the top of the arena, else goes on top."""
    free: list[list[int]] = []  # [offset, size], sorted by offset, adjacent ones joined
    live: list[tuple[int, int, int]] = []  # (end, offset, size)
    top = 0

    def release(offset: int, size: int) -> None:
        free.append([offset, size])
        free.sort()
        joined = [free[0]]
        for block in free[1:]:
            if joined[-1][0] + joined[-1][1] >= block[0]:
                joined[-1][1] = max(joined[-1][0] + joined[-1][1], block[0] + block[1]) - joined[-1][0]
            else:
                joined.append(block)
        free[:] = joined

    def aligned(offset: int, align: int) -> int:
        """The first offset from ``offset`` a buffer of that alignment may take; the gap before it is freed."""
        at = offset + (-offset % align)
        if at > offset:
            release(offset, at - offset)
        return at

    for start, end, size, _ in sorted(intervals, key=lambda i: (i[0], -i[2], i[3])):
        for done in sorted(x for x in live if x[0] <= start):
            live.remove(done)
            release(done[1], done[2])
        align = TILE_ALIGN if size % TILE_ALIGN == 0 else SHARED_ALIGN
        fits = [(b[1] - size, n) for n, b in enumerate(free) if b[1] - (-b[0] % align) >= size]
        if fits:
            block = free.pop(min(fits)[1])
            offset = aligned(block[0], align)
            if block[0] + block[1] > offset + size:
                release(offset + size, block[0] + block[1] - offset - size)
        elif free and sum(free[-1]) == top and free[-1][0] + (-free[-1][0] % align) < top:
            offset = aligned(free.pop()[0], align)  # the free block at the top grows
            top = offset + size
        else:
            offset = aligned(top, align)
            top = offset + size
        live.append((end, offset, size))
    return top
