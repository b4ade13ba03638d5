#!/usr/bin/env bash
# Issue 17b on one GPU, in one command (about 4 minutes on an H100), from the repo root:
#   OUT=/some/dir bash scripts/gpu_issue17b.sh
# 1. decode bench alone on the GPU: B = 1, 64, 256, 1024; every decode variant (the persistent
#    "-pf" ones included), FLA when importable, the copy ceiling; at B = 1 DecodeStep and DecodeGraph
#    call to result beside the empty-launch floors of each path;
# 2. then side by side: the decode GPU tests (test_cupy_recurrent.py, test_cupy_decode_graph.py)
#    and compute-sanitizer memcheck over the new paths (scripts/memcheck_issue17b.py).
# FLA: wheels in .whl/fla/*.whl (or .whl/*.whl) are installed into /tmp/site when present.
# Writes 6 files to $OUT (default ./gpu_logs): summary.log, bench.log, decode_bench.json,
# decode_bench.md, pytest_gpu.log, memcheck.log. Exit status: nonzero if any part failed.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset GDN_CUPY_CHECKED  # the tests cover the deferred mode too
WHEELS=$(ls .whl/fla/*.whl .whl/*.whl 2>/dev/null | tr '\n' ' ')
if [ -n "$WHEELS" ] && [ ! -d /tmp/site/fla ]; then
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
SUMMARY="$OUT/summary.log"
t0=$(date +%s)
{ date -u; git rev-parse --short HEAD 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  compute-sanitizer --version | tail -n 1
  python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
  python3 -c "import torch; print('torch', torch.__version__)" 2>&1 | tail -n 1
  python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -n 1; } > "$SUMMARY" 2>&1

# 1. bench, alone on the GPU (compiles every variant first; CuPy caches the binaries for part 2)
timeout "${BENCH_TIMEOUT:-200}" python3 scripts/decode_bench_issue17.py "$OUT" > "$OUT/bench.log" 2>&1
bench_rc=$?
tail -n 12 "$OUT/bench.log"
echo "== bench: exit $bench_rc, $(( $(date +%s) - t0 ))s" | tee -a "$SUMMARY"

# 2. decode GPU tests and memcheck side by side
PHASE2=${PHASE2_TIMEOUT:-150}
( timeout "$PHASE2" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cupy_recurrent.py \
    tests/test_cupy_decode_graph.py > "$OUT/pytest_gpu.log" 2>&1
  echo "pytest exit $?" >> "$OUT/pytest_gpu.log" ) &
( { timeout "$PHASE2" compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/memcheck_issue17b.py
    echo "memcheck exit $?"
  } > "$OUT/memcheck.log" 2>&1 ) &
wait
{ echo "== phase 2: $(( $(date +%s) - t0 ))s"
  echo "--- pytest"; tail -n 15 "$OUT/pytest_gpu.log"
  echo "--- memcheck"; grep -E "ERROR SUMMARY|exit|FAIL|expectations" "$OUT/memcheck.log" | tail -n 12
  echo "--- goals"; sed -n '/Issue 17 goals/,$p' "$OUT/decode_bench.md" 2>/dev/null
} >> "$SUMMARY"
cat "$SUMMARY"
fail=0
[ "$bench_rc" = 0 ] || fail=1
grep -q "pytest exit 0" "$OUT/pytest_gpu.log" || fail=1
grep -q "memcheck exit 0" "$OUT/memcheck.log" || fail=1
exit $fail
