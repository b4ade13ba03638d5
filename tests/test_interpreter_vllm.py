"""vLLM's real GDN ops of releases on both sides of the state-layout change, under Triton's interpreter.

vLLM's recurrent kernels held the state k-first (``[.., K, V]``) up to 0.15.1 and v-first from
0.16.0 (``vllm_releases.TABLE``). Each release's ops folder comes from
``gdn_verify.runners.releases.site`` (downloaded once into the release cache) and runs in a child
process of its own (``GDN_VERIFY_VLLM_OPS``, ``TRITON_INTERPRET=1``, CPU torch tensors): a
reduced ``check`` (``matches_reference``, K = V = 32, few short examples) of every adapter the
release has, in float32 and float16; vLLM's chunk refuses float32, which must come back
unsupported. A row of the table with its layout flipped must make the same check fail. The
newest release's raw-gate kernels also take the caller's raw gates in each dtype. The children run two at a
time (the `children` fixture).
Skipped without torch/Triton or when the release cannot be fetched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from gdn_verify.runners import releases  # noqa: E402
from tests.scale_plugins import LIMITS  # noqa: E402

EXAMPLES = 2
# The child: argv[1] is {"runs": [[impl, dtype], ...], "properties": [...], "corrupt": row name or
# null}; it runs each (impl, dtype) on the properties and prints {impl/dtype/property: status}. A
# "corrupt" row of vllm_releases.TABLE has its layouts flipped first (a corrupted row).
CHILD = textwrap.dedent(
    """
    import dataclasses, json, sys, tempfile
    from gdn_verify.api import check
    from gdn_verify.implementations import registry, vllm_releases
    job = json.loads(sys.argv[1])
    if job["corrupt"]:
        vllm_releases.TABLE = tuple(
            dataclasses.replace(r, state_v_first=not r.state_v_first, chunk_v_first=not r.chunk_v_first)
            if r.name == job["corrupt"] else r
            for r in vllm_releases.TABLE
        )
    EXAMPLES = {examples}
    scale = job.get("scale")  # the scale tier's limits (ScaleLimits' fields), for the scale_* properties
    if scale:
        from gdn_verify.runners.scale import ScaleLimits
        scale = ScaleLimits(**scale)
    out = {}
    with tempfile.TemporaryDirectory() as cases:
        for name, dtype in job["runs"]:
            result = check(
                registry.resolve(name), dtype=dtype, properties=job["properties"], seed=0,
                max_examples=EXAMPLES, dims=[32], max_tokens=64, cases_dir=cases, plans_dir=None,
                **({"scale_limits": scale} if scale else {}),
            )
            out.update({f"{name}/{dtype}/{r.name}": r.status for r in result.results})
    print("RESULT " + json.dumps(out))
    """
).replace("{examples}", str(EXAMPLES))


def _site(version: str):
    try:
        return releases.site("vllm", version)
    except Exception as exc:  # noqa: BLE001 - no network, no index: skip with the reason
        pytest.skip(f"vllm {version} cannot be fetched: {exc}")


def run_release(
    site,
    runs: list[tuple[str, str]],
    corrupt: str | None = None,
    properties: tuple[str, ...] = ("matches_reference",),
    scale: dict | None = None,
) -> dict[str, str]:
    """``{impl/dtype/property: status}`` of the reduced checks of the vLLM ops at ``site``, in a child process."""
    env = releases.child_env(site)
    env["TRITON_INTERPRET"] = "1"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    job = json.dumps({"runs": runs, "properties": list(properties), "corrupt": corrupt, "scale": scale})
    done = subprocess.run([sys.executable, "-c", CHILD, job], env=env, capture_output=True, text=True, timeout=1500,
                          cwd=os.getcwd())  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


BASE = [("vllm-recurrent", "float32"), ("vllm-recurrent", "float16"), ("vllm-chunk", "float16")]
FUSED = [(impl, dtype) for impl in ("vllm-packed-decode", "vllm-sigmoid-recurrent") for dtype in ("float32", "float16")]
RELEASES = {
    "0.10.2": BASE,  # the first with GDN ops: k-first, no padding test
    "0.16.0": BASE,  # the first v-first release (PAD_SLOT_ID)
    "0.34.0": BASE + FUSED,  # the newest: null block, the fused decode kernels
}
GATE_PROPERTIES = ("in_kernel_gate", "optional_dtypes")
SCALE_PROPERTIES = ("scale_decode_batch", "scale_varlen_many_short", "scale_many_chunks", "scale_long_sequence")
# Every child of this module by name: (release, run_release's other arguments). The children are
# single-threaded interpreters, so the module runs them two at a time (CI's two cores) as soon as
# its first test asks, and each test waits for its own.
JOBS: dict[str, tuple[str, dict]] = {
    **{f"release {v}": (v, dict(runs=[*runs, ("vllm-chunk", "float32")])) for v, runs in RELEASES.items()},
    "raw gates": ("0.34.0", dict(runs=FUSED, properties=GATE_PROPERTIES)),
    "corrupted row": ("0.10.2", dict(runs=[("vllm-recurrent", "float32")], corrupt="k-first")),
    "scale": ("0.34.0", dict(runs=[("vllm-packed-decode", "float32")], properties=SCALE_PROPERTIES,
                             scale=dataclasses.asdict(LIMITS))),
}  # fmt: skip


@pytest.fixture(scope="module")
def children():
    """``{name: Future of run_release}`` for every job of ``JOBS``, two running at a time. The sites
    are fetched here first, one release at a time (two children of one release would unpack it at
    once); a release that cannot be fetched skips its tests."""
    sites: dict[str, Any] = {}
    for version in {v for v, _ in JOBS.values()}:
        try:
            sites[version] = _site(version)
        except pytest.skip.Exception as exc:
            sites[version] = exc
    with ThreadPoolExecutor(max_workers=2) as pool:

        def submit(version: str, kwargs: dict) -> Future:
            site = sites[version]
            if isinstance(site, BaseException):
                failed: Future = Future()
                failed.set_exception(site)
                return failed
            return pool.submit(run_release, site, **kwargs)

        yield {name: submit(version, kwargs) for name, (version, kwargs) in JOBS.items()}


@pytest.mark.interpreter
@pytest.mark.parametrize("version", list(RELEASES))
def test_a_release_passes_a_reduced_check_in_float32_and_float16(children, version):
    runs = RELEASES[version]
    statuses = children[f"release {version}"].result()
    assert statuses.pop("vllm-chunk/float32/matches_reference") == "unsupported", "vLLM's chunk refuses float32 inputs"
    assert statuses == {f"{impl}/{dtype}/matches_reference": "passed" for impl, dtype in runs}


@pytest.mark.interpreter
def test_the_fused_kernels_take_the_callers_raw_gates_in_each_dtype(children):
    """The raw-gate kernels handed the caller's ``a``, ``A_log``, ``dt_bias`` (FLA's in-kernel gate
    options), and ``A_log``, ``dt_bias`` in their two dtypes in turn (``optional_dtypes``)."""
    statuses = children["raw gates"].result()
    assert statuses == {f"{impl}/{dtype}/{p}": "passed" for impl, dtype in FUSED for p in GATE_PROPERTIES}


@pytest.mark.interpreter
def test_a_corrupted_row_fails_its_release(children):
    """The row that 0.10.2's fingerprint selects, with its layout flipped: the check must fail."""
    assert children["corrupted row"].result() == {"vllm-recurrent/float32/matches_reference": "failed"}


@pytest.mark.interpreter
def test_the_packed_decode_runs_the_scale_cases_one_launch_crosses(children):
    """vLLM's packed decode is called once per token step (``extra["token_steps"]``): the scale
    cases that grow a launch (many sequences) run, the others are unsupported with the reason."""
    name = "vllm-packed-decode/float32/"
    assert children["scale"].result() == {
        name + "scale_decode_batch": "passed",
        name + "scale_varlen_many_short": "passed",
        name + "scale_many_chunks": "unsupported",
        name + "scale_long_sequence": "unsupported",
    }
