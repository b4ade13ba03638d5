#!/usr/bin/env bash
# Modular MAX's gated_delta kernels under `check` and a short `fuzz` campaign on one H100/H200: the
# recurrence and the speculative verify ring, each on a float32 and a bfloat16 pool (max-recurrence,
# max-recurrence-bf16, max-verify-ring, max-verify-ring-bf16), drawn from MAX's Qwen3.5 shapes (K = V
# = 128, stored as the shape pools the runs reuse): the campaigns on the whole layers (16 key heads;
# 32, 48 or 64 value heads), the checks on one GPU's share at tensor parallelism CHECK_TP (8: 2 key
# heads; 4, 6 or 8 value heads), where our float64 oracle costs 4 to 8 times less (the whole layers'
# checks did not finish in 25 minutes, H100 2026-11-28). Every graph is compiled here beforehand
# (`mefs`, MAX's virtual-device mode) and loaded there, so that no device time goes to compiling.
# MAX 26.7.0 is 243 MB of wheels: it travels as one xz-compressed site in three parts of at most
# 56 MiB, one per device call (scripts/gpu-machine/README.md, "MAX wheels"), which `bash scripts/gpu-machine/pack_carried.sh max`
# builds here from wheels pinned by version and sha256. Detached, so that the work outlives one
# device call while the machine stays warm:
#   bash scripts/gpu-machine/gpu_max.sh pack                  here, once: runs `bash scripts/gpu-machine/pack_carried.sh max` (.whl/max1 .whl/max2 .whl/max3)
#   bash scripts/gpu-machine/gpu_max.sh mefs                  here, after each change to the adapters' graphs: compiles them into
#                                                 .whl/maxmefs/mefs.tar.xz (needs MAX 26.7.0 for this Python: MAX_HERE, a site)
#   bash scripts/gpu-machine/gpu_max.sh stage                 on the GPU machine, once per carried part (calls 1-3)
#   bash scripts/gpu-machine/gpu_max.sh install               after the third: check the parts, unpack /tmp/maxsite, check every file
#   bash scripts/gpu-machine/gpu_max.sh copy                  the checkout (less .whl) to /tmp/gdnv, where the driver runs
#   bash scripts/gpu-machine/gpu_max.sh --background          (from /tmp/gdnv) start the driver
#   bash scripts/gpu-machine/gpu_max.sh --collect SECONDS     wait up to SECONDS for it, then pack $OUT
# IMPLS, CHECK_IMPLS (the checks' subset of IMPLS), FUZZ_IMPLS (the campaigns'; empty: none), CHECK_PROPERTIES (every property), CHECK_TOKENS (the
# checks' --max-tokens, 4096: error_growth's default sweep for a GPU adapter goes to 65536 tokens, where our
# float64 oracle on the CPU took over 300 s per example, H100 2026-11-28), CHECK_TP (8), CHECK_EXAMPLES (10), CHECK_TIMEOUT (1500 s per check), FUZZ_BUDGET (3m),
# TIMEOUT (300 s: compiles run inside calls), SMOKE (1) and SIDE_BY_SIDE (0; 1: the campaigns start with the checks,
# so that their compiles overlap) narrow a rerun. MAX_SITE (/tmp/maxsite) and MAX_PARTS (/tmp/maxparts) move the site and the staged parts.
set -u -o pipefail
OUT=${OUT:-gpu_logs}
LOGS=/tmp/gpu_max
SITE=${MAX_SITE:-/tmp/maxsite}
PARTS=${MAX_PARTS:-/tmp/maxparts}
IMPLS=${IMPLS:-max-recurrence max-recurrence-bf16 max-verify-ring max-verify-ring-bf16}
ARCHIVE=max-site.tar.xz
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # install cds into $PARTS

MEFS=$PARTS/mefs  # the precompiled graphs on the GPU machine
case ${1:-} in
  pack)  # here (network): one way to pack, scripts/gpu-machine/pack_carried.sh max
    exec bash "$HERE/pack_carried.sh" max ;;
  mefs)  # here (no GPU): every graph of both shape pools, compiled for sm_90a, as one small archive, carried with part 3
    [ -n "${MAX_HERE:-}" ] || { echo "MAX_HERE: a site with max==26.7.0 for $(python3 -V) (pip install --target)"; exit 2; }
    rm -rf .whl/mefs && PYTHONPATH="$PWD:$MAX_HERE" python3 "$HERE/../max_precompile.py" .whl/mefs --tensor-parallel "1,${CHECK_TP:-8}" \
      && mkdir -p .whl/maxmefs && tar -C .whl -cJf .whl/maxmefs/mefs.tar.xz mefs && rm -rf .whl/mefs && ls -l .whl/maxmefs/mefs.tar.xz
    exit $? ;;
  stage)  # on the GPU machine: keep the carried part outside the synced checkout (max3 brings SHA256SUMS and site.sha256)
    mkdir -p "$PARTS" && cp .whl/max[123]/"$ARCHIVE".part* "$PARTS"/ 2>/dev/null
    for f in SHA256SUMS site.sha256; do [ -f ".whl/max3/$f" ] && cp ".whl/max3/$f" "$PARTS"/; done
    if [ -f .whl/maxmefs/mefs.tar.xz ]; then  # Python's tarfile: no xz on the GPU machine
      rm -rf "$MEFS" && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
        .whl/maxmefs/mefs.tar.xz "$PARTS" && echo "precompiled graphs: $(find "$MEFS" -name '*.mef' | wc -l) in $MEFS"
    fi
    ls -l "$PARTS"; shift; [ "${1:-}" = install ] || exit 0 ;;
esac
if [ "${1:-}" = install ]; then
  [ -f "$SITE/.max-site-complete" ] && { echo "site already complete"; exit 0; }
  cd "$PARTS" || exit 3
  for i in 0 1 2; do [ -f "$ARCHIVE.part$i" ] || { echo "part $i missing: stage all three"; exit 3; }; done
  if ! { [ -f SHA256SUMS ] && [ -f site.sha256 ] && grep -qxE "[0-9a-f]{64}  site\.sha256" SHA256SUMS; }; then
    echo "SHA256SUMS or site.sha256 missing (both come with .whl/max3 of bash scripts/gpu-machine/pack_carried.sh max): stage it"; exit 3
  fi
  rm -f "$ARCHIVE"  # an earlier join
  sha256sum -c --ignore-missing SHA256SUMS || { echo "a part is damaged: carry it again"; exit 3; }
  cat "$ARCHIVE.part0" "$ARCHIVE.part1" "$ARCHIVE.part2" > "$ARCHIVE"
  grep " $ARCHIVE$" SHA256SUMS | sha256sum -c || { rm -f "$ARCHIVE"; echo "the parts joined differ from SHA256SUMS: parts of two packs?"; exit 3; }
  rm -rf "$SITE" && mkdir -p "$(dirname "$SITE")" || exit 3
  unpack=$(mktemp -d "$(dirname "$SITE")/.maxsite-unpack.XXXXXX") || exit 3
  # Unpacked with Python's tarfile (no xz here) into a fresh folder, every file checked against site.sha256.
  python3 "$HERE/carried/site_check.py" max "$ARCHIVE" site.sha256 "$unpack"
  status=$?
  rm -f "$ARCHIVE"
  [ "$status" = 0 ] || { rm -rf "$unpack"; echo "the unpacked site does not match site.sha256 (above): nothing installed"; exit 3; }
  mv "$unpack" "$SITE" && chmod 755 "$SITE" && touch "$SITE/.max-site-complete" \
    && echo "max install: $SITE complete ($(du -sh "$SITE" | cut -f1))"
  exit $?
fi
if [ "${1:-}" = copy ]; then
  rm -rf /tmp/gdnv && mkdir -p /tmp/gdnv
  tar -cf - --exclude=./.whl --exclude=./.gdn_verify --exclude=./.venv --exclude=./.git . \
    | tar -xf - -C /tmp/gdnv && echo "copied to /tmp/gdnv"
  exit $?
fi

mkdir -p "$OUT" "$LOGS"
pack() {
  grep -hE "^(gdn-verify|  [a-z_]+ +(passed|FAILED|failed|ERROR|error|unsupported|timeout)|[0-9]+ passed|FAILED|ERROR|  minimal|  likely|campaign|exit|smoke|plan|torch|[A-Z].*(H100|H200))" \
    "$LOGS"/*.log "$LOGS"/env.txt 2>/dev/null | cut -c1-400 > "$OUT/summary.txt"
  local out; out=$(cd "$OUT" && pwd)
  (cd "$LOGS" && find . -maxdepth 2 \( -name '*.log' -o -name '*.json' -o -name '*.txt' -o -name '*.npz' \) -size -4M \
    | tar -czf "$out/max.tar.gz" -T -)
  cat "$OUT/summary.txt"
}
# shellcheck disable=SC1091  # detached.sh, beside this script
. "$(dirname "$0")/detached.sh"
detached "$@"
[ -f "$SITE/.max-site-complete" ] || { echo "MAX site missing: stage the three parts and install first"; exit 3; }
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
[ -d "$MEFS" ] && export GDN_VERIFY_MAX_MEFS=$MEFS  # else every process compiles its graphs (minutes each)
{ date -u; echo "GDN_VERIFY_MAX_MEFS=${GDN_VERIFY_MAX_MEFS:-(none: compiled here)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import importlib.metadata as m, torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__, *(p + ' ' + m.version(p) for p in ('max', 'max-core', 'mojo-compiler')))"
} > "$LOGS/env.txt" 2>&1
# Smoke: one Qwen3.5-sized call of each kernel against the float64 oracle, with the compile timed,
# so that an engine that cannot compile or run here says so in a few lines.
smoke() {
timeout 900 python3 - 2>&1 <<'EOF'
import time
import numpy as np
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.implementations import resolve

rng = np.random.default_rng(0)
H, HV, K, lengths = 16, 32, 128, [1, 7, 0, 33]
cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
T = int(cu[-1])
problem = Problem(
    q=rng.standard_normal((1, T, H, K)), k=rng.standard_normal((1, T, H, K)), v=rng.standard_normal((1, T, HV, K)),
    g=np.log(rng.uniform(0.9, 1.0, (1, T, HV))), beta=rng.uniform(0, 1, (1, T, HV)),
    initial_state=rng.standard_normal((len(lengths), HV, K, K)).astype(np.float32),
    use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
).astype(DTYPES["bfloat16"])
want_o, want_s = numpy_oracle(problem)
for name in ("max-recurrence", "max-verify-ring"):
    try:
        impl = resolve(name)
        for which in ("first (loads or compiles)", "second"):
            start = time.perf_counter()
            r = impl.run(problem)
            print(f"smoke {name} {which} call: {time.perf_counter() - start:.1f} s")
        o_err = np.abs(np.asarray(r.o, np.float64) - want_o).max()
        s_err = np.abs(np.asarray(r.final_state, np.float64) - want_s).max()
        print(f"smoke {name}: max |o - oracle| {o_err:.3g}, max |state - oracle| {s_err:.3g}")
    except Exception as exc:  # noqa: BLE001 - the smoke test reports, the checks judge
        print(f"smoke {name} FAILED: {type(exc).__name__}: {exc}")
EOF
echo "exit $?"
}
if [ "${SMOKE:-1}" = 1 ]; then
  smoke > "$LOGS/smoke.log"
  # Precompiled graphs that do not load on this machine must not cost the run: compile instead.
  if grep -q FAILED "$LOGS/smoke.log" && [ -n "${GDN_VERIFY_MAX_MEFS:-}" ]; then
    unset GDN_VERIFY_MAX_MEFS
    { echo "smoke with the precompiled graphs failed (above): again, compiling them here"; smoke; } >> "$LOGS/smoke.log"
    echo "GDN_VERIFY_MAX_MEFS unset after the smoke failed with it" >> "$LOGS/env.txt"
  fi
fi
# The shape pools: MAX's Qwen3.5 classes, stored as the plans the runs reuse (no probe, no other
# classes): whole layers for the campaigns (plans-fuzz), tensor parallelism CHECK_TP for the checks.
for pool in fuzz:1 "check:${CHECK_TP:-8}"; do
  # shellcheck disable=SC2086  # IMPLS: one word per implementation
  python3 - "$LOGS/plans-${pool%%:*}" "${pool#*:}" $IMPLS >> "$LOGS/plans.log" 2>&1 <<'EOF'
import sys
from pathlib import Path
from gdn_verify.implementations import resolve
from gdn_verify.implementations.max_kernels import qwen35_classes
from gdn_verify.runners.compile import PlanKey, ShapePlan, save_plan

for name in sys.argv[3:]:
    impl = resolve(name)
    key = PlanKey.of(impl, "bfloat16", (128,))
    classes = qwen35_classes("bfloat16", tensor_parallel=int(sys.argv[2]))
    save_plan(Path(sys.argv[1]) / key.filename(), key, ShapePlan(classes, None, None, True))
    heads = sorted({(c.H, c.HV) for c in classes})
    print(f"plan {name} ({Path(sys.argv[1]).name}): {len(classes)} classes, heads {heads}")
EOF
  echo "exit $?" >> "$LOGS/plans.log"
done
common=(--dtype bfloat16 --dims 128 --cases "$LOGS/cases" --timeout "${TIMEOUT:-300}")
for impl in ${CHECK_IMPLS:-$IMPLS}; do
  ( start=$(date +%s)
    timeout "${CHECK_TIMEOUT:-1500}" python3 cli.py check --impl "$impl" "${common[@]}" --plans "$LOGS/plans-check" --seed 1 \
      --max-examples "${CHECK_EXAMPLES:-10}" \
      ${CHECK_PROPERTIES:+--properties "$CHECK_PROPERTIES"} --max-tokens "${CHECK_TOKENS:-4096}" \
      --json "$LOGS/check-$impl.json" > "$LOGS/check-$impl.log" 2>&1
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$LOGS/check-$impl.log" ) &
done
[ "${SIDE_BY_SIDE:-0}" = 1 ] || wait
for impl in ${FUZZ_IMPLS-$IMPLS}; do
  ( start=$(date +%s)
    timeout 1500 python3 cli.py fuzz --impl "$impl" "${common[@]}" --plans "$LOGS/plans-fuzz" --seed 2 \
      --budget "${FUZZ_BUDGET:-3m}" \
      --database "$LOGS/hypothesis-$impl" --campaigns "$LOGS/campaigns.json" --json "$LOGS/fuzz-$impl.json" \
      > "$LOGS/fuzz-$impl.log" 2>&1
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$LOGS/fuzz-$impl.log" ) &
done
wait
