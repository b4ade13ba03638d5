"""The precision contract's models: NumPy kernels that make one allowed or one forbidden rounding.

A correct GDN kernel may round some intermediates (``docs/precision.md``); the tolerance model
(``gdn_verify.core.tolerance``) has one derived term for each allowed rounding, and none for a
forbidden one. Each :class:`RoundingModel` here is a float32 NumPy kernel in FLA's convention
that makes its rounding and nothing else (beside float32 arithmetic): the allowed ones must pass
every property in every input dtype, the forbidden ones must fail, and
``benchmarks/precision_contract.py`` measures by how much. "16 bits" means the input dtype
when it has 16 bits and bfloat16 for float32 inputs (:func:`planted.sixteen_bits`).

Allowed (FLA's ``chunk_gated_delta_rule`` makes all of them in bfloat16): the l2-normalised q/k
stored in the input dtype (``qk``); the operands of tensor-core products in the input dtype
(``operands``: beta k for k k^T, the inverse T, beta exp(G) k and beta v for W and U, the gated
q k^T, the decayed v_new of the state update); W, U, the chunk-start state used in products and
v_new stored in the input dtype between stages (``stored``); all of those at once (``fla16``, at
C = 64 and 16); a float32 chunk-local gate cumsum (``cumsum32``); float32 arithmetic (the token
loop and the chunked form, ``float32``).

Forbidden: the carried state rounded to 16 bits every token (``state16_token``) or every chunk
on top of FLA's allowed roundings (``state16_chunk``), unless the kernel declares that state
dtype (``Implementation.extra["state_dtype"]``: then :func:`stored_state` is its model, outside
``MODELS``, and the bound has a term for it); the decay factor ``exp(g)`` rounded to 16
bits inside the update (``decay16``); beta rounded to 16 bits inside the update (``beta16``); the
gate cumsum in 16 bits (``cumsum16``); the l2norm without its epsilon, torch's ``F.normalize``
(``l2norm_no_eps``); and a named precision loss, TF32 products (``tf32``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gdn_verify.core.conventions import L2NORM_EPS
from gdn_verify.core.reference import STAGES
from gdn_verify.implementations import numpy_impl, planted
from gdn_verify.implementations.planted import prenormalized, sixteen_bits

# Intermediates of each allowed rounding (the same groups as the tolerance model's terms).
OPERANDS = ("kkt_operand", "inverse", "wu_operands", "attn", "v_new_decayed")
STORED = ("wu", "h", "v_new")


@dataclass(frozen=True)
class RoundingModel:
    """One rounding as a runnable kernel. ``run(**kwargs)`` takes FLA's native keyword arguments.

    ``allowed``: True for the contract's allowed roundings, False for forbidden ones, None for a
    named precision loss (TF32), which fails where it matters and is reported by name.
    ``identity_for``: input dtypes for which the rounding changes nothing (beta rounded to
    bfloat16 when beta already is bfloat16), so the model is the correct kernel there.
    """

    name: str
    allowed: bool | None
    description: str
    run: Callable[..., tuple]
    identity_for: tuple[str, ...] = ()


def fla_rounded(
    chunk_size: int = 64,
    stages: tuple[str, ...] = STAGES,
    qk: bool = True,
    carried: bool = False,
    cumsum16: bool = False,
    tf32: bool = False,
) -> Callable[..., tuple]:
    """FLA's chunked algorithm (``numpy_impl.chunk_fla_core``) rounding ``stages`` (names of
    ``reference.STAGES``) and, with ``qk``, the l2-normalised q/k to the input dtype (the allowed
    roundings); ``carried``: the carried state to 16 bits at every chunk boundary; ``cumsum16``:
    the gate cumsum in 16 bits (forbidden ones)."""

    def run(**kw):
        dtype = np.asarray(kw["v"]).dtype
        store = None if dtype.itemsize > 2 else dtype  # float32 inputs: stored in float32, no rounding
        half = sixteen_bits(dtype)

        def hook(name: str, x: np.ndarray) -> np.ndarray:
            return x.astype(store).astype(np.float32) if store is not None and name in stages else x

        return numpy_impl.chunk_fla_gated_delta_rule(
            **(prenormalized(kw, dtype=store) if qk else kw),
            chunk_size=chunk_size,
            cumsum_dtype=half if cumsum16 else np.float32,
            tf32=tf32,
            hook=hook,
            carried_dtype=half if carried else None,
        )

    return run


def _normalize_like_torch(x: np.ndarray) -> np.ndarray:
    """torch.nn.functional.normalize: ``x / max(||x||, 1e-12)``, no epsilon inside the square root."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), np.float32(1e-12))


def _l2norm_no_eps(**kw):
    return numpy_impl.chunk_gated_delta_rule(**prenormalized(kw, _normalize_like_torch))


def _loop(bug: str) -> Callable[..., tuple]:
    return lambda **kw: planted.token_loop(bug, **kw)


MODELS: tuple[RoundingModel, ...] = (
    RoundingModel("float32_loop", True, "float32 token loop", numpy_impl.recurrent_gated_delta_rule),
    RoundingModel("float32_chunk", True, "float32 chunked form, C=64", numpy_impl.chunk_gated_delta_rule),
    RoundingModel(
        "cumsum32",
        True,
        "FLA's chunked form with its float32 chunk-local gate cumsum",
        fla_rounded(stages=(), qk=False),
    ),
    RoundingModel("qk", True, "l2-normalised q/k stored in 16 bits", fla_rounded(stages=())),
    RoundingModel("operands", True, "tensor-core product operands in 16 bits", fla_rounded(stages=OPERANDS, qk=False)),
    RoundingModel(
        "stored", True, "W, U, chunk-start states and v_new stored in 16 bits", fla_rounded(stages=STORED, qk=False)
    ),
    RoundingModel("fla16", True, "all of FLA's 16-bit roundings, C=64", fla_rounded()),
    RoundingModel("fla16_c16", True, "all of FLA's 16-bit roundings, C=16", fla_rounded(16)),
    RoundingModel("state16_token", False, "carried state rounded to 16 bits every token", _loop("state16")),
    RoundingModel(
        "state16_chunk",
        False,
        "FLA's roundings and the carried state rounded to 16 bits every chunk",
        fla_rounded(carried=True),
    ),
    RoundingModel("decay16", False, "decay factor exp(g) rounded to 16 bits inside the update", _loop("decay16")),
    RoundingModel(
        "beta16",
        False,
        "beta rounded to 16 bits inside the update",
        _loop("beta16"),
        identity_for=("bfloat16", "float16"),
    ),
    RoundingModel(
        "cumsum16",
        False,
        "FLA's chunked form with its gate cumsum in 16 bits",
        fla_rounded(stages=(), qk=False, cumsum16=True),
    ),
    RoundingModel(
        "l2norm_no_eps",
        False,
        f"l2norm without its epsilon (x / max(||x||, 1e-12) instead of x / sqrt(||x||^2 + {L2NORM_EPS:g}))",
        _l2norm_no_eps,
    ),
    RoundingModel(
        "tf32",
        None,
        "TF32 products (FLA's chunked form, every product's operands rounded to TF32)",
        fla_rounded(stages=(), qk=False, tf32=True),
    ),
)
BY_NAME = {model.name: model for model in MODELS}


def round_mantissa(x: np.ndarray, bits: int) -> np.ndarray:
    """Float32 values rounded to nearest (ties away from zero) with ``bits`` explicit mantissa bits
    and float32's exponent range (7: bfloat16's precision); returned as float32."""
    x = np.ascontiguousarray(x, np.float32)
    dropped = 23 - bits
    half = np.uint32(1 << (dropped - 1))
    mask = np.uint32(~((1 << dropped) - 1) & 0xFFFFFFFF)
    rounded = ((x.view(np.uint32) + half) & mask).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)


def stored_state(dtype="bfloat16", mantissa_bits: int | None = None, every_token: bool = True) -> Callable[..., tuple]:
    """A float32 token loop whose carried state lives in ``dtype`` (a bfloat16 state pool, as
    FlashInfer's bf16-state decode): rounded to it as loaded and after every token
    (``numpy_impl.recurrent_stored_state_gated_delta_rule``). ``mantissa_bits``: instead rounded to
    that many explicit mantissa bits in float32's range (3: bfloat16 16 times coarser).
    ``every_token=False``: rounded only as loaded and as the final state is stored, carried in
    float32 in between (MAX's recurrence on a bfloat16 pool; declared as ``tolerance.StoredState``)."""
    if mantissa_bits is None:
        narrow = np.dtype(dtype)

        def store(x: np.ndarray) -> np.ndarray:
            return x.astype(narrow).astype(np.float32)
    else:

        def store(x: np.ndarray) -> np.ndarray:
            return round_mantissa(x, mantissa_bits)

    def run(**kw):
        return numpy_impl.recurrent_stored_state_gated_delta_rule(**kw, store=store)

    def once_per_call(**kw):
        if kw.get("initial_state") is not None:
            kw["initial_state"] = store(np.asarray(kw["initial_state"], np.float32))
        o, final = numpy_impl.recurrent_stored_state_gated_delta_rule(**kw)
        return o, None if final is None else store(np.asarray(final, np.float32))

    return run if every_token else once_per_call
