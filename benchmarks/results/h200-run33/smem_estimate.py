"""The smem rule's count (``rules.shared_bytes``) against the block tilelang's planner gives
the compiled kernel (``compiler.shared_memory``), on random candidates of one kernel file,
on the CPU (run 33's README: 28 candidates of four files, equal or 2-3 KB under).

    python benchmarks/results/h200-run33/smem_estimate.py tests/data/sparse_attn_v4.py batch=1,seq=1024,seq_kv=4096,heads=64,topk=512 8
"""

import random
import sys

import tilelang

from ws_tuner import compiler, rules
from ws_tuner.kernel import load_kernel
from ws_tuner.task import Task


def main() -> None:
    path, shape, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tilelang.disable_cache()  # a cached kernel does not say what it allocates
    spec = load_kernel(path)
    task = Task.make(spec, spec.parse_problem(shape))
    space, rng = task.space(), random.Random(1)
    for _ in range(n):
        point = space.random_point(rng)
        candidate = None if point is None else space.candidate(point)
        if candidate is None or isinstance(candidate, str):
            continue
        shape_ = space.shape(point.params)
        depth = {b: p.depth for p in candidate.schedule.pipelines for b in p.buffers}
        sizes = {b: size * depth.get(b, 1) for b, size in shape_.info.shared_bytes.items()}
        counted = rules.shared_bytes(sizes, space._shared_uses(shape_, shape_.plan(point.layout, point.moved)))
        func, configs = task.lowered(candidate)
        planned = compiler.shared_memory(compiler.compile_kernel(func, configs))
        ordered = func.attrs is not None and compiler.ROLE_ORDER_ATTR in func.attrs
        print(f"rule {counted / 1024:6.1f} KB  planned {planned / 1024:6.1f} KB  every tile {sum(sizes.values()) / 1024:6.1f} KB  "
              f"{'ordered' if ordered else 'as emitted'}  {candidate.describe()}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
