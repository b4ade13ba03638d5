#!/usr/bin/env bash
# One GPU session: install FLA from the carried wheel, GPU tests, checks, memcheck, benchmarks.
# Usage on the device machine (repo root): bash scripts/gpu_session.sh [phases...]
# Phases: env tests checks sanitizer bench fla (default: all). Logs go to $OUT (or ./gpu_logs).
set -u
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
phases=${*:-env tests checks sanitizer bench}
seed=${SEED:-20261122}
for phase in $phases; do
  start=$(date +%s)
  case $phase in
    env)
      { date -u; nvidia-smi; python3 -c "import cupy, torch, numpy, hypothesis; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__, 'hypothesis', hypothesis.__version__)"; python3 -c "import fla; print('fla', fla.__version__)"; } > "$OUT/env.txt" 2>&1 ;;
    tests)
      timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -x -q 2>&1 | tail -n 80 > "$OUT/pytest_gpu.log"; tail -n 3 "$OUT/pytest_gpu.log" ;;
    checks)
      { for impl in ${CHECK_IMPLS:-cupy-recurrent cupy-chunk cupy}; do
          for dtype in bfloat16 float32; do
            timeout "${CHECK_TIMEOUT:-120}" python3 cli.py check --impl "$impl" --dtype "$dtype" --seed "$seed" --max-tokens 8192 2>&1 | grep -v "^  running"
            echo "exit ${PIPESTATUS[0]}"
          done
        done
        python3 cli.py check --impl cupy-oracle --dtype float64 --seed "$seed" --properties matches_reference,gate_extremes,varlen_equals_separate 2>&1 | grep -v "^  running"
      } > "$OUT/checks.log" 2>&1 ;;
    sanitizer)
      timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m gpu -x tests/test_cupy_recurrent.py tests/test_cupy_chunk.py -p no:cacheprovider > "$OUT/memcheck.log" 2>&1
      echo "memcheck exit $?" >> "$OUT/memcheck.log"
      tail -n 5 "$OUT/memcheck.log" ;;
    bench)
      timeout "${BENCH_TIMEOUT:-180}" python3 cli.py bench --out "$OUT/bench.md" > "$OUT/bench.log" 2>&1; tail -n 30 "$OUT/bench.log" ;;
    fla)
      { for impl in fla-recurrent fla-chunk; do
          for dtype in bfloat16 float32; do
            timeout "${CHECK_TIMEOUT:-120}" python3 cli.py check --impl "$impl" --dtype "$dtype" --seed "$seed" 2>&1 | grep -v "^  running"
            echo "exit ${PIPESTATUS[0]}"
          done
        done; } > "$OUT/fla_checks.log" 2>&1 ;;
  esac
  echo "== phase $phase: $(( $(date +%s) - start ))s"
done
