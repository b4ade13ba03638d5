#!/usr/bin/env bash
# The release matrix on one GPU: the default check of every FLA and vLLM adapter at several releases
# of its library, and beside it the scale tier of some. One `gdn-verify matrix` per (adapter,
# release), so that releases run side by side (scripts/summarize_releases.py joins them into one
# table per adapter); a queue of DEFAULT_JOBS default checks at once and SCALE_LANES scale tiers at
# once (a scale case takes up to ~60 GiB of the GPU). Detached: the work outlives one device call.
# Run from a copy outside the synced checkout (a later call that carries nothing removes .whl/):
#   rm -rf /tmp/gdnr && cp -a . /tmp/gdnr && cd /tmp/gdnr && bash scripts/gpu-machine/gpu_releases.sh --background
#   cd /tmp/gdnr && bash scripts/gpu-machine/gpu_releases.sh --collect SECONDS
# Carried: .whl/releases, the release sites unpacked here (no network there):
#   GDN_VERIFY_RELEASES=$PWD/.whl/releases python -c "from gdn_verify.runners import releases; \
#     [releases.site(l, v, Path('wheels')) for l, v in ...]"   (see the report's README)
# Knobs: FLA_VERSIONS, VLLM_VERSIONS (comma lists), FLA_IMPLS, VLLM_IMPLS, SCALE_IMPLS (space lists; empty: none),
# DEFAULT_JOBS (10), SCALE_LANES (2), CHECK_ARGS (extra check flags: a reduced check for a dry run on
# a CPU under TRITON_INTERPRET=1, with SCALE_IMPLS=""), JOB_TIMEOUT (s, 1500).
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=${LOGS:-/tmp/gpu_releases}
mkdir -p "$OUT" "$LOGS"
pack() {
  PYTHONPATH=$PWD python3 scripts/summarize_releases.py "$LOGS" --out "$OUT" > "$OUT/summary.txt" 2>&1
  tar -czf "$OUT/releases.tar.gz" -C "$LOGS" $(cd "$LOGS" && ls ./*.log ./*.json ./*.txt 2>/dev/null)
  cat "$OUT/summary.txt"
}
. "$(dirname "$0")/detached.sh"
detached "$@"

FLA_VERSIONS=${FLA_VERSIONS:-0.4.2,0.5.2,0.6.0}
VLLM_VERSIONS=${VLLM_VERSIONS:-0.10.2,0.16.0,0.20.0,0.34.0}
FLA_IMPLS=${FLA_IMPLS-fla-chunk fla-recurrent}
VLLM_IMPLS=${VLLM_IMPLS-vllm-chunk vllm-recurrent vllm-spec vllm-packed-decode vllm-sigmoid-recurrent vllm-sigmoid-spec}
SCALE_IMPLS=${SCALE_IMPLS-fla-chunk vllm-recurrent fla-recurrent vllm-chunk vllm-packed-decode}
SCALE_CASES=scale_decode_batch,scale_varlen_many_short,scale_many_chunks,scale_batch_offset,scale_varlen_offset,scale_long_sequence
# One BLAS thread per process: many checks share the cores (the float64 oracle is NumPy); a
# compile pool of 2 workers each; one Triton cache (releases share unchanged kernels); the scale
# tier's float64 cases cached once for the machine (one seed).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GDN_VERIFY_RELEASES=$PWD/.whl/releases OPENBLAS_NUM_THREADS=1 \
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 GDN_VERIFY_COMPILE_WORKERS=2 TRITON_CACHE_DIR=$LOGS/triton \
  GDN_VERIFY_SCALE_CACHE=$LOGS/scale-cache
{ date -u; git rev-parse --short HEAD 2>/dev/null; nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
  ls "$GDN_VERIFY_RELEASES"; } > "$LOGS/env.txt" 2>&1

job() {  # IMPL VERSION [matrix flags...]: one release of one adapter; the log and JSON named after both
  local impl=$1 version=$2 name=$1-$2; shift 2
  case "$*" in *scale_*) name=$name-scale ;; esac
  local start=$SECONDS
  # shellcheck disable=SC2086
  timeout "${JOB_TIMEOUT:-1500}" python3 cli.py matrix --impl "$impl" --versions "$version" --seed 1 \
    --cases "$LOGS/cases" --plans "$LOGS/plans" --json "$LOGS/$name.json" ${CHECK_ARGS:-} "$@" \
    > "$LOGS/$name.log" 2>&1
  echo "exit $? after $((SECONDS - start)) s" >> "$LOGS/$name.log"
}
export -f job
export LOGS CHECK_ARGS JOB_TIMEOUT

queue() {  # the default checks, slowest adapters first
  for impl in $FLA_IMPLS; do for v in ${FLA_VERSIONS//,/ }; do echo "$impl $v"; done; done
  for impl in $VLLM_IMPLS; do for v in ${VLLM_VERSIONS//,/ }; do echo "$impl $v"; done; done
}
scale_queue() {  # each SCALE_IMPL at its library's releases, oldest first within a lane's turn
  for impl in $SCALE_IMPLS; do
    case $impl in fla-*) versions=$FLA_VERSIONS ;; *) versions=$VLLM_VERSIONS ;; esac
    for v in ${versions//,/ }; do echo "$impl $v --properties $SCALE_CASES"; done
  done
}
echo "start $(date -u +%T)"
scale_queue | xargs -r -P "${SCALE_LANES:-2}" -L 1 bash -c 'job $0 "$@"' &
queue | xargs -r -P "${DEFAULT_JOBS:-10}" -L 1 bash -c 'job $0 "$@"'
wait
echo "done $(date -u +%T)"
