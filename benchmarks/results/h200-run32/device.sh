#!/bin/bash
# H200 run 32: the device side of one call. Usage: bash device.sh STEP...  (steps below; $OUT from the device tool)
set -u
mkdir -p /tmp/site && tar -C /tmp/site -xJf .device-site/site312.tar.xz && python3 -m zipfile -e .device-site/ws_tune-0.1.0-py3-none-any.whl /tmp/site && rm -rf ws_tuner
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/gpu.txt
tune() {  # NAME SECONDS FILE@SHAPE[@PARAMS]...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 -u benchmarks/kernel_files_h200.py --out $OUT/$name --budget ${N:-24} --time-budget ${TB:-60} --jobs 15 "$@" > $OUT/$name.log 2>&1
  echo "rc $?" >> $OUT/$name.log
}
for arg in "$@"; do
  step=${arg%%:*}; TB=${arg#*:}; [ "$TB" = "$arg" ] && TB=60  # STEP[:TIME_BUDGET]
  case $step in
    space) WS_TUNE_SPACE_SAMPLES=6 timeout 280 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_space_gpu.py -k "${K:-sparse_attn_v4 or sparse_mla}" > $OUT/space.log 2>&1; echo "rc $?" >> $OUT/space.log ;;
    kda) tune kda 280 tests/data/kda_chunk_o.py@B=1,S=8192,H=64@block_DK=64 ;;
    v4) tune v4 280 tests/data/sparse_attn_v4.py@batch=1,seq=4096,seq_kv=8192,heads=128,dim=512,topk=1024 ;;
    mla) tune mla 280 tests/data/sparse_mla.py@batch=1,seq=4096,seq_kv=8192,heads=128,topk=2048 ;;
    bc) tune bc 300 tests/data/block_causal_attn.py@batch=4,heads=16,seq=8192,dim=128,dllm_block=32 ;;
    moe) tune moe 300 tests/data/fused_moe.py@E=8,tokens=2048,hidden=4096,expert=1024 ;;
    sp) tune sp 280 tests/data/gemm_sp.py@M=8192,N=8192,K=8192 ;;
    attn) timeout 440 python3 -u benchmarks/attention_h200.py --out $OUT/attn --budget ${N:-24} --time-budget $TB --jobs 15 \
            --only S=8192,D=128,causal=0 S=4096,D=128,causal=1 > $OUT/attn.log 2>&1; echo "rc $?" >> $OUT/attn.log ;;
    *) echo "unknown step $step" >> $OUT/steps.log ;;
  esac
done
for f in $OUT/*/*/*.db $OUT/*/*.db; do [ -f "$f" ] && python3 benchmarks/trials_tsv.py --delete "$f"; done
# The tarball is written outside $OUT: one written into the folder it archives "changed as we read it" (rc 1).
cd $OUT && tar -czf /tmp/run.tgz . && mv /tmp/run.tgz $OUT/ && ls -la $OUT
