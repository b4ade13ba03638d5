#!/usr/bin/env bash
# The scale tier, the guarded-memory properties and memcheck on one H100/H200, detached so that the
# work outlives one device call (10 min) while the machine stays warm.
# Usage (repo root, on the device machine):
#   bash scripts/gpu-machine/gpu_scale.sh --background main|flashinfer   start a driver; `flashinfer` waits for a
#                                                          running `main`, then runs FlashInfer's
#   bash scripts/gpu-machine/gpu_scale.sh --collect SECONDS           wait up to SECONDS for the drivers, then pack
# Knobs: SCALE_IMPLS entries are IMPL or IMPL:case,case (a rerun of some cases); GUARD_IMPLS=""
# and MEMCHECK=0 skip the guarded runs and memcheck; GRID_REPRO=1 first runs scripts/repro/fla_grid_repro.py.
# FI_GUARD_IMPLS (default FI_IMPLS) the FlashInfer guarded runs; FI_REPRO cases of scripts/repro/limits_repro.py
# run after FlashInfer's tier. An empty list (GUARD_IMPLS="") runs none. Run it from a copy outside the synced checkout (/tmp): a
# later device call that does not carry a folder removes it.
# Carried: .whl/*.whl (FLA), .whl/vllm_fla (vLLM's ops), and for `flashinfer` the site that
# .whl/gpu1/install1.sh and .whl/gpu2/install.sh unpack into /tmp/site (two calls, one machine).
# Logs and JSON in /tmp/gpu_scale; packing writes $OUT/scale.tar.gz and $OUT/summary.txt.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=/tmp/gpu_scale
mkdir -p "$OUT" "$LOGS"
SCALE_IMPLS=${SCALE_IMPLS-"cupy cupy-chunk fla-recurrent fla-chunk vllm-recurrent vllm-chunk"}
GUARD_IMPLS=${GUARD_IMPLS-"cupy cupy-chunk fla-recurrent fla-chunk vllm-recurrent vllm-chunk vllm-spec vllm-sigmoid-spec vllm-sigmoid-recurrent vllm-packed-decode"}
FI_IMPLS=${FI_IMPLS-"flashinfer-decode flashinfer-decode-bf16 flashinfer-prefill flashinfer-prefill-cp flashinfer-mtp"}
GUARDED=guarded_inputs,spec_guarded_pool,spec_decode_stream
CASES=scale_decode_batch,scale_varlen_many_short,scale_many_chunks,scale_batch_offset,scale_varlen_offset,scale_long_sequence

pack() {
  { cat "$LOGS/env.txt" 2>/dev/null
    for f in "$LOGS"/*.log; do
      [ -e "$f" ] || continue
      echo "== $(basename "$f")"
      grep -E "^(FAILED|ERROR|TIMEOUT|  minimal example|  [a-z_]+ +(passed|failed|error|timeout|unsupported)|[0-9]+ (passed|failed)|exit|gdn-verify check)" "$f" | cut -c1-600 | head -40
    done
    [ -f "$LOGS/limits_repro.log" ] && { echo "== limits_repro.log"; tail -n 30 "$LOGS/limits_repro.log"; }; } > "$OUT/summary.txt"
  # not the oracle cache (GBs: packing it outran a 10-minute device call, 2026-11-26) nor the cases
  tar -czf "$OUT/scale.tar.gz" --exclude=oracle-cache --exclude="*.npz" -C /tmp gpu_scale
  cat "$OUT/summary.txt"
}
case ${1:-} in
  --background)
    shift
    OUT=$LOGS setsid nohup bash "$0" "${1:-main}" > "$LOGS/driver-${1:-main}.txt" 2>&1 < /dev/null &
    echo $! >> "$LOGS/drivers.pid"; echo "started driver $!"; exit 0 ;;
  --collect)
    for _ in $(seq "${2:-540}"); do
      alive=0; for pid in $(cat "$LOGS/drivers.pid" 2>/dev/null); do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break; sleep 1
    done
    [ "${alive:-0}" = 1 ] && echo "drivers still running: packing what is there"
    pack; exit 0 ;;
esac
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/fla ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PYTHONPATH:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
[ -d .whl/vllm_fla ] && export GDN_VERIFY_VLLM_OPS=$PWD/.whl/vllm_fla
export GDN_VERIFY_SCALE_CACHE=$LOGS/oracle-cache  # one oracle per scale case on this machine, whatever the implementation
export FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws
check() {  # IMPL NAME ARGS...: one check, its log and JSON
  local impl=$1 name=$2; shift 2
  local start=$(date +%s)
  timeout "${CHECK_TIMEOUT:-1500}" python3 cli.py check --impl "$impl" --dtype bfloat16 --json "$LOGS/$name.json" \
    --cases "$LOGS/cases" "$@" > "$LOGS/$name.log" 2>&1
  echo "exit $? after $(( $(date +%s) - start )) s" >> "$LOGS/$name.log"
}
scale() {  # IMPL or IMPL:case,case
  local impl=${1%%:*} cases=$CASES
  [ "$impl" != "$1" ] && cases=${1#*:}
  check "$impl" "scale-$impl" --properties "$cases" --timeout 60 --seed 1  # one seed: one oracle per case (the cache)
}
if [ "${1:-}" = flashinfer ]; then
  python3 -c "import flashinfer, importlib.metadata as m; print('flashinfer', m.version('flashinfer-python'))" \
    >> "$LOGS/env.txt" 2>&1
  # small problems beside main's scale tier; the scale cases one large case at a time, after main's
  for impl in ${FI_GUARD_IMPLS-$FI_IMPLS}; do check "$impl" "guard-$impl" --properties "$GUARDED" --seed 1 --dims 128; done
  while [ -n "$(pgrep -f 'gpu_scale.sh main' || true)" ]; do sleep 5; done
  for impl in $FI_IMPLS; do scale "$impl"; done
  # FI_REPRO: cases of scripts/repro/limits_repro.py run after the tier (the direct confirmation of a failure)
  if [ -n "${FI_REPRO:-}" ]; then
    timeout 900 python3 scripts/repro/limits_repro.py $FI_REPRO > "$LOGS/limits_repro.log" 2>&1; echo "exit $?" >> "$LOGS/limits_repro.log"
  fi
  exit 0
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, cupy, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
  python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
  head -n 1 .whl/vllm_fla/MANIFEST.txt 2>/dev/null; which compute-sanitizer; } > "$LOGS/env.txt" 2>&1
# the torch path at small limits first (seconds): a bug in the tier shows before the hour of GPU time
timeout 600 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_scale.py > "$LOGS/smoke.log" 2>&1
echo "exit $?" >> "$LOGS/smoke.log"
# small problems, many at once beside the scale tier: the guarded properties, then memcheck on ours
( if [ "${GRID_REPRO:-0}" = 1 ]; then  # a few GB beside the scale tier
    timeout 400 python3 scripts/repro/fla_grid_repro.py > "$LOGS/fla_grid_repro.log" 2>&1; echo "exit $?" >> "$LOGS/fla_grid_repro.log"
  fi &
  for impl in $GUARD_IMPLS; do check "$impl" "guard-$impl" --properties "$GUARDED" --seed 1 & done; wait
  [ "${MEMCHECK:-1}" = 1 ] && check cupy memcheck-cupy --sanitize --properties "$GUARDED,matches_reference,spec_decode_slots" --max-examples 6 --dims 64 --seed 1 &
  [ "${MEMCHECK:-1}" = 1 ] && check cupy-chunk memcheck-cupy-chunk --sanitize --properties "guarded_inputs,matches_reference,varlen_equals_separate" --max-examples 6 --dims 64 --seed 1 &
  wait ) &
guards=$!
# the scale tier: one implementation at a time (a case takes up to ~60 GB)
for impl in $SCALE_IMPLS; do scale "$impl"; done
wait $guards
