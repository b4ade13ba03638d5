#!/usr/bin/env bash
# Issue 15 on one H100/H200: the real FlashInfer 0.7.2.post1 and vLLM 0.33.0 GDN kernels under
# `check` and `fuzz`. Run from the folder that holds .whl/ (see scripts/gpu_issue15.md), as
#   bash PATH/TO/scripts/gpu_issue15.sh part1   # unpack .whl/gpu1 into /tmp/site (call 1)
#   bash PATH/TO/scripts/gpu_issue15.sh check   # unpack .whl/gpu2, smoke, `check` every adapter (call 2)
#   bash PATH/TO/scripts/gpu_issue15.sh fuzz    # 7 fuzz campaigns side by side on the one GPU (call 3)
# Calls 1 and 2 must run on the same warm machine: /tmp/site lives only as long as the machine.
# Results go to $OUT (default ./gpu_logs), at most 8 files per phase.
set -u -o pipefail
ROOT=$PWD                                   # holds .whl/gpu1, .whl/gpu2, .whl/vllm_fla
REPO=$(cd "$(dirname "$0")/.." && pwd)      # this checkout (cli.py)
OUT=${OUT:-$ROOT/gpu_logs}
mkdir -p "$OUT"
ADAPTERS=${ADAPTERS:-"flashinfer-prefill flashinfer-decode flashinfer-decode-kmajor flashinfer-mtp vllm-chunk vllm-recurrent vllm-spec"}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
export PYTHONPATH="$REPO:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"  # .pth files are not run from --target
export GDN_VERIFY_VLLM_OPS=${GDN_VERIFY_VLLM_OPS:-$ROOT/.whl/vllm_fla}
export FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws  # CuTe DSL compile cache, reused while the machine stays warm
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
DATE=$(date -u +%Y-%m-%d)

need_site() {
  test -f /tmp/site/.gdnv-site-complete || { echo "site missing: run part1 then check on one warm machine"; exit 3; }
}

versions() {
  python3 - <<'EOF'
import importlib.metadata as md
import torch
for p in ("flashinfer-python", "nvidia-cutlass-dsl", "apache-tvm-ffi", "torch", "triton", "cuda-bindings", "cupy-cuda13x", "hypothesis"):
    try:
        print(p, md.version(p))
    except md.PackageNotFoundError:
        print(p, "absent")
print("gpu", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
import flashinfer.gdn_decode as d
print("flashinfer flags", d._PRETRANSPOSE_AVAILABLE, d._MTP_AVAILABLE if hasattr(d, "_MTP_AVAILABLE") else "?")
EOF
  head -n 2 "$GDN_VERIFY_VLLM_OPS/MANIFEST.txt" 2>/dev/null
}

case "${1:-}" in
part1)
  bash "$ROOT/.whl/gpu1/install1.sh" && nvidia-smi -L && python3 -m pip show cuda-bindings 2>/dev/null | head -n 2
  ;;
check)
  bash "$ROOT/.whl/gpu2/install.sh" || exit $?
  need_site
  { date -u; echo "$DEVICE"; versions; } > "$OUT/env.log" 2>&1
  cat "$OUT/env.log"
  cd "$REPO" || exit 2
  mkdir -p "$OUT/check"
  # one process per adapter, side by side; each compiles its kernels once (head size 128 only)
  for impl in $ADAPTERS; do
    ( timeout "${CHECK_TIMEOUT:-480}" python3 cli.py check --impl "$impl" --dtype bfloat16 --dims 128 \
        --max-examples "${CHECK_EXAMPLES:-8}" --max-tokens 1024 --seed 15 --cases "$OUT/check/cases" \
        --json "$OUT/check/$impl.json" > "$OUT/check/$impl.log" 2>&1
      echo "exit $?" >> "$OUT/check/$impl.log" ) &
  done
  wait
  for impl in $ADAPTERS; do echo "== $impl"; grep -vE "^\[" "$OUT/check/$impl.log" | tail -n 40; done > "$OUT/check_summary.log"
  (cd "$OUT" && tar -czf check.tar.gz check && rm -rf check)
  cat "$OUT/check_summary.log"
  ;;
fuzz)
  need_site
  cd "$REPO" || exit 2
  mkdir -p "$OUT/fuzz"
  BUDGET=${FUZZ_BUDGET:-8m}  # the last example can take a minute past the budget: keep well inside the timeout
  start=$(date +%s)
  for impl in $ADAPTERS; do
    ( timeout "${FUZZ_TIMEOUT:-560}" python3 cli.py fuzz --impl "$impl" --dtype bfloat16 --dims 128 \
        --budget "$BUDGET" --cases "$OUT/fuzz/cases" --database "/tmp/fuzzdb-$impl" > "$OUT/fuzz/$impl.log" 2>&1
      echo "exit $?" >> "$OUT/fuzz/$impl.log" ) &
  done
  wait
  minutes=$(python3 -c "print(round(($(date +%s) - $start) / 60, 1))")
  python3 - "$OUT" "$DEVICE" "$DATE" "$minutes" $ADAPTERS <<'EOF'
import json, re, sys
from pathlib import Path
out, device, date, minutes, impls = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5:]
rows = []
for impl in impls:
    text = (out / "fuzz" / f"{impl}.log").read_text(errors="replace")
    done = re.search(r"fuzz done: (\d+) cases.*?(\d+) failures", text)
    # killed by the timeout: the last progress line still says how far it got
    last = re.findall(r"cases (\d+) .*?failures (\d+)", text)
    got = done.groups() if done else (last[-1] if last else (None, None))
    cases, failures = (None, None) if got[0] is None else (int(got[0]), int(got[1]))
    rows.append(dict(impl=impl, dtype="bfloat16", cases=cases, failures=failures, minutes=minutes,
                     device=device, date=date, note=None if done else "stopped by the timeout; counts from the last progress line"))
(out / "campaigns.json").write_text(json.dumps(rows, indent=1) + "\n")
print(json.dumps(rows, indent=1))
EOF
  for impl in $ADAPTERS; do echo "== $impl"; grep -vE "^\[fuzz\]" "$OUT/fuzz/$impl.log" | tail -n 30; done > "$OUT/fuzz_summary.log"
  (cd "$OUT" && tar -czf fuzz.tar.gz fuzz && rm -rf fuzz)
  cat "$OUT/fuzz_summary.log"
  ;;
*)
  echo "usage: $0 part1|check|fuzz"; exit 2
  ;;
esac
