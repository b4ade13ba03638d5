#!/usr/bin/env bash
# Builds the git-ignored bundles under .whl/ that GPU runs carry (the GPU machine has no network),
# from pinned wheels whose sha256 is checked after every download, so that each session carries the
# same bytes. Here, from the repository root, with PyPI reachable (any python3 with pip; xz and GNU
# tar for fqla, flashinfer and max):
#   bash scripts/gpu-machine/pack_carried.sh fla        FLA 0.6.0's two wheels into .whl/ (1.4 MiB), installed on the
#                                           GPU machine by scripts/gpu-machine/common.sh (/tmp/site) or scripts/gpu-machine/gpu_grad.sh
#                                           (/tmp/fqsite)
#   bash scripts/gpu-machine/pack_carried.sh fqla       .whl/fqla/ (39 MiB): FlashQLA 0.1.3, TileLang 0.1.15, apache-tvm-ffi
#                                           0.1.12 and what they need that the GPU image lacks, laid out as
#                                           `pip install --target` lays them out for CPython 3.12 and xz-compressed
#                                           as one fqla-site.tar.xz; install.sh (scripts/gpu-machine/carried/fqla_install.sh),
#                                           SHA256SUMS, site.sha256 (every file of the site) and README.txt
#   bash scripts/gpu-machine/pack_carried.sh flashinfer .whl/gpu1/ and .whl/gpu2/: FlashInfer 0.7.2.post1, apache-tvm-ffi
#                                           0.1.15.post2 and CuTe DSL 4.8.1 as one site (FlashInfer's data/ left
#                                           out) in two parts, one device call each: gpu1 holds CuTe DSL's 193 MB
#                                           _cutlass_ir.cu13 library alone, xz-compressed (45 MiB), gpu2 the rest
#                                           (site-rest.tar.xz, libcute_dsl_runtime.so.xz); install1.sh and
#                                           install.sh (scripts/gpu-machine/carried/flashinfer_install.sh), SHA256SUMS,
#                                           site.sha256, README.txt in each
#   bash scripts/gpu-machine/pack_carried.sh vllm       .whl/vllm_fla/: the 13 kernel files of vllm 0.33.0's
#                                           third_party/flash_linear_attention/ops/ (each checked against the
#                                           wheel's RECORD) and MANIFEST.txt; the 336 MB wheel stays in the cache
#   bash scripts/gpu-machine/pack_carried.sh max        .whl/max1/, .whl/max2/, .whl/max3/: Modular MAX 26.7.0 (max, max-core,
#                                           the Mojo compiler and kernel libraries, msgspec, exceptiongroup,
#                                           taskgroup; 626 MB installed) as one site, xz-compressed as
#                                           max-site.tar.xz (132 MiB) and cut in three equal parts of 44 MiB,
#                                           one device call each (max-site.tar.xz.part0, part1, part2); max3 also holds
#                                           SHA256SUMS (the whole, the parts, site.sha256), site.sha256 and
#                                           README.txt. scripts/gpu-machine/gpu_max.sh stage and install take them in.
#   bash scripts/gpu-machine/pack_carried.sh verify     what is in .whl/ already, against the pins (no network)
# Subcommands run in the order given (`fla fqla flashinfer vllm max`). About 5 minutes each for fqla
# and flashinfer, 10 for max, on 2 cores (xz -9e); two packs of the same pins give the same archives.
# A site bundle is installed into a scratch folder with its own install scripts (max: gpu_max.sh
# stage, then install) before it replaces the one in .whl/. Downloads stay in $PACK_CACHE
# (~/.cache/gdn-verify/wheels).
# The wheels' requirements are checked by scripts/gpu-machine/carried/requires.py against the GPU image's
# distributions (scripts/gpu-machine/carried/gpu_image_packages.txt): the pack fails on a requirement met by
# neither that is not listed with its reason (FI_MISSING_OK), and on a carried wheel nothing needs.
# scripts/gpu-machine/README.md ("Carried wheels") says what travels in which device call.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
WHL=.whl
LIMIT_MIB=56  # a device call carries 64 MiB, the working tree (~5 MiB) included
CACHE=${PACK_CACHE:-$HOME/.cache/gdn-verify/wheels}  # downloaded wheels that are not carried as they are
XZ=(xz -T1 --x86 "--lzma2=preset=9e,dict=192MiB")  # one thread: the same bytes on every machine
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
# FlashInfer with CuTe DSL's CUDA 13 libraries (its cu13 extra asks nvidia-cutlass-dsl[cu13]); the
# GPU image has cuda-bindings 13.3.1 (CuTe DSL needs >= 12.8), torch, numpy and the rest.
FI_ROOTS=("flashinfer-python[cu13]")
FI_PINS=(
  "flashinfer-python 0.7.2.post1 flashinfer_python-0.7.2.post1-py3-none-any.whl bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49"
  "apache-tvm-ffi 0.1.15.post2 apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl 059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b"
  "nvidia-cutlass-dsl 4.8.1 nvidia_cutlass_dsl-4.8.1-py3-none-any.whl 43ed46b21d151aa643c6765457c7310827b938c1cf45d5109a0152de4ef06227"
  "nvidia-cutlass-dsl-libs-base 4.8.1 nvidia_cutlass_dsl_libs_base-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl ac2fd8c7fa3d6ded00917fa7cba8686061005da8c4703c6a29e03c1504543909"
  "nvidia-cutlass-dsl-libs-core 4.8.1 nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl bacc6760e3286db447d45720d32ae58ac2e6cecade1152345ef784b2d5e44431"
  "nvidia-cutlass-dsl-libs-cu13 4.8.1 nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl 50191a381d8cc1393373ae0bc879b0aefa9a256c23c22d4fa1c2fe3dfe57bc90"
)
# Requirements met neither by these wheels nor by the GPU image, each with why the GDN paths run
# without it (the same six wheels ran every FlashInfer adapter on an H100, 2026-11-23); requires.py
# reports each and fails on any other, and on a name here that nothing misses any more.
FI_MISSING_OK=(
  "cuda-python: a meta-distribution over cuda-bindings, which the image has (13.3.1); flashinfer imports cuda.bindings"
  "cuda-tile: imported only by FlashInfer's cuTile kernels (attention/kernels/cutile, comm), not by its GDN modules"
  "nccl-extensions: imported only by flashinfer.comm and flashinfer.moe_ep (multi-GPU communication)"
  "nccl4py: imported only by flashinfer.comm and flashinfer.moe_ep (multi-GPU communication)"
  "nvidia-cudnn-frontend: imported inside FlashInfer's cuDNN attention functions only, on their first call"
  "nvidia-cutlass-dsl-libs-cu12: CuTe DSL's CUDA 12 libraries; the image is CUDA 13, whose libraries (libs-cu13) travel"
)
FI_LEAVE_OUT=flashinfer/data  # 332 MiB of CUDA sources and headers for FlashInfer's JIT; the GDN paths build CuTe DSL in-process
# Site files compressed alone (NAME.xz=PATH): part 1 is the first, the 193 MB library by itself.
FI_LONE1=_cutlass_ir.cu13.so.xz=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
FI_LONE2=libcute_dsl_runtime.so.xz=nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so
# vLLM's GDN kernel files, taken out of its wheel (never carried); gdn_verify/implementations/vllm.py loads them.
VLLM_PINS=(
  "vllm 0.33.0 vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl 4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
)
VLLM_SRC=vllm/third_party/flash_linear_attention
VLLM_FILES=(chunk chunk_delta_h chunk_o chunk_scaled_dot_kkt cumsum fused_recurrent fused_sigmoid_gating index l2norm op
  solve_tril utils wy_fast)
# Modular MAX for the max-* adapters (scripts/gpu-machine/gpu_max.sh). Its wheels are manylinux_2_34 (glibc 2.34),
# so MAX's pip calls take MAX_TARGET for TARGET. max requires click, numpy, psutil, rich and
# typing-extensions beside these, all in the GPU image; nothing is missing.
MAX_ROOTS=(max)
MAX_TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
MAX_PINS=(
  "max 26.7.0 max-26.7.0-cp312-cp312-manylinux_2_34_x86_64.whl 3c14ab2cffba9cccea534c55be499542cd3e4f5cdd0e3bde444c23549e90b636"
  "max-core 26.7.0 max_core-26.7.0-py3-none-manylinux_2_34_x86_64.whl 59bd4c95b0e41ae1f006f65ab6e6270413b84a673b9ffc7fb6849eaf67c4119a"
  "max-mojo-libs 26.7.0 max_mojo_libs-26.7.0-py3-none-any.whl c9eeaef01a19565b8467da9c6b7cd57fa787759ce5954140b0e031d095c630b9"
  "max-shmem-libs 26.7.0 max_shmem_libs-26.7.0-py3-none-manylinux_2_34_x86_64.whl 73a2108a76974eb75b061a27b793343a0fdafeca620fe548933b09797b48a6b4"
  "mojo-compiler 1.2.0 mojo_compiler-1.2.0-py3-none-manylinux_2_34_x86_64.whl 3ee34a3b26c6cccaa9523a0e8db8f67bea954497d782d97c9e61c3c4ecbdac7b"
  "mojo-compiler-mojo-libs 1.2.0 mojo_compiler_mojo_libs-1.2.0-py3-none-any.whl 3d631f7e798c11d0029c4a892ebae1f5742751fac0c526af74b45a8ae07c3acb"
  "msgspec 0.22.0 msgspec-0.22.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl 99c401861c5bb3a57f7d6423ea7ed4352cd57aa3f04f4fbe9f3e3e4564a10f08"
  "exceptiongroup 1.3.2 exceptiongroup-1.3.2-py3-none-any.whl 41c6a70dfec22050d3d8b43386b059a4dc0bca3f3d40a40971cb206fff1785af"
  "taskgroup 0.2.2 taskgroup-0.2.2-py2.py3-none-any.whl e2c53121609f4ae97303e9ea1524304b4de6faf9eb2c9280c7f87976479a52fb"
)
MAX_DIRS=(max1 max2 max3)  # .whl/max1 .. max3: the parts that scripts/gpu-machine/gpu_max.sh stage copies (part0 in max1, ...)
MAX_ARCHIVE=max-site.tar.xz

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

requires() {  # --roots NAME[EXTRA]... [--missing-ok NAME...] -- WHEEL...: exactly what the roots need beside the GPU image
  "$PYTHON" scripts/gpu-machine/carried/requires.py --image scripts/gpu-machine/carried/gpu_image_packages.txt "$@" \
    || die "the wheels' requirements are not met by the carried wheels and the GPU image (above)"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

pack_fla() {
  fetch "$WHL" "${FLA_PINS[@]}"
  mapfile -t wheels < <(files "$WHL" "${FLA_PINS[@]}")
  requires --roots fla-core flash-linear-attention -- "${wheels[@]}" > /dev/null
  local f extra=()
  for f in "$WHL"/*.whl; do
    printf '%s\n' "${wheels[@]}" | grep -qxF "$f" || extra+=("$f")
  done
  [ ${#extra[@]} = 0 ] || echo "pack_carried: note: other wheels in $WHL/ that common.sh installs too: ${extra[*]}" >&2
  echo "fla: $(mib "$(du -cb "${wheels[@]}" | tail -n 1 | cut -f1)") MiB in $WHL/"
  ls -l "${wheels[@]}"
}

tools() {  # xz and GNU tar, which the site bundles need here (not on the GPU machine)
  command -v xz > /dev/null || die "xz not found (apt-get install xz-utils)"
  tar --version 2>/dev/null | grep -q "GNU tar" || die "GNU tar needed (--sort=name)"
}

dist_infos() {  # PIN...: the .dist-info folders that the pinned wheels install, sorted
  local name version file sum
  for pin in "$@"; do read -r name version file sum <<< "$pin"; echo "${file%%-"$version"-*}-$version.dist-info"; done | sort
}

first_platform() {  # TARGET's first --platform (the newest glibc it takes)
  local word prev=
  for word in "${TARGET[@]}"; do [ "$prev" = --platform ] && { echo "$word"; return; }; prev=$word; done
}

site_install() {  # CACHE SITE PIN...: the pinned wheels in SITE as `pip install --target` lays them out for TARGET
  local cache=$1 site=$2 specs=() name version file sum got want; shift 2
  for pin in "$@"; do read -r name version file sum <<< "$pin"; specs+=("$name==$version"); done
  rm -rf "$site"
  # By name from the cache (--isolated: no configured find-links or index), so that pip writes no
  # direct_url.json naming this machine's paths; bin/ scripts keep this machine's python3 shebang.
  "$PYTHON" -m pip --isolated install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --find-links "$cache" --target "$site" "${TARGET[@]}" "${specs[@]}" 2>&1 | { grep -v "as the 'root' user" || true; } \
    || die "pip install --target $site failed (above)"
  got=$(find "$site" -maxdepth 1 -name '*.dist-info' -printf '%f\n' | sort)
  want=$(dist_infos "$@")
  [ "$got" = "$want" ] || die "the site holds $(tr '\n' ' ' <<< "$got")but the pins are $(tr '\n' ' ' <<< "$want")"
}

manifest() {  # SITE: "sha256  path" of every file of SITE, sorted by path
  (cd "$1" && find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 sha256sum)
}

tar_xz() {  # SITE OUT: SITE as a GNU tar sorted by name, every mtime 2026-01-01 00:00 UTC, compressed by XZ
  tar --sort=name --mtime=@1767225600 --owner=0 --group=0 --numeric-owner --format=gnu -cf - -C "$1" . | "${XZ[@]}" > "$2"
}

take() {  # SITE NAME.xz=PATH: SITE/PATH moved out of the site to $SCRATCH/NAME (compressed alone, not in the tar)
  local site=$1 name=${2%%=*} path=${2#*=}
  [ -f "$site/$path" ] || die "$path is not in the site: did a pin change? (FI_LONE1, FI_LONE2)"
  mv "$site/$path" "$SCRATCH/${name%.xz}"
}

compress() {  # DIR NAME.xz=PATH: the file that take moved out, compressed by XZ into DIR/NAME.xz
  local name=${2%%=*}
  "${XZ[@]}" -c "$SCRATCH/${name%.xz}" > "$1/$name"
}

render() {  # TEMPLATE [KEY=VALUE...]: the template with each @KEY@ replaced by VALUE
  local template=$1 kv args=(-e '')
  shift
  for kv in "$@"; do
    case ${kv#*=} in *'|'* | *'&'* | *\\*) die "render: $kv holds | & or a backslash" ;; esac
    args+=(-e "s|@${kv%%=*}@|${kv#*=}|g")
  done
  sed "${args[@]}" "$template"
}

seal() {  # DIR TEMPLATE INSTALLER [KEY=VALUE...]: DIR/INSTALLER from TEMPLATE and site_check.py, then SHA256SUMS of DIR's files
  local dir=$1 template=$2 installer=$3
  shift 3
  render "$template" "$@" > "$dir/$installer"
  ! grep -nE '@[A-Z0-9_]+@' "$dir/$installer" || die "$template: a placeholder left unset (above)"
  cp scripts/gpu-machine/carried/site_check.py "$dir/"  # the installers' manifest check
  local sums
  sums=$(cd "$dir" && find . -maxdepth 1 -type f ! -name SHA256SUMS ! -name README.txt -printf '%P\n' | LC_ALL=C sort \
    | xargs sha256sum)
  echo "$sums" > "$dir/SHA256SUMS"
}

bytes() { du -cb "$@" | tail -n 1 | cut -f1; }

fits() {  # DIR: within what one device call carries beside the working tree
  local total
  total=$(bytes "$1"/*)
  [ "$total" -le $((LIMIT_MIB * 1048576)) ] || die "$1 is $(mib "$total") MiB, over $LIMIT_MIB MiB: split it further"
}

place() {  # NEW DEST: NEW replaces DEST
  rm -rf "$2" && mv "$1" "$2"
  echo "$(basename "$2"): $(mib "$(bytes "$2"/*)") MiB in $2/"
  ls -l "$2"
}

readme() {  # DIR CACHE TABLE INTRO ARCHIVE NOTES PIN...: README.txt of a site bundle DIR, on stdout
  local dir=$1 cache=$2 table=$3 intro=$4 archive=$5 notes=$6 name version file sum f
  shift 6
  cat <<EOF
$intro

Files ($(mib "$(bytes "$dir"/*)") MiB in all):
$(cd "$dir" && for f in *; do [ "$f" = README.txt ] || printf '  %-26s %10d bytes\n' "$f" "$(stat -c %s "$f")"; done)
  README.txt                 this file

SHA256SUMS:
$(sed 's/^/  /' "$dir/SHA256SUMS")

$archive

Wheels (pip download --no-deps --require-hashes for CPython 3.12, $(first_platform | sed 's/_x86_64$//') x86_64):
$(for pin in "$@"; do
    read -r name version file sum <<< "$pin"
    printf '  %s %s\n    %s (%s bytes)\n    sha256 %s\n' "$name" "$version" "$file" "$(stat -c %s "$cache/$file")" "$sum"
  done)

Why each travels, and where each requirement is met (Requires-Dist for CPython 3.12 on Linux x86_64,
with the extras asked for; "GPU image": a distribution of the GPU machine, scripts/gpu-machine/carried/gpu_image_packages.txt):
  ${table//$'\n'/$'\n'  }

$notes
EOF
}

try_install() {  # SITE COMMAND...: run the bundle's install script(s) into a scratch SITE, as on the GPU machine
  local site=$1
  shift
  rm -rf "$site"
  SITE=$site PYTHON=$PYTHON "$@" > "$SCRATCH/try.log" 2>&1 || { cat "$SCRATCH/try.log" >&2; die "the new bundle does not install (above)"; }
  grep -h "installed, each\|files unpacked\|complete" "$SCRATCH/try.log" | sed 's/^/  tried: /'
  rm -rf "$site"
}

pack_fqla() {
  tools
  local cache=$CACHE/fqla new=$WHL/fqla.new site=$SCRATCH/fqla-site table
  fetch "$cache" "${FQLA_PINS[@]}"
  mapfile -t wheels < <(files "$cache" "${FQLA_PINS[@]}")
  table=$(requires --roots "${FQLA_ROOTS[@]}" -- "${wheels[@]}")
  rm -rf "$new" && mkdir -p "$new"
  site_install "$cache" "$site" "${FQLA_PINS[@]}"
  manifest "$site" > "$new/site.sha256"
  echo "fqla: $(wc -l < "$new/site.sha256") files, $(du -sh "$site" | cut -f1) installed; xz -9e (about 4 min on 2 cores)"
  tar_xz "$site" "$new/fqla-site.tar.xz"
  seal "$new" scripts/gpu-machine/carried/fqla_install.sh install.sh
  readme "$new" "$cache" "$table" "$(fqla_intro)" "$(fqla_archive "$new" "$site")" "$(fqla_notes)" "${FQLA_PINS[@]}" > "$new/README.txt"
  fits "$new"
  try_install "$SCRATCH/try-fqsite" bash "$new/install.sh"
  place "$new" "$WHL/fqla"
}

fqla_intro() {
  cat <<EOF
.whl/fqla/: the FlashQLA site for scripts/gpu-machine/gpu_grad.sh, carried to the GPU machine (no network there).
Built $(date -u +%Y-%m-%d) by \`bash scripts/gpu-machine/pack_carried.sh fqla\` (the repository's scripts/gpu-machine/pack_carried.sh,
which pins every wheel below by version and sha256); rebuild it with that command rather than by hand.

Install (GPU machine, from the checkout's root; needs python3 with tarfile/lzma and sha256sum, no xz):
  SITE=/tmp/fqsite bash .whl/fqla/install.sh
Then PYTHONPATH=\$PWD:/tmp/fqsite. Never into /tmp/site: FlashInfer's site there has another tvm_ffi
(install.sh refuses it). install.sh checks SHA256SUMS, unpacks with Python's tarfile, checks every
file against site.sha256, and only then touches \$SITE/.fqla-site-complete.
EOF
}

archive_text() {  # SITE NAME FILES: how NAME was made from SITE
  cat <<EOF
$2: the wheels below installed as
  pip install --no-index --no-deps --no-compile --target SITE --only-binary=:all: --python-version 3.12 \\
    --implementation cp --platform $(first_platform) ... NAME==VERSION ...
($3 files, $(du -sb "$1" | cut -f1) bytes), as a GNU tar sorted by name, every mtime 2026-01-01 00:00 UTC,
compressed by xz --x86 --lzma2=preset=9e,dict=192MiB (Python's lzma reads it; 192 MiB of memory to unpack).
EOF
}

fqla_archive() {  # DIR SITE
  archive_text "$2" fqla-site.tar.xz "$(wc -l < "$1/site.sha256")"
  echo "The console scripts bin/tvm-ffi-config and bin/tvm-ffi-stubgen keep the packing machine's python"
  echo "shebang (bin/z3 is z3-solver's executable); nothing here runs them."
}

fqla_notes() {
  cat <<'EOF'
At import time: tilelang loads its own libtvm_compiler.so and libtvm_runtime.so (no LLVM in them:
its CUDA kernels are CUDA C that nvcc compiles, found on PATH or under CUDA_HOME, which gpu_grad.sh
sets to /usr/local/cuda; CUTLASS headers come in tilelang/3rdparty), which find libtvm_ffi.so
and libz3.so.4.15 through RUNPATH $ORIGIN/../../tvm_ffi/lib and $ORIGIN/../../z3/lib, so tvm_ffi
and z3 must sit in the same site as tilelang; its Python imports beyond these wheels are in the GPU
image (torch, numpy, tqdm, psutil, cloudpickle, ml_dtypes, typing_extensions). flash_qla picks its
kernels at import from the GPU's compute capability (sm90, sm100/103, sm120/121; anything else
raises) and reads torch.cuda.get_device_properties(), so it imports only where a GPU is visible.
EOF
}

fi_render() {  # PART GPU2_SITE_SHA256: the KEY=VALUE words that make .whl/gpuPART's installer of scripts/gpu-machine/carried/flashinfer_install.sh
  local part=$1 site_sha256=$2 lone=$FI_LONE2
  [ "$part" = 1 ] && lone=$FI_LONE1
  echo "PART=$part" "SITE_ID=$(sha256sum < "$site_sha256" | cut -d' ' -f1)" "LONE=$lone"
}

fi_parts() {  # SITE NEW1 NEW2: the two parts of the site in NEW1 and NEW2 (SITE is used up), installers and SHA256SUMS
  local site=$1 new1=$2 new2=$3 part1
  manifest "$site" > "$new2/site.sha256"
  grep -xE "[0-9a-f]{64}  ${FI_LONE1#*=}" "$new2/site.sha256" > "$new1/site.sha256" || die "${FI_LONE1#*=} is not in the site"
  take "$site" "$FI_LONE1"
  take "$site" "$FI_LONE2"
  compress "$new1" "$FI_LONE1" &  # part 1 on one core (5 min), part 2 on the other
  part1=$!
  compress "$new2" "$FI_LONE2"
  tar_xz "$site" "$new2/site-rest.tar.xz"  # the site without the two files compressed alone
  wait "$part1" || die "part 1's xz failed"
  # shellcheck disable=SC2046  # fi_render's KEY=VALUE words
  seal "$new1" scripts/gpu-machine/carried/flashinfer_install.sh install1.sh $(fi_render 1 "$new2/site.sha256")
  # shellcheck disable=SC2046
  seal "$new2" scripts/gpu-machine/carried/flashinfer_install.sh install.sh $(fi_render 2 "$new2/site.sha256")
}

pack_flashinfer() {
  tools
  local cache=$CACHE/flashinfer site=$SCRATCH/flashinfer-site new1=$WHL/gpu1.new new2=$WHL/gpu2.new table m
  local missing=()
  fetch "$cache" "${FI_PINS[@]}"
  mapfile -t wheels < <(files "$cache" "${FI_PINS[@]}")
  for m in "${FI_MISSING_OK[@]}"; do missing+=("${m%%:*}"); done
  table=$(requires --roots "${FI_ROOTS[@]}" --missing-ok "${missing[@]}" -- "${wheels[@]}")
  rm -rf "$new1" "$new2" && mkdir -p "$new1" "$new2"
  site_install "$cache" "$site" "${FI_PINS[@]}"
  [ -d "$site/$FI_LEAVE_OUT" ] || die "$FI_LEAVE_OUT is not in the site: did the flashinfer pin change?"
  rm -rf "${site:?}/$FI_LEAVE_OUT"
  local archive notes
  archive=$(archive_text "$site" "The site" "$(find "$site" -type f | wc -l)"; fi_archive)
  notes=$(fi_notes)
  echo "flashinfer: $(du -sh "$site" | cut -f1) installed without $FI_LEAVE_OUT; xz -9e of part 1 beside part 2 (about 5 min on 2 cores)"
  fi_parts "$site" "$new1" "$new2"
  readme "$new1" "$cache" "$table" "$(fi_intro 1)" "$archive" "$notes" "${FI_PINS[@]}" > "$new1/README.txt"
  readme "$new2" "$cache" "$table" "$(fi_intro 2)" "$archive" "$notes" "${FI_PINS[@]}" > "$new2/README.txt"
  fits "$new1"
  fits "$new2"
  try_install "$SCRATCH/try-site" bash -c "bash $new1/install1.sh && bash $new2/install.sh"
  place "$new1" "$WHL/gpu1"
  place "$new2" "$WHL/gpu2"
}

fi_intro() {  # PART
  local this=".whl/gpu1/: part 1 of 2" install=install1.sh
  [ "$1" = 2 ] && this=".whl/gpu2/: part 2 of 2" install=install.sh
  cat <<EOF
$this of the FlashInfer site (scripts/gpu-machine/gpu_session.sh phases site_part1, site_part2), carried to
the GPU machine (no network there) in two device calls to one warm machine: the site is 163 MB of
wheels, more than one call carries. Built $(date -u +%Y-%m-%d) by \`bash scripts/gpu-machine/pack_carried.sh flashinfer\` (the
repository's scripts/gpu-machine/pack_carried.sh, which pins every wheel below by version and sha256); rebuild
it with that command rather than by hand.

Install (GPU machine, from the checkout's root; needs python3 with tarfile/lzma and sha256sum, no xz):
  bash .whl/gpu1/install1.sh      (call 1; into \${SITE:-/tmp/site})
  bash .whl/gpu2/install.sh       (call 2, the same machine: refused without part 1)
This folder's $install checks SHA256SUMS, unpacks this part into a fresh folder beside \$SITE, checks
each file against site.sha256 and the site's files already in \$SITE too, and only then moves them
in; part 1 writes \$SITE/.gdnv-site-part1, part 2 touches \$SITE/.gdnv-site-complete once the site's
folders hold exactly the files of its site.sha256. Then PYTHONPATH=\$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
(scripts/gpu-machine/common.sh sets it: \`--target\` installs run no .pth files).
EOF
}

fi_archive() {
  cat <<EOF
FlashInfer's $FI_LEAVE_OUT is left out (332 MiB of CUDA sources for its JIT; the GDN paths build CuTe
DSL in-process), before site.sha256 is taken. Two files are compressed alone by the same xz instead:
  part 1 (gpu1): ${FI_LONE1%%=*} is ${FI_LONE1#*=}
  part 2 (gpu2): ${FI_LONE2%%=*} is ${FI_LONE2#*=}
and site-rest.tar.xz (gpu2) is the rest. site.sha256 lists part 1's file in gpu1, every file of the
site (part 1's included) in gpu2; the sha256 of gpu2's site.sha256 is the site's id in both installers.
The console scripts in bin/ keep the packing machine's python shebang; nothing here runs them.
EOF
}

fi_notes() {
  local m
  echo "Not carried though required (Requires-Dist met neither by these wheels nor by the GPU image; FI_MISSING_OK):"
  for m in "${FI_MISSING_OK[@]}"; do echo "  ${m%%:*}:${m#*:}"; done
}

pack_vllm() {
  local cache=$CACHE/vllm new=$WHL/vllm_fla.new name version file sum
  read -r name version file sum <<< "${VLLM_PINS[0]}"
  fetch "$cache" "${VLLM_PINS[@]}"
  vllm_extract "$cache/$file" "$new"
  fits "$new"
  place "$new" "$WHL/vllm_fla"
}

vllm_extract() {  # WHEEL NEW: VLLM_FILES out of the wheel into NEW/ops/, each checked against its RECORD, and MANIFEST.txt
  local wheel=$1 new=$2 f
  rm -rf "$new" && mkdir -p "$new/ops"
  "$PYTHON" - "$wheel" "$VLLM_SRC/ops" "$new/ops" "${VLLM_FILES[@]}" <<'EOF' || die "the files do not match the wheel's RECORD (above)"
import base64
import csv
import hashlib
import io
import os
import sys
import zipfile

wheel, src, dest, *names = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    record_name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
    record = {row[0]: row[1] for row in csv.reader(io.StringIO(z.read(record_name).decode())) if row}
    bad = []
    for name in names:
        data = z.read(f"{src}/{name}.py")
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if record.get(f"{src}/{name}.py") != f"sha256={digest}":
            bad.append(name)
        with open(os.path.join(dest, f"{name}.py"), "wb") as f:
            f.write(data)
for name in bad:
    print(f"pack_carried: {src}/{name}.py: sha256 differs from RECORD", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
  vllm_head > "$new/MANIFEST.txt"
  (cd "$new" && for f in "${VLLM_FILES[@]}"; do sha256sum "ops/$f.py"; done) >> "$new/MANIFEST.txt"
}

vllm_head() {  # the first lines of .whl/vllm_fla/MANIFEST.txt (common.sh prints the first in env.txt)
  local name version file sum
  read -r name version file sum <<< "${VLLM_PINS[0]}"
  echo "# Extracted from $file (sha256 $sum)"
  echo "# source dir in wheel: $VLLM_SRC/ ; files unmodified"
}

pack_max() {
  tools
  local -a TARGET=("${MAX_TARGET[@]}")  # fetch, site_install and the README read TARGET
  local cache=$CACHE/max site=$SCRATCH/max-site table archive d news=()
  for d in "${MAX_DIRS[@]}"; do news+=("$WHL/$d.new"); done
  fetch "$cache" "${MAX_PINS[@]}"
  mapfile -t wheels < <(files "$cache" "${MAX_PINS[@]}")
  table=$(requires --roots "${MAX_ROOTS[@]}" -- "${wheels[@]}")
  rm -rf "${news[@]}" && mkdir -p "${news[@]}"
  site_install "$cache" "$site" "${MAX_PINS[@]}"
  archive=$(archive_text "$site" "$MAX_ARCHIVE" "$(find "$site" -type f | wc -l)"; max_archive)
  echo "max: $(du -sh "$site" | cut -f1) installed; xz -9e on one thread (about 10 min)"
  max_parts "$site" "${news[@]}"
  readme "${news[-1]}" "$cache" "$table" "$(max_intro "${news[@]}")" "$archive" "$(max_notes)" "${MAX_PINS[@]}" \
    > "${news[-1]}/README.txt"
  for d in "${news[@]}"; do fits "$d"; done
  try_install "$SCRATCH/try-maxsite" max_try "${news[@]}"
  for d in "${MAX_DIRS[@]}"; do place "$WHL/$d.new" "$WHL/$d"; done
  [ ! -e "$WHL/max" ] && [ ! -e "$WHL/$MAX_ARCHIVE" ] \
    || echo "pack_carried: note: $WHL/max/ or $WHL/$MAX_ARCHIVE is left from the hand-made pack; nothing reads them now" >&2
}

max_parts() {  # SITE NEW...: SITE as MAX_ARCHIVE cut in equal parts, part I in the (I+1)th NEW; site.sha256, SHA256SUMS in the last
  local site=$1 whole=$SCRATCH/$MAX_ARCHIVE i=0 new
  shift
  local last=${!#}
  manifest "$site" > "$last/site.sha256"
  tar_xz "$site" "$whole"
  split -n $# -d -a 1 "$whole" "$whole.part"
  for new in "$@"; do mv "$whole.part$i" "$new/" && i=$((i + 1)); done
  # Bare names, as scripts/gpu-machine/gpu_max.sh install finds them in its parts folder: the whole, each part, site.sha256.
  { (cd "$SCRATCH" && sha256sum "$MAX_ARCHIVE")
    for new in "$@"; do (cd "$new" && sha256sum "$MAX_ARCHIVE".part*); done
    (cd "$last" && sha256sum site.sha256); } > "$SCRATCH/max-sums"
  mv "$SCRATCH/max-sums" "$last/SHA256SUMS"
  rm -f "$whole"
}

max_try() {  # NEW...: scripts/gpu-machine/gpu_max.sh as on the GPU machine, into $SITE: stage, one call per part, then install
  local tree=$SCRATCH/try-tree parts=$SCRATCH/try-maxparts site=${SITE:?try_install sets it} i=0 new
  rm -rf "$parts"
  for new in "$@"; do
    i=$((i + 1))
    rm -rf "$tree" && mkdir -p "$tree/.whl" && ln -s "$(realpath "$new")" "$tree/.whl/max$i"  # a call carries its part alone
    if [ "$i" -lt $# ]; then
      (cd "$tree" && MAX_PARTS=$parts bash "$ROOT/scripts/gpu-machine/gpu_max.sh" stage) || return 1
    else
      (cd "$tree" && MAX_PARTS=$parts MAX_SITE=$site bash "$ROOT/scripts/gpu-machine/gpu_max.sh" stage install) || return 1
    fi
  done
  rm -rf "$tree" "$parts"
}

max_intro() {  # NEW...: the parts
  local i=0 new
  cat <<EOF
.whl/max3/: the last of three parts of Modular MAX 26.7.0's site for scripts/gpu-machine/gpu_max.sh (the max-*
adapters), carried to the GPU machine (no network there) in three device calls to one warm machine:
the site is more than one call carries. Built $(date -u +%Y-%m-%d) by \`bash scripts/gpu-machine/pack_carried.sh max\` (the
repository's scripts/gpu-machine/pack_carried.sh, which pins every wheel below by version and sha256); rebuild
it with that command rather than by hand.

The parts, $MAX_ARCHIVE cut in three:
$(for new in "$@"; do
    printf '  .whl/%s/%s.part%d %10d bytes\n' "${MAX_DIRS[i]}" "$MAX_ARCHIVE" "$i" "$(stat -c %s "$new/$MAX_ARCHIVE.part$i")"
    i=$((i + 1))
  done)

Install (GPU machine, from the checkout's root; needs python3 with tarfile/lzma and sha256sum, no xz):
  bash scripts/gpu-machine/gpu_max.sh stage            (call 1 carrying .whl/max1, call 2 carrying .whl/max2)
  bash scripts/gpu-machine/gpu_max.sh stage install    (call 3 carrying .whl/max3, the same warm machine)
stage copies the carried part (and, from max3, SHA256SUMS and site.sha256) out of the checkout into
/tmp/maxparts; install checks each part and the joined archive against SHA256SUMS, unpacks it with
Python's tarfile into a fresh folder beside /tmp/maxsite, checks every file against site.sha256,
and only then moves it to /tmp/maxsite and touches /tmp/maxsite/.max-site-complete. Then
PYTHONPATH=\$PWD:/tmp/maxsite (MAX finds modular/lib beside its package).
EOF
}

max_archive() {
  cat <<EOF
$MAX_ARCHIVE is cut by \`split -n ${#MAX_DIRS[@]}\` into parts of equal size (part0 in max1, part1 in max2,
part2 in max3); it is never carried whole. SHA256SUMS lists the whole, each part and site.sha256.
The console scripts bin/lld, bin/max, bin/modular-crashpad-handler and bin/mojo keep the packing
machine's python shebang; nothing here runs them (MAX runs its tools from modular/bin).
EOF
}

max_notes() {
  cat <<'EOF'
At import time: max loads libmax.so and the rest of the engine from modular/lib (max-core), and a
graph imports its kernels from the Mojo packages of max-mojo-libs (state_space.mojoc) with the
compiler of mojo-compiler's modular/bin; without them it fails with "MAXG_addKernelPackage: failed
to import kernels from ''". max-shmem-libs (NVSHMEM) is required by max-core. msgspec,
exceptiongroup and taskgroup are requirements of max that the GPU image lacks; its others (click,
numpy, psutil, rich, typing-extensions) are in the image, so nothing is listed as missing.
EOF
}

verify_max() {  # the MAX parts: each against max3/SHA256SUMS, joined against the whole's sum, site.sha256 against MAX_PINS; 1 if not
  local dir=$WHL/${MAX_DIRS[-1]} ok=0 i d f want got whole names=()
  for i in "${!MAX_DIRS[@]}"; do names+=("$WHL/${MAX_DIRS[i]}/$MAX_ARCHIVE.part$i"); done
  want=$( (echo "$MAX_ARCHIVE"; for f in "${names[@]}"; do basename "$f"; done; echo site.sha256) | LC_ALL=C sort)
  got=$(sed -nE 's/^[0-9a-f]{64}  //p' "$dir/SHA256SUMS" | LC_ALL=C sort)
  [ "$got" = "$want" ] || { echo "max: $dir/SHA256SUMS lists $(tr '\n' ' ' <<< "$got")but should list $(tr '\n' ' ' <<< "$want")"; return 1; }
  # Each carried file against its line (bare names in SHA256SUMS: gpu_max.sh stage puts them in one folder).
  for f in "${names[@]}" "$dir/site.sha256"; do
    grep -F "  $(basename "$f")" "$dir/SHA256SUMS" | grep -xE "[0-9a-f]{64}  [^ ]+" | sed "s#  .*#  $f#"
  done | sha256sum --strict --quiet -c - || ok=1
  whole=$(cat "${names[@]}" | sha256sum | cut -d' ' -f1)
  grep -qxF "$whole  $MAX_ARCHIVE" "$dir/SHA256SUMS" || { echo "max: the parts joined are not the $MAX_ARCHIVE of SHA256SUMS: parts of two packs?"; ok=1; }
  got=$(sed -nE 's#^[0-9a-f]{64}  ([^/]+\.dist-info)/.*#\1#p' "$dir/site.sha256" | sort -u)
  [ "$got" = "$(dist_infos "${MAX_PINS[@]}")" ] \
    || { echo "max: site.sha256 holds $(tr '\n' ' ' <<< "$got")but the pins install $(dist_infos "${MAX_PINS[@]}" | tr '\n' ' '): pack again"; ok=1; }
  for i in "${!MAX_DIRS[@]}"; do
    d=$WHL/${MAX_DIRS[i]}
    want=$MAX_ARCHIVE.part$i
    [ "$d" = "$dir" ] && want=$(printf '%s\n' "$want" README.txt SHA256SUMS site.sha256 | LC_ALL=C sort)
    got=$(cd "$d" && find . -type f -printf '%P\n' | LC_ALL=C sort)
    [ "$got" = "$want" ] || { echo "max: $d holds $(tr '\n' ' ' <<< "$got")but should hold $(tr '\n' ' ' <<< "$want")"; ok=1; }
  done
  for d in "${MAX_DIRS[@]}"; do
    echo "$d: $(mib "$(bytes "$WHL/$d"/*)") MiB in $WHL/$d/$([ $ok = 0 ] && echo ", as $dir/SHA256SUMS says")"
  done
  return $ok
}

verify_site() {  # DIR TEMPLATE INSTALLER [KEY=VALUE...]: a site bundle against its SHA256SUMS and its template; 1 if not
  local dir=$1 template=$2 installer=$3 ok=0
  shift 3
  (cd "$dir" && sha256sum --strict --quiet -c SHA256SUMS) || ok=1
  render "$template" "$@" | cmp -s - "$dir/$installer" \
    || { echo "$dir/$installer differs from what $template makes now: pack again"; ok=1; }
  cmp -s scripts/gpu-machine/carried/site_check.py "$dir/site_check.py" \
    || { echo "$dir/site_check.py differs from scripts/gpu-machine/carried/site_check.py: pack again"; ok=1; }
  echo "$(basename "$dir"): $(mib "$(bytes "$dir"/*)") MiB in $dir/$([ $ok = 0 ] && echo ", as its SHA256SUMS says")"
  return $ok
}

verify() {  # no network: the pinned wheels present, and each bundle against its SHA256SUMS or MANIFEST.txt
  local ok=1 have f name version file sum
  have=$(files "$WHL" "${FLA_PINS[@]}" | while read -r f; do [ -f "$f" ] && echo "$f"; done)
  if [ -n "$have" ]; then
    sums "$WHL" "${FLA_PINS[@]}" | grep -F -f <(echo "$have") | sha256sum --strict -c - || ok=0
  else
    echo "fla: no pinned wheel in $WHL/ (bash scripts/gpu-machine/pack_carried.sh fla)"
  fi
  if [ -f "$WHL/fqla/SHA256SUMS" ]; then
    verify_site "$WHL/fqla" scripts/gpu-machine/carried/fqla_install.sh install.sh || ok=0
  else
    echo "fqla: no $WHL/fqla/SHA256SUMS (bash scripts/gpu-machine/pack_carried.sh fqla)"
  fi
  if [ -f "$WHL/gpu1/SHA256SUMS" ] && [ -f "$WHL/gpu2/SHA256SUMS" ]; then
    # shellcheck disable=SC2046  # fi_render's KEY=VALUE words
    verify_site "$WHL/gpu1" scripts/gpu-machine/carried/flashinfer_install.sh install1.sh $(fi_render 1 "$WHL/gpu2/site.sha256") || ok=0
    # shellcheck disable=SC2046
    verify_site "$WHL/gpu2" scripts/gpu-machine/carried/flashinfer_install.sh install.sh $(fi_render 2 "$WHL/gpu2/site.sha256") || ok=0
    [ "$(grep -cxF -f "$WHL/gpu1/site.sha256" "$WHL/gpu2/site.sha256")" = "$(wc -l < "$WHL/gpu1/site.sha256")" ] \
      || { echo "flashinfer: gpu1/site.sha256 is not in gpu2/site.sha256: two packs mixed"; ok=0; }
  else
    echo "flashinfer: no $WHL/gpu1/SHA256SUMS and $WHL/gpu2/SHA256SUMS (bash scripts/gpu-machine/pack_carried.sh flashinfer)"
  fi
  if [ -f "$WHL/vllm_fla/MANIFEST.txt" ]; then
    local want got
    want=$(vllm_head; for f in "${VLLM_FILES[@]}"; do echo "ops/$f.py"; done)
    got=$(grep '^#' "$WHL/vllm_fla/MANIFEST.txt"; grep -v '^#' "$WHL/vllm_fla/MANIFEST.txt" | cut -d' ' -f3-)
    [ "$got" = "$want" ] || { echo "vllm_fla: MANIFEST.txt names another wheel or other files: pack again"; ok=0; }
    (cd "$WHL/vllm_fla" && grep -v '^#' MANIFEST.txt | sha256sum --strict --quiet -c -) || ok=0
    got=$(cd "$WHL/vllm_fla" && find . -type f ! -path '*/__pycache__/*' -printf '%P\n' | LC_ALL=C sort)
    want=$( (echo MANIFEST.txt; for f in "${VLLM_FILES[@]}"; do echo "ops/$f.py"; done) | LC_ALL=C sort)
    [ "$got" = "$want" ] || { echo "vllm_fla: other files than MANIFEST.txt lists: $(comm -3 <(echo "$got") <(echo "$want") | tr -d '\t' | tr '\n' ' ')"; ok=0; }
    read -r name version file sum <<< "${VLLM_PINS[0]}"
    echo "vllm_fla: ${#VLLM_FILES[@]} files of $name $version in $WHL/vllm_fla/"
  else
    echo "vllm_fla: no $WHL/vllm_fla/MANIFEST.txt (bash scripts/gpu-machine/pack_carried.sh vllm)"
  fi
  if [ -f "$WHL/${MAX_DIRS[-1]}/SHA256SUMS" ]; then
    verify_max || ok=0
  else
    echo "max: no $WHL/${MAX_DIRS[-1]}/SHA256SUMS (bash scripts/gpu-machine/pack_carried.sh max)"
  fi
  [ "$ok" = 1 ] || die "a carried file does not match its pin or SHA256SUMS (above)"
}

# Sourced (tests/test_pack_carried.py): the functions only.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi
[ $# -gt 0 ] || die "usage: bash scripts/gpu-machine/pack_carried.sh fla|fqla|flashinfer|vllm|max|verify ... (its header says what each builds)"
for cmd in "$@"; do
  case $cmd in
    fla | fqla | flashinfer | vllm | max | verify) ;;
    *) die "unknown subcommand '$cmd': fla, fqla, flashinfer, vllm, max or verify" ;;
  esac
done
ignored_check
for cmd in "$@"; do
  case $cmd in
    fla) pack_fla ;;
    fqla) pack_fqla ;;
    flashinfer) pack_flashinfer ;;
    vllm) pack_vllm ;;
    max) pack_max ;;
    verify) verify ;;
  esac
done
