#!/bin/bash
# H200 run 43: the device side of one call. Usage: bash device.sh STEP...  (steps below; $OUT from the device tool)
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
    space) WS_TUNE_SPACE_SAMPLES=${S:-4} timeout ${TB} python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_space_gpu.py -k "${K:-not nothing}" > $OUT/space.log 2>&1; echo "rc $?" >> $OUT/space.log ;;
    v4) tune v4 280 tests/data/sparse_attn_v4.py@batch=1,seq=4096,seq_kv=8192,heads=128,dim=512,topk=1024 ;;
    dec) tune dec 280 tests/data/mla_decode.py@batch=132,seqlen_kv=8192 ;;
    la) tune la 280 tests/data/linear_attn.py@B=8,S=4096,H=16 ;;
    gg) tune gg 280 tests/data/gather_gemm.py@M=8192,N=8192,K=8192 ;;
    files) tune files ${FT:-540} $F ;;
    mla) tune mla 280 tests/data/sparse_mla.py@batch=1,seq=4096,seq_kv=8192,heads=128,topk=2048 ;;
    gemm) timeout ${GT:-300} python3 -u benchmarks/gemm_h200.py --out $OUT/gemm --budget ${N:-24} --time-budget $TB --jobs 15 --shapes ${G:-8192x8192x8192} > $OUT/gemm.log 2>&1; echo "rc $?" >> $OUT/gemm.log ;;
    attn) timeout ${AT:-440} python3 -u benchmarks/attention_h200.py --out $OUT/attn --budget ${N:-16} --time-budget $TB --jobs 15 \
            --only ${A:-S=8192,D=128,causal=0 S=4096,D=128,causal=1} > $OUT/attn.log 2>&1; echo "rc $?" >> $OUT/attn.log ;;
    *) echo "unknown step $step" >> $OUT/steps.log ;;
  esac
done
for f in $OUT/*/*/*.db $OUT/*/*.db; do [ -f "$f" ] && python3 benchmarks/trials_tsv.py --delete "$f"; done
# The tarball is written outside $OUT: one written into the folder it archives "changed as we read it" (rc 1).
cd $OUT && tar -czf /tmp/run.tgz . && mv /tmp/run.tgz $OUT/ && ls -la $OUT
