#!/usr/bin/env bash
# Builds the git-ignored bundles under .whl/ that GPU runs carry (the GPU machine has no network),
# from pinned wheels whose sha256 is checked after every download, so that each session carries the
# same bytes. Here, from the repository root, with PyPI reachable (any python3 with pip; xz and GNU
# tar for fqla):
#   bash scripts/pack_carried.sh fla      FLA 0.6.0's two wheels into .whl/ (1.4 MiB), installed on the
#                                         GPU machine by scripts/common.sh (/tmp/site) or scripts/gpu_grad.sh
#                                         (/tmp/fqsite)
#   bash scripts/pack_carried.sh fqla     .whl/fqla/ (39 MiB): FlashQLA 0.1.3, TileLang 0.1.15, apache-tvm-ffi
#                                         0.1.12 and what they need that the GPU image lacks, laid out as
#                                         `pip install --target` lays them out for CPython 3.12 and xz-compressed
#                                         as one fqla-site.tar.xz; install.sh (scripts/carried/fqla_install.sh),
#                                         SHA256SUMS, site.sha256 (every file of the site) and README.txt
#   bash scripts/pack_carried.sh verify   what is in .whl/ already, against the pins (no network)
# Subcommands run in the order given (`fla fqla`). About 5 minutes for fqla on 2 cores (xz -9e); two
# packs of the same pins give the same fqla-site.tar.xz. Downloads stay in $PACK_CACHE (~/.cache/gdn-verify/wheels).
# The wheels' requirements are checked by scripts/carried/requires.py against the GPU image's
# distributions (scripts/carried/gpu_image_packages.txt): the pack fails on a requirement met by
# neither, and on a carried wheel nothing needs. scripts/README.md ("Carried wheels") says what
# travels in which device call.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHL=.whl
LIMIT_MIB=56  # a device call carries 64 MiB, the working tree (~5 MiB) included
CACHE=${PACK_CACHE:-$HOME/.cache/gdn-verify/wheels}  # downloaded wheels that are not carried as they are
die() { echo "pack_carried: $*" >&2; exit 1; }
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

# The GPU machine: CPython 3.12.3, manylinux_2_28 or newer, x86_64.
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64)

# Pins: distribution, version, the wheel pip picks for TARGET, its sha256 (PyPI, 2026-11-27).
FLA_PINS=(
  "fla-core 0.6.0 fla_core-0.6.0-py3-none-any.whl b0708b70e0b119cd58a0a5146ea56cb175cef6ed969d8ac60267e3e077ce3ebd"
  "flash-linear-attention 0.6.0 flash_linear_attention-0.6.0-py3-none-any.whl 6dec9735f8454523c13553622e98aff30152dde6586b4ac7d88010fbb7a06b5f"
)
FQLA_ROOTS=(flash-qla tilelang apache-tvm-ffi)
FQLA_PINS=(
  "flash-qla 0.1.3 flash_qla-0.1.3-py3-none-any.whl 4a76f76edfc98e0f161c2f0fee73f7d7267276d954339dec4fb5d2e077aff061"
  "tilelang 0.1.15 tilelang-0.1.15-cp39-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl ca021a3450ad84b8fe7deb1b659c8d3d2e4b0855fdb59e2992a5349acf019881"
  "apache-tvm-ffi 0.1.12 apache_tvm_ffi-0.1.12-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl dc0acd7eeb0e451d5e3f686af3ba0b495fdbf97b5b54cf9a0f770cdafe0e691a"
  # tilelang requires z3-solver<4.15.5,>=4.13.0 (libtvm_compiler.so links libz3.so.4.15 from z3/lib)
  "z3-solver 4.15.4.0 z3_solver-4.15.4.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl 7e103a6f203f505b8b8b8e5c931cc407c95b61556512d4921c1ddc0b3f41b08e"
  # tilelang requires torch-c-dlpack-ext (Python < 3.14); tvm_ffi skips it where torch has the exchange API
  "torch-c-dlpack-ext 0.1.5 torch_c_dlpack_ext-0.1.5-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl e6f9da4bb9af70e27facc777458be62e10dbbbddda7672d16138db0553c5a524"
)

ignored_check() {  # a .whl/ that git does not ignore would travel whole with every device call
  git rev-parse --is-inside-work-tree > /dev/null 2>&1 || return 0
  git check-ignore -q "$WHL/" || die "$WHL/ is not git-ignored: add /.whl/ to .gitignore, or every device call carries it"
}

sums() {  # DIR PIN...: the pins' "sha256  DIR/file" lines
  local dir=$1 name version file sum; shift
  for pin in "$@"; do
    read -r name version file sum <<< "$pin"
    echo "$sum  $dir/$file"
  done
}

fetch() {  # DIR PIN...: pip download each pinned wheel into DIR (pip checks the hash), then check every sha256 again
  local dir=$1 req name version file sum; shift
  mkdir -p "$dir"
  req=$SCRATCH/requirements.txt
  for pin in "$@"; do
    read -r name version file sum <<< "$pin"
    echo "$name==$version --hash=sha256:$sum"
  done > "$req"
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --require-hashes "${TARGET[@]}" \
    -d "$dir" -r "$req" || die "pip download failed (above): no network, a pin PyPI no longer serves, or a sha256 other than the pin"
  for pin in "$@"; do
    read -r name version file sum <<< "$pin"
    [ -f "$dir/$file" ] || die "$dir/$file missing after download: pip picked another file for $name $version"
  done
  sums "$dir" "$@" | sha256sum --quiet --strict -c - || die "a wheel in $dir does not match its pinned sha256"
}

files() {  # DIR PIN...: the pinned wheel paths
  local dir=$1 name version file sum; shift
  for pin in "$@"; do read -r name version file sum <<< "$pin"; echo "$dir/$file"; done
}

requires() {  # ROOTS(space-separated) WHEEL...: exactly what the roots need beside the GPU image
  local roots=$1; shift
  # shellcheck disable=SC2086
  "$PYTHON" scripts/carried/requires.py --image scripts/carried/gpu_image_packages.txt --roots $roots -- "$@" \
    || die "the wheels' requirements are not met by the carried wheels and the GPU image (above)"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

pack_fla() {
  fetch "$WHL" "${FLA_PINS[@]}"
  mapfile -t wheels < <(files "$WHL" "${FLA_PINS[@]}")
  requires "fla-core flash-linear-attention" "${wheels[@]}" > /dev/null
  local f extra=()
  for f in "$WHL"/*.whl; do
    printf '%s\n' "${wheels[@]}" | grep -qxF "$f" || extra+=("$f")
  done
  [ ${#extra[@]} = 0 ] || echo "pack_carried: note: other wheels in $WHL/ that common.sh installs too: ${extra[*]}" >&2
  echo "fla: $(mib "$(du -cb "${wheels[@]}" | tail -n 1 | cut -f1)") MiB in $WHL/"
  ls -l "${wheels[@]}"
}

pack_fqla() {
  command -v xz > /dev/null || die "xz not found (apt-get install xz-utils)"
  tar --version 2>/dev/null | grep -q "GNU tar" || die "GNU tar needed (--sort=name)"
  local cache=$CACHE/fqla new=$WHL/fqla.new site
  fetch "$cache" "${FQLA_PINS[@]}"
  mapfile -t wheels < <(files "$cache" "${FQLA_PINS[@]}")
  local table
  table=$(requires "${FQLA_ROOTS[*]}" "${wheels[@]}")
  rm -rf "$new" && mkdir -p "$new"
  site=$SCRATCH/fqla-site
  rm -rf "$site"
  # By name from the cache (--isolated: no configured find-links or index), so that pip writes no
  # direct_url.json naming this machine's paths; bin/ scripts keep this machine's python3 shebang.
  local specs=() name version file sum
  for pin in "${FQLA_PINS[@]}"; do read -r name version file sum <<< "$pin"; specs+=("$name==$version"); done
  "$PYTHON" -m pip --isolated install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --find-links "$cache" --target "$site" "${TARGET[@]}" "${specs[@]}" 2>&1 | { grep -v "as the 'root' user" || true; }
  local got want
  got=$(find "$site" -maxdepth 1 -name '*.dist-info' -printf '%f\n' | sort)
  want=$(for pin in "${FQLA_PINS[@]}"; do read -r name version file sum <<< "$pin"; echo "${file%%-"$version"-*}-$version.dist-info"; done | sort)
  [ "$got" = "$want" ] || die "the site holds $(tr '\n' ' ' <<< "$got")but the pins are $(tr '\n' ' ' <<< "$want")"
  (cd "$site" && find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 sha256sum) > "$new/site.sha256"
  echo "fqla: $(wc -l < "$new/site.sha256") files, $(du -sh "$site" | cut -f1) installed; xz -9e (about 4 min on 2 cores)"
  tar --sort=name --mtime=@1767225600 --owner=0 --group=0 --numeric-owner --format=gnu -cf - -C "$site" . \
    | xz -T1 --x86 --lzma2=preset=9e,dict=192MiB > "$new/fqla-site.tar.xz"
  cp scripts/carried/fqla_install.sh "$new/install.sh"
  (cd "$new" && sha256sum fqla-site.tar.xz site.sha256 install.sh > SHA256SUMS)
  local total
  total=$(du -cb "$new"/* | tail -n 1 | cut -f1)
  [ "$total" -le $((LIMIT_MIB * 1048576)) ] || die "$new is $(mib "$total") MiB, over $LIMIT_MIB MiB: split it as gpu_max.sh pack does"
  readme "$new" "$site" "$table" "$total" > "$new/README.txt"
  rm -rf "$WHL/fqla" && mv "$new" "$WHL/fqla"
  echo "fqla: $(mib "$total") MiB in $WHL/fqla/"
  ls -l "$WHL/fqla"
}

readme() {  # BUNDLE SITE TABLE BYTES: README.txt of .whl/fqla
  local new=$1 site=$2 table=$3 total=$4 name version file sum
  cat <<EOF
.whl/fqla/: the FlashQLA site for scripts/gpu_grad.sh, carried to the GPU machine (no network there).
Built $(date -u +%Y-%m-%d) by \`bash scripts/pack_carried.sh fqla\` (the repository's scripts/pack_carried.sh,
which pins every wheel below by version and sha256); rebuild it with that command rather than by hand.

Install (GPU machine, from the checkout's root; needs python3 with tarfile/lzma and sha256sum, no xz):
  SITE=/tmp/fqsite bash .whl/fqla/install.sh
Then PYTHONPATH=\$PWD:/tmp/fqsite. Never into /tmp/site: FlashInfer's site there has another tvm_ffi
(install.sh refuses it). install.sh checks SHA256SUMS, unpacks with Python's tarfile, checks every
file against site.sha256, and only then touches \$SITE/.fqla-site-complete.

Files ($(mib "$total") MiB in all):
$(cd "$new" && for f in fqla-site.tar.xz site.sha256 install.sh SHA256SUMS; do printf '  %-18s %10d bytes\n' "$f" "$(stat -c %s "$f")"; done)
  README.txt         this file

SHA256SUMS:
$(sed 's/^/  /' "$new/SHA256SUMS")

fqla-site.tar.xz: the wheels below installed as
  pip install --no-index --no-deps --no-compile --target SITE --only-binary=:all: --python-version 3.12 \\
    --implementation cp --platform manylinux_2_28_x86_64 ... NAME==VERSION ...
($(wc -l < "$new/site.sha256") files, $(du -sb "$site" | cut -f1) bytes), as a GNU tar sorted by name, every mtime 2026-01-01 00:00 UTC,
compressed by xz --x86 --lzma2=preset=9e,dict=192MiB (Python's lzma reads it; 192 MiB of memory to unpack).
The console scripts bin/tvm-ffi-config and bin/tvm-ffi-stubgen keep the packing machine's python
shebang (bin/z3 is z3-solver's executable); nothing here runs them.

Wheels (pip download --no-deps --require-hashes for CPython 3.12, manylinux_2_28 x86_64):
$(for pin in "${FQLA_PINS[@]}"; do
    read -r name version file sum <<< "$pin"
    printf '  %s %s\n    %s (%s bytes)\n    sha256 %s\n' "$name" "$version" "$file" "$(stat -c %s "$CACHE/fqla/$file")" "$sum"
  done)

Why each travels, and where each requirement is met (Requires-Dist for CPython 3.12 on Linux x86_64,
no extras; "GPU image": a distribution of the GPU machine, scripts/carried/gpu_image_packages.txt):
$(sed 's/^/  /' <<< "$table")

At import time: tilelang loads its own libtvm_compiler.so and libtvm_runtime.so (no LLVM in them:
its CUDA kernels are CUDA C that nvcc compiles, found on PATH or under CUDA_HOME, which gpu_grad.sh
sets to /usr/local/cuda; CUTLASS headers come in tilelang/3rdparty), which find libtvm_ffi.so
and libz3.so.4.15 through RUNPATH \$ORIGIN/../../tvm_ffi/lib and \$ORIGIN/../../z3/lib, so tvm_ffi
and z3 must sit in the same site as tilelang; its Python imports beyond these wheels are in the GPU
image (torch, numpy, tqdm, psutil, cloudpickle, ml_dtypes, typing_extensions). flash_qla picks its
kernels at import from the GPU's compute capability (sm90, sm100/103, sm120/121; anything else
raises) and reads torch.cuda.get_device_properties(), so it imports only where a GPU is visible.
EOF
}

verify() {  # no network: the pinned wheels present, and .whl/fqla against its SHA256SUMS
  local ok=1 have
  have=$(files "$WHL" "${FLA_PINS[@]}" | while read -r f; do [ -f "$f" ] && echo "$f"; done)
  if [ -n "$have" ]; then
    sums "$WHL" "${FLA_PINS[@]}" | grep -F -f <(echo "$have") | sha256sum --strict -c - || ok=0
  else
    echo "fla: no pinned wheel in $WHL/ (bash scripts/pack_carried.sh fla)"
  fi
  if [ -f "$WHL/fqla/SHA256SUMS" ]; then
    (cd "$WHL/fqla" && sha256sum --strict -c SHA256SUMS) || ok=0
    cmp -s scripts/carried/fqla_install.sh "$WHL/fqla/install.sh" \
      || { echo "fqla: install.sh differs from scripts/carried/fqla_install.sh: pack again"; ok=0; }
    echo "fqla: $(mib "$(du -cb "$WHL/fqla"/* | tail -n 1 | cut -f1)") MiB in $WHL/fqla/"
  else
    echo "fqla: no $WHL/fqla/SHA256SUMS (bash scripts/pack_carried.sh fqla)"
  fi
  [ "$ok" = 1 ] || die "a carried file does not match its pin or SHA256SUMS (above)"
}

[ $# -gt 0 ] || die "usage: bash scripts/pack_carried.sh fla|fqla|verify ... (its header says what each builds)"
for cmd in "$@"; do
  case $cmd in
    fla | fqla | verify) ;;
    *) die "unknown subcommand '$cmd': fla, fqla or verify" ;;
  esac
done
ignored_check
for cmd in "$@"; do
  case $cmd in
    fla) pack_fla ;;
    fqla) pack_fqla ;;
    verify) verify ;;
  esac
done
