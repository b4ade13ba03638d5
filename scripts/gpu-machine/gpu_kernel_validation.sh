#!/usr/bin/env bash
# The GPU runs a change to cupy_kernels/ must pass before it merges (the kernel split of issue 28
# was verified by nvcc, NVRTC-built SASS and CPU tests only). On the device machine, from the
# repository root, one step per device call (each stays under the 10-minute limit):
#   bash scripts/gpu-machine/gpu_kernel_validation.sh [STEP ...]     (default: every step, in order)
# Logs and results go to $OUT (default ./gpu_logs), through scripts/gpu-machine/gpu_session.sh's phases.
#
#   tests      env, then every GPU test: pytest -m gpu over tests/ (recurrent, decode, DecodeGraph,
#              chunk on all three paths incl. the wgmma probe, gates, bad-input corpus). Must end
#              "N passed" with no failure (~4 min on an H100)
#   memcheck   compute-sanitizer memcheck: the recurrent, gate and chunk GPU tests; the bad-input
#              corpus in one process; scripts/sanitize_decode.py (every decode variant, DecodeGraph).
#              Each must report 0 errors and exit 0 (~5 min)
#   racecheck  racecheck and synccheck over scripts/sanitize_launches.py, racecheck over the fused
#              and wgmma chunk tests: 0 hazards, 0 errors (~3 min)
#   benches    the decode bench (scripts/bench_decode.py) and the prefill bench (cli.py bench
#              --what prefill), then scripts/compare_kernel_benches.py against the committed
#              numbers (reports/2026-11-23-decode-validation/, reports/2026-11-23-chunk-prefill/,
#              NVIDIA H100 80GB HBM3): each decode form within 3 points of the copy ceiling share,
#              each prefill row's ratio ours / FLA (side by side in the same run, the median of
#              its interleaved rounds) within 5 % of the committed ratio on the same kernels (absolute times printed as information; judged on
#              them only where FLA's time is missing; a row that fails on event time passes where the
#              kernels' device times of scripts/profile_prefill.py keep the committed ratio), the
#              accuracies unchanged (~6 min). Run it on
#              the kind of device the numbers were taken on.
#
# Record the device, the date and the results in reports/<date>-<topic>/ before merging.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
export OUT
mkdir -p "$OUT"
here=$(dirname "$0")
# PYTHONPATH with the carried FLA wheels installed (the prefill bench's side-by-side FLA; without it
# every row was judged on absolute time, H100 2026-11-27)
. "$here/common.sh"
steps=${*:-tests memcheck racecheck benches}
status=0
for step in $steps; do
  case $step in
    tests)
      bash "$here/gpu_session.sh" env tests || status=1
      grep -qE "[0-9]+ passed" "$OUT/pytest_gpu.log" && ! grep -qE "[0-9]+ (failed|error)" "$OUT/pytest_gpu.log" || status=1 ;;
    memcheck)
      bash "$here/gpu_session.sh" sanitizer memcheck_corpus memcheck_decode || status=1
      for log in memcheck.log memcheck-corpus.log memcheck-decode.log; do
        grep -qE "exit 0$" "$OUT/$log" || { echo "$log: memcheck did not exit 0"; status=1; }
      done ;;
    racecheck)
      bash "$here/gpu_session.sh" racecheck || status=1
      [ "$(grep -cE "exit 0$" "$OUT/racecheck.log")" -eq 3 ] || { echo "racecheck.log: a run did not exit 0"; status=1; } ;;
    benches)
      bash "$here/gpu_session.sh" decode_bench || status=1
      timeout "${BENCH_TIMEOUT:-300}" python3 cli.py bench --what prefill --json "$OUT/prefill_bench.json" \
        --out "$OUT/prefill_bench.md" > "$OUT/prefill_bench.log" 2>&1 || { echo "prefill bench failed"; status=1; }
      # device time per kernel, for the rows whose event window holds host time (compare_kernel_benches.py)
      timeout 300 python3 "$here/../profile_prefill.py" > "$OUT/profile_prefill.log" 2>&1 \
        || echo "profile_prefill failed: varlen rows judged on event time only"
      python3 "$here/../compare_kernel_benches.py" "$OUT" | tee "$OUT/compare_benches.log" || status=1 ;;
    *) echo "unknown step $step (see the list at the top of $0)" >&2; exit 2 ;;
  esac
  echo "== step $step: $([ $status -eq 0 ] && echo ok || echo FAILED so far)"
done
exit $status
