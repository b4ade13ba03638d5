"""vLLM's per-release conventions (``vllm_releases``) and the adapters that follow them, on CPU.

No kernels run here: the table's ranges and fingerprints are checked for consistency, the
feature reader on small synthetic ops folders, the probe path with stand-in probes, and the
adapters with NumPy/torch stand-ins that hold the state in the layout a row names and record
the dtypes and strides they were handed (``tests/test_interpreter_vllm.py`` runs the real ops).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gdn_verify.core import reference
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.implementations import vllm, vllm_releases
from gdn_verify.implementations.vllm_releases import TABLE
from tests.test_spec_adapters import standin_vllm_recurrent

K_FIRST = "p_h0 = p_h0 + i_hv * K * V + o_k[:, None] * V + o_v[None, :]\nssm_state_indices\n"
V_FIRST = "p_h0 = p_h0 + i_hv * V * K + o_v[:, None] * K + o_k[None, :]\nssm_state_indices\n"
CHUNK_K = "tl.make_block_ptr(h0, (K, V), (V, 1), (0, i_v * BV), (64, BV), (1, 0))\n"
CHUNK_V = "p_h0_1 = h0 + o_v[:, None] * K + o_k1[None, :]\n"
PADS = {"none": "", "negative": "if state_idx < 0:\n    return\n", "null": "if state_idx <= 0:\n    return\n"}


def folder(tmp_path: Path, row: vllm_releases.Conventions) -> Path:
    """A synthetic ops folder showing ``row``'s features (not a loadable one)."""
    ops = tmp_path / row.name / "ops"
    ops.mkdir(parents=True)
    recurrent = (V_FIRST if row.state_v_first else K_FIRST) + PADS[row.padding]
    if row.packed_decode:
        recurrent += "def fused_recurrent_gated_delta_rule_packed_decode(\n"
    (ops / "fused_recurrent.py").write_text(recurrent)
    (ops / "chunk_delta_h.py").write_text(CHUNK_V if row.chunk_v_first else CHUNK_K)
    if row.sigmoid_gating:
        (ops / "fused_sigmoid_gating.py").write_text(V_FIRST if row.state_v_first else K_FIRST)
    return ops.parent


def test_rows_cover_the_surveyed_releases_in_order_without_overlap():
    key = vllm_releases._key  # noqa: SLF001
    for before, after in zip(TABLE, TABLE[1:]):
        assert key(before.last) < key(after.first)
    for first, last in vllm_releases.FINGERPRINTS.values():
        rows = [row for row in TABLE if row.covers(first) and row.covers(last)]
        assert len(rows) == 1, f"fingerprint {first}..{last} must fall in exactly one row"
    assert not any(row.covers("0.10.1") for row in TABLE), "GDN ops came in 0.10.2"
    assert {row.name: row.state_v_first for row in TABLE}["k-first"] is False


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_each_rows_features_pick_that_row(row, tmp_path):
    root = folder(tmp_path, row)
    found = vllm_releases.features(root / "ops")
    assert vllm_releases.match(found) == row
    release = vllm_releases.identify(SimpleNamespace(root=root), run_probe=lambda ops: pytest.fail("probed"))
    assert release.conventions == row and release.how == "features"


def test_undecided_features_are_probed_and_an_unsettled_probe_is_one_configuration_error(tmp_path):
    row = TABLE[1]
    root = folder(tmp_path, row)
    (root / "ops" / "fused_recurrent.py").write_text("ssm_state_indices\nstate_idx < 0\n")  # no layout shown
    probed = dict(state_v_first=True, chunk_v_first=True, padding="negative")
    release = vllm_releases.identify(SimpleNamespace(root=root), run_probe=lambda ops: probed)
    assert release.conventions == row and release.how == "probe"
    with pytest.raises(ConfigurationError, match=r"no known release.*probed: state_v_first=None.*padding=negative"):
        vllm_releases.identify(SimpleNamespace(root=root), run_probe=lambda ops: dict(state_v_first=None))

    def broken(ops):
        raise RuntimeError("no device")

    with pytest.raises(ConfigurationError, match="probe_error=RuntimeError: no device"):
        vllm_releases.identify(SimpleNamespace(root=root), run_probe=broken)


def test_a_fingerprinted_folder_takes_its_versions_row_whatever_it_shows(tmp_path, monkeypatch):
    # the fingerprint names the release, and the table (not the files) says its conventions:
    # so a wrong row is what the interpreter tests catch (test_interpreter_vllm's corrupted row)
    root = folder(tmp_path, TABLE[0])
    monkeypatch.setitem(vllm_releases.FINGERPRINTS, vllm_releases.fingerprint(root / "ops"), ("0.16.1", "0.16.1"))
    release = vllm_releases.identify(SimpleNamespace(root=root))
    assert release.conventions.name == "pad-slot" and "fingerprint" in release.how


def kfirst(kernel):
    """``standin_vllm_recurrent`` (a v-first pool) as a kernel holding its pool k-first."""

    def call(*args, initial_state, **kw):
        pool = np.ascontiguousarray(initial_state.swapaxes(-1, -2))
        o, _ = kernel(*args, initial_state=pool, **kw)
        initial_state[...] = pool.swapaxes(-1, -2)
        return o, initial_state

    return call


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    cu = np.array([0, 3, 3, 9])
    q, k = rng.standard_normal((2, 1, 9, 2, 8))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((1, 9, 4, 6))  # V != K: a transposed state cannot pass for the right one
    g, beta = -rng.random((1, 9, 4)), rng.random((1, 9, 4))
    S0 = rng.standard_normal((3, 4, 8, 6))
    return (q, k, v, g, beta), dict(initial_state=S0, output_final_state=True, cu_seqlens=cu, scale=0.4)


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_the_recurrent_adapter_follows_the_rows_layout_and_a_flipped_row_is_wrong(row):
    args, kw = _problem()
    want_o, want_s = reference.recurrent_gated_delta_rule(*args, **kw)
    kernel = standin_vllm_recurrent if row.state_v_first else kfirst(standin_vllm_recurrent)
    o, s = vllm.recurrent_adapter(kernel, np, kernel_v_first=row.state_v_first)(*args, **kw)
    assert np.allclose(o, want_o, atol=1e-6) and np.allclose(s, want_s, atol=1e-6)
    with pytest.raises(ValueError):  # K != V: the flipped pool does not even have the kernel's shape
        vllm.recurrent_adapter(kernel, np, kernel_v_first=not row.state_v_first)(*args, **kw)


def test_a_release_without_a_padding_test_refuses_padding_in_the_spec_form():
    args, _ = _problem()
    pool = np.zeros((4, 4, 8, 8), np.float32)
    indices = np.array([[1, 2, 0], [-1, -1, -1], [3, 0, 0]], np.int32)
    spec = vllm.spec_adapter(standin_vllm_recurrent, padding="none")
    with pytest.raises(NotImplementedError, match="no padding test"):
        spec(*args, pool, np.array([0, 3, 3, 9]), indices, np.array([1, 1, 1]))
    assert TABLE[0].spec_rules.padding == "negative" and TABLE[-1].spec_rules.null_slot == 0
    assert [row.spec_rules.pool_v_first for row in TABLE] == [row.state_v_first for row in TABLE]


class Recorder:
    """A fake kernel: records every array keyword's dtype, shape and strides, returns zeros."""

    def __init__(self, packed: bool = False):
        self.calls: list[dict] = []
        self.packed = packed

    def __call__(self, **kw):
        torch = pytest.importorskip("torch")
        arrays = {k: x for k, x in kw.items() if hasattr(x, "stride")}
        self.calls.append({k: (str(x.dtype), tuple(x.shape), x.stride()) for k, x in arrays.items()})
        if self.packed:
            return kw["out"]
        v = kw["v"]
        return torch.zeros(v.shape, dtype=v.dtype), kw.get("initial_state")


def _torch_problem(dtype_name: str):
    torch = pytest.importorskip("torch")
    (q, k, v, g, beta), kw = _problem(1)
    dtype = getattr(torch, dtype_name)
    to = lambda x: torch.as_tensor(x).to(dtype)  # noqa: E731
    kw = dict(kw, initial_state=torch.as_tensor(kw["initial_state"], dtype=torch.float32))
    kw["cu_seqlens"] = torch.as_tensor(kw["cu_seqlens"])
    return (to(q), to(k), to(v), to(g), to(beta)), kw


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_the_adapters_pass_what_vllms_layer_passes(row, dtype):
    """Gates and pools in the dtypes and strides of vLLM's Qwen GDN layer, per release."""
    args, kw = _torch_problem(dtype)
    model = f"torch.{dtype}"
    HV = args[2].shape[2]
    # fused_recurrent (and chunk): g float32; beta float32 from 0.20 (fused_post_conv_prep), else the model's
    rec = Recorder()
    vllm.recurrent_adapter(rec, kernel_v_first=row.state_v_first, beta_float32=row.beta_float32)(*args, **kw)
    (seen,) = rec.calls
    assert seen["g"][0] == "torch.float32"
    assert seen["beta"][0] == ("torch.float32" if row.beta_float32 else model)
    assert seen["q"][0] == model and seen["initial_state"][0] == "torch.float32"  # mamba_ssm_cache_dtype=float32
    assert seen["initial_state"][1][-2:] == ((6, 8) if row.state_v_first else (8, 6))
    if not row.sigmoid_gating:
        return
    # the fused raw-gate kernels: a, b in the model dtype, [tokens, HV] halves of one [b | a] buffer
    for adapter, recorder in (
        (lambda r: vllm.recurrent_adapter(r, raw=True, kernel_v_first=row.state_v_first), Recorder()),
        (lambda r: vllm.packed_decode_adapter(r, vllm.TorchOps(), row.state_v_first), Recorder(packed=True)),
    ):
        adapter(recorder)(*args, **kw)
        for seen in recorder.calls:
            assert seen["a"][0] == seen["b"][0] == seen["dt_bias"][0] == model
            assert seen["A_log"][0] == "torch.float32"
            assert seen["a"][2] == seen["b"][2] == (2 * HV, 1) and seen["a"][1][1:] == (HV,)
