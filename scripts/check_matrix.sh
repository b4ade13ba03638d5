#!/usr/bin/env bash
# CPU matrix: the correct NumPy implementations pass `check` with the defaults (token loop, FLA-style
# chunk 64 and 16 with a float32 gate cumsum, float64-cumsum chunk) in float32 and float16 under
# three seeds. 24 runs, in parallel on a machine with many cores:
#   JOBS=12 OUT=logs bash scripts/check_matrix.sh
# Writes $OUT/check_matrix.log (one line per run: implementation, dtype, seed, exit status,
# counts) and exits nonzero if any run did not exit 0.
set -u -o pipefail
OUT=${OUT:-check_matrix_logs}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT/runs"
runs=()
for impl in numpy-recurrent numpy-chunk-fla numpy-chunk16-fla numpy-chunk-cumsum64; do
  for dtype in float32 float16; do
    for seed in 1 2 3; do runs+=("$impl $dtype $seed"); done
  done
done
one() {
  set -- $1
  local log="$OUT/runs/$1-$2-$3.log"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout 900 python3 cli.py check --impl "$1" --dtype "$2" --seed "$3" \
    --cases "$OUT/cases" > "$log" 2>&1
  echo "$1 $2 seed=$3 exit=$? $(tail -n 1 "$log")"
}
export -f one
export OUT
printf '%s\n' "${runs[@]}" | xargs -P "$JOBS" -I{} bash -c 'one "{}"' | sort | tee "$OUT/check_matrix.log"
! grep -v "exit=0" "$OUT/check_matrix.log"
