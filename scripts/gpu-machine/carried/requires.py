"""Checks that a set of wheels carried to the GPU machine is exactly what its roots need there.

    python3 scripts/gpu-machine/carried/requires.py --image scripts/gpu-machine/carried/gpu_image_packages.txt \
        --roots NAME[EXTRA,...] [...] [--missing-ok NAME ...] -- WHEEL [WHEEL ...]

Reads each wheel's ``Requires-Dist`` (markers evaluated for CPython 3.12 on Linux x86_64, with the
extras asked for: a root's, and those a carried wheel's requirement asks of another, as pip
resolves ``NAME[EXTRA]``) and fails (exit 1, one line per problem) when a requirement is met
neither by a carried wheel (name and version) nor by a distribution of the GPU image (``--image``:
one name a line, with its version where known), when a carried wheel is in the image already, or
when a carried wheel is neither a root nor required by another carried wheel. A requirement on a
``--missing-ok`` name that neither meets is reported (in its wheel's line and as a note), not
failed; a ``--missing-ok`` name that no requirement misses is a problem, so that the list stays
exact. Prints one line per wheel: name, version, why it travels, and where each of its
requirements is met (scripts/gpu-machine/pack_carried.sh writes these into the bundle's README.txt). Standard
library only, plus ``packaging`` (pip's copy where no other is installed).
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from email.parser import HeaderParser

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pragma: no cover - every pip vendors it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

# The GPU machine: CPython 3.12.3 on Linux x86_64.
ENVIRONMENT = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.12.3",
    "python_version": "3.12",
    "sys_platform": "linux",
    "extra": "",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def metadata(wheel: str) -> tuple[str, str, list[str]]:
    """``(name, version, Requires-Dist)`` of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        path = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        msg = HeaderParser().parsestr(z.read(path).decode())
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


def image_packages(path: str) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for line in open(path):
        words = line.split("#", 1)[0].split()
        if words:
            found[normalize(words[0])] = words[1] if len(words) > 1 else None
    return found


def applies(req: Requirement, extras: set[str]) -> bool:
    """Whether ``req`` applies on the GPU machine to a distribution installed with ``extras``."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**ENVIRONMENT, "extra": extra}) for extra in {"", *extras})


def check(
    wheels: list[str], roots: list[str], image: dict[str, str | None], missing_ok: tuple[str, ...] = ()
) -> tuple[list[str], list[str], list[str]]:
    """``(lines, problems, notes)``: one line per wheel, one problem per unmet or needless wheel,
    one note per unmet requirement that ``missing_ok`` names."""
    carried = {}
    for wheel in wheels:
        name, version, requires = metadata(wheel)
        carried[normalize(name)] = (name, version, [Requirement(text) for text in requires])
    asked = [Requirement(r) for r in roots]
    roots = [normalize(r.name) for r in asked]
    problems = [f"{r}: a root, but no carried wheel" for r in roots if r not in carried]
    # The extras each carried distribution is installed with: the roots', then those its
    # dependants' requirements ask for (NAME[EXTRA]), until none is added.
    extras: dict[str, set[str]] = {key: set() for key in carried}
    for r in asked:
        extras.get(normalize(r.name), set()).update(r.extras)
    grown = True
    while grown:
        grown = False
        for key, (_, _, requires) in carried.items():
            for req in requires:
                dep = normalize(req.name)
                if dep in carried and applies(req, extras[key]) and not req.extras <= extras[dep]:
                    extras[dep] |= req.extras
                    grown = True
    missing_ok_set = {normalize(m) for m in missing_ok}
    missed: set[str] = set()
    notes = []
    needed_by: dict[str, list[str]] = {key: [] for key in carried}
    lines = []
    for key, (name, version, requires) in sorted(carried.items()):
        label = f"{name}[{','.join(sorted(extras[key]))}]" if extras[key] else name
        if key in image:
            problems.append(f"{name} {version}: in the GPU image already, do not carry it")
        met = []
        for req in requires:
            if not applies(req, extras[key]):
                continue
            dep = normalize(req.name)
            if dep in carried:
                have, where = carried[dep][1], "carried"
                needed_by[dep].append(f"{label} ({req})")
            elif dep in image:
                have, where = image[dep], "GPU image"
            elif dep in missing_ok_set:
                missed.add(dep)
                met.append(f"{req} (MISSING: neither carried nor in the GPU image, --missing-ok)")
                notes.append(f"{name} {version} requires {req}: neither carried nor in the GPU image (--missing-ok)")
                continue
            else:
                problems.append(f"{name} {version} requires {req}: neither carried nor in the GPU image")
                continue
            if have is not None and not req.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{name} {version} requires {req}, but {where} has {have}")
            met.append(f"{req} ({where}{' ' + have if have else ''})")
        lines.append((key, label, version, met))
    problems += [f"--missing-ok {m}: no requirement misses it, drop it" for m in sorted(missing_ok_set - missed)]
    out = []
    for key, label, version, met in lines:
        if key in roots:
            why = "asked for"
        elif needed_by[key]:
            why = "required by " + ", ".join(needed_by[key])
        else:
            why = ""
            problems.append(f"{label} {version}: carried, but no root needs it")
        out.append(f"{label} {version}: {why}; requires: {', '.join(met) or 'nothing'}")
    return out, problems, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True, help="the GPU image's distributions, one a line")
    parser.add_argument("--roots", nargs="+", required=True, help="the distributions asked for, NAME[EXTRA,...]")
    parser.add_argument(
        "--missing-ok", nargs="+", default=[], help="names a requirement may miss: reported, not failed"
    )
    parser.add_argument("wheels", nargs="+")
    args = parser.parse_args(argv)
    lines, problems, notes = check(args.wheels, args.roots, image_packages(args.image), tuple(args.missing_ok))
    print("\n".join(lines))
    for note in notes:
        print(f"requires.py: note: {note}", file=sys.stderr)
    for problem in problems:
        print(f"requires.py: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
