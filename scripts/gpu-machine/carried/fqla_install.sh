#!/usr/bin/env bash
# Installs the FlashQLA site carried in .whl/fqla/ (FlashQLA, TileLang, apache-tvm-ffi and the
# dependencies the GPU image lacks; its README.txt lists them) into ${SITE:-/tmp/fqsite}, on the
# GPU machine, with no network and no xz: copied to .whl/fqla/install.sh by
# `bash scripts/gpu-machine/pack_carried.sh fqla` from scripts/gpu-machine/carried/fqla_install.sh. scripts/gpu-machine/gpu_grad.sh runs
#   SITE=/tmp/fqsite bash .whl/fqla/install.sh
# It checks the carried files against SHA256SUMS, unpacks fqla-site.tar.xz with Python's tarfile
# and lzma into a fresh folder beside $SITE, checks every unpacked file against site.sha256 (no file
# missing, none extra, each sha256 equal: the bundle's site_check.py, from scripts/gpu-machine/carried/), moves
# that folder to $SITE and only then touches $SITE/.fqla-site-complete. A $SITE that exists without the marker is refused, never overwritten;
# so is /tmp/site (FlashInfer's site there has another tvm_ffi). Exit 0: complete; 3: refused.
set -euo pipefail
BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SITE=${SITE:-/tmp/fqsite}
MARKER=.fqla-site-complete
PYTHON=${PYTHON:-python3}
die() { echo "fqla install: $*" >&2; exit 3; }

[ -f "$SITE/$MARKER" ] && { echo "fqla install: $SITE is complete already"; exit 0; }
case $(realpath -m "$SITE") in
  /tmp/site | /tmp/site/*) die "not into /tmp/site: FlashInfer's site there has another tvm_ffi (use SITE=/tmp/fqsite)" ;;
esac
if [ -e "$SITE" ] && [ -n "$(ls -A "$SITE" 2>/dev/null)" ]; then
  die "$SITE exists without $MARKER (an earlier install that failed?): remove it, then run this again"
fi
for f in SHA256SUMS fqla-site.tar.xz site.sha256 site_check.py; do
  [ -f "$BUNDLE/$f" ] || die "$BUNDLE/$f missing: carry .whl/fqla whole (bash scripts/gpu-machine/pack_carried.sh fqla)"
done
(cd "$BUNDLE" && sha256sum --quiet --strict -c SHA256SUMS) \
  || die "a carried file does not match $BUNDLE/SHA256SUMS: pack and carry .whl/fqla again"
parent=$(dirname "$SITE")
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/.fqsite-unpack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" "$BUNDLE/site_check.py" fqla "$BUNDLE/fqla-site.tar.xz" "$BUNDLE/site.sha256" "$tmp" \
  || die "the unpacked site does not match site.sha256 (above): nothing installed"
rmdir "$SITE" 2>/dev/null || true  # an empty folder only; one with files was refused above
mv "$tmp" "$SITE"
trap - EXIT
chmod 755 "$SITE"
touch "$SITE/$MARKER"
echo "fqla install: $SITE complete ($(du -sh "$SITE" | cut -f1))"
