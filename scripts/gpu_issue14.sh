#!/usr/bin/env bash
# Issue 14 on one H100 (or H200) with FLA, from the repo root, one device call per phase (each
# under the 10-minute per-call limit; the Triton cache and campaigns.json persist between calls
# while the machine stays warm):
#   PHASE=cold    bash scripts/gpu_issue14.sh   # fresh Triton cache; check --impl fla-chunk bf16 (target <= 10 min)
#   PHASE=warm    bash scripts/gpu_issue14.sh   # same check, warm cache (target <= 3 min); fla-recurrent 2-min fuzz
#   PHASE=fuzz    bash scripts/gpu_issue14.sh   # fla-chunk fuzz, bf16 and fp32 side by side on the one GPU (9 min)
#   PHASE=warmpool bash scripts/gpu_issue14.sh  # compile all 18 candidate classes in 16 processes, copy the cache
#                                               # once per worker count
#   PHASE=scaling bash scripts/gpu_issue14.sh   # nvidia-h200-x2 only: fla-chunk fuzz with 1 then 2 workers
#                                               # (SCALING_BUDGET minutes each, default 4; SCALING_WORKERS="1 2")
# Each phase writes at most 8 files to $OUT (default ./gpu_logs): summary.log, the logs and JSON of its
# runs, and campaigns.json (every campaign row so far: copy it to reports/<date>/campaigns.json).
set -u -o pipefail
OUT=${OUT:-gpu_logs}
PHASE=${PHASE:-cold}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/fla/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/fla ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
# Outside the repo (its copy is not sent back) but on the machine, so that `warm` finds what `cold` compiled.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/gdn_issue14_triton}
DATE=$(date -u +%F)
CAMPAIGNS=${CAMPAIGNS:-/tmp/gdn_issue14_campaigns.json}
SEED=${SEED:-20261123}
SUMMARY="$OUT/summary.log"
t0=$(date +%s)
{ date -u; echo "phase $PHASE"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)" 2>&1 | tail -n 1
} > "$SUMMARY" 2>&1

elapsed() { echo "$(( $(date +%s) - t0 ))s"; }

case "$PHASE" in
  cold)
    rm -rf "$TRITON_CACHE_DIR" && mkdir -p "$TRITON_CACHE_DIR"
    timeout 570 python3 cli.py check --impl fla-chunk --dtype bfloat16 --seed "$SEED" \
      --json "$OUT/check_cold.json" > "$OUT/check_cold.log" 2>&1
    echo "== cold check: exit $? (124: over 570 s), $(elapsed)" >> "$SUMMARY"
    grep -E "passed,|shapes:|FAILED" "$OUT/check_cold.log" >> "$SUMMARY"
    ;;
  warm)
    timeout 300 python3 cli.py check --impl fla-chunk --dtype bfloat16 --seed "$SEED" \
      --json "$OUT/check_warm.json" > "$OUT/check_warm.log" 2>&1
    echo "== warm check: exit $?, $(elapsed)" >> "$SUMMARY"
    grep -E "passed,|shapes:|FAILED" "$OUT/check_warm.log" >> "$SUMMARY"
    timeout 200 python3 cli.py fuzz --impl fla-recurrent --dtype bfloat16 --budget 2m --database /tmp/gdn_issue14_db \
      --campaigns "$CAMPAIGNS" --json "$OUT/fuzz_recurrent.json" > "$OUT/fuzz_recurrent.log" 2>&1
    echo "== fla-recurrent fuzz 2m: exit $?, $(elapsed)" >> "$SUMMARY"
    grep -E "fuzz done|campaign recorded" "$OUT/fuzz_recurrent.log" >> "$SUMMARY"
    ;;
  fuzz)
    # Two campaigns share the one GPU: compilation is CPU-bound (16 cores), the kernels are small.
    for dtype in bfloat16 float32; do
      timeout 590 python3 cli.py fuzz --impl fla-chunk --dtype "$dtype" --budget "${FUZZ_BUDGET:-9m}" \
        --database /tmp/gdn_issue14_db --campaigns "$CAMPAIGNS" --json "$OUT/fuzz_chunk_$dtype.json" \
        > "$OUT/fuzz_chunk_$dtype.log" 2>&1 &
    done
    wait
    echo "== fla-chunk fuzz bf16 and fp32 side by side: $(elapsed)" >> "$SUMMARY"
    grep -hE "fuzz done|campaign recorded|FAILED|minimal example" "$OUT"/fuzz_chunk_*.log >> "$SUMMARY"
    ;;
  warmpool)
    # Every worker count must start from the same cache: all candidate classes compiled, then one
    # copy of that cache per worker count, so that what one run compiles cannot help the other.
    timeout 300 python3 scripts/warm_pool.py --impl fla-chunk --dtype bfloat16 --processes 16 > "$OUT/warm_pool.log" 2>&1
    echo "== warm pool: exit $?, $(elapsed)" >> "$SUMMARY"
    tail -n 1 "$OUT/warm_pool.log" >> "$SUMMARY"
    for n in 1 2; do rm -rf "$TRITON_CACHE_DIR.w$n" && cp -a "$TRITON_CACHE_DIR" "$TRITON_CACHE_DIR.w$n"; done
    echo "cache: $(du -sh "$TRITON_CACHE_DIR" | cut -f1), copied for 1 and 2 workers" >> "$SUMMARY"
    ;;
  scaling)
    # After PHASE=warmpool on the same machine: each worker count runs on its own copy of the warm
    # cache. The kill limit leaves 2 minutes past the budget, so the summary is always printed.
    budget=${SCALING_BUDGET:-4}
    for n in ${SCALING_WORKERS:-1 2}; do
      cache="$TRITON_CACHE_DIR.w$n"; [ -d "$cache" ] || cache="$TRITON_CACHE_DIR"
      TRITON_CACHE_DIR="$cache" timeout $(( budget * 60 + 120 )) python3 cli.py fuzz --impl fla-chunk --dtype bfloat16 \
        --budget "${budget}m" --workers "$n" --database "/tmp/gdn_issue14_db_w$n" --campaigns "$CAMPAIGNS" \
        --cases /tmp/gdn_issue14_cases --json "$OUT/fuzz_workers$n.json" > "$OUT/fuzz_workers$n.log" 2>&1
      echo "== fla-chunk fuzz ${budget}m, $n workers, cache $cache: exit $?, $(elapsed)" >> "$SUMMARY"
      grep -E "fuzz done|campaign recorded" "$OUT/fuzz_workers$n.log" >> "$SUMMARY"
    done
    # minimal failing cases (replay files), so that FLA findings can be replayed here
    [ -d /tmp/gdn_issue14_cases ] && tar czf "$OUT/cases.tgz" -C /tmp gdn_issue14_cases
    ;;
  *) echo "unknown PHASE=$PHASE (cold, warm, fuzz, warmpool, scaling)" >&2; exit 2 ;;
esac
[ -f "$CAMPAIGNS" ] && cp "$CAMPAIGNS" "$OUT/campaigns.json"
echo "== done: $(elapsed); campaigns.json rows go to reports/$DATE/campaigns.json" >> "$SUMMARY"
cat "$SUMMARY"
