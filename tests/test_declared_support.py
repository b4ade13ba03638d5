"""Property draws within what an implementation declares it supports (``strategies.supported``): no
example is drawn only to be refused, and a property that needs what is missing says why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gdn_verify import api
from gdn_verify.core.implementation import ConfigurationError, Implementation
from gdn_verify.implementations import numpy_impl
from gdn_verify.properties import Limits
from gdn_verify.properties.strategies import supported
from gdn_verify.runners.check import RunSettings, run_property


def refusing(heads: bool = False, dims: tuple[int, ...] | None = None):
    """The NumPy kernel, refusing HV != H (``heads``) or head sizes outside ``dims``."""

    def run(**kw):
        H, K = kw["q"].shape[2:]
        HV, V = kw["v"].shape[2:]
        if heads and HV != H:
            raise NotImplementedError("HV must equal H")
        if dims is not None and (K not in dims or V not in dims):
            raise NotImplementedError(f"no kernel for K={K}, V={V}")
        return numpy_impl.chunk_gated_delta_rule(**kw)

    return run


def run(impl: Implementation, name: str, tmp_path):
    prop = api.catalogue_for(impl)[name]
    return run_property(prop, impl, RunSettings(max_examples=15, seed=3, cases_dir=tmp_path))


def test_a_kernel_declaring_no_gva_is_drawn_h_equal_hv_only(tmp_path):
    declared = Implementation("no-gva", {"chunk": refusing(heads=True)}, extra={"gva": False})
    for name in ("matches_reference", "varlen_equals_separate"):
        result = run(declared, name, tmp_path)
        assert (result.status, result.unsupported) == ("passed", 0), (name, result.note)
    mapping = run(declared, "head_mapping", tmp_path)
    assert mapping.status == "unsupported" and 'declares no GVA (extra["gva"] = False)' in mapping.note
    # undeclared, the same kernel's refusals are counted as unsupported examples, with the reason
    undeclared = run(Implementation("quiet", {"chunk": refusing(heads=True)}), "matches_reference", tmp_path)
    assert undeclared.unsupported > 0 and "HV must equal H" in undeclared.note


def test_declared_head_sizes_narrow_the_draws(tmp_path):
    declared = Implementation("dims", {"chunk": refusing(dims=(4, 8))}, extra={"head_dims": (4, 8)})
    result = run(declared, "matches_reference", tmp_path)
    assert (result.status, result.unsupported) == ("passed", 0), result.note
    limits = supported(Limits(head_dims=(2, 4, 100)), declared)
    assert limits.head_dims == (4,)
    assert supported(Limits(head_dims=(2, 100)), declared).head_dims == (4, 8)  # none in common: the declared
    assert supported(Limits(), Implementation("plain", {"chunk": refusing()})) == Limits()


def test_declared_head_sizes_reach_the_shape_pool_and_the_process_properties(tmp_path):
    """``check`` narrows once for every property (``options.suite_limits``): a JIT-compiled kernel's
    shape pool and the process properties draw only the declared sizes. Before, the pool's classes
    (K = 128, V = 100; K = 60, V = 32) left FlashInfer's and FlashQLA's process properties with
    nothing but unsupported examples (H100, 2026-12-05)."""
    extra = {"head_dims": (4,), "compile_classes": True}
    impl = Implementation("dims-jit", {"chunk": refusing(dims=(4,))}, "numpy", extra=extra)
    names = ["output_isolation", "shape_class_return", "varlen_equals_separate", "matches_reference"]
    result = api.check(impl, properties=names, max_examples=4, seed=1, plans_dir=None, cases_dir=tmp_path)
    for r in result.results:
        assert (r.status, r.unsupported) == ("passed", 0), (r.name, r.note)
    # asked for sizes the kernel declares none of: one ConfigurationError naming the argument
    with pytest.raises(ConfigurationError, match="dims-jit has kernels for head sizes 4 only; got 64"):
        api.check(impl, properties=names, dims=[64], plans_dir=None)


def test_the_header_names_the_head_sizes_an_adapter_declares():
    """The header says the sizes the properties draw (``options.suite_limits``), not a second
    computation of them."""
    from gdn_verify._cli import head_sizes_note
    from gdn_verify.options import declared_head_dims, suite_limits

    def note(impl: Implementation, asked: list[int] | None) -> str:
        drawn = suite_limits(impl, "float32", asked, None).head_dims
        return head_sizes_note(asked, drawn, impl.name if declared_head_dims(impl) else None)

    plain = Implementation("x", {"chunk": refusing()})
    declaring = Implementation("flashinfer-decode", {"chunk": refusing(dims=(128,))}, extra={"head_dims": (128,)})
    assert note(plain, None) == ""
    assert note(plain, [64, 128]) == ", head sizes 64,128 only"
    assert note(declaring, None) == ", head sizes 128 only (the sizes flashinfer-decode declares)"
    assert note(declaring, [64, 128]) == ", head sizes 128 only (the sizes flashinfer-decode declares)"


def test_flashinfer_and_flashqla_adapters_declare_their_head_sizes():
    """Read from the adapters' source file, not loaded (their libraries need a GPU)."""
    from gdn_verify.implementations import flashinfer, flashqla

    assert flashinfer.HEAD_DIMS == (128,)
    text = Path(flashinfer.__file__).read_text()
    builders = {
        node.name: ast.get_source_segment(text, node) or ""
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("flashinfer_")
    }
    assert set(builders) >= {f"flashinfer_{n}" for n in ("prefill", "prefill_cp", "decode", "decode_bf16", "mtp")}
    for name, body in builders.items():
        assert "head_dims" in body or "DECODE_COMPILE" in body, name
        if "decode" in name or "mtp" in name:  # scale is in their CuTe DSL compile keys
            assert "DECODE_COMPILE" in body, name
    assert flashinfer.DECODE_COMPILE == {"compile_scales": True, "head_dims": (128,)}
    assert '"head_dims": (128,)' in Path(flashqla.__file__).read_text()
