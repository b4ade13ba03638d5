#!/usr/bin/env bash
# Installs part @PART@ of the FlashInfer site (FlashInfer, apache-tvm-ffi, CuTe DSL; README.txt lists
# the wheels) into ${SITE:-/tmp/site}, on the GPU machine, with no network and no xz. Written by
# `bash scripts/gpu-machine/pack_carried.sh flashinfer` from scripts/gpu-machine/carried/flashinfer_install.sh, as
# .whl/gpu1/install1.sh (part 1: CuTe DSL's 193 MB _cutlass_ir.cu13 library alone) and
# .whl/gpu2/install.sh (part 2: the rest); the two parts travel in two device calls to one warm
# machine (scripts/gpu-machine/gpu_session.sh phases site_part1, then site_part2).
# It checks the carried files against SHA256SUMS, unpacks this part (*.tar.xz with Python's tarfile,
# each lone NAME.xz with lzma) into a fresh folder beside $SITE and checks every file against
# site.sha256 before anything in $SITE changes. Files of the site found in $SITE already (part 1's,
# or those of an install cut short) must have the sha256 of site.sha256; anything else inside the
# site's folders (another tvm_ffi, say) is refused. Then it moves the files in, and marks $SITE:
# part 1 writes $SITE/.gdnv-site-part1 (the id of the whole site); part 2 refuses without that mark
# of the same site, checks that the site's folders hold exactly the files of site.sha256 (part 1's
# included) and only then touches $SITE/.gdnv-site-complete. Other folders in $SITE (FLA's, which
# scripts/gpu-machine/common.sh installs there) are left alone. Exit 0: done; 3: refused.
set -euo pipefail
BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SITE=${SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
PART=@PART@
SITE_ID=@SITE_ID@  # sha256 of the whole site's file list (.whl/gpu2/site.sha256), the same in both parts
LONE="@LONE@"  # NAME.xz=PATH: one site file compressed alone
PART1_MARK=.gdnv-site-part1
MARKER=.gdnv-site-complete
die() { echo "flashinfer site part $PART: $*" >&2; exit 3; }

[ -f "$SITE/$MARKER" ] && { echo "flashinfer site part $PART: $SITE is complete already"; exit 0; }
mark=$(cat "$SITE/$PART1_MARK" 2>/dev/null || true)
if [ "$PART" = 1 ] && [ "$mark" = "$SITE_ID" ]; then
  echo "flashinfer site part 1: in $SITE already"
  exit 0
fi
if [ "$PART" = 2 ] && [ "$mark" != "$SITE_ID" ]; then
  [ -n "$mark" ] || die "part 1 is not in $SITE: run bash .whl/gpu1/install1.sh first, on this machine (phase site_part1)"
  die "part 1 in $SITE is of another pack (site id $mark): remove $SITE, then install both parts of one pack"
fi
for f in SHA256SUMS site.sha256 site_check.py; do
  [ -f "$BUNDLE/$f" ] || die "$BUNDLE/$f missing: carry the folder whole (bash scripts/gpu-machine/pack_carried.sh flashinfer)"
done
(cd "$BUNDLE" && sha256sum --quiet --strict -c SHA256SUMS) \
  || die "a carried file does not match $BUNDLE/SHA256SUMS: pack and carry it again"
parent=$(dirname "$SITE")
mkdir -p "$SITE"
tmp=$(mktemp -d "$parent/.gdnv-site-unpack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086  # LONE: NAME.xz=PATH words
"$PYTHON" - "$PART" "$BUNDLE" "$SITE" "$tmp" $LONE <<'EOF' || die "nothing marked (above)"
import lzma
import os
import shutil
import sys
import tarfile

part, bundle, site, tmp, *lone = sys.argv[1:]
sys.path.insert(0, bundle)
from site_check import read_manifest, sha256  # noqa: E402 - the bundle's copy of scripts/gpu-machine/carried/site_check.py


def say(text):
    print(f"flashinfer site part {part}: {text}", file=sys.stderr)


want = read_manifest(os.path.join(bundle, "site.sha256"))
# What belongs to the site in a folder that may hold other installs: its own top-level folders
# whole (every file in them is the site's), and its files in bin/ and at the top one by one.
folders = {p.split(os.sep)[0] for p in want if os.sep in p} - {"bin"}
single = {p for p in want if p.split(os.sep)[0] not in folders}


def site_files(top):
    found = {p for p in single if os.path.lexists(os.path.join(top, p))}
    for folder in folders:
        for root, dirs, files in os.walk(os.path.join(top, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]  # written by Python, not by pip --no-compile
            found.update(os.path.relpath(os.path.join(root, n), top) for n in files)
    return found


carried = [line.rstrip("\n").split("  ", 1)[1] for line in open(os.path.join(bundle, "SHA256SUMS"))]
for name in carried:
    if name.endswith(".tar.xz"):
        with tarfile.open(os.path.join(bundle, name), "r:xz") as tar:
            tar.extractall(tmp, filter="tar")
for pair in lone:
    name, path = pair.split("=", 1)
    os.makedirs(os.path.dirname(os.path.join(tmp, path)), exist_ok=True)
    with lzma.open(os.path.join(bundle, name)) as src, open(os.path.join(tmp, path), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(os.path.join(tmp, path), 0o755)  # a shared library, as pip installs it

unpacked = set()
for root, _dirs, found in os.walk(tmp):
    unpacked.update(os.path.relpath(os.path.join(root, n), tmp) for n in found)

present = site_files(site) - unpacked  # files of the site in $SITE already that this part does not bring
problems = [f"unpacked, but not in site.sha256: {p}" for p in sorted(unpacked - set(want))]
problems += [f"missing (part 1's?): {p}" for p in sorted(set(want) - unpacked - present)]
problems += [f"in {site} but not in site.sha256 (another install?): {p}" for p in sorted(present - set(want))]
for p in sorted(unpacked & set(want)):
    if sha256(os.path.join(tmp, p)) != want[p]:
        problems.append(f"sha256 differs from site.sha256: {p}")
for p in sorted(present & set(want)):
    if sha256(os.path.join(site, p)) != want[p]:
        problems.append(f"in {site} with another sha256: {p}")
for problem in problems[:20]:
    say(problem)
if problems:
    say(f"{len(problems)} {'problem' if len(problems) == 1 else 'problems'}, {site} unchanged")
    sys.exit(1)
for path in sorted(unpacked):
    os.makedirs(os.path.dirname(os.path.join(site, path)), exist_ok=True)
    os.replace(os.path.join(tmp, path), os.path.join(site, path))
have = site_files(site)
if have != set(want):
    for p in sorted(set(want) - have)[:10] + sorted(have - set(want))[:10]:
        say(f"after the move, differs from site.sha256: {p}")
    say(f"remove {site}, then install both parts again")
    sys.exit(1)
count = f"{len(unpacked)} {'file' if len(unpacked) == 1 else 'files'}"
print(f"flashinfer site part {part}: {count} installed, each sha256 as in site.sha256")
EOF
if [ "$PART" = 1 ]; then
  echo "$SITE_ID" > "$SITE/$PART1_MARK"
  echo "flashinfer site part 1: in $SITE; now bash .whl/gpu2/install.sh on this machine"
else
  touch "$SITE/$MARKER"
  echo "flashinfer site: $SITE complete ($(du -sh "$SITE" | cut -f1))"
fi
