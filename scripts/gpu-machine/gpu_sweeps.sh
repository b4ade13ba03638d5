#!/usr/bin/env bash
# Bugs that hide from a default run, on one H100/H200: every autotuner config of FLA's chunked
# forward and backward (`check --all-configs`, the backward on the backend FLA picks there), and the
# process and batch-mix properties with the backend recorded on every adapter that this call carries
# (FLA 0.6.0, vLLM 0.34.0's ops, our CuPy kernels, FlashQLA; FlashInfer where its site is installed
# in /tmp/site by earlier calls, in a process of its own: its tvm-ffi cannot share one with TileLang's).
# Detached, so that the work outlives one device call while the machine stays warm. On one warm
# machine, the FlashInfer site first (two calls: `bash scripts/gpu-machine/gpu_session.sh site_part1`
# carrying .whl/gpu1, then `site_part2` carrying .whl/gpu2), then from a copy outside the synced checkout:
#   rm -rf /tmp/gdns && cp -a . /tmp/gdns && cd /tmp/gdns && bash scripts/gpu-machine/gpu_sweeps.sh --background
#   cd /tmp/gdns && bash scripts/gpu-machine/gpu_sweeps.sh --collect SECONDS
# Carried: .whl/releases/fla-0.6.0 and .whl/releases/vllm-0.34.0 (release sites unpacked here:
# gdn_verify.runners.releases.site), .whl/fqla (TileLang and FlashQLA: FLA 0.6.0 refuses its
# chunked backward on Hopper under Triton < 3.7.1 without TileLang; pack_carried.sh fqla).
# Knobs: CONFIG_EXAMPLES (examples per property and config, 8), JOB_TIMEOUT (s per check, 900),
# GRAD_CONFIG_KERNELS (the backward kernels swept; "" for every kernel the backward launches),
# MIX_IMPLS, EXACT_IMPLS, FI_MIX_IMPLS, FI_EXACT_IMPLS (space lists, "" for none; FlashInfer's where its site is), STEPS
# (configs grad-configs mix exact, all by default), CHECK_ARGS (extra check flags: a dry
# run on a CPU under TRITON_INTERPRET=1 with "--dtype float32 --dims 16 --max-examples 2").
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=${LOGS:-/tmp/gpu_sweeps}
mkdir -p "$OUT" "$LOGS"
pack() {
  grep -hE "^(gdn-verify|all configs|FAILED|[0-9]+ passed|exit|error|  same_across)" "$LOGS"/*.log | cut -c1-400 \
    > "$OUT/summary.txt"
  tar -czf "$OUT/sweeps.tar.gz" -C "$LOGS" $(cd "$LOGS" && ls ./*.log ./*.json ./*.txt 2>/dev/null)
  cat "$OUT/summary.txt"
}
. "$(dirname "$0")/detached.sh"
detached "$@"

FQSITE=/tmp/fqsite
if [ -d .whl/fqla ]; then
  [ -f "$FQSITE/.fqla-site-complete" ] || SITE=$FQSITE bash .whl/fqla/install.sh > "$LOGS/fqla-install.txt" 2>&1 || exit 3
else
  echo "no .whl/fqla: FLA's backward and flash-qla run without TileLang" > "$LOGS/fqla-install.txt"
fi
R=$PWD/.whl/releases
export PYTHONPATH="$PWD:$R/fla-0.6.0:$FQSITE" PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
  GDN_VERIFY_VLLM_OPS="$R/vllm-0.34.0/$(cat "$R/vllm-0.34.0/.ops")" CUDA_HOME=/usr/local/cuda \
  TILELANG_CACHE_DIR=/tmp/tilelang-cache TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache TRITON_CACHE_DIR=$LOGS/triton
FI_PATH="$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"  # FlashInfer's site: --target runs no .pth
{ date -u; git rev-parse --short HEAD 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, numpy, importlib.metadata as m; print('torch', torch.__version__, 'triton', \
triton.__version__, 'numpy', numpy.__version__, *(p + ' ' + m.version(p) for p in ('flash-qla', 'tilelang')))"
  python3 -c "import fla; print('fla', fla.__version__, fla.__file__)"; } > "$LOGS/env.txt" 2>&1

check() {  # NAME ARGS...: one check, its log and JSON
  local name=$1 start=$SECONDS; shift
  timeout "${JOB_TIMEOUT:-900}" python3 cli.py check --seed 1 --json "$LOGS/$name.json" --cases "$LOGS/cases" "$@" ${CHECK_ARGS:-} \
    > "$LOGS/$name.log" 2>&1
  echo "exit $? after $((SECONDS - start)) s" >> "$LOGS/$name.log"
}
STEPS=${STEPS:-configs grad-configs mix exact}
N=${CONFIG_EXAMPLES:-8}
case " $STEPS " in *" configs "*)
  # every config of each autotuned kernel FLA's chunked form launches, forward and backward; FLA's
  # recurrent kernel has no autotuner (heuristics only), which the check says in one line (exit 2)
  check configs-fla-chunk --impl fla-chunk --all-configs --max-examples "$N" --dims 64,128 &
  check configs-fla-recurrent --impl fla-recurrent --all-configs --max-examples "$N" &
  ;; esac
case " $STEPS " in *" grad-configs "*)
  # the backward's own kernels (24 of its 58 (kernel, config) pairs; the 34 forward pairs, which the
  # backward launches too, are the forward sweep's): all 58 beside 23 other checks on an H100
  # (2026-12-05) ran 4 property runs in 900 s, most of it compiling. GRAD_CONFIG_KERNELS="": all.
  KERNELS=${GRAD_CONFIG_KERNELS-chunk_bwd_kernel_dv_local,chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64,prepare_wy_repr_bwd_kernel}
  check configs-fla-chunk-grad --impl fla-chunk --grad --all-configs ${KERNELS:+--config-kernels "$KERNELS"} \
    --max-examples 4 --dims 64,128 &
  ;; esac
case " $STEPS " in *" mix "*)
  # the process and batch-mix properties, each adapter's backend recorded in its JSON and counts line
  NATIVE=output_isolation,optional_dtypes,shape_class_return,varlen_equals_separate,guarded_inputs,in_kernel_gate
  NATIVE=$NATIVE,inputs_read_exactly
  SPEC=spec_batch_mix,spec_guarded_pool,spec_decode_slots,spec_decode_stream
  for impl in ${MIX_IMPLS-fla-chunk fla-recurrent vllm-chunk vllm-recurrent vllm-packed-decode \
      vllm-sigmoid-recurrent vllm-spec vllm-sigmoid-spec cupy cupy-recurrent cupy-chunk flash-qla}; do
    case $impl in vllm-spec | vllm-sigmoid-spec) props=$SPEC ;; cupy) props=$NATIVE,$SPEC ;; *) props=$NATIVE ;; esac
    check "mix-$impl" --impl "$impl" --properties "$props" &
  done
  # FlashInfer in a process without TileLang's site (another tvm-ffi)
  if [ -f /tmp/site/.gdnv-site-complete ]; then
    for impl in ${FI_MIX_IMPLS-flashinfer-prefill flashinfer-prefill-cp flashinfer-decode flashinfer-decode-bf16 \
        flashinfer-decode-kmajor flashinfer-mtp}; do
      case $impl in flashinfer-mtp) props=$SPEC ;; *) props=$NATIVE ;; esac
      PYTHONPATH="$FI_PATH" check "mix-$impl" --impl "$impl" --properties "$props" &
    done
  fi
  ;; esac
case " $STEPS " in *" exact "*)
  # float16 inputs held to the exact result (FlashInfer #4214: float16 down a bfloat16 path)
  for impl in ${EXACT_IMPLS-fla-chunk vllm-packed-decode cupy cupy-chunk}; do
    check "exact-$impl" --impl "$impl" --dtype float16 --properties inputs_read_exactly &
  done
  if [ -f /tmp/site/.gdnv-site-complete ]; then
    for impl in ${FI_EXACT_IMPLS-flashinfer-prefill flashinfer-decode flashinfer-decode-kmajor}; do
      PYTHONPATH="$FI_PATH" check "exact-$impl" --impl "$impl" --dtype float16 --properties inputs_read_exactly &
    done
  fi
  ;; esac
wait
echo "done $(date -u +%T)"
