#!/usr/bin/env bash
# Issue 16 on one H100 (or H200), from the repo root: the chunk kernel's GPU tests, compute-sanitizer
# memcheck and racecheck on the fused path, Nsight Compute per kernel at 1 x 16384, the fused state
# kernel with k_split 1 and 2 side by side, `check --impl cupy` (chunk_equals_recurrent) and
# `cli.py bench --what prefill` beside FLA 0.6 (carried as .whl/fla/*.whl). All steps take about
# 10 minutes, so run them in two device calls. Writes at most 8 files to $OUT (default ./gpu_logs).
#   STEPS="tests sanitizer ncu split" bash scripts/gpu_issue16.sh; STEPS="check bench" bash scripts/gpu_issue16.sh
set -u -o pipefail
OUT=${OUT:-gpu_logs}
STEPS=${STEPS:-tests sanitizer ncu split}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/fla/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/fla ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
SUMMARY="$OUT/summary.log"
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__)" 2>&1 | tail -n 1
} > "$SUMMARY" 2>&1

for step in $STEPS; do
  case "$step" in
    tests)
      timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_cupy_chunk.py tests/test_cupy_gates.py \
        > "$OUT/pytest_chunk.log" 2>&1
      echo "== tests: exit $?, $(elapsed)" >> "$SUMMARY"; tail -n 15 "$OUT/pytest_chunk.log" >> "$SUMMARY" ;;
    sanitizer)
      for tool in memcheck racecheck; do
        timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 -m pytest -q -p no:cacheprovider tests/test_cupy_chunk.py -k "wgmma or (fused and (ragged_k128 or v48 or gate or k96))" \
          > "$OUT/sanitizer_$tool.log" 2>&1
        echo "== $tool: exit $?, $(elapsed)" >> "$SUMMARY"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer_$tool.log" | tail -n 3 >> "$SUMMARY"
      done ;;
    ncu)
      cat > /tmp/ncu_prefill.py <<'PY'
import torch
from cupy_kernels.chunk import chunk_gated_delta_rule as ours
from gdn_verify.bench.prefill import _inputs
x = _inputs(torch, 1, 16384, 16, 32, 128, 128, 0, torch.bfloat16)
for wgmma in (True, False, True, False):  # launches 0-7: prep, state (wgmma), prep, state (mma.sync), ...
    ours(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True, wgmma=wgmma)
torch.cuda.synchronize()
PY
      timeout 240 ncu --kernel-name regex:gdn_ --launch-skip 4 --launch-count 4 --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --section SourceCounters python3 /tmp/ncu_prefill.py > "$OUT/ncu.log" 2>&1
      echo "== ncu: exit $?, $(elapsed)" >> "$SUMMARY"
      grep -E "gdn_fused|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Issued Warp|No Eligible" "$OUT/ncu.log" >> "$SUMMARY" ;;
    split)
      # The fused state kernel with one or two warps per 16-column slab, on the bench's shapes.
      cat > /tmp/split_prefill.py <<'PY'
import torch
from cupy_kernels import chunk
from gdn_verify.bench.prefill import _inputs, _time_ms
for seqs, length in ((1, 4096), (1, 16384), (2, 4096), (8, 2048), (64, 512)):
    x = _inputs(torch, seqs, length, 16, 32, 128, 128, 0, torch.bfloat16)
    cu = None if seqs == 1 else x["cu"]
    times = {}
    for split in (1, 2, None):
        times[split] = _time_ms(lambda: chunk.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                output_final_state=True, cu_seqlens=cu, k_split=split), torch.cuda.synchronize, 3, 10)
    print(f"{seqs} x {length}: k_split=1 {times[1]:.3f} ms, k_split=2 {times[2]:.3f} ms, default {times[None]:.3f} ms")
PY
      timeout 150 python3 /tmp/split_prefill.py > "$OUT/split.log" 2>&1
      echo "== split: exit $?, $(elapsed)" >> "$SUMMARY"; grep -E "k_split|Error" "$OUT/split.log" >> "$SUMMARY" ;;
    check)
      # Every property on the fused path (bf16), chunk_equals_recurrent included.
      timeout 240 python3 cli.py check --impl cupy --dtype bfloat16 --seed 20261123 > "$OUT/check_cupy_bf16.log" 2>&1
      echo "== check --impl cupy bf16: exit $?, $(elapsed)" >> "$SUMMARY"
      grep -E "chunk_equals|passed,|FAILED|failed" "$OUT/check_cupy_bf16.log" | tail -n 6 >> "$SUMMARY"
      for dtype in bfloat16 float32; do
        timeout 150 python3 cli.py check --impl cupy-chunk --dtype "$dtype" --seed 20261123 > "$OUT/check_cupy_chunk_$dtype.log" 2>&1
        echo "== check --impl cupy-chunk $dtype: exit $?, $(elapsed)" >> "$SUMMARY"
        grep -E "passed,|FAILED|failed" "$OUT/check_cupy_chunk_$dtype.log" | tail -n 3 >> "$SUMMARY"
      done ;;
    bench)
      timeout 400 python3 cli.py bench --what prefill --json "$OUT/bench-prefill.json" --out "$OUT/bench-prefill.md" \
        > "$OUT/bench.log" 2>&1
      echo "== bench: exit $?, $(elapsed)" >> "$SUMMARY"; tail -n 25 "$OUT/bench.log" >> "$SUMMARY" ;;
    ncusrc)
      # Per-SASS-instruction stall samples of the wgmma state kernel at 1 x 16384 (CSV).
      cat > /tmp/ncu_src.py <<'PY'
import torch
from cupy_kernels.chunk import chunk_gated_delta_rule as ours
from gdn_verify.bench.prefill import _inputs
x = _inputs(torch, 1, 16384, 16, 32, 128, 128, 0, torch.bfloat16)
for _ in range(2):
    ours(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True, wgmma=True)
torch.cuda.synchronize()
PY
      timeout 240 ncu --kernel-name regex:sm90 --launch-skip 1 --launch-count 1 --section SourceCounters \
        --section WarpStateStats --page source --print-source sass --csv python3 /tmp/ncu_src.py > "$OUT/ncu_src.csv" 2>&1
      echo "== ncusrc: exit $?, $(elapsed)" >> "$SUMMARY" ;;
    probe)
      # The sm_90a build and the wgmma B layouts: both descriptor readings of each layout.
      cat > /tmp/probe.py <<'PY'
import time, numpy as np, cupy as cp
from cupy_kernels import chunk
t = time.time(); mod = chunk.sm90a_module(); print(f"sm90a build {time.time() - t:.1f} s")
probe = mod.get_function("gdn_wgmma_probe")
rng = np.random.default_rng(3)
a = rng.integers(-8, 8, (64, 16)).astype(np.float32); tile = rng.integers(-8, 8, (64, 128)).astype(np.float32)
bf = lambda x: cp.asarray((x.view(np.uint32) >> 16).astype(np.uint16))
for lk, sk, lm, sm in ((16, 1024, 8192, 1024), (16, 1024, 1024, 8192)):
    d1, d2 = cp.full((64, 64), np.nan, cp.float32), cp.full((64, 128), np.nan, cp.float32)
    probe((1,), (128,), (bf(a), bf(tile), d1, d2, np.int32(lk), np.int32(sk), np.int32(lm), np.int32(sm)))
    e1 = np.abs(d1.get() - a @ tile[:, 80:96].T).max(); e2 = np.abs(d2.get() - a @ tile[16:32, :]).max()
    print(f"K-major lbo={lk} sbo={sk}: max err {e1}; MN-major lbo={lm} sbo={sm}: max err {e2}")
PY
      timeout 120 python3 /tmp/probe.py > "$OUT/probe.log" 2>&1
      echo "== probe: exit $?, $(elapsed)" >> "$SUMMARY"; tail -n 6 "$OUT/probe.log" >> "$SUMMARY" ;;
    wgmma)
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cupy_chunk.py -k "wgmma or fused" \
        > "$OUT/pytest_wgmma.log" 2>&1
      echo "== wgmma tests: exit $?, $(elapsed)" >> "$SUMMARY"; tail -n 15 "$OUT/pytest_wgmma.log" >> "$SUMMARY" ;;
    sbs)
      # The wgmma and mma.sync state kernels side by side, end to end, on the bench's shapes.
      cat > /tmp/sbs_prefill.py <<'PY'
import torch
from cupy_kernels import chunk
from gdn_verify.bench.prefill import _inputs, _time_ms
for seqs, length in ((1, 4096), (1, 16384), (1, 65536), (8, 2048), (64, 512)):
    x = _inputs(torch, seqs, length, 16, 32, 128, 128, 0, torch.bfloat16)
    cu = None if seqs == 1 else x["cu"]
    run = lambda w: chunk.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True,
                                                 cu_seqlens=cu, wgmma=w)
    (o1, s1), (o2, s2) = run(True), run(False)
    d = ((s1 - s2).norm() / s2.norm()).item(); do = ((o1.float() - o2.float()).norm() / o2.float().norm()).item()
    t = {w: _time_ms(lambda: run(w), torch.cuda.synchronize, 3, 10) for w in (True, False)}
    print(f"{seqs} x {length}: wgmma {t[True]:.3f} ms, mma {t[False]:.3f} ms, ratio {t[True] / t[False]:.2f}; "
          f"state diff {d:.1e}, o diff {do:.1e}")
PY
      timeout 200 python3 /tmp/sbs_prefill.py > "$OUT/sbs.log" 2>&1
      echo "== sbs: exit $?, $(elapsed)" >> "$SUMMARY"; grep -E "wgmma|Error|error" "$OUT/sbs.log" | tail -n 8 >> "$SUMMARY" ;;
    *) echo "unknown step $step" >> "$SUMMARY" ;;
  esac
done
echo "== done: $(elapsed)" >> "$SUMMARY"
cat "$SUMMARY"
