"""Property draws within what an implementation declares it supports (``strategies.supported``): no
example is drawn only to be refused, and a property that needs what is missing says why."""

from __future__ import annotations

from gdn_verify import api
from gdn_verify.core.implementation import Implementation
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
