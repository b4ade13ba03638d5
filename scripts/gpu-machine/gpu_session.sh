#!/usr/bin/env bash
# One GPU session, phase by phase, on the device machine from the repository root:
#   bash scripts/gpu-machine/gpu_session.sh [PHASE ...]          (default: env tests checks sanitizer bench)
# Logs and results go to $OUT (default ./gpu_logs). Carried wheels (.whl/, see scripts/gpu-machine/README.md) are
# installed once per machine by scripts/gpu-machine/common.sh. A device call runs at most 10 minutes: the
# comment beside each phase says about how long it took on an H100.
#
# Our kernels
#   env              machine, driver, library versions -> env.txt
#   tests            every GPU test (pytest -m gpu), bad-input corpus included (4 min)
#   checks           check of cupy-recurrent, cupy-chunk and cupy in bf16 and fp32; cupy-oracle in fp64
#   sanitizer        memcheck over the recurrent, gate and chunk GPU tests (3 min)
#   memcheck_corpus  memcheck over the bad-input corpus in one process (1-2 min)
#   memcheck_decode  memcheck over scripts/sanitize_decode.py (decode variants, DecodeGraph; 1 min)
#   racecheck        racecheck and synccheck over scripts/sanitize_launches.py, racecheck over the
#                    fused and wgmma chunk tests (3 min)
#   bench            gdn-verify bench (decode and prefill beside FLA) -> bench.md, bench.json
#   decode_bench     scripts/bench_decode.py alone on the GPU: every decode variant, the launch
#                    floors, the two decode goals -> decode_bench.json, decode_bench.md (2-3 min)
#   ncu_decode       Nsight Compute of wide, wide-cs and the SM copy at B = 64, 1024 -> ncu-decode.log
#   ncu_prefill      Nsight Compute of prep and both state kernels at 1 x 16384 -> ncu-prefill.log
#   profile_prefill  scripts/profile_prefill.py: host time and per-kernel time, ours and FLA's
#   extra            spec_decode under --convention spec; error_growth to 64k tokens
# FLA (carried .whl/*.whl)
#   fla              check of fla-recurrent and fla-chunk in bf16 and fp32, side by side
#   report           gdn-verify report of four kernels to REPORT_TOKENS (default 16384) -> report/
#   fuzz_start       four FLA fuzz campaigns (FUZZ_BUDGET each, default 10m) detached, so that they
#                    outlive the call on a machine that stays warm; fuzz_collect (a later call) waits
#                    for them and packs logs, databases and cases -> fuzz.tar.gz
#   fuzz_scaling     fla-chunk fuzz with 1, then 2 workers (SCALING_WORKERS), each on its own copy of
#                    one Triton cache warmed by scripts/warm_pool.py (SCALING_BUDGET minutes, default
#                    3), on a 2-GPU machine -> campaigns.json, fuzz-workersN.json (about 9 min in all:
#                    run SCALING_WORKERS=1, then SCALING_WORKERS=2 in a second call on the same machine)
# FlashInfer and vLLM (the two-part site of .whl/gpu1 and .whl/gpu2, vLLM's files in .whl/vllm_fla)
#   site_part1       unpack .whl/gpu1 into /tmp/site (its own call: the carry limit is 64 MiB)
#   site_part2       unpack .whl/gpu2 into /tmp/site: the site is complete (same warm machine)
#   adapters_check   check every adapter in ADAPTERS side by side (bf16, --dims 128, CHECK_EXAMPLES
#                    examples, seed 15) -> adapters_check_summary.log, adapters-check.tar.gz (8.5 min)
#   adapters_fuzz    fuzz every adapter side by side (FUZZ_BUDGET, default 8m) -> campaigns.json,
#                    adapters_fuzz_summary.log, adapters-fuzz.tar.gz (9.5 min)
set -u -o pipefail
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
. "$(dirname "$0")/common.sh"
phases=${*:-env tests checks sanitizer bench}
seed=${SEED:-20261122}
ADAPTERS=${ADAPTERS:-"flashinfer-prefill flashinfer-decode flashinfer-decode-kmajor flashinfer-mtp vllm-chunk vllm-recurrent vllm-spec"}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi_ws}  # CuTe DSL compile cache, kept while the machine is warm
need_site() {  # the FlashInfer site of site_part1 and site_part2, on this machine
  [ -f "$SITE/.gdnv-site-complete" ] || { echo "site missing: run site_part1, then site_part2, on one warm machine"; return 1; }
  case ":$PYTHONPATH:" in *":$SITE/nvidia_cutlass_dsl/dsl_packages:"*) ;;
    *) export PYTHONPATH="$PYTHONPATH:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages" ;; esac
}
for phase in $phases; do
  start=$(date +%s)
  case $phase in
    env)
      { describe_machine; nvidia-smi; } > "$OUT/env.txt" 2>&1 ;;
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
    memcheck_corpus)
      ( unset GDN_CUPY_CHECKED  # the corpus covers the deferred mode too
        timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m tests.bad_inputs all ) > "$OUT/memcheck-corpus.log" 2>&1
      echo "memcheck corpus exit $?" >> "$OUT/memcheck-corpus.log"
      grep -E "ERROR SUMMARY|exit" "$OUT/memcheck-corpus.log" | tail -n 3 ;;
    memcheck_decode)
      timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/sanitize_decode.py > "$OUT/memcheck-decode.log" 2>&1
      echo "memcheck exit $?" >> "$OUT/memcheck-decode.log"
      grep -E "ERROR SUMMARY|exit|FAIL|expectations" "$OUT/memcheck-decode.log" | tail -n 5 ;;
    racecheck)
      { timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 python3 scripts/sanitize_launches.py
        echo "racecheck exit $?"
        timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 python3 scripts/sanitize_launches.py
        echo "synccheck exit $?"
        timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
          tests/test_cupy_chunk.py -k "wgmma or fused"
        echo "racecheck chunk tests exit $?"
      } > "$OUT/racecheck.log" 2>&1
      grep -E "RACECHECK SUMMARY|ERROR SUMMARY|exit|passed|failed" "$OUT/racecheck.log" | tail -n 8 ;;
    bench)
      timeout "${BENCH_TIMEOUT:-400}" python3 cli.py bench --out "$OUT/bench.md" --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1; tail -n 30 "$OUT/bench.log" ;;
    decode_bench)
      timeout "${BENCH_TIMEOUT:-200}" python3 scripts/bench_decode.py "$OUT" > "$OUT/decode_bench.log" 2>&1
      echo "decode bench exit $?"; sed -n '/^Goals/,$p' "$OUT/decode_bench.md" 2>/dev/null ;;
    ncu_decode)
      metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active
      timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none -k 'regex:recurrent_kernel|copy16' \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --metrics "$metrics" \
        python3 scripts/profile_decode_ncu.py ${NCU_VARIANTS:-wide wide-cs} > "$OUT/ncu-decode.log" 2>&1
      echo "ncu exit $?"
      grep -E "launch:|gpu__time_duration|dram__throughput|Registers Per|Achieved Active Warps" "$OUT/ncu-decode.log" | head -40 ;;
    ncu_prefill)
      timeout "${NCU_TIMEOUT:-240}" ncu --kernel-name regex:gdn_ --launch-skip 4 --launch-count 4 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --section SourceCounters python3 scripts/profile_prefill_ncu.py > "$OUT/ncu-prefill.log" 2>&1
      echo "ncu exit $?"
      grep -E "gdn_fused|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per" "$OUT/ncu-prefill.log" | head -40 ;;
    profile_prefill)
      OUT=$OUT timeout "${PROFILE_TIMEOUT:-300}" python3 scripts/profile_prefill.py > "$OUT/profile_prefill.log" 2>&1
      echo "profile exit $?"; tail -n 10 "$OUT/profile_prefill.log" | cut -c1-300 ;;
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
    fuzz_scaling)
      # Every worker count starts from the same cache: all candidate classes compiled once, then a copy
      # per worker count, so that what one run compiles cannot help the other. The kill limit leaves
      # 2 minutes past the budget, so that the summary is always printed.
      cache=/tmp/triton-scaling budget=${SCALING_BUDGET:-3}
      if [ ! -d "$cache" ]; then
        TRITON_CACHE_DIR=$cache timeout 300 python3 scripts/warm_pool.py --impl fla-chunk --dtype bfloat16 \
          --processes "${WARM_PROCESSES:-16}" > "$OUT/warm_pool.log" 2>&1
        echo "warm pool exit $?: $(tail -n 1 "$OUT/warm_pool.log"), cache $(du -sh "$cache" | cut -f1)"
      fi
      for n in ${SCALING_WORKERS:-1 2}; do
        rm -rf "$cache.w$n" && cp -a "$cache" "$cache.w$n"
        TRITON_CACHE_DIR="$cache.w$n" timeout $(( budget * 60 + 120 )) python3 cli.py fuzz --impl fla-chunk --dtype bfloat16 \
          --budget "${budget}m" --workers "$n" --database "/tmp/fuzz-scaling-db-w$n" --campaigns "$OUT/campaigns.json" \
          --cases "$OUT/cases" --json "$OUT/fuzz-workers$n.json" > "$OUT/fuzz-workers$n.log" 2>&1
        echo "fuzz fla-chunk ${budget}m, $n workers: exit $?"
        grep -E "fuzz done|campaign recorded" "$OUT/fuzz-workers$n.log"
      done ;;
    site_part1)
      bash .whl/gpu1/install1.sh && nvidia-smi -L && python3 -m pip show cuda-bindings 2>/dev/null | head -n 2 ;;
    site_part2)
      bash .whl/gpu2/install.sh && need_site && describe_machine > "$OUT/env.txt" 2>&1
      python3 -c "import flashinfer.gdn_decode as d; print('flashinfer flags', d._PRETRANSPOSE_AVAILABLE, getattr(d, '_MTP_AVAILABLE', '?'))" >> "$OUT/env.txt" 2>&1
      cat "$OUT/env.txt" ;;
    adapters_check)
      need_site || continue
      mkdir -p "$OUT/adapters-check"
      # one process per adapter, side by side; each compiles its kernels once (head size 128 only)
      for impl in $ADAPTERS; do
        ( timeout "${CHECK_TIMEOUT:-480}" python3 cli.py check --impl "$impl" --dtype bfloat16 --dims 128 \
            --max-examples "${CHECK_EXAMPLES:-8}" --max-tokens 1024 --seed 15 --cases "$OUT/adapters-check/cases" \
            --json "$OUT/adapters-check/$impl.json" > "$OUT/adapters-check/$impl.log" 2>&1
          echo "exit $?" >> "$OUT/adapters-check/$impl.log" ) &
      done
      wait
      for impl in $ADAPTERS; do echo "== $impl"; grep -vE "^\[" "$OUT/adapters-check/$impl.log" | tail -n 40; done > "$OUT/adapters_check_summary.log"
      (cd "$OUT" && tar -czf adapters-check.tar.gz adapters-check && rm -rf adapters-check)
      cat "$OUT/adapters_check_summary.log" ;;
    adapters_fuzz)
      need_site || continue
      mkdir -p "$OUT/adapters-fuzz"
      budget=${FUZZ_BUDGET:-8m}  # the whole campaign stays inside the 560 s kill limit
      for impl in $ADAPTERS; do
        ( timeout "${FUZZ_TIMEOUT:-560}" python3 cli.py fuzz --impl "$impl" --dtype bfloat16 --dims 128 --budget "$budget" \
            --cases "$OUT/adapters-fuzz/cases" --database "/tmp/fuzzdb-$impl" --campaigns "$OUT/adapters-fuzz/campaigns-$impl.json" \
            > "$OUT/adapters-fuzz/$impl.log" 2>&1
          echo "exit $?" >> "$OUT/adapters-fuzz/$impl.log" ) &
      done
      wait
      # one row per campaign; a campaign killed by the timeout wrote none: its last progress line says how far it got
      python3 - "$OUT" $ADAPTERS <<'EOF'
import json, re, sys
from pathlib import Path
out, impls = Path(sys.argv[1]), sys.argv[2:]
rows = []
for impl in impls:
    written = out / "adapters-fuzz" / f"campaigns-{impl}.json"
    if written.is_file():
        rows += json.loads(written.read_text())
        continue
    last = re.findall(r"cases (\d+) .*?failures (\d+)", (out / "adapters-fuzz" / f"{impl}.log").read_text(errors="replace"))
    cases, failures = (int(last[-1][0]), int(last[-1][1])) if last else (None, None)
    rows.append(dict(impl=impl, dtype="bfloat16", cases=cases, failures=failures,
                     note="stopped by the timeout; counts from the last progress line"))
(out / "campaigns.json").write_text(json.dumps(rows, indent=1) + "\n")
print(json.dumps(rows, indent=1))
EOF
      for impl in $ADAPTERS; do echo "== $impl"; grep -vE "^\[fuzz\]" "$OUT/adapters-fuzz/$impl.log" | tail -n 30; done > "$OUT/adapters_fuzz_summary.log"
      (cd "$OUT" && tar -czf adapters-fuzz.tar.gz adapters-fuzz && rm -rf adapters-fuzz) ;;
    extra)
      { timeout 150 python3 cli.py check --convention spec --impl cupy_kernels.recurrent:spec_decode --array torch \
          --seed "$seed" 2>&1 | grep -v "^  running"; echo "exit ${PIPESTATUS[0]}"
        for impl in cupy-recurrent cupy-chunk; do
          timeout 200 python3 cli.py check --impl "$impl" --dtype float32 --properties error_growth --seed "$seed" \
            --max-examples 2 --max-tokens 65536 2>&1 | grep -v "^  running"; echo "exit ${PIPESTATUS[0]}"
        done; } > "$OUT/extra.log" 2>&1 ;;
    *) echo "unknown phase $phase (see the list at the top of $0)" >&2; exit 2 ;;
  esac
  echo "== phase $phase: $(( $(date +%s) - start ))s"
done
