#!/usr/bin/env bash
# Issue 17b, second GPU command (about 2-3 minutes on an H100), from the repo root:
#   OUT=/some/dir bash scripts/gpu_issue17b_ncu.sh
# 1. the decode bench again (run-to-run spread against gpu_issue17b.sh's run): $OUT/run2/;
# 2. Nsight Compute on wide-cs vs wide-cs-pf vs the SM copy kernel at B = 64 and 1024
#    (scripts/ncu_issue17b.py): $OUT/ncu.log (sections and metrics as text).
set -u -o pipefail
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT/run2"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WHEELS=$(ls .whl/fla/*.whl .whl/*.whl 2>/dev/null | tr '\n' ' ')
if [ -n "$WHEELS" ] && [ ! -d /tmp/site/fla ]; then
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
t0=$(date +%s)
timeout "${BENCH_TIMEOUT:-150}" python3 scripts/decode_bench_issue17.py "$OUT/run2" > "$OUT/run2/bench.log" 2>&1
bench_rc=$?
echo "== bench: exit $bench_rc, $(( $(date +%s) - t0 ))s"
sed -n '/Issue 17 goals/,$p' "$OUT/run2/decode_bench.md"
KSEL='regex:recurrent_kernel|decode_persistent_kernel|copy16'
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active
# shellcheck disable=SC2086
timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none -k "$KSEL" $SECTIONS --metrics "$METRICS" \
  python3 scripts/ncu_issue17b.py wide-cs wide-cs-pf > "$OUT/ncu.log" 2>&1
ncu_rc=$?
echo "== ncu: exit $ncu_rc, $(( $(date +%s) - t0 ))s"
grep -E "launch:|recurrent_kernel|decode_persistent|copy16|gpu__time_duration|dram__throughput|dram__bytes|lts__t_sector_hit|sm__warps_active|Registers Per|Warp Cycles Per Issued|Achieved Active Warps|Theoretical Occupancy|Local" "$OUT/ncu.log" | head -120
[ "$bench_rc" = 0 ] && [ "$ncu_rc" = 0 ]
