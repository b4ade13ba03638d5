#!/usr/bin/env bash
# Default `check` runs of GPU implementations, many at once on one GPU machine, with their logs packed.
# Usage (repo root, on the device machine):
#   bash scripts/gpu-machine/gpu_checks.sh STEP [STEP ...]          run the steps, then pack
#   bash scripts/gpu-machine/gpu_checks.sh --background STEP ...    the same in a detached process (outlives the command)
#   bash scripts/gpu-machine/gpu_checks.sh --collect SECONDS        wait up to SECONDS for a detached run, then pack
# A STEP is IMPL:DTYPE:SEED (e.g. fla-chunk:bfloat16:1), `wait` (for the runs started so far) or
# warm:IMPL:DTYPE (scripts/warm_pool.py). IMPL:DTYPE:SEED runs start at once, in parallel (one NumPy
# thread each); `wait` and warm steps wait for them.
# Carried wheels in .whl/ are installed once into /tmp/site (scripts/gpu-machine/common.sh). Logs and JSON go to /tmp/gpu_checks;
# packing writes $OUT/checks.tar.gz and $OUT/summary.txt (the device tool returns 8 files at most).
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=/tmp/gpu_checks
mkdir -p "$OUT" "$LOGS"
pack() {
  { cat "$LOGS/env.txt" 2>/dev/null
    for f in "$LOGS"/check-*.log; do
      [ -e "$f" ] || continue
      echo "== $(basename "$f")"
      grep -E "^(FAILED|ERROR|TIMEOUT|  likely cause|  kind|  minimal example|[0-9]+ passed|exit|  [a-z_]+ +(failed|error|timeout))" "$f" | cut -c1-400 | head -60
    done
    tail -n 5 "$LOGS"/warm-*.log 2>/dev/null; } > "$OUT/summary.txt"
  tar -czf "$OUT/checks.tar.gz" -C /tmp gpu_checks
  cat "$OUT/summary.txt"
}
case ${1:-} in
  --background)
    shift
    OUT=$LOGS setsid nohup bash "$0" "$@" > "$LOGS/driver.log" 2>&1 < /dev/null &
    echo $! > "$LOGS/driver.pid"; echo "started driver $(cat "$LOGS/driver.pid")"; exit 0 ;;
  --collect)
    for _ in $(seq "${2:-540}"); do kill -0 "$(cat "$LOGS/driver.pid" 2>/dev/null)" 2>/dev/null || break; sleep 1; done
    kill -0 "$(cat "$LOGS/driver.pid" 2>/dev/null)" 2>/dev/null && echo "driver still running: packing what is there"
    pack; exit 0 ;;
esac
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
. "$(dirname "$0")/common.sh"  # PYTHONPATH, and the carried wheels installed once into /tmp/site
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, cupy, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'numpy', numpy.__version__)"
  python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1; } > "$LOGS/env.txt" 2>&1
pids=()
flush() { for pid in "${pids[@]}"; do wait "$pid"; done; pids=(); }
for step in "$@"; do
  IFS=: read -r what a b <<< "$step"
  case $what in
    wait) flush ;;
    warm) flush; timeout "${WARM_TIMEOUT:-400}" python3 scripts/warm_pool.py --impl "$a" --dtype "$b" --processes "${WARM_PROCESSES:-16}" > "$LOGS/warm-$a-$b.log" 2>&1 ;;
    *) name="check-$what-$a-$b"
       ( start=$(date +%s)
         timeout "${CHECK_TIMEOUT:-900}" python3 cli.py check --impl "$what" --dtype "$a" --seed "$b" --json "$LOGS/$name.json" \
           --cases "$LOGS/cases-$name" 2>&1 | grep -v "^  running"
         echo "exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" ) > "$LOGS/$name.log" 2>&1 &
       pids+=($!) ;;
  esac
done
flush
pack
