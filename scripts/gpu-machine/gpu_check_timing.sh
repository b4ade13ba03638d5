#!/usr/bin/env bash
# What a check of a JIT-compiled kernel costs on one H100/H200, cold then warm: `check --impl
# fla-chunk --dtype bfloat16` with the defaults (fresh Triton cache and plans folder, then the same
# command again), the same for vllm-chunk, then a cProfile of a warm matches_reference. Each run's
# JSON carries the split (compile, kernel, oracle, causes, ours). Detached, so that the work outlives
# one device call while the machine stays warm. Run from a copy outside the synced checkout (/tmp):
#   bash scripts/gpu-machine/gpu_check_timing.sh --background      start the driver
#   bash scripts/gpu-machine/gpu_check_timing.sh --collect SECONDS wait up to SECONDS for it, then pack $OUT
# AFTER_WARM: a command the driver starts once fla-chunk's warm run is done (the next GPU job, so
# that it does not share the machine with the timed runs); VLLM=0 stops after it. Carried: .whl/*.whl (FLA), .whl/vllm_fla.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=/tmp/gpu_check_timing
mkdir -p "$OUT" "$LOGS"
pack() {
  grep -hE "^(gdn-verify|  [a-z_]+ +(passed|failed|error|timeout|unsupported)|FAILED|ERROR|shapes:|time:|[0-9]+ passed|exit)" \
    "$LOGS"/*.log | cut -c1-400 > "$OUT/summary.txt"
  tar -czf "$OUT/timing.tar.gz" -C "$LOGS" $(cd "$LOGS" && ls ./*.log ./*.json ./*.txt ./*.prof 2>/dev/null)
  cat "$OUT/summary.txt"
}
. "$(dirname "$0")/detached.sh"
detached "$@"
SITE=/tmp/site
[ -d "$SITE/fla" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1 GDN_VERIFY_VLLM_OPS=$PWD/.whl/vllm_fla
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  python3 -c "import torch, triton, numpy, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'fla', fla.__version__)"
  head -n 1 .whl/vllm_fla/MANIFEST.txt; } > "$LOGS/env.txt" 2>&1
check() {  # NAME ARGS...: one default check in bfloat16 (a fixed seed: cold and warm draw alike)
  local name=$1; shift
  local start=$(date +%s.%N)
  timeout "${CHECK_TIMEOUT:-900}" python3 cli.py check --dtype bfloat16 --seed 1 --json "$LOGS/$name.json" \
    --cases "$LOGS/cases" --plans "$LOGS/plans" "$@" > "$LOGS/$name.log" 2>&1
  local status=$?  # the wall clock to 0.1 s: less the JSON's seconds and startup_seconds, the exit
  echo "exit $status after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s" >> "$LOGS/$name.log"
}
imports() {  # what a warm run's start-up is made of: each import and CUDA's start, in one process
  python3 - > "$LOGS/imports.txt" 2>&1 <<'PY'
import time
t = [time.perf_counter()]
import torch; t.append(time.perf_counter())
torch.zeros(1, device="cuda"); torch.cuda.synchronize(); t.append(time.perf_counter())
import fla.ops.gated_delta_rule; t.append(time.perf_counter())
import gdn_verify.api, gdn_verify.implementations; t.append(time.perf_counter())
names = ("import torch", "CUDA start", "import fla.ops.gated_delta_rule", "import gdn_verify")
print("; ".join(f"{n} {b - a:.2f} s" for n, a, b in zip(names, t, t[1:])))
PY
}
export TRITON_CACHE_DIR=/tmp/triton-timing  # fresh: the machine is new, the folder did not exist
check fla-chunk-cold --impl fla-chunk
# BEFORE_WARM: a command the warm run waits for (e.g. other jobs on the machine ending: the warm run
# is the measurement, the cold one may share the machine when its cost is known)
[ -n "${BEFORE_WARM:-}" ] && bash -c "$BEFORE_WARM"
check fla-chunk-warm --impl fla-chunk
imports
[ -n "${AFTER_WARM:-}" ] && (setsid nohup bash -c "$AFTER_WARM" > "$LOGS/after-warm.txt" 2>&1 < /dev/null &)
[ "${VLLM:-1}" = 1 ] || exit 0  # VLLM=0: fla-chunk's cold and warm runs only
check vllm-chunk-cold --impl vllm-chunk
check vllm-chunk-warm --impl vllm-chunk
# where a warm example's second goes, function by function (cProfile slows Python code: not timed)
timeout 600 python3 -m cProfile -o "$LOGS/fla-chunk-warm.prof" cli.py check --impl fla-chunk --dtype bfloat16 \
  --seed 1 --plans "$LOGS/plans" --properties matches_reference > "$LOGS/profile.log" 2>&1
python3 - "$LOGS/fla-chunk-warm.prof" >> "$LOGS/profile.log" 2>&1 <<'EOF'
import pstats, sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("cumulative").print_stats(45)
stats.print_callees("autotuner.py.*run|Autotuner.run")  # autotuning inside the kernel calls
EOF
echo "exit $?" >> "$LOGS/profile.log"
