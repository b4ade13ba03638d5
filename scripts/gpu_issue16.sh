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
          python3 -m pytest -q -p no:cacheprovider tests/test_cupy_chunk.py -k "fused and (ragged_k128 or v48 or gate or k96)" \
          > "$OUT/sanitizer_$tool.log" 2>&1
        echo "== $tool: exit $?, $(elapsed)" >> "$SUMMARY"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer_$tool.log" | tail -n 3 >> "$SUMMARY"
      done ;;
    ncu)
      cat > /tmp/ncu_prefill.py <<'PY'
import torch
from cupy_kernels.chunk import chunk_gated_delta_rule as ours
from gdn_verify.bench.prefill import _inputs
x = _inputs(torch, 1, 16384, 16, 32, 128, 128, 0, torch.bfloat16)
for fused in (True, False, True):
    ours(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True, fused=fused)
torch.cuda.synchronize()
PY
      timeout 240 ncu --kernel-name regex:gdn_ --launch-skip 5 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats python3 /tmp/ncu_prefill.py > "$OUT/ncu.log" 2>&1
      echo "== ncu: exit $?, $(elapsed)" >> "$SUMMARY"
      grep -E "gdn_fused|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per" "$OUT/ncu.log" >> "$SUMMARY" ;;
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
      grep -E "chunk_equals|passed,|FAILED|failed" "$OUT/check_cupy_bf16.log" | tail -n 6 >> "$SUMMARY" ;;
    bench)
      timeout 400 python3 cli.py bench --what prefill --json "$OUT/bench-prefill.json" --out "$OUT/bench-prefill.md" \
        > "$OUT/bench.log" 2>&1
      echo "== bench: exit $?, $(elapsed)" >> "$SUMMARY"; tail -n 25 "$OUT/bench.log" >> "$SUMMARY" ;;
    *) echo "unknown step $step" >> "$SUMMARY" ;;
  esac
done
echo "== done: $(elapsed)" >> "$SUMMARY"
cat "$SUMMARY"
