#!/usr/bin/env bash
# `check --grad` on one H100/H200: FLA 0.6's chunk_gated_delta_rule backward (its own kernels:
# FlashQLA dispatch off) in bfloat16 and float16, cold then warm, and FlashQLA's, directly and
# through FLA's dispatch. Detached, so that the work outlives one device call while the machine
# stays warm. AFTER_WARM: a command started once the timed cold and warm runs are done (the next
# GPU job, kept off the timed runs). Run from a copy outside the synced checkout (/tmp), as
#   bash scripts/gpu-machine/gpu_grad.sh --background        start the driver
#   bash scripts/gpu-machine/gpu_grad.sh --collect SECONDS   wait up to SECONDS for it, then pack $OUT
# Needs .whl/fqla (FlashQLA 0.1.3, TileLang 0.1.15 and their deps) and the FLA wheels .whl/*.whl,
# both built here by `bash scripts/gpu-machine/pack_carried.sh fla fqla` (scripts/gpu-machine/README.md, "FLA and FlashQLA")
# and installed into /tmp/fqsite: FLA 0.6.0 refuses its backward on Hopper
# with Triton < 3.7.1 unless TileLang is importable (it then runs chunk_bwd_dqkwg in TileLang),
# and TileLang's tvm-ffi cannot share a process with FlashInfer's site.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=/tmp/gpu_grad
mkdir -p "$OUT" "$LOGS"
pack() {
  grep -hE "^(gdn-verify|  grad_|FAILED|ERROR|  minimal|  likely|[0-9]+ passed|exit|\[FLA|backend|fla-|qla-)" "$LOGS"/*.log \
    | cut -c1-400 > "$OUT/summary.txt"
  tar -czf "$OUT/grad.tar.gz" -C "$LOGS" $(cd "$LOGS" && ls ./*.log ./*.json ./*.txt 2>/dev/null)
  cat "$OUT/summary.txt"
}
. "$(dirname "$0")/detached.sh"
detached "$@"
SITE=/tmp/fqsite
[ -f "$SITE/.fqla-site-complete" ] || SITE=$SITE bash .whl/fqla/install.sh || exit 3
[ -d "$SITE/fla" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 CUDA_HOME=/usr/local/cuda \
  TILELANG_CACHE_DIR=/tmp/tilelang-cache TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, numpy, importlib.metadata as m; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, *(p + ' ' + m.version(p) for p in ('fla-core', 'flash-qla', 'tilelang', 'apache-tvm-ffi')))"
} > "$LOGS/env.txt" 2>&1
check() {  # NAME ARGS...: one check --grad, its log and JSON
  local name=$1; shift
  local start=$(date +%s)
  timeout "${CHECK_TIMEOUT:-1500}" python3 cli.py check --grad --json "$LOGS/$name.json" --cases "$LOGS/cases" "$@" \
    > "$LOGS/$name.log" 2>&1
  echo "exit $? after $(( $(date +%s) - start )) s" >> "$LOGS/$name.log"
}
# The independent repro of what the checks reported (scripts/repro/fla_grad_repro.py: float64 torch
# autograd of the token loop, each kernel call in a subprocess of its own), beside the checks;
# REPRO=late starts it after the timed runs (it compiles FLA's kernels too), REPRO=0 not at all;
# REPRO_CASES (comma-separated, run in that order) picks its cases.
repro() {
  ( timeout 1500 python3 scripts/repro/fla_grad_repro.py "$LOGS/repro.json" ${REPRO_CASES:-} > "$LOGS/repro.log" 2>&1
    echo "exit $?" >> "$LOGS/repro.log" ) &
}
[ "${REPRO:-1}" = 1 ] && repro
# Cold (fresh Triton and TileLang caches) then the same command again (warm), one check at a time:
# on 2026-11-26 four checks compiling side by side took over 8 minutes for FLA's 4 classes.
export FLA_FLASH_QLA=0 TRITON_CACHE_DIR=/tmp/triton-fla
# GRAD_DIMS (e.g. "64,128"): head sizes for the timed runs; FLA 0.6's backward is wrong and can
# fault at V = 16 and 32 (reports/2026-11-26-fla-backward-findings/), which stops a default run at
# its first such example, so a complete run's cost needs sizes it handles
DIMS=${GRAD_DIMS:+--dims $GRAD_DIMS}
# TIMED=0 skips the timed cold and warm runs (their cost is measured once; reports/*-fla-grad-check/)
if [ "${TIMED:-1}" = 1 ]; then
  check fla-chunk-bf16-cold --impl fla-chunk --dtype bfloat16 --seed 1 $DIMS
  check fla-chunk-bf16-warm --impl fla-chunk --dtype bfloat16 --seed 1 $DIMS
fi
[ -n "${AFTER_WARM:-}" ] && (setsid nohup bash -c "$AFTER_WARM" > "$LOGS/after-warm.txt" 2>&1 < /dev/null &)
[ "${REPRO:-1}" = late ] && repro
# the rest side by side (their compile costs are not the measurement); GRAD_MORE picks them.
# SERIAL=1: one after another instead, each cold pool with the machine to itself (two cold pools
# of 15 workers each, plus the repro, drove the load to 57 on 16 cores on 2026-11-27).
# A job `sleep:N` waits N seconds before starting the jobs after it (e.g. past the cold pools before).
for job in ${GRAD_MORE-fp16 qla-bf16 qla-fp16 dispatch}; do
  case $job in
    bf16) check fla-chunk-bf16 --impl fla-chunk --dtype bfloat16 --seed 1 $DIMS & ;;  # untimed (TIMED=0)
    fp16) check fla-chunk-fp16 --impl fla-chunk --dtype float16 --seed 1 $DIMS & ;;
    fp32) check fla-chunk-fp32 --impl fla-chunk --dtype float32 --seed 1 $DIMS & ;;
    default) check fla-chunk-bf16-default --impl fla-chunk --dtype bfloat16 --seed 2 & ;;  # every head size
    qla-bf16) TRITON_CACHE_DIR=/tmp/triton-qla check flash-qla-bf16 --impl flash-qla --dtype bfloat16 --dims 128 --seed 1 & ;;
    qla-fp16) TRITON_CACHE_DIR=/tmp/triton-qla16 check flash-qla-fp16 --impl flash-qla --dtype float16 --dims 128 --seed 1 & ;;
    sleep:*) sleep "${job#sleep:}"; continue ;;
    dispatch) FLA_FLASH_QLA=1 TRITON_CACHE_DIR=/tmp/triton-dispatch \
      check fla-chunk-dispatch-bf16 --impl fla-chunk --dtype bfloat16 --dims 128 --seed 1 & ;;
  esac
  [ "${SERIAL:-0}" = 1 ] && wait $!  # this job only: the repro runs on beside
done
wait
