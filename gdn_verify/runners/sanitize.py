"""A gdn-verify command under compute-sanitizer's memcheck, in a child process.

memcheck sees what no output comparison can: a read before a pool, a write one element past a
tensor that lands in padding, an uninitialised read that happens to hold zeros. The child runs the
same command (kernels 10-100x slower under the tool, so keep ``--max-examples`` small); the first
error memcheck reports is the verdict, with the kernel and address it names.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass

from gdn_verify.core.implementation import ConfigurationError

ERROR_EXIT = 86  # memcheck's exit status when it found an error (distinct from the command's own)
PREFIX = "========= "


@dataclass(frozen=True)
class Sanitized:
    """The child's exit status, its output, and memcheck's first error (empty when none)."""

    returncode: int
    output: str
    first_error: str

    @property
    def clean(self) -> bool:
        return self.returncode != ERROR_EXIT and not self.first_error


def first_error(output: str) -> str:
    """The first error block of memcheck's report (``========= Invalid __global__ write ...`` and
    the lines of that block, its host backtrace left out)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        text = line.removeprefix(PREFIX)
        if line.startswith(PREFIX) and (text.startswith(("Invalid", "Program hit", "Uninitialized", "Race"))):
            block = [text.strip()]
            for follow in lines[i + 1 : i + 8]:
                body = follow.removeprefix(PREFIX).strip()
                if not follow.startswith(PREFIX) or not body or body.startswith(("Saved host backtrace", "Host Frame")):
                    break
                block.append(body)
            return "; ".join(block)
    return ""


def memcheck_tool() -> str:
    """The path of ``compute-sanitizer``; :class:`ConfigurationError` naming ``sanitize`` when absent."""
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        raise ConfigurationError("sanitize", "compute-sanitizer is not on PATH (it ships with the CUDA toolkit)")
    return tool


def run_sanitized(argv: list[str], timeout: float | None = None) -> Sanitized:
    """``python -m gdn_verify ARGV`` under ``compute-sanitizer --tool memcheck``."""
    tool = memcheck_tool()
    command = [
        tool,
        "--tool",
        "memcheck",
        "--error-exitcode",
        str(ERROR_EXIT),
        "--print-limit",
        "4",
        sys.executable,
        "-m",
        "gdn_verify",
        *argv,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    return Sanitized(proc.returncode, output, first_error(output))
