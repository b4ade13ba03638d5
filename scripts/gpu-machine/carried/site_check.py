"""Every file of a carried site against its manifest (``site.sha256``: ``<sha256>  <path>`` lines).

Standard library only: it runs on the GPU machine (no network, no ``xz``), carried in each site
bundle by ``scripts/gpu-machine/pack_carried.sh`` (``seal``) and run from the checkout by
``scripts/gpu-machine/gpu_max.sh install``. As a command, ``python3 site_check.py LABEL ARCHIVE MANIFEST DEST``
unpacks the ``.tar.xz`` ARCHIVE into DEST (a fresh folder) and checks that DEST holds exactly the
manifest's files, each with its sha256: exit 0 (a line saying so), or 1 with the problems on
stderr, each line prefixed ``LABEL install:``. The FlashInfer installer imports
:func:`read_manifest` and :func:`sha256` for its two-part check.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile


def read_manifest(path: str) -> dict[str, str]:
    """``{relative path: sha256}`` of a ``site.sha256`` file."""
    want = {}
    with open(path) as f:
        for line in f:
            digest, name = line.rstrip("\n").split("  ", 1)
            want[os.path.normpath(name)] = digest
    return want


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def problems(dest: str, want: dict[str, str]) -> list[str]:
    """What keeps ``dest`` from holding exactly the files of ``want``, each with its sha256."""
    have = {os.path.relpath(os.path.join(root, n), dest) for root, _dirs, names in os.walk(dest) for n in names}
    found = [f"missing {p}" for p in sorted(set(want) - have)]
    found += [f"not in site.sha256: {p}" for p in sorted(have - set(want))]
    found += [f"sha256 differs: {p}" for p in sorted(set(want) & have) if sha256(os.path.join(dest, p)) != want[p]]
    return found


def main(argv: list[str]) -> int:
    label, archive, manifest, dest = argv
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, filter="tar")
    want = read_manifest(manifest)
    found = problems(dest, want)
    for problem in found[:20]:
        print(f"{label} install: {problem}", file=sys.stderr)
    if found:
        return 1
    print(f"{label} install: {len(want)} files unpacked, each sha256 as in site.sha256")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
