#!/usr/bin/env bash
# One GPU session: install FLA from the carried wheel, GPU tests, checks, memcheck, benchmarks.
# Usage on the device machine (repo root): bash scripts/gpu_session.sh [phases...]
# Phases: env tests checks sanitizer bench fla report fuzz_start fuzz_collect extra issue17
# (default: env tests checks sanitizer bench). Logs go to $OUT (or ./gpu_logs).
# issue17 runs scripts/gpu_issue17.sh: decode bench, GPU tests with the bad-input corpus,
# memcheck and racecheck (its own 7 logs; run it alone, it needs most of a 10-minute command).
# fuzz_start launches the four FLA campaigns (FUZZ_BUDGET each, default 10m) in their own
# process sessions, so they outlive this command on a machine that stays warm; fuzz_collect,
# in a later command, waits for them and packs their logs, databases and cases.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/fla ]; then  # once per machine: phases may run in parallel
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
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
      timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -m gpu -x tests/test_cupy_recurrent.py tests/test_cupy_gates.py tests/test_cupy_chunk.py -p no:cacheprovider > "$OUT/memcheck.log" 2>&1
      echo "memcheck exit $?" >> "$OUT/memcheck.log"
      tail -n 5 "$OUT/memcheck.log" ;;
    bench)
      timeout "${BENCH_TIMEOUT:-180}" python3 cli.py bench --out "$OUT/bench.md" > "$OUT/bench.log" 2>&1; tail -n 30 "$OUT/bench.log" ;;
    fla)
      # In parallel: FLA's chunked kernels compile and autotune per head size, hence --dims for them.
      for impl in fla-recurrent fla-chunk; do
        for dtype in bfloat16 float32; do
          dims=""; [ "$impl" = fla-chunk ] && dims="--dims ${FLA_CHUNK_DIMS:-64,128}"
          ( timeout "${CHECK_TIMEOUT:-120}" python3 cli.py check --impl "$impl" --dtype "$dtype" --seed "$seed" \
              $dims --json "$OUT/check-$impl-$dtype.json" 2>&1 | grep -v "^  running"
            echo "exit ${PIPESTATUS[0]}" ) > "$OUT/check-$impl-$dtype.log" 2>&1 &
        done
      done
      wait ;;
    report)
      timeout "${REPORT_TIMEOUT:-500}" python3 cli.py report --impl cupy-chunk --impl cupy-recurrent --impl fla-chunk \
        --impl fla-recurrent --dtype bfloat16 --dtype float32 --max-tokens "${REPORT_TOKENS:-16384}" \
        --max-examples "${REPORT_EXAMPLES:-10}" --dims 128 --out "$OUT/report" \
        --properties "${REPORT_PROPERTIES:-matches_reference,gate_extremes,determinism,state_layout,in_kernel_gate,in_kernel_beta_sigmoid}" \
        > "$OUT/report.log" 2>&1
      echo "report exit $?" >> "$OUT/report.log"; tail -n 12 "$OUT/report.log" ;;
    fuzz_start)
      mkdir -p /tmp/fuzz
      for impl in fla-chunk fla-recurrent; do
        for dtype in bfloat16 float32; do
          setsid nohup python3 cli.py fuzz --impl "$impl" --dtype "$dtype" --budget "${FUZZ_BUDGET:-10m}" \
            --dims "${FUZZ_DIMS:-16,64,100,128}" --database /tmp/fuzz/db --cases "/tmp/fuzz/cases-$impl-$dtype" \
            > "/tmp/fuzz/fuzz-$impl-$dtype.log" 2>&1 < /dev/null &
        done
      done
      sleep 2; ls /tmp/fuzz ;;
    fuzz_collect)
      for _ in $(seq "${FUZZ_WAIT:-120}"); do pgrep -f "cli.py fuzz" > /dev/null || break; sleep 5; done
      pgrep -af "cli.py fuzz"; tail -n 4 /tmp/fuzz/*.log
      tar -czf "$OUT/fuzz.tar.gz" -C /tmp fuzz ;;
    issue17)
      bash scripts/gpu_issue17.sh ;;
    extra)
      { timeout 150 python3 cli.py check --convention spec --impl cupy_kernels.recurrent:spec_decode --array torch \
          --seed "$seed" 2>&1 | grep -v "^  running"; echo "exit ${PIPESTATUS[0]}"
        for impl in cupy-recurrent cupy-chunk; do
          timeout 200 python3 cli.py check --impl "$impl" --dtype float32 --properties error_growth --seed "$seed" \
            --max-examples 2 --max-tokens 65536 2>&1 | grep -v "^  running"; echo "exit ${PIPESTATUS[0]}"
        done; } > "$OUT/extra.log" 2>&1 ;;
  esac
  echo "== phase $phase: $(( $(date +%s) - start ))s"
done
