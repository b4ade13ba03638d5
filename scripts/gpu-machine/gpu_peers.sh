#!/usr/bin/env bash
# Every peer bench on one warm H100/H200, one run after another in a detached driver, so that the
# queue outlives each device call and a lost turn costs no run (scripts/gpu-machine/README.md, "The peer
# prefill bench"). Run from a copy outside the synced checkout (/tmp), after site_part1 and
# site_part2 of gpu_session.sh (FlashInfer's site, FLA installed into it):
#   bash scripts/gpu-machine/gpu_peers.sh --background        start the driver (STEPS, default below)
#   bash scripts/gpu-machine/gpu_peers.sh --collect SECONDS   wait up to SECONDS for it, then pack $OUT
# Steps, in STEPS order (each writes /tmp/peers/STEP/ and /tmp/peers/STEP.log):
#   site       bench_peers.py: SITE_PEERS (default ours, ours-cp-off, fla, flashinfer, flashinfer-cp,
#              vllm); every row below 262144 tokens
#   decode     bench_decode.py --peers: ours, DecodeStep, FLA, FlashInfer fp32/bf16 state, the copy
#   fqla       bench_peers.py: ours, flashqla (below 262144 tokens), in FlashQLA's site /tmp/fqsite,
#              which never shares a process with /tmp/site (two tvm-ffi versions); installed from
#              FQLA_BUNDLE (default /tmp/fqla-bundle: a later call copies a carried .whl/fqla
#              there), waited for up to FQLA_WAIT seconds
#   long       the 262144-token rows without vLLM; long-vllm: ours and vLLM alone on them (its fork
#              has failed past 2^31 elements: a lost CUDA context voids a row for every peer);
#   fqla-long  ours and flashqla on them
#   cp         bench_context_parallel.py: the context-parallel cost model's measurements
#   slow, fqla-slow  the prefill peers (FlashQLA apart) on SLOW_ROWS with slow gates
#              (bench_peers.py --gates slow: the state remembers thousands of tokens), named only
#   ncu        scripts/profile_peers_ncu.py: host and device time per prefill peer (NCU_ROWS), then
#              Nsight Compute of each prefill peer (NCU_PEERS, space-separated) on those rows and of the
#              float32-state decode of ours and FlashInfer (NCU_DECODE, comma-separated H/HV:B), one ncu
#              run per peer and NCU_CALLS (default 1) profiled calls per row -> ncu/*.log, and
#              scripts/ncu_summary.py's tables of them -> ncu/summary.md, ncu/summary.json
#   fqla-ncu   the same for flashqla in its site: host times, then ncu on NCU_ROWS -> ncu/prefill-flashqla.log,
#              and the summary again over every log in ncu/
# A step whose prefill_peers.json exists continues with --resume. The timed runs are one at a time:
# the machine is otherwise idle.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=/tmp/peers
mkdir -p "$OUT" "$LOGS"
pack() {
  cat "$LOGS/driver.txt"
  for f in "$LOGS"/*.log; do echo "== $f"; tail -n 4 "$f" | cut -c1-300; done
  tar -czf "$OUT/peers.tar.gz" -C /tmp peers
}
. "$(dirname "$0")/detached.sh"
detached "$@"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws CUDA_HOME=/usr/local/cuda \
  TILELANG_CACHE_DIR=/tmp/tilelang-cache TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache
SITE=/tmp/site
FI_PATH="$PWD:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages"
QLA_PATH="$PWD:/tmp/fqsite"
[ -f "$SITE/.gdnv-site-complete" ] || { echo "site missing: run gpu_session.sh site_part1, site_part2 first"; exit 3; }
export GDN_VERIFY_VLLM_OPS=$PWD/.whl/vllm_fla
LONG=262144
SLOW_ROWS=${SLOW_ROWS:-1x65536\$,^16/32 64x512\$}  # the slow-gate rows: where CP and decay truncation matter, and one many-sequence row
prefill() {  # NAME PYTHONPATH PEERS [ROWS [GATES]]: one bench_peers.py run
  local name=$1 path=$2 list=$3 rows=${4:-} gates=${5:-fast} resume=()
  [ -f "$LOGS/$name/prefill_peers.json" ] && resume=(--resume)
  echo "$(date -u +%T) $name: $list${rows:+, rows $rows}, $gates gates"
  PYTHONPATH=$path python3 scripts/bench_peers.py "$LOGS/$name" --peers "$list" ${rows:+--rows "$rows"} \
    --gates "$gates" "${resume[@]}" >> "$LOGS/$name.log" 2>&1
  echo "$(date -u +%T) $name: exit $?"
}
fqla_site() {  # installs FlashQLA's site once; waits for the carried bundle
  [ -f /tmp/fqsite/.fqla-site-complete ] && return 0
  local bundle=${FQLA_BUNDLE:-/tmp/fqla-bundle}
  for _ in $(seq "${FQLA_WAIT:-600}"); do [ -f "$bundle/install.sh" ] && break; sleep 1; done
  [ -f "$bundle/install.sh" ] || { echo "no FlashQLA bundle at $bundle: fqla skipped"; return 1; }
  SITE=/tmp/fqsite bash "$bundle/install.sh" && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/fqsite .whl/*.whl
}
NCU_ROWS=${NCU_ROWS:-16/32 8x2048\$,2/8 1x65536\$} NCU_PEERS=${NCU_PEERS:-ours ours-cp-off flashinfer flashinfer-cp}
NCU_DECODE=${NCU_DECODE:-16/32:1024}
profile() {  # PYTHONPATH LOG ARGS...: one ncu run of profile_peers_ncu.py -> ncu/LOG.log
  local path=$1 log=$2; shift 2
  PYTHONPATH=$path timeout "${NCU_TIMEOUT:-300}" ncu --profile-from-start off --clock-control none \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    python3 scripts/profile_peers_ncu.py "$@" --calls "${NCU_CALLS:-1}" > "$LOGS/ncu/$log.log" 2>&1
  echo "$(date -u +%T) ncu $log: exit $?"
}
summarize() { python3 scripts/ncu_summary.py "$LOGS/ncu/summary" "$LOGS"/ncu/prefill-*.log "$LOGS"/ncu/decode-*.log; }
for step in ${STEPS:-site decode fqla long long-vllm fqla-long cp}; do
  case $step in
    site) prefill site "$FI_PATH" "${SITE_PEERS:-ours,ours-cp-off,fla,flashinfer,flashinfer-cp,vllm}" "^(?!.*$LONG)" ;;
    decode)
      mkdir -p "$LOGS/decode"; echo "$(date -u +%T) decode"
      PYTHONPATH=$FI_PATH python3 scripts/bench_decode.py "$LOGS/decode" --peers > "$LOGS/decode.log" 2>&1
      echo "$(date -u +%T) decode: exit $?" ;;
    fqla | fqla-long)
      rows="^(?!.*$LONG)"; [ "$step" = fqla-long ] && rows=$LONG
      fqla_site && prefill "$step" "$QLA_PATH" ours,flashqla "$rows" ;;
    slow) prefill slow "$FI_PATH" ours,ours-cp-off,fla,flashinfer,flashinfer-cp "$SLOW_ROWS" slow ;;
    fqla-slow) fqla_site && prefill fqla-slow "$QLA_PATH" ours,flashqla "$SLOW_ROWS" slow ;;
    long) prefill long "$FI_PATH" ours,ours-cp-off,fla,flashinfer,flashinfer-cp "$LONG" ;;
    long-vllm) prefill long-vllm "$FI_PATH" ours,vllm "$LONG" ;;
    cp)
      echo "$(date -u +%T) cp"
      PYTHONPATH=$PWD python3 scripts/bench_context_parallel.py "$LOGS/cp" > "$LOGS/cp.log" 2>&1
      echo "$(date -u +%T) cp: exit $?" ;;
    ncu)
      mkdir -p "$LOGS/ncu"; echo "$(date -u +%T) ncu"
      PYTHONPATH=$FI_PATH python3 scripts/profile_peers_ncu.py --rows "$NCU_ROWS" --peers "$(echo $NCU_PEERS | tr ' ' ,)" \
        --decode '' --calls 0 > "$LOGS/ncu/host.log" 2>&1
      for p in $NCU_PEERS; do profile "$FI_PATH" "prefill-$p" --rows "$NCU_ROWS" --peers "$p" --decode ''; done
      for p in ours flashinfer; do profile "$FI_PATH" "decode-$p" --rows '' --decode "$NCU_DECODE" --decode-peers "$p"; done
      summarize ;;
    fqla-ncu)
      mkdir -p "$LOGS/ncu"; echo "$(date -u +%T) fqla-ncu"
      fqla_site && PYTHONPATH=$QLA_PATH python3 scripts/profile_peers_ncu.py --rows "$NCU_ROWS" --peers flashqla \
        --decode '' --calls 0 > "$LOGS/ncu/host-flashqla.log" 2>&1 &&
        profile "$QLA_PATH" prefill-flashqla --rows "$NCU_ROWS" --peers flashqla --decode '' && summarize ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "$(date -u +%T) queue done"
