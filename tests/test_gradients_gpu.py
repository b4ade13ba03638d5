"""The float64 gradient oracle on a GPU (``array_module=cupy``) against NumPy's (GPU only).

Apart from ``test_gradients.py``, whose reference derivatives need HIPS ``autograd``, which the
GPU machine's image does not have.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.core.gradients import recurrent_gated_delta_rule_backward

pytestmark = pytest.mark.gpu


def test_the_adjoint_on_a_gpu_equals_numpys(cp):
    """``array_module=cupy`` runs the adjoint's loops and products in float64 on the GPU: the same
    gradients as NumPy's up to the order of float64 sums, on a GVA varlen pack with l2norm, an
    initial state, a final-state cotangent and two recomputed segments per sequence."""
    rng = np.random.default_rng(3)
    T, H, HV, K, V = 70, 2, 4, 16, 12
    cu = np.array([0, 33, 70])
    args = (
        rng.normal(size=(1, T, H, K)),
        rng.normal(size=(1, T, H, K)),
        rng.normal(size=(1, T, HV, V)),
        -rng.uniform(0.0, 0.5, size=(1, T, HV)),
        rng.uniform(0.0, 1.0, size=(1, T, HV)),
        0.3,
        rng.normal(size=(2, HV, K, V)),
        True,
        cu,
    )
    kw = dict(do=rng.normal(size=(1, T, HV, V)), dht=rng.normal(size=(2, HV, K, V)), checkpoint_every=16)
    want = recurrent_gated_delta_rule_backward(*args, **kw)
    got = recurrent_gated_delta_rule_backward(*args, **kw, array_module=cp)
    for name, w in want.items():
        if w is None:
            assert got[name] is None
            continue
        assert isinstance(got[name], np.ndarray), name
        np.testing.assert_allclose(got[name], w, rtol=1e-11, atol=1e-11 * np.abs(w).max(), err_msg=name)
