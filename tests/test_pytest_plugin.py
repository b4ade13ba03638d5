"""The pytest plugin, as a kernel author uses it: ``pytest --gdn-impl M:F`` in a folder of their own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = textwrap.dedent("""
    from gdn_verify.implementations import numpy_impl, planted

    def good(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
             use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        return numpy_impl.recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
                                                     use_qk_l2norm_in_kernel, cu_seqlens)

    bad = planted.BUGS["off_by_one_final_state"][1]
""")


def run_pytest(folder: Path, *args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    # The tree under test after the user's folder: not another checkout the package may be installed from.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *(["-q"] if quiet else []), "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    return tmp_path


def test_a_correct_plugin_passes_one_item_per_property(folder):
    done = run_pytest(
        folder,
        "--gdn-impl",
        "kernels:good",
        "--gdn-array",
        "numpy",
        "--gdn-dtype",
        "float32",
        "--gdn-max-examples",
        "5",
        "--gdn-seed",
        "1",
        "-rs",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    passed = int(done.stdout.split(" passed")[0].split()[-1])
    assert passed >= 10
    assert "gdn-verify: impl=kernels:good" in done.stdout or "skipped" in done.stdout


def test_a_buggy_plugin_fails_with_its_minimal_example(folder):
    done = run_pytest(
        folder,
        "--gdn-impl",
        "kernels:bad",
        "--gdn-array",
        "numpy",
        "--gdn-dtype",
        "float32",
        "--gdn-max-examples",
        "20",
        "--gdn-seed",
        "1",
        "--gdn-properties",
        "matches_reference,determinism",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gdn-verify::matches_reference" in done.stdout and "minimal example: B=" in done.stdout
    assert "replay: gdn-verify replay /" in done.stdout
    assert "1 failed, 1 passed" in done.stdout
    # pytest's output holds results only: no status line ("  determinism  12 examples worst ...").
    output = done.stdout + done.stderr
    assert "\r" not in output and not re.search(r"^ *[a-z_]+ +\d+ examples", output, re.M), output


def test_the_items_are_counted_selected_and_summarized_once(folder):
    """pytest said "collected 0 items" (the items were appended after collection, uncounted) and
    its short summary read "FAILED gdn-verify::x - FAILED x: ..."."""
    done = run_pytest(
        folder,
        "--gdn-impl", "kernels:bad", "--gdn-array", "numpy", "--gdn-max-examples", "20", "--gdn-seed", "1",
        "--gdn-properties", "matches_reference,determinism,varlen_equals_separate", "-k", "not varlen", "-rf",
        quiet=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "collected 3 items / 1 deselected / 2 selected" in done.stdout
    summary = [line for line in done.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(summary) == 1 and summary[0].startswith("FAILED gdn-verify::matches_reference - state error")
    assert "1 failed, 1 passed, 1 deselected" in done.stdout
    assert "minimal example: B=" in done.stdout and "replay: gdn-verify replay /" in done.stdout


def test_misuse_is_a_usage_error(folder):
    done = run_pytest(folder, "--gdn-impl", "kernels:missing")
    assert done.returncode == 4 and "--gdn-impl" in done.stderr and "has no function" in done.stderr
    done = run_pytest(folder, "--gdn-impl", "numpy", "--gdn-scale")
    assert done.returncode == 4 and "--gdn-scale: the scale tier needs a GPU" in done.stderr
    done = run_pytest(folder, "--gdn-impl", "numpy", "--gdn-properties", "matches_reference,bogus")
    assert done.returncode == 4 and "--gdn-properties" in done.stderr and "bogus" in done.stderr


def test_the_fixture_checks_a_kernel_inside_a_users_own_test(folder):
    (folder / "test_mine.py").write_text(
        textwrap.dedent("""
        from kernels import bad, good

        def test_good(gdn_check):
            gdn_check(good, properties=["matches_reference"], max_examples=5).assert_passed()

        def test_bad(gdn_check):
            gdn_check(bad, properties=["matches_reference"], max_examples=20).assert_passed()
    """)
    )
    done = run_pytest(folder, "test_mine.py")
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout, done.stdout
    assert "minimal example: B=" in done.stdout
