"""On a Hopper GPU: the candidates the schedule space generates compute what
their seed computes. For each seed shape (the attention and async GEMM
examples, and the space's test kernels: root-scope pipeline, role chain, two
consumer roles, an epilogue in a role of its own) it draws valid points,
builds them (verifier + nvcc) and runs the correctness gate. It prints, per
kernel, how many were rejected by the verifier and how many were WRONG; the
issue's goal is under 2% WRONG.

    python -m pytest -q -s tests/gpu/test_space_gpu.py

Skipped where no NVIDIA GPU is visible (tests/conftest.py)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.kernel import load_kernel
from ws_tuner.result import Status
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput
from ws_tuner.task import Task

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SAMPLES = int(os.environ.get("WS_TUNE_SPACE_SAMPLES", "40"))
CASES = {
    "attention": (ROOT / "examples" / "attention.py", "B=2,H=8,S=2048,D=128", {"block_N": (128,)}),
    "attention-causal-d64": (ROOT / "examples" / "attention.py", "B=2,H=8,S=2048,D=64,causal=1", {"block_N": (128,)}),
    # The cooperative role's warpgroups taking turns at barriers of the kernel's own (13 + its index): no
    # candidate compiled from stop 33's renumbering of ThreadSync's barriers until stop 42.
    "attention-alternating": (ROOT / "examples" / "attention.py", "B=2,H=8,S=2048,D=128", {"block_N": (128,), "consumers": ("alternating",)}),
    # block_K 64: at 128 the seed's 3 stages need 288 KB of shared memory and fail to launch, as they should
    # (the space's shallower candidates there fit; benchmarks/gemm_h200.py's GRID leaves it out for that).
    "gemm": (ROOT / "examples" / "gemm.py", "M=4096,N=4096,K=4096", {"block_M": (128,), "block_N": (256,), "block_K": (64,), "swizzle": (8,)}),
    "flash_fwd": (DATA / "flash_fwd.py", "B=2,H=8,S=2048,D=128", {}),
    "two_consumers": (DATA / "two_consumers.py", "M=4096,N=4096,K=4096", {}),
    # Stop 38: a hand-written producer that gathers A's rows by index (async.gather_a: cp.async or registers).
    "gather_gemm": (DATA / "gather_gemm.py", "M=4096,N=4096,K=4096", {}),
    "chain_gemm": (DATA / "chain_gemm.py", "M=4096,N=4096,K=4096", {}),
    "persistent_epilogue": (DATA / "persistent_epilogue.py", "M=4096,N=4096,K=4096", {}),
    # Written as new users would (H200 run 23): TMA im2col, fp8 operands, a loop whose loads and MMA
    # are conditional, an epilogue that reads global memory.
    "conv2d": (DATA / "conv2d.py", "N=32,C=128,H=32,W=32,F=256", {}),
    "fp8_gemm": (DATA / "fp8_gemm.py", "M=4096,N=4096,K=4096", {}),
    # threads=384: role_based's seed puts 12 warps on a 128x128 tile, which no wgmma split covers (a compile error).
    "blocksparse_gemm": (DATA / "blocksparse_gemm.py", "M=2048,N=2048,K=2048", {"threads": (256,)}),
    "bias_silu_gemm": (DATA / "bias_silu_gemm.py", "M=4096,N=4096,K=4096", {}),
    # Run 24: scales read from global memory inside the pipelined loop (DeepGEMM's 2xAcc); a symbolic M.
    "blockscaled_fp8_gemm": (DATA / "blockscaled_fp8_gemm.py", "M=2048,N=2048,K=2048", {}),
    "dynamic_gemm": (DATA / "dynamic_gemm.py", "M=2000,N=2048,K=2048", {}),
    # Stop 29: int4 weights dequantized in registers into the MMA's register operand; flash decoding
    # (two kernels in one function: the split attention, then the combine), S chained into P @ V.
    "w4a16_gemm": (DATA / "w4a16_gemm.py", "M=2048,N=2048,K=2048", {}),
    "gqa_decode": (DATA / "gqa_decode.py", "batch=16,seqlen_kv=4096", {}),
    # The latent tile read by both MMAs; 64x512 output accumulator (the spill and wgmma-register rules).
    # Two stages: 288 KB of tiles, launched with the output tile over Q's (rules.shared_order; 290 KB failed to launch before).
    "mla_decode": (DATA / "mla_decode.py", "batch=16,seqlen_kv=2048", {"out": ("own",), "num_stages": (2,)}),
    # Stop 30: kernels with atomics, seeded through stand-ins (role_based skips atomics): split-K
    # (RESET_TO_ZERO) and FlashAttention's backward (dQ by atomics, five MMAs, three outputs).
    "splitk_gemm": (DATA / "splitk_gemm.py", "M=2048,N=2048,K=4096", {}),
    "flash_bwd": (DATA / "flash_bwd.py", "batch=2,heads=8,seq_len=1024", {}),
    "flash_bwd-causal-d128": (DATA / "flash_bwd.py", "batch=2,heads=8,seq_len=1024,dim=128,causal=1", {}),
    # A state carried across the loop in a fragment; O added from shared memory by a tile atomic (a Store role's).
    "linear_attn": (DATA / "linear_attn.py", "B=2,S=2048,H=8", {}),
    # x transposed and scaled in registers into the MMA's register operand; a hand-annotated swizzle.
    "chunk_state": (DATA / "chunk_state.py", "batch=2,seqlen=2048", {}),
    # Block indices read in the loop, the body under an if on them (64 query heads per KV head: a warpgroup's rows).
    "nsa_fwd": (DATA / "nsa_fwd.py", "batch=1,seq_len=2048,heads=256,groups=64", {"threads": (128,)}),
    # Stop 31: stream-K (an if-else split into two guarded ifs; a while loop; a dynamic trip count),
    # attention with a sink and a sliding window (a key loop from the window's start, made 0-based),
    # two-pass RMSNorm (its x tile reused by the second loop, given a buffer per loop).
    # threads=256: at 128, block_N=256 puts a 128x256 fp32 accumulator on one warpgroup, and role_based's
    # seed fails in ptxas (C7600), as it should; at 4 stages its two loops' tiles need 256 KB of shared
    # memory and fail to launch. At block_N=256 the whole-tile wave runs no trips.
    "streamk_gemm": (DATA / "streamk_gemm.py", "M=2048,N=2048,K=2048", {"threads": (256,), "num_stages": (2, 3)}),
    "sink_attn": (DATA / "sink_attn.py", "batch=2,heads=8,seq_q=1024,seq_kv=2048", {}),
    "sink_attn-window": (DATA / "sink_attn.py", "batch=2,heads=8,seq_q=2048,seq_kv=2048,window=128", {}),
    "rmsnorm": (DATA / "rmsnorm.py", "M=4096,N=4096", {}),
    # Stop 32: block-sparse attention (each key block's loads guarded by a mask row copied into registers,
    # read in place from the input), DeepSeek-V3.2's sparse MLA (keys gathered element by element by index).
    "blocksparse_attn": (DATA / "blocksparse_attn.py", "batch=2,heads=8,seq=2048,topk=8", {}),
    "blocksparse_attn-dense": (DATA / "blocksparse_attn.py", "batch=2,heads=8,seq=2048,causal=0,topk=4", {}),
    "sparse_mla": (DATA / "sparse_mla.py", "batch=1,seq=512,seq_kv=1024,heads=128,topk=512", {}),
    # Stop 33: fused MoE's gate and up projections (the token rows an MMA operand read into registers,
    # staged through shared memory; experts of unequal sizes, rows masked at each expert's end).
    "fused_moe": (DATA / "fused_moe.py", "E=4,tokens=512,hidden=1024,expert=512,skew=1", {}),
    # Stop 34: a diffusion LLM's block-causal attention (K and V from one half or the other by an if-else,
    # joined into one copy; a key loop whose trip count depends on the block; boundary tiles masked).
    "block_causal_attn": (DATA / "block_causal_attn.py", "batch=2,heads=8,seq=2048,dim=128,dllm_block=16", {}),
    # Stop 35: DeepSeek-V4's sparse attention (its gather binds its own index: moved to the Load role; -1
    # padding masked; a sink), Kimi Delta Attention's chunked output (a gated q written in shared memory;
    # num_stages and threads only steer tilelang's own lowering: one candidate per kernel).
    "sparse_attn_v4": (DATA / "sparse_attn_v4.py", "batch=1,seq=256,seq_kv=2048,heads=64,dim=512,topk=512", {}),
    "kda_chunk_o": (DATA / "kda_chunk_o.py", "B=1,S=2048,H=8", {}),
    # Stop 36: a 2:4-sparse GEMM (T.gemm_sp: A compressed, its metadata E a third tile of the pipeline).
    "gemm_sp": (DATA / "gemm_sp.py", "M=1024,N=1024,K=1024", {}),
    # Stop 40: DeepSeek sparse attention's block-sparse MQA indexer (fp8; the pipeline inside a serial
    # loop over the picked key blocks, two tiles a block, its logits written to global memory each trip).
    "block_sparse_mqa": (DATA / "block_sparse_mqa.py", "seq=512,seq_kv=8192", {}),
    # DeepSeek's hyper-connections, post-mixing (memory-bound, no MMA; written back through shared memory).
    "mhc_post": (DATA / "mhc_post.py", "tokens=1024", {}),
    # MInference's vertical-slash attention (two pipelined loops with trip counts read per block: TMA at
    # indexed offsets, then columns gathered by index, which move to the Load role with their binds).
    "vs_sparse_attn": (DATA / "vs_sparse_attn.py", "batch=1,heads=4,seq=2048,slash=8,vertical=256", {}),
    # FlashAttention over packed sequences of different lengths (bounds from cu_seqlens; rows stored one by one).
    "varlen_attn-causal": (DATA / "varlen_attn.py", "batch=4,heads=4,max_seqlen=1024,causal=1", {}),
    # MLA decoding over a paged KV cache (each tile's page read from a block table in the loop; backwards).
    "mla_paged": (DATA / "mla_paged.py", "batch=16,seqlen=2048", {}),
    # Local variables computed from inputs before the loop, now in every role: DeepSeek-V3.2's lightning
    # indexer (its key range, reduced), a grouped GEMM (its group, picked by a scan under a guard).
    "lightning_indexer": (DATA / "lightning_indexer.py", "seq=1024", {}),
    "grouped_gemm-skew": (DATA / "grouped_gemm.py", "G=4,M=512,N=1024,K=1024,skew=1", {}),
    # Gated DeltaNet's WY recomputation (two pipelined loops, each scaling its tile in shared memory for its
    # MMA and storing its product through shared memory every trip: a Load and a Store role in each).
    "wy_fast": (DATA / "wy_fast.py", "B=1,S=4096,H=4", {}),
    # Stop 41: a legacy (v1) reducer, canonicalized to reducer v2 before role_based (which could not
    # parse it): gemv's row sums, all-reduced over the Worker role's threads alone.
    "gemv": (DATA / "gemv.py", "M=8192,N=8192", {}),
    # BitNet's prefill GEMM: 2-bit weights decoded shared-to-shared by the threads' own index (its role
    # kept on the seed's warps: the tid rule); tilelang's online softmax, its register loads staged
    # through shared tiles (role_based found nothing on chip to hand over).
    "bitnet_gemm": (DATA / "bitnet_gemm.py", "M=2048,N=2048,K=2048", {}),
    "online_softmax": (DATA / "online_softmax.py", "M=4096,N=8192", {}),
    # Hopper's bf16 x fp4 GEMM: each thread decodes its own packed bytes by inline PTX (the tid rule again).
    "fp4_gemm": (DATA / "fp4_gemm.py", "M=2048,N=2048,K=2048", {}),
    # Gated DeltaNet's chunk recurrence, seeded once its h store is taken from the state's fragment
    # (tilelang's own lowerings are WRONG past 0 stages: run 27); flash decoding for MHA (split KV, combine).
    "gdn_state": (DATA / "gdn_state.py", "B=2,S=2048,H=4", {}),
    "mha_decode_split": (DATA / "mha_decode_split.py", "batch=2,seqlen_q=128,seqlen_kv=8192", {}),
    # Gated DeltaNet's chunked output backward (dq, dk, dw, dg: four MMAs into register accumulators, dg reduced).
    "gdn_chunk_o_bwd": (DATA / "gdn_chunk_o_bwd.py", "B=1,S=4096,H=4", {}),
    # Kimi Delta Attention's chunk recurrence (seeded as gdn_state is); Mamba-2's chunk scan (it opts
    # out of setmaxnreg: no role gets a budget; a causal trip count per block).
    "kda_state": (DATA / "kda_state.py", "B=1,S=4096,H=4", {}),
    "mamba_chunk_scan": (DATA / "mamba_chunk_scan.py", "batch=2,seqlen=2048", {}),
    # GQA backward with dQ, dK and dV by TMA reductions, kept with the Worker that writes their tiles.
    "gqa_bwd": (DATA / "gqa_bwd.py", "batch=2,heads=32,seq_len=1024", {"block_M": (64,), "block_N": (32,)}),
    # Stop 42: Gated DeltaNet's backward through the recurrence (its dh and dv2 tiles written, stored and
    # read in one trip: both stores taken from their fragments); RetNet's chunked retention (q scaled in its load).
    "gdn_delta_bwd": (DATA / "gdn_delta_bwd.py", "B=1,S=2048,H=4", {}),
    "retention_fwd": (DATA / "retention_fwd.py", "B=2,S=2048,H=8", {}),
    # Attention with a sink, backward (four launches; dQ by atomics into a layout of its own); NSA decoding
    # (selected key blocks read by index under a guard; 64 query heads per KV head: a warpgroup's rows).
    "sink_attn_bwd": (DATA / "sink_attn_bwd.py", "batch=1,heads=8,seq_len=1024", {}),
    "nsa_decode": (DATA / "nsa_decode.py", "batch=8,seq_len=4096,heads=256,groups=64", {}),
    # SeerAttention's block-sparse attention (loads and MMAs of a key block under its mask bit); KDA's
    # intra-chunk backward (index arithmetic bound under an if, inlined: MaterializeWSSchedule refused it).
    "seer_attn": (DATA / "seer_attn.py", "batch=1,heads=8,seq_q=2048,seq_kv=2048,dim=128,topk=8", {}),
    "kda_bwd_intra": (DATA / "large" / "kda_bwd_intra.py", "B=1,S=2048,H=4", {"block_BC": (16,), "threads": (128,)}),
    # Stop 43: NSA's backward (a key block's K and V kept, every later query walked, its dQ rows added by
    # fp16 atomics under a mask read from global memory in the loop). Its example launches 32 threads:
    # seeded there, at 64 and in NSA decoding's 16 heads on the kernel's own warps (role_based's schedule
    # of the kernel at 128 threads, the other roles right after). KDA's inter-chunk backward (dq, dk, dw, dg).
    "nsa_bwd": (DATA / "nsa_bwd.py", "batch=1,seq_len=2048", {}),
    "nsa_decode-16": (DATA / "nsa_decode.py", "batch=8,seq_len=4096,heads=64,groups=16", {}),
    "kda_bwd_dqkwg": (DATA / "kda_bwd_dqkwg.py", "B=1,S=2048,H=4", {"block_DK": (64,), "block_DV": (64,), "num_stages": (1,)}),
    # Stop 44: DeepSeek-V3.2's sparse MLA backward (gathered keys, eight MMAs a step, a shared-staged
    # fp32 atomic epilogue in the loop; moves of the gathers and the atomics to roles of their own).
    "sparse_mla_bwd": (DATA / "sparse_mla_bwd.py", "batch=1,seq=512,seq_kv=1024,topk=256,heads=16,dim=256", {"block_size": (32,)}),
    # KDA's backward through the chunk recurrence (dh carried in a fragment, its shared tile stored and
    # read by the trip's first MMA; one shared tile for dv and dv2), at 32 threads narrowed after a rewrite.
    "kda_delta_bwd": (DATA / "kda_delta_bwd.py", "B=1,S=2048,H=4", {"block_DV": (32,), "num_stages": (0, 1), "threads": (32, 128)}),
    # tilelang's plain GQA forward (role_based's seed: Load and Store warps, one Worker; V one stage behind K reachable)
    "gqa_fwd": (DATA / "gqa_fwd.py", "batch=1,heads=32,seq_len=2048,dim=128,groups=8,is_causal=1", {}),
    # Stop 45: tilelang's MXFP4 GEMM (B dequantized by PTX twiddling in the loop; no register budgets at 512
    # threads) and DeepSeek-V3.2's indexer top-k (an MMA, then bitonic sorts through shared memory; indices exact up to ties).
    "mxfp4_gemm": (DATA / "mxfp4_gemm.py", "M=2048,N=2048,K=2048", {"block_K": (128,), "split": (1,), "threads": (256, 512)}),
    "indexer_topk": (DATA / "indexer_topk.py", "seq_len=2048", {}),
    # KDA's intra-chunk dv (A masked in place in shared memory before the loop; a tf32 MMA with A transposed)
    "kda_bwd_dv": (DATA / "kda_bwd_dv.py", "B=1,S=2048,H=4", {}),
    # Stop 46: DeepSeek HISA's pooled fp8 MQA scores (a pipelined loop whose start and trip count two
    # serial reductions set; a clearing kernel beside it).
    "pool_mqa_fp8": (DATA / "pool_mqa_fp8.py", "seq=4096", {}),
    # GDN's WY backward, second pass (two MMAs before the loop, three a trip; role_based's budgets undefined)
    "gdn_wy_fast_bwd": (DATA / "gdn_wy_fast_bwd.py", "S=4096", {}),
    # Stop 48: KDA's token-parallel intra-chunk A (opts out of setmaxnreg: the seed sets no budget), and
    # gpt-oss's GQA with sinks over packed sequences (a scalar max_seqlen_q argument, a sliding window).
    "kda_intra_token": (DATA / "kda_intra_token.py", "B=1,S=2048,H=16", {}),
    "kda_bwd_gla_da": (DATA / "kda_bwd_gla_da.py", "B=1,S=2048,H=16", {}),
    # GQA forward with its author's own T.Pipelined order/stage plan (only no_ws follows it), and
    # GQA backward over packed sequences (dQ, dK, dV reduced into by TMA atomics).
    "gqa_fwd_pipelined": (DATA / "gqa_fwd_pipelined.py", "batch=1,heads=32,seq_len=4096,groups=8", {}),
    "gqa_bwd_varlen": (DATA / "gqa_bwd_varlen.py", "batch=4,heads=32,seq_len=1024,causal=1", {}),
    "sink_gqa_varlen": (DATA / "sink_gqa_varlen.py", "batch=4,heads=32,q_seqlen=1024,k_seqlen=1024,groups=8,is_causal=1,window=128", {}),
    # Stop 49: its backward (dQ in a head-major layout, dK/dV added from shared memory), and FlashAttention's
    # wgmma backward (MMAs left in flight; its mma=sync twin has the seed).
    "sink_gqa_bwd_varlen": (DATA / "sink_gqa_bwd_varlen.py", "batch=4,heads=32,q_seqlen=1024,k_seqlen=1024,groups=8,is_causal=1,window=128", {}),
    "mha_bwd_wgmma": (DATA / "mha_bwd_wgmma.py", "batch=4,heads=16,seq_len=1024,causal=1", {"mma": ("sync",)}),
    # Block-sparse GQA decoding over a KV cache of varied lengths (key blocks read by index under a guard,
    # the parts combined by a second kernel; its example's fast math kept as PASS_CONFIGS). role_based seeds
    # it at one stage only (a guarded write would be versioned at two).
    "sparse_gqa_decode": (DATA / "sparse_gqa_decode.py", "batch=8,max_cache_seqlen=4096", {"num_split": (1, 4), "num_stages": (1,)}),
    # tilelang's hand-written ldmatrix/mma.sync GEMM (accumulator in T.alloc_local; its T.copy twin has the seed)
    "gemm_intrinsics": (DATA / "gemm_intrinsics.py", "M=2048,N=2048,K=2048", {"load": ("copy",), "num_stages": (2,)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_candidates_compute_what_the_seed_computes(name):
    path, shape, pinned = CASES[name]
    spec = load_kernel(path)
    task = Task.make(spec, spec.parse_problem(shape), {**spec.params, **pinned})
    space = task.space()
    rng = random.Random(0)
    seeds = [space.seed_candidate(p) for p in space.param_points() if not isinstance(space.shape(p), str)]
    # At most SAMPLES of them: attention's grid has hundreds of seed points, more than one device call
    # builds and runs (tests/gpu/test_examples.py runs every variant's seed).
    seeds = rng.sample(seeds, SAMPLES) if len(seeds) > SAMPLES else seeds
    drawn = {}
    for _ in range(20 * SAMPLES):
        point = space.random_point(rng)
        cand = space.candidate(point) if point else None
        if cand is not None and not isinstance(cand, str):
            drawn.setdefault(cand.hash, cand)
        if len(drawn) == SAMPLES:
            break
    cands = seeds + [c for h, c in drawn.items() if h not in {s.hash for s in seeds}]
    inputs = [BuildInput(str(spec.path), spec.source_hash, task.problem, c) for c in cands]
    with LocalBuilder(jobs=max(1, (os.cpu_count() or 2) - 2), timeout=600) as builder:
        builds = builder.build(inputs)
    config = EvaluatorConfig(timeout=60)
    results = {}
    with LocalRunner(0) as runner:
        for b in builds:
            if b.ok:
                results[b.candidate.hash] = runner.submit(RunInput(str(spec.path), spec.source_hash, task.problem, b.candidate, config)).result()
    rejected = [b for b in builds[len(seeds) :] if b.status is Status.REJECTED]
    seed_bad = [(s.describe(), results.get(s.hash)) for s in seeds if s.hash not in results or results[s.hash].status is not Status.OK]
    sampled = [results[c.hash] for c in cands[len(seeds) :] if c.hash in results]
    wrong = [r for r in sampled if r.status is Status.WRONG]
    other = [(r.status.value, r.message[:120]) for r in sampled if r.status not in (Status.OK, Status.WRONG)]
    print(f"\n{name}: {len(seeds)} seeds, {len(cands) - len(seeds)} sampled candidates: {len(rejected)} rejected by the verifier, "
          f"{len(wrong)} WRONG of {len(sampled)} run, other failures {other[:5]}")  # fmt: skip
    for r in wrong:
        print("  WRONG", r.message, next(c.describe() for c in cands if c.hash == r.candidate_hash))
    assert not seed_bad, seed_bad  # the seeds themselves must be right, or nothing below means anything
    assert not rejected, [b.message for b in rejected]
    assert len(wrong) <= 0.02 * max(len(sampled), 1), [r.message for r in wrong]
