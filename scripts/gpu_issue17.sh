#!/usr/bin/env bash
# Issue 17 on one GPU, in one command (under 9 minutes on an H100), from the repo root:
#   bash scripts/gpu_issue17.sh
# 1. decode bench alone on the GPU (B = 1, 64, 256, 1024; ours vs FLA vs the copy ceiling),
# 2. then in parallel: the GPU tests (recurrent, chunk, gate options, bad-input corpus with one
#    process per case), compute-sanitizer memcheck (bad-input corpus in one process, then the GPU
#    suite) and racecheck (both kernels).
# Writes at most 8 files to $OUT (default ./gpu_logs): summary.log, bench.log, decode_bench.json,
# decode_bench.md, pytest_gpu.log, memcheck.log, racecheck.log. Exit status: nonzero if any part failed.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset GDN_CUPY_CHECKED  # the corpus tests the deferred mode too
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/fla ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
SUMMARY="$OUT/summary.log"
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  compute-sanitizer --version | tail -n 1
  python3 -c "import cupy, torch, numpy; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
  python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -n 1; } > "$SUMMARY" 2>&1

# 1. bench, alone on the GPU
timeout "${BENCH_TIMEOUT:-150}" python3 scripts/decode_bench_issue17.py "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -n 12
bench_rc=$?
echo "== bench: exit $bench_rc, $(( $(date +%s) - t0 ))s" | tee -a "$SUMMARY"

# 2. tests, memcheck and racecheck side by side
PHASE2=${PHASE2_TIMEOUT:-300}
( timeout "$PHASE2" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cupy_recurrent.py \
    tests/test_cupy_chunk.py tests/test_cupy_gates.py tests/test_cupy_bad_inputs.py > "$OUT/pytest_gpu.log" 2>&1
  echo "pytest exit $?" >> "$OUT/pytest_gpu.log" ) &
( { echo "--- memcheck: bad-input corpus, one process"
    timeout $(( PHASE2 / 3 )) compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m tests.bad_inputs all
    echo "memcheck corpus exit $?"
    echo "--- memcheck: GPU suite"
    timeout $(( PHASE2 - PHASE2 / 3 - 5 )) compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
      -m gpu -x -p no:cacheprovider tests/test_cupy_recurrent.py tests/test_cupy_gates.py tests/test_cupy_chunk.py
    echo "memcheck suite exit $? (124: ran out of time; the part that ran is above)"
  } > "$OUT/memcheck.log" 2>&1 ) &
( { timeout "$PHASE2" compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 \
      python3 scripts/racecheck_issue17.py
    echo "racecheck exit $?"
    timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 python3 scripts/racecheck_issue17.py
    echo "synccheck exit $?"
  } > "$OUT/racecheck.log" 2>&1 ) &
wait
{ echo "== phase 2: $(( $(date +%s) - t0 ))s"
  echo "--- pytest"; tail -n 15 "$OUT/pytest_gpu.log"
  echo "--- memcheck"; grep -E "ERROR SUMMARY|exit|passed|failed" "$OUT/memcheck.log" | tail -n 12
  echo "--- racecheck"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|exit|done" "$OUT/racecheck.log" | tail -n 8
  echo "--- goals"; sed -n '/Issue 17 goals/,$p' "$OUT/decode_bench.md" 2>/dev/null
} >> "$SUMMARY"
cat "$SUMMARY"
fail=0
[ "$bench_rc" = 0 ] || fail=1
grep -q "pytest exit 0" "$OUT/pytest_gpu.log" || fail=1
grep -q "memcheck corpus exit 0" "$OUT/memcheck.log" || fail=1
grep -q "memcheck suite exit 0" "$OUT/memcheck.log" || fail=1
grep -q "racecheck exit 0" "$OUT/racecheck.log" || fail=1
exit $fail
