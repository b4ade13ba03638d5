"""Checks that a set of wheels carried to the GPU machine is exactly what its roots need there.

    python3 scripts/carried/requires.py --image scripts/carried/gpu_image_packages.txt \
        --roots NAME [NAME ...] -- WHEEL [WHEEL ...]

Reads each wheel's ``Requires-Dist`` (markers evaluated for CPython 3.12 on Linux x86_64, no
extras) and fails (exit 1, one line per problem) when a requirement is met neither by a carried
wheel (name and version) nor by a distribution of the GPU image (``--image``: one name a line,
with its version where known), when a carried wheel is in the image already, or when a carried
wheel is neither a root nor required by another carried wheel. Prints one line per wheel: name,
version, why it travels, and where each of its requirements is met (scripts/pack_carried.sh
writes these into the bundle's README.txt). Standard library only, plus ``packaging`` (pip's copy
where no other is installed).
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


def check(wheels: list[str], roots: list[str], image: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """``(lines, problems)``: one line per wheel, one problem per unmet or needless wheel."""
    carried = {}
    for wheel in wheels:
        name, version, requires = metadata(wheel)
        carried[normalize(name)] = (name, version, requires)
    roots = [normalize(r) for r in roots]
    problems = [f"{r}: a root, but no carried wheel" for r in roots if r not in carried]
    needed_by: dict[str, list[str]] = {key: [] for key in carried}
    lines = []
    for key, (name, version, requires) in sorted(carried.items()):
        if key in image:
            problems.append(f"{name} {version}: in the GPU image already, do not carry it")
        met = []
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(ENVIRONMENT):
                continue
            dep = normalize(req.name)
            if dep in carried:
                have, where = carried[dep][1], "carried"
                needed_by[dep].append(f"{name} ({req})")
            elif dep in image:
                have, where = image[dep], "GPU image"
            else:
                problems.append(f"{name} {version} requires {req}: neither carried nor in the GPU image")
                continue
            if have is not None and not req.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{name} {version} requires {req}, but {where} has {have}")
            met.append(f"{req} ({where}{' ' + have if have else ''})")
        lines.append((key, name, version, met))
    out = []
    for key, name, version, met in lines:
        if key in roots:
            why = "asked for"
        elif needed_by[key]:
            why = "required by " + ", ".join(needed_by[key])
        else:
            why = ""
            problems.append(f"{name} {version}: carried, but no root needs it")
        out.append(f"{name} {version}: {why}; requires: {', '.join(met) or 'nothing'}")
    return out, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True, help="the GPU image's distributions, one a line")
    parser.add_argument("--roots", nargs="+", required=True, help="the distributions asked for")
    parser.add_argument("wheels", nargs="+")
    args = parser.parse_args(argv)
    lines, problems = check(args.wheels, args.roots, image_packages(args.image))
    print("\n".join(lines))
    for problem in problems:
        print(f"requires.py: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
