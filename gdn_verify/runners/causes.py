"""Named causes: which known mistake or precision loss reproduces a failure.

When a property fails against the oracle, :func:`explain` reruns the implementation on the
minimal (shrunk) failing problem and compares its outputs with those of each *error model*
in :data:`MODELS`: a NumPy implementation of one specific mistake (a planted bug of
``gdn_verify.implementations.planted``, a gate or beta convention slip, a scale or
initial-state default) or precision loss (TF32 products, a bfloat16, float16 or input-dtype
state, a float32 chunk-local gate cumsum). A model *explains* the failure when it reproduces
the implementation's outputs far better than the exact oracle does (see :func:`verdict`); the
best one is named with its evidence, e.g. ``TF32 matrix products (the FLA-style chunked
algorithm with the operands of every matrix product rounded to TF32 reproduces the outputs to
3.1%: state error 2.1e-06 against it, 6.8e-05 against the exact oracle)``. A mistake confined
to a few (sequence, value head) blocks is named with them (:func:`localized`): ``..., in
sequence 1 value head 1 only (...)``.

Cheap by construction: one oracle and one implementation call per probe, one call per model,
all on the minimal problem; exact (bitwise) contracts, non-numeric failures and the
speculative-decoding form are not explained, but for one output-contract failure whose shape
names its cause: a final state returned in the other layout (:func:`_layout_cause`).

Every numeric failure gets a kind: the named model's, or for an unexplained failure
:func:`classify`'s, which calls it a precision loss only on evidence that roundings made it (it
shrinks in a finer input dtype, or it is drawn afresh when the inputs move by a few 16-bit ulps).
Gradient failures have their own models (``grad_causes``, which builds on this module).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gdn_verify.core import gating, reference
from gdn_verify.core import tolerance as tol
from gdn_verify.core.conventions import l2norm
from gdn_verify.core.implementation import Implementation, Result
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Measurement
from gdn_verify.core.verdict import as64, output_contract_violations, sequence_part
from gdn_verify.implementations import numpy_impl, planted, precision

# A model explains a failure when the error left against it is at most REPRODUCES of the
# error against the oracle (on every metric that failed), or at most WITHIN_REPRODUCES while
# the implementation is within the tolerance of the model. An unrelated model leaves the error
# as it is (about 1: a model that equals the oracle on this problem) or adds its own (about
# sqrt(2) for an independent error of the same size), so these are far from chance.
REPRODUCES = 0.25
WITHIN_REPRODUCES = 0.5
# A failure confined to a few (sequence, value head) blocks: the fewest blocks holding this share
# of the squared error are the failing ones (see localized()).
LOCALIZED_SHARE = 0.9
# Failing that, a model whose own error correlates with the implementation's (see pattern()).
CORRELATION = 0.5
SIZE = 2.0
MAX_TOKENS = 1 << 14  # larger minimal problems (long fuzz campaigns on a GPU) are not explained
# A candidate model must also agree with the implementation on FRESH other examples of the failing
# shape class (every other one FRESH_EXTRA tokens longer per sequence) and on the failing examples
# seen before shrinking; where the implementation passes, the model must stay within CONTRADICTS
# times the bound of it (a logic mistake errs by far more; a rounding model by about the bound).
FRESH = 4
FRESH_EXTRA = 23
CONTRADICTS = 4.0
# An unexplained failure beyond PRECISION_SLACK times a bfloat16-everything tolerance is a logic error;
# within it, a precision loss only when it scales with the input precision (a finer dtype's error at
# most REPRODUCES of it) or is drawn afresh by moving every input by DITHER of itself (its correlation
# with the new error at most REDRAWN: half its energy new). See classify().
PRECISION_SLACK = 3.0
DITHER = 2.0**-6  # four bfloat16 ulps at 1 (2^-8 unit roundoff): every 16-bit rounding lands elsewhere
REDRAWN = 0.5
FINER = {"bfloat16": "float32", "float16": "float32", "float32": "float64"}
LOGIC, PRECISION = "logic error", "precision loss"
# Named from the rows alone (no model reproduces garbage): see _empty_state_wrong.
EMPTY_STATE_CAUSE = "an empty sequence's final state not written (it is its initial state)"
UNWRITTEN = 2.0**-6  # relative RMS past a 16-bit rounding (2^-9) of the start state: not a copy of it


@dataclass(frozen=True)
class ErrorModel:
    """One known mistake or precision loss as a runnable model.

    ``run(**kwargs)`` takes the native call's keyword arguments (NumPy, FLA's convention) and
    returns ``(o [B, T, HV, V] in v's dtype, final_state float32 | None)``. ``cause`` is what a
    failure line names, ``experiment`` what was run. ``options``: the model takes FLA's in-kernel
    gate options (it models a mistake in them); the others run on the native gates.
    """

    name: str
    cause: str
    experiment: str
    run: Callable[..., tuple]
    options: bool = False
    kind: str = LOGIC  # or PRECISION: a forbidden rounding (or TF32)
    # Named only where it reproduces the outputs pointwise: a mistake that does not depend on the
    # algorithm around it (a rounding of the inputs, a decay read another way) reproduces that way,
    # so a mere likeness of pattern (a partial rounding of k alone; a state that forgets at once
    # against one that forgets fast) is no evidence for it.
    pointwise: bool = False
    # How closely it must reproduce a failure pointwise (verdict): a model whose likeness to another
    # mistake is loose (a decay that forgets fast looks like no memory at all) asks for more.
    reproduces: float = REPRODUCES


def _loop(bug: str) -> Callable[..., tuple]:
    return lambda **kw: planted.token_loop(bug, **kw)


def _chunk_loop(bug: str, chunk_size: int) -> Callable[..., tuple]:
    return lambda **kw: planted.chunk_loop(bug, chunk_size, **kw)


def _float32(**changes) -> Callable[..., tuple]:
    """The correct float32 chunked implementation with some arguments replaced (a value, or a
    function of the call's keyword arguments)."""

    def run(**kw):
        new = {name: (value(kw) if callable(value) else value) for name, value in changes.items()}
        return numpy_impl.chunk_gated_delta_rule(**{**kw, **new})

    return run


def _fla(chunk_size: int, tf32: bool = False) -> Callable[..., tuple]:
    def run(**kw):
        return numpy_impl.chunk_fla_gated_delta_rule(**kw, chunk_size=chunk_size, tf32=tf32)

    return run


def _tf32_inputs(**kw):
    """The float64 oracle on q, k (l2-normalised first when asked) and v cut to TF32."""
    q, k = (np.asarray(kw[name], np.float32) for name in ("q", "k"))
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    rounded = {
        "q": numpy_impl.truncate_to_tf32(q),
        "k": numpy_impl.truncate_to_tf32(k),
        "v": numpy_impl.truncate_to_tf32(np.asarray(kw["v"], np.float32)),
    }
    o, state = reference.recurrent_gated_delta_rule(**{**kw, **rounded, "use_qk_l2norm_in_kernel": False})
    final_state = None if state is None else np.asarray(state, np.float32)
    return np.asarray(o).astype(np.asarray(kw["v"]).dtype), final_state


def _inputs_read_as_bf16(**kw):
    """The float64 oracle on q, k and v as read through bfloat16 (each rounded to its 8-bit
    significand, l2norm after, as a kernel reading the tensors as bfloat16 does); out in v's dtype."""
    read = {n: np.asarray(kw[n]).astype(DTYPES["bfloat16"]).astype(np.float32) for n in ("q", "k", "v")}
    o, state = reference.recurrent_gated_delta_rule(**{**kw, **read})
    final_state = None if state is None else np.asarray(state, np.float32)
    return np.asarray(o).astype(np.asarray(kw["v"]).dtype), final_state


def _bug(name: str) -> Callable[..., tuple]:
    return planted.BUGS[name][1]


def _per_row(run: Callable[..., tuple]) -> Callable[..., tuple]:
    """A model written per varlen sequence, applied to batched rows too (each row a sequence):
    a mistake in per-sequence bookkeeping makes no difference between the two layouts."""

    def model(**kw):
        if kw.get("cu_seqlens") is not None:
            return run(**kw)
        B, T = np.shape(kw["q"])[:2]
        flat = {
            name: np.asarray(kw[name]).reshape((1, B * T) + np.shape(kw[name])[2:]) for name in "q k v g beta".split()
        }
        o, state = run(**{**kw, **flat, "cu_seqlens": np.arange(B + 1, dtype=np.int64) * T})
        return np.asarray(o).reshape((B, T) + np.shape(o)[2:]), state

    return model


def _other_layout(read: bool) -> Callable[..., tuple]:
    """The final state handed back v-first ``[.., V, K]`` where k-first is asked for, and with
    ``read`` the initial state read as v-first memory too (``planted.state_other_layout``). With
    K != V the returned shape itself names the mistake (:func:`_layout_cause`), and a v-first call
    that gets a k-first state is ``state_layout_ignored``: the model runs on neither."""

    def run(**kw):
        if kw.get("state_v_first") or np.shape(kw["q"])[-1] != np.shape(kw["v"])[-1]:
            raise NotImplementedError("a k-first call with K = V")
        h0 = kw.get("initial_state")
        if read and h0 is not None:
            h0 = np.ascontiguousarray(np.swapaxes(h0, -1, -2))  # K = V: the v-first reading is the transpose
        o, state = numpy_impl.chunk_gated_delta_rule(**{**kw, "initial_state": h0})
        return o, None if state is None else np.ascontiguousarray(state.swapaxes(-1, -2))

    return run


def _scale_twice(kw: dict) -> float:
    scale = np.shape(kw["q"])[-1] ** -0.5 if kw.get("scale") is None else kw["scale"]
    return float(scale) ** 2


def _precision(name: str) -> Callable[..., tuple]:
    return precision.BY_NAME[name].run


MODELS: tuple[ErrorModel, ...] = (
    # Precision losses: TF32 and the forbidden roundings of the precision contract.
    ErrorModel(
        "tf32_products",
        "TF32 matrix products",
        "the FLA-style chunked algorithm with the operands of every matrix product rounded to TF32",
        _fla(64, tf32=True),
        kind=PRECISION,
    ),
    ErrorModel(
        "tf32_inputs",
        "TF32 matrix products",
        "the oracle's algorithm with q, k and v rounded to TF32",
        _tf32_inputs,
        kind=PRECISION,
    ),
    ErrorModel(
        "inputs_bf16",
        "q, k and v read as bfloat16",
        "the oracle's algorithm with q, k and v rounded to bfloat16 (float16 inputs down a bfloat16 path)",
        _inputs_read_as_bf16,
        kind=PRECISION,
        pointwise=True,
    ),
    ErrorModel(
        "bf16_state",
        "a bfloat16 state",
        "a float32 token loop rounding its state to bfloat16 every token",
        _loop("bf16_state"),
        kind=PRECISION,
    ),
    ErrorModel(
        "fp16_state",
        "a float16 state",
        "a float32 token loop rounding its state to float16 every token",
        _loop("fp16_state"),
        kind=PRECISION,
    ),
    ErrorModel(
        "state16",
        "a carried state rounded to 16 bits",
        "a float32 token loop rounding its state to 16 bits (the input dtype, or bfloat16) every token",
        _loop("state16"),
        kind=PRECISION,
    ),
    ErrorModel(
        "state16_chunk",
        "a carried state rounded to 16 bits at every chunk boundary",
        "FLA's chunked algorithm (C=64) rounding its carried state to 16 bits after each chunk",
        _precision("state16_chunk"),
        kind=PRECISION,
    ),
    ErrorModel(
        "decay16",
        "the decay factor exp(g) rounded to 16 bits",
        "a float32 token loop rounding exp(g) to 16 bits before it multiplies the state",
        _loop("decay16"),
        kind=PRECISION,
    ),
    ErrorModel(
        "beta16",
        "beta rounded to 16 bits inside the update",
        "a float32 token loop rounding beta to 16 bits",
        _loop("beta16"),
        kind=PRECISION,
    ),
    ErrorModel(
        "cumsum_float32",
        "float32 chunk-local gate cumsum cancellation",
        "the FLA-style chunked algorithm (C=64) with its gate cumsum in float32",
        _fla(64),
        kind=PRECISION,
    ),
    ErrorModel(
        "cumsum16",
        "a gate cumsum in 16 bits",
        "the FLA-style chunked algorithm (C=64) with its gate cumsum in 16 bits",
        _precision("cumsum16"),
        kind=PRECISION,
    ),
    # The same in bfloat16 whatever the inputs: with float16 inputs cumsum16 rounds to float16,
    # whose finer digits do not reproduce a bfloat16 cumsum (no cause was named there before).
    ErrorModel(
        "cumsum_bf16",
        "a gate cumsum in bfloat16",
        "the FLA-style chunked algorithm (C=64) with its gate cumsum in bfloat16",
        _bug("gate_cumsum_bf16"),
        kind=PRECISION,
    ),
    # Gate and beta conventions.
    ErrorModel(
        "gate_without_exp",
        "g used as a linear decay (missing exp)",
        "decay g instead of exp(g)",
        _bug("gate_without_exp"),
    ),
    ErrorModel(
        "alpha_as_g", "exp applied to a linear decay (alpha used as g)", "decay exp(exp(g))", _loop("alpha_as_g")
    ),
    ErrorModel(
        "decay_as_log_rate",
        "a linear decay read as a log-space rate (the state times exp(-alpha), alpha = exp(g))",
        "decay exp(-exp(g))",
        _float32(g=lambda kw: -np.exp(np.asarray(kw["g"], np.float64)).astype(np.float32)),
        pointwise=True,
        reproduces=0.02,
    ),
    ErrorModel(
        "log_of_log_gate",
        "log-space g given to a kernel that takes a linear decay (log(alpha) of a log)",
        "decay exp(log(g + 1e-10))",
        _loop("log_of_log_gate"),
    ),
    ErrorModel(
        "gate_ignored", "the gate ignored (no decay: g taken as 0)", "g = 0 on every token", _loop("gate_ignored")
    ),
    ErrorModel(
        "gate_sign_flipped",
        "the gate's sign flipped (decay exp(-g): the state grows)",
        "decay exp(-g) instead of exp(g)",
        _float32(g=lambda kw: -np.asarray(kw["g"], np.float32)),
    ),
    ErrorModel("beta_twice", "beta applied twice", "beta^2 in place of beta", _bug("beta_twice")),
    ErrorModel(
        "beta_ignored",
        "beta not applied",
        "beta = 1 on every token",
        _float32(beta=lambda kw: np.ones_like(kw["beta"])),
    ),
    # The delta rule's update.
    ErrorModel(
        "delta_without_erase",
        "the delta rule's erase term missing (S += beta k v^T: gated linear attention)",
        "the update S + beta k v^T without -beta k k^T S",
        _loop("delta_without_erase"),
    ),
    ErrorModel(
        "beta_on_write_only",
        "beta applied to the write but not to the erase (S += k (beta v - S^T k))",
        "u = beta v - S^T k instead of beta (v - S^T k)",
        _loop("beta_on_write_only"),
    ),
    ErrorModel(
        "qk_swapped",
        "q and k swapped (the state written with q, read with k)",
        "q and k exchanged",
        _float32(q=lambda kw: kw["k"], k=lambda kw: kw["q"]),
    ),
    ErrorModel(
        "decay_after_update",
        "the decay applied after the update",
        "S decayed after the delta update",
        _bug("decay_after_update"),
    ),
    ErrorModel(
        "output_before_update",
        "o_t read before token t's update",
        "o_t from the decayed state before the update",
        _bug("output_before_update"),
    ),
    # Defaults and options.
    ErrorModel(
        "scale_ignored", "the scale argument ignored", "scale = K^-0.5 whatever is passed", _bug("scale_ignored")
    ),
    ErrorModel(
        "scale_default_one",
        "the scale default (None means K^-0.5) not applied",
        "scale = 1 when None is passed",
        _float32(scale=lambda kw: 1.0 if kw.get("scale") is None else kw["scale"]),
    ),
    ErrorModel(
        "scale_not_applied",
        "the scale not applied (o = S^T q without the scale)",
        "scale = 1 whatever is passed",
        _float32(scale=1.0),
    ),
    ErrorModel(
        "scale_twice", "the scale applied twice (scale^2)", "scale^2 in place of scale", _float32(scale=_scale_twice)
    ),
    ErrorModel(
        "scale_from_value_dim",
        "the scale default taken from the value size (V^-0.5 instead of K^-0.5)",
        "scale = V^-0.5 when None is passed",
        _bug("scale_from_value_dim"),
    ),
    ErrorModel(
        "initial_state_ignored", "the initial state ignored", "initial_state = None", _float32(initial_state=None)
    ),
    ErrorModel(
        "empty_sequence_state_zeroed",
        "a sequence of length 0 returning a zero final state instead of its initial state",
        "the final state of every empty sequence zeroed",
        _bug("empty_sequence_state_zeroed"),
    ),
    ErrorModel(
        "empty_sequence_shifts_outputs",
        "an empty sequence in cu_seqlens corrupting the sequences after it",
        "the outputs of the last sequences (one for each empty sequence before them) left unwritten, as when "
        "the sequences are numbered over the non-empty ones",
        _bug("empty_sequence_shifts_outputs"),
    ),
    ErrorModel(
        "l2norm_without_eps",
        "the l2norm epsilon missing (x / max(||x||, 1e-12) instead of x / sqrt(||x||^2 + 1e-6))",
        "q and k normalised like torch's F.normalize",
        _precision("l2norm_no_eps"),
    ),
    ErrorModel(
        "l2norm_eps_outside_sqrt",
        "the l2norm epsilon outside the square root (x / (||x|| + 1e-6))",
        "q and k normalised as x / (||x|| + 1e-6)",
        _bug("l2norm_eps_outside_sqrt"),
    ),
    ErrorModel(
        "l2norm_as_rmsnorm",
        "the l2norm computed as an RMS norm (mean of squares: ||q||, ||k|| = sqrt(K))",
        "q and k normalised as x / sqrt(mean(x^2) + 1e-6)",
        _bug("l2norm_as_rmsnorm"),
    ),
    ErrorModel(
        "qk_l2norm_ignored",
        "use_qk_l2norm_in_kernel ignored (q and k used unnormalised)",
        "use_qk_l2norm_in_kernel=False",
        _float32(use_qk_l2norm_in_kernel=False),
    ),
    ErrorModel(
        "nan_on_zero_rows",
        "l2norm without epsilon on all-zero rows",
        "x / ||x|| (NaN on zero rows)",
        _bug("nan_on_zero_rows"),
    ),
    ErrorModel(
        "state_layout_ignored",
        "state_v_first ignored",
        "the state read and written k-first",
        _bug("state_layout_ignored"),
    ),
    # A kernel of the other layout (vLLM's recurrent kernels kept the state k-first in older releases
    # and v-first in later ones). Without an initial state the two coincide and are named together.
    ErrorModel(
        "final_state_transposed",
        "state returned in the other layout ([.., V, K] instead of [.., K, V])",
        "the final state transposed",
        _other_layout(read=False),
    ),
    ErrorModel(
        "state_transposed",
        "state returned in the other layout ([.., V, K] instead of [.., K, V]), the initial state read in it too",
        "the initial state read transposed and the final state returned transposed",
        _other_layout(read=True),
    ),
    ErrorModel(
        "gate_bias_ignored",
        "dt_bias dropped from the in-kernel gate",
        "-exp(A_log) softplus(g)",
        _bug("gate_bias_ignored"),
        options=True,
    ),
    ErrorModel(
        "neg_eigval_ignored",
        "allow_neg_eigval ignored",
        "beta = sigmoid(b) instead of 2 sigmoid(b)",
        _bug("neg_eigval_ignored"),
        options=True,
    ),
    # Varlen, final state, head mapping and tiling.
    ErrorModel(
        "state_across_sequences",
        "varlen boundary: the state carried into the next sequence",
        "each sequence starting from the previous one's final state",
        _bug("state_across_sequences"),
    ),
    *(
        ErrorModel(
            f"ragged_chunk_reads_next_c{C}",
            f"varlen boundary: a ragged last chunk (C={C}) reading the next sequence's tokens",
            f"each sequence's state run on to the next multiple of {C} tokens",
            lambda C=C, **kw: planted.ragged_chunk_reads_next(C, **kw),
        )
        for C in (16, 64)
    ),
    ErrorModel(
        "off_by_one_final_state",
        "the final state missing the last token",
        "the state before each sequence's last token",
        _per_row(_bug("off_by_one_final_state")),
    ),
    ErrorModel(
        "wrong_gva_mapping",
        "head mapping: value head h reading q/k head h % H instead of h // (HV // H)",
        "q/k head h % H",
        _bug("wrong_gva_mapping"),
    ),
    ErrorModel(
        "key_dim_tail_truncated",
        "key dims past the last full 32-wide tile dropped",
        "only the first 32 * (K // 32) key dims used",
        _bug("key_dim_tail_truncated"),
    ),
    # Chunked-form mistakes.
    *(
        model
        for C in (16, 64)
        for model in (
            ErrorModel(
                f"chunk_state_without_decay_c{C}",
                f"state passing without the chunk's total decay (C={C})",
                f"a chunked loop (C={C}) omitting exp(G_last) on the carried state",
                _chunk_loop("chunk_state_without_decay", C),
            ),
            ErrorModel(
                f"intra_chunk_excludes_diagonal_c{C}",
                f"the intra-chunk causal mask dropping the current token (C={C})",
                f"a chunked loop (C={C}) with a strictly lower intra-chunk mask",
                _chunk_loop("intra_chunk_excludes_diagonal", C),
            ),
            ErrorModel(
                f"ragged_gate_from_padding_c{C}",
                f"a ragged last chunk (C={C}) taking its total gate from zero-staged padding (G_last = 0)",
                f"a chunked loop (C={C}) with G_last = 0 in each sequence's ragged last chunk",
                _chunk_loop("ragged_gate_from_padding", C),
            ),
            ErrorModel(
                f"wy_decay_on_u_c{C}",
                f"the WY form applying exp(G) to U as well as W (C={C})",
                f"a chunked loop (C={C}) with U = T (beta exp(G) v)",
                _chunk_loop("wy_decay_on_u", C),
            ),
            ErrorModel(
                f"safe_exp_as_causal_mask_c{C}",
                f"exp(where(d <= 0, d, -inf)) as the only causal mask: with g = 0 future tokens leak in (C={C})",
                f"a chunked loop (C={C}) without the triangular mask",
                _chunk_loop("safe_exp_as_causal_mask", C),
            ),
        )
    ),
    ErrorModel(
        "gamma_ratio_of_exps",
        "gate ratios as exp(G_i) / exp(G_j) (0/0 once exp(G) underflows)",
        "a chunked loop (C=16) dividing exponentials",
        _chunk_loop("gamma_ratio_of_exps", 16),
    ),
)


@dataclass(frozen=True)
class Probe:
    """One call of the implementation: ``problem`` with ``options``, judged against the oracle on
    ``native`` (the same problem with the gates the options define)."""

    problem: Problem
    options: dict
    native: Problem


def make_probe(problem: Problem, options: dict) -> Probe:
    """The call of ``problem`` with FLA's in-kernel gate ``options`` (none: the native gates)."""
    if not options:
        return Probe(problem, options, problem)
    g, beta = gating.in_kernel_gates(problem.g, problem.beta, **options)
    return Probe(problem, options, problem.replace(g=g, beta=beta))


def probes(problem: Problem, params: dict, prop: str) -> list[Probe]:
    """The calls that can show a failure of ``prop`` on ``problem`` as a plain difference from the oracle.

    The problem itself; for a split (``state_continuation``) the second part started from the
    oracle's state at the split (no tokens where the split is at the end: the property's empty
    continuation call); for ``state_layout`` the v-first layout.
    """
    out = [make_probe(problem, gating.options_from_params(params))]
    T = problem.q.shape[1]
    if "split" in params and 0 < min(params["split"], T):
        t = min(params["split"], T)
        state = np.asarray(numpy_oracle(problem.tokens(0, t))[1], np.float32)
        second = problem.tokens(t, T, state)
        out.append(Probe(second, {}, second))
    if prop == "state_layout" and problem.initial_state is not None and not problem.state_v_first:
        v_first = problem.replace(
            state_v_first=True, initial_state=np.ascontiguousarray(problem.initial_state.swapaxes(-1, -2))
        )
        out.append(Probe(v_first, {}, v_first))
    return out


def _k_first(state, problem: Problem):
    state = as64(state)
    return None if state is None else (state.swapaxes(-1, -2) if problem.state_v_first else state)


def _errors(o, state, ref: tuple, problem: Problem, scales: tol.Scales | None) -> tol.Errors:
    ref_state = _k_first(ref[1], problem) if problem.output_final_state else None
    return tol.measure(o, None if ref_state is None else _k_first(state, problem), ref[0], ref_state, problem, scales)


def _nonfinite(o, state) -> tuple[np.ndarray, np.ndarray]:
    masks = []
    for x in (o, state):
        masks.append(np.zeros(0, bool) if x is None else ~np.isfinite(np.asarray(x, np.float64)).ravel())
    return masks[0], masks[1]


@dataclass(frozen=True)
class Finding:
    """A model that explains a failure, with the evidence on ``metric`` (the worst-failing one).

    Pointwise (``correlation`` None): the implementation's error against the model and against
    the oracle, and their worst ratio over the failing metrics (``reproduction``). By pattern:
    the model's own error against the oracle (``against_model`` holds it), its ``correlation``
    with the implementation's error and its size relative to it (``reproduction`` holds it).
    Non-finite (``nonfinite`` > 0): the same elements are NaN or Inf.
    """

    model: ErrorModel
    metric: str
    against_model: float
    against_oracle: float
    reproduction: float
    correlation: float | None = None
    nonfinite: int = 0
    alike: tuple[ErrorModel, ...] = ()  # other models that reproduce this example as well
    where: str = ""  # localized: the (sequence, value head) blocks it reproduces; the rest match the oracle

    def text(self) -> str:
        m = self.model
        what = self.metric.replace("_", " ")
        if self.nonfinite:
            return f"{m.cause} ({m.experiment} gives non-finite values at the same {self.nonfinite} elements)"
        if self.correlation is not None:
            return (
                f"{m.cause} ({m.experiment} makes an error of the same size ({self.reproduction:.3g}x) and pattern "
                f"(correlation {self.correlation:.3g}): {what} error {self.against_model:.3g} for it, "
                f"{self.against_oracle:.3g} for the implementation, against the exact oracle)"
            )
        how = "exactly" if self.reproduction == 0 else f"to {100 * self.reproduction:.3g}%"
        if self.where:
            return (
                f"{m.cause}, in {self.where} only ({m.experiment} reproduces the outputs there {how}: {what} error "
                f"{self.against_model:.3g} against it, {self.against_oracle:.3g} against the exact oracle; "
                "the other blocks match the oracle)"
            )
        others = dict.fromkeys(a.cause for a in self.alike if a.cause != m.cause)
        alike = f"; on this example indistinguishable from: {'; '.join(others)}" if others else ""
        return (
            f"{m.cause} ({m.experiment} reproduces the outputs {how}: {what} error "
            f"{self.against_model:.3g} against it, {self.against_oracle:.3g} against the exact oracle){alike}"
        )


def verdict(
    against_model: tol.Errors, against_oracle: tol.Errors, bound: tol.Tolerance, reproduces: float = REPRODUCES
) -> float | None:
    """The reproduction ratio when a model reproduces a failure pointwise, else None.

    ``against_model``, ``against_oracle``: the implementation's errors against the model's and the
    oracle's outputs; ``bound``: the tolerance of the problem. Explained: on every metric over
    its bound against the oracle, the error against the model is at most ``reproduces`` of it, or
    at most ``WITHIN_REPRODUCES`` of it with every metric within the bound against the model.
    """
    failing = [name for name in tol.METRICS if getattr(against_oracle, name) > getattr(bound, name)]
    values = [getattr(against_model, name) for name in tol.METRICS]
    if not failing or not all(np.isfinite(values)):
        return None
    ratio = max(getattr(against_model, name) / getattr(against_oracle, name) for name in failing)
    within = all(v <= getattr(bound, name) for v, name in zip(values, tol.METRICS))
    return ratio if ratio <= reproduces or (within and ratio <= min(reproduces, WITHIN_REPRODUCES)) else None


def pattern(impl_error: np.ndarray, model_error: np.ndarray) -> tuple[float, float] | None:
    """``(correlation, size ratio)`` when a model's error matches the implementation's in pattern, else None.

    ``impl_error``, ``model_error``: float64 vectors, the implementation's and the model's outputs
    minus the oracle's. A rounding model cannot reproduce another algorithm's roundings pointwise
    (a different summation order), but the roundings they share (inputs, products of the same
    operands) make the errors correlated: TF32 products at another chunk size correlate 0.6 to
    0.9 with the model, unrelated errors about ``1/sqrt(n)``. Matched: correlation at least
    ``CORRELATION`` and ``4/sqrt(n)`` (four standard deviations of chance), size within a factor
    ``SIZE`` either way.
    """
    n = impl_error.size
    a, b = float(np.linalg.norm(impl_error)), float(np.linalg.norm(model_error))
    if n == 0 or a == 0 or b == 0:
        return None
    rho = float(impl_error @ model_error) / (a * b)
    size = b / a
    if rho >= max(CORRELATION, 4 / np.sqrt(n)) and 1 / SIZE <= size <= SIZE:
        return rho, size
    return None


def _blocks(x: np.ndarray, problem: Problem, on_state: bool) -> list[tuple[str, np.ndarray]]:
    """``x`` (an output ``[B, T, HV, V]`` or a k-first state ``[N, HV, K, V]``) cut into one flat
    block per (sequence, value head), each named as a failure line says it."""
    x = np.asarray(x, np.float64)
    N, HV = problem.num_sequences, x.shape[-3 if on_state else -2]
    if on_state:
        return [(f"sequence {n} value head {h}", x[n, h].ravel()) for n in range(N) for h in range(HV)]
    flat, b = x.reshape((-1,) + x.shape[2:]), problem.bounds
    return [(f"sequence {n} value head {h}", flat[b[n] : b[n + 1], h].ravel()) for n in range(N) for h in range(HV)]


def localized(impl_error: list[np.ndarray], model_error: list[np.ndarray]) -> tuple[list[int], float] | None:
    """``(blocks, reproduction)`` when a model reproduces the implementation in the blocks that fail.

    ``impl_error``, ``model_error``: per block, the implementation's outputs minus the oracle's and
    minus the model's. The failing blocks are the fewest that hold ``LOCALIZED_SHARE`` of the
    implementation's squared error; the model reproduces them when the error left against it there
    is at most ``REPRODUCES`` of the error against the oracle. A mistake confined to one head or
    one sequence (a kernel that carries the state across a boundary for one head only) is
    reproduced there by the model of that mistake, while the whole-output verdict sees the heads
    the implementation got right as the model's own error.
    """
    energy = np.array([float(e @ e) for e in impl_error])
    total = energy.sum()
    if not total > 0:
        return None
    order = np.argsort(-energy)
    count = int(np.searchsorted(np.cumsum(energy[order]), LOCALIZED_SHARE * total)) + 1
    if count >= len(energy):
        return None  # the failure is everywhere: the whole-output verdict's case
    chosen = sorted(int(i) for i in order[:count])
    left = sum(float(model_error[i] @ model_error[i]) for i in chosen)
    ratio = float(np.sqrt(left / energy[chosen].sum()))
    return (chosen, ratio) if ratio <= REPRODUCES else None


def _run_model(model: ErrorModel, probe: Probe) -> tuple | None:
    if model.options != bool(probe.options) and model.options:
        return None  # an option mistake only shows where the options are used
    source = probe.problem if model.options else probe.native
    kw = {**source.kwargs(), **(probe.options if model.options else {})}
    try:
        with np.errstate(all="ignore"):
            return model.run(**kw)
    except Exception:  # noqa: BLE001 - a model that cannot run this problem explains nothing
        return None


@dataclass(frozen=True)
class Observation:
    """The implementation on one probe, against the oracle: what every model is compared with."""

    probe: Probe
    result: Result
    ref: tuple
    bound: tol.Tolerance
    against_oracle: tol.Errors | None  # None when the implementation returned NaN/Inf
    nonfinite: tuple[np.ndarray, np.ndarray]

    @property
    def failing(self) -> bool:
        return self.against_oracle is None or bool(self.bound.violations(self.against_oracle))


def observe(impl: Implementation, probe: Probe) -> Observation | None:
    """Run ``impl`` on ``probe`` and measure it against the oracle (None: the call raised)."""
    ref, bound = _reference(probe.native)
    try:
        with np.errstate(all="ignore"):
            result = impl.run(probe.problem, options=probe.options or None)
    except Exception:  # noqa: BLE001 - the failure itself is already recorded
        return None
    if output_contract_violations(result, probe.problem, shapes_only=True):
        return None  # wrong shapes: an output-contract failure, not a numeric one
    bad = _nonfinite(result.o, result.final_state if probe.problem.output_final_state else None)
    against = (
        None if bad[0].any() or bad[1].any() else _errors(result.o, result.final_state, ref, probe.native, bound.scales)
    )
    return Observation(probe, result, ref, bound, against, bad)


def judge(model: ErrorModel, obs: Observation) -> Finding | None:
    """How ``model`` explains a failing observation (pointwise, in some blocks, by pattern, or the
    same non-finite elements), or None."""
    out = _run_model(model, obs.probe)
    if out is None:
        return None
    native, result = obs.probe.native, obs.result
    if obs.against_oracle is None:
        mo, ms = _nonfinite(out[0], out[1] if obs.probe.problem.output_final_state else None)
        if np.array_equal(mo, obs.nonfinite[0]) and np.array_equal(ms, obs.nonfinite[1]):
            n = int(obs.nonfinite[0].sum() + obs.nonfinite[1].sum())
            return Finding(model, "output_rms", float("nan"), float("nan"), 0.0, nonfinite=n)
        return None
    if not all(x is None or np.all(np.isfinite(np.asarray(x, np.float64))) for x in out):
        return None
    against_oracle, bound = obs.against_oracle, obs.bound
    ratios = [getattr(against_oracle, n) / getattr(bound, n) if getattr(bound, n) else np.inf for n in tol.METRICS]
    metric = tol.METRICS[int(np.argmax(ratios))]
    against_model = _errors(result.o, result.final_state, (as64(out[0]), out[1]), native, bound.scales)
    ratio = verdict(against_model, against_oracle, bound, model.reproduces)
    if ratio is not None:
        return Finding(model, metric, getattr(against_model, metric), getattr(against_oracle, metric), ratio)
    on_state = metric == "state"  # what the worst-failing metric compares: the outputs or the final state
    if on_state and out[1] is None:
        return None

    def compared(o, state) -> np.ndarray:
        return np.asarray(_k_first(state, native) if on_state else as64(o), np.float64)

    exact, ours, theirs = compared(*obs.ref), compared(result.o, result.final_state), compared(out[0], out[1])
    impl_blocks = _blocks(ours - exact, native, on_state)
    found = localized([e for _, e in impl_blocks], [e for _, e in _blocks(ours - theirs, native, on_state)])
    if found is not None:
        chosen, ratio = found
        names = ", ".join(impl_blocks[i][0] for i in chosen)
        scale = float(np.linalg.norm(exact)) or 1.0  # block errors relative to the whole reference
        there = float(np.sqrt(sum(float(impl_blocks[i][1] @ impl_blocks[i][1]) for i in chosen))) / scale
        return Finding(model, metric, ratio * there, there, ratio, where=names)
    matched = None if model.pointwise else pattern((ours - exact).ravel(), (theirs - exact).ravel())
    if matched is None:
        return None
    own = getattr(_errors(out[0], out[1], obs.ref, native, bound.scales), metric)
    return Finding(model, metric, own, getattr(against_oracle, metric), matched[1], correlation=matched[0])


def consistent(model: ErrorModel, obs: Observation) -> bool:
    """Whether ``model`` agrees with the implementation on another example: it explains the failure
    there, or (where the implementation passes) it predicts no clear failure either."""
    if obs.failing:
        return judge(model, obs) is not None
    out = _run_model(model, obs.probe)
    if out is None or not all(x is None or np.all(np.isfinite(np.asarray(x, np.float64))) for x in out):
        return False
    against_model = _errors(
        obs.result.o, obs.result.final_state, (as64(out[0]), out[1]), obs.probe.native, obs.bound.scales
    )
    return not obs.bound.scaled(CONTRADICTS).violations(against_model)


def _best(findings: list[Finding]) -> Finding | None:
    """Pointwise reproductions first (models that coincide named together), then block-wise, then by pattern.

    None when the best pointwise reproductions (within 1%) mix a logic error and a precision loss:
    the evidence cannot tell a mistake from a rounding, and naming either by list order could be
    wrong, which is worse than naming none.
    """
    pointwise = [f for f in findings if f.correlation is None and not f.where]
    if pointwise:
        best = min(pointwise, key=lambda f: f.reproduction)
        tied = [f for f in pointwise if f.reproduction <= 1.01 * best.reproduction]
        # E.g. a float32 state that underflows where the float64 oracle's does not: every float32
        # model, mistake or rounding, reproduces that "failure" exactly.
        if len({f.model.kind for f in tied}) > 1:
            return None
        # Mistakes that coincide on this example (dropping the intra-chunk diagonal is reading
        # the state before the update when T = 1) are named together, not picked by list order.
        return dataclasses.replace(best, alike=tuple(f.model for f in tied if f is not best))
    local = [f for f in findings if f.where]
    if local:
        return min(local, key=lambda f: f.reproduction)
    by_pattern = [f for f in findings if f.correlation is not None]
    return max(by_pattern, key=lambda f: f.correlation or 0.0) if by_pattern else None


def fresh_examples(problem: Problem, params: dict, count: int = FRESH, seed: int = 0) -> list[Problem]:
    """Other examples of the failing shape class: the same heads, sizes, dtype, flags, layout and
    scale, with new values, and every other one with each sequence ``FRESH_EXTRA`` tokens longer.

    Gates are mild or moderate, token by token (raw N(0, 2) inputs with in-kernel gate options),
    beta from [0.1, 0.9] (logits with the in-kernel sigmoid), keys unit rows (unless l2norm does
    it), a random initial state where there was one: none of the degenerate values (all-zero
    gates, T = 0) on which different mistakes coincide.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        extra = FRESH_EXTRA if i % 2 else 0
        lengths = problem.lengths + extra
        s = problem.shape
        if problem.cu_seqlens is not None:
            B, T, cu = 1, int(lengths.sum()), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        else:
            B, T, cu = s["B"], s["T"] + extra, None
        k = rng.standard_normal((B, T, s["H"], s["K"]))
        if not problem.use_qk_l2norm_in_kernel:
            k /= np.linalg.norm(k, axis=-1, keepdims=True)
        raw_gates = bool(gating.options_from_params(params))
        shape = (B, T, s["HV"])
        # Mild gates (decay near 1) mixed with moderate ones (-0.5 to -3): missing exp (decay = g)
        # and a lost state coincide on the first, not on the second.
        mixed = np.where(
            rng.uniform(size=shape) < 0.5, np.log(rng.uniform(0.9, 1.0, shape)), -rng.uniform(0.5, 3.0, shape)
        )
        g = rng.normal(0.0, 2.0, shape) if raw_gates else mixed
        beta = (
            rng.normal(0.0, 2.0, (B, T, s["HV"]))
            if params.get("beta_logits")
            else rng.uniform(0.1, 0.9, (B, T, s["HV"]))
        )
        state = None
        if problem.initial_state is not None:
            state = rng.standard_normal(problem.initial_state.shape).astype(np.float32)
        fresh = problem.replace(
            q=rng.standard_normal((B, T, s["H"], s["K"])),
            k=k,
            v=rng.standard_normal((B, T, s["HV"], s["V"])),
            g=g,
            beta=beta,
            initial_state=state,
            cu_seqlens=cu,
        )
        out.append(fresh.astype(problem.dtype))
    return out


@dataclass(frozen=True)
class Cause:
    """A named cause: ``text`` (the console's ``likely cause:`` line), the error model's ``model``
    name, ``kind`` ("logic error" or "precision loss") and how many failing examples it explains.
    ``kind`` alone (no model): the failure's class from its size (see :func:`classify`)."""

    text: str = ""
    model: str = ""
    kind: str = ""
    examples: int = 0
    alike: tuple[str, ...] = ()  # models that reproduce the example as exactly as ``model`` (named in ``text``)

    def __bool__(self) -> bool:
        return bool(self.text)


def classify(impl: Implementation, obs: Observation) -> str:
    """A failure no model explains: "precision loss" only with evidence that roundings made it,
    else "logic error" (see docs/causes.md, "The kind of an unexplained failure").

    1. NaN/Inf, or errors beyond ``PRECISION_SLACK`` times what a correct *bfloat16* kernel may
       make on this problem (the tolerance with the output and every allowed rounding at
       bfloat16's unit roundoff: the coarsest type a GDN kernel rounds to), is a logic error:
       no rounding to 16 bits or finer reaches it.
    2. Within that, size cannot tell (a float32 kernel rounding somewhere to bfloat16 errs by
       1e4 times its float32 bound, as does a kernel ignoring its mild gates). A rounding's error
       scales with the unit roundoff and is set by where each value falls between representable
       numbers; a mistake's error is a smooth function of the inputs. So it is a precision loss
       when the error shrinks to at most ``REPRODUCES`` of itself on the same values in a finer
       input dtype (:func:`finer_rerun`), or when it is drawn afresh by moving every input by a
       few 16-bit ulps (:func:`redrawn`); a logic error when it does neither.
    """
    if obs.against_oracle is None:
        return LOGIC
    u16 = tol.unit_roundoff("bfloat16")
    u_in = tol.unit_roundoff(obs.probe.native.dtype)
    budget = np.zeros(3)
    for name, values in obs.bound.terms:
        factor = 1.0
        if name == "output rounding" and values[0] > 0:
            factor = u16 / values[0]
        elif name in tol.ROUNDING_TEXT.values():
            factor = u16 / u_in
        budget += np.array(values) * max(factor, 1.0)
    errors = np.array([getattr(obs.against_oracle, m) for m in tol.METRICS])
    if np.any(errors > PRECISION_SLACK * budget):
        return LOGIC
    return PRECISION if finer_rerun(impl, obs) or redrawn(impl, obs) else LOGIC


def _worst_metric(obs: Observation) -> str:
    assert obs.against_oracle is not None
    ratios = [
        getattr(obs.against_oracle, n) / getattr(obs.bound, n) if getattr(obs.bound, n) else 0 for n in tol.METRICS
    ]
    return tol.METRICS[int(np.argmax(ratios))]


def _error_vector(obs: Observation, on_state: bool) -> np.ndarray:
    """The implementation minus the oracle on the outputs or the (k-first) final state, float64."""
    native = obs.probe.native
    if on_state:
        got, want = _k_first(obs.result.final_state, native), _k_first(obs.ref[1], native)
        assert got is not None and want is not None  # the state metric failed: both exist
        return (got - want).ravel()
    return (np.asarray(obs.result.o, np.float64) - np.asarray(obs.ref[0], np.float64)).ravel()


def finer_rerun(impl: Implementation, obs: Observation) -> bool:
    """Whether the failure scales with the input dtype's unit roundoff: the same values in the next
    finer dtype (16 bits: float32; float32: float64; exact conversions, so the oracle is the same)
    leave an error at most ``REPRODUCES`` of it on the worst metric. False where the implementation
    does not take that dtype (most GPU kernels refuse float64): no evidence."""
    finer = FINER.get(np.dtype(obs.probe.native.dtype).name)
    if finer is None:
        return False
    probe = obs.probe
    rerun = Probe(probe.problem.astype(DTYPES[finer]), probe.options, probe.native.astype(DTYPES[finer]))
    fine = observe(impl, rerun)
    if fine is None or fine.against_oracle is None:
        return False
    metric = _worst_metric(obs)
    return getattr(fine.against_oracle, metric) <= REPRODUCES * getattr(obs.against_oracle, metric)


def dithered(problem: Problem, seed: int = 0) -> Problem:
    """``problem`` with every input element moved by ``DITHER`` of itself, up or down at random, and
    rounded back to its dtype (an element that is 0 stays 0)."""
    rng = np.random.default_rng(seed)

    def nudge(x):
        if x is None:
            return None
        x64 = np.asarray(x, np.float64)
        return (x64 * (1.0 + DITHER * rng.choice((-1.0, 1.0), x64.shape))).astype(x.dtype)

    names = ("q", "k", "v", "g", "beta", "initial_state")
    return problem.replace(**{name: nudge(getattr(problem, name)) for name in names})


def redrawn(impl: Implementation, obs: Observation) -> bool:
    """Whether the failure's error is drawn afresh when every input moves by ``DITHER`` (four
    bfloat16 ulps, many float16 or float32 ones): every rounding to 16 bits or finer then lands
    elsewhere between representable numbers, while a mistake's error, a smooth function of the
    inputs, moves by about ``DITHER * kappa`` of itself. With ``e0``, ``e1`` the errors (outputs or
    final state, whichever failed worst) before and after: redrawn when ``e0 . e1`` is at most
    ``REDRAWN * (|e0|^2 + |e1|^2) / 2``, i.e. at least half of the error's energy is new."""
    probe = obs.probe
    moved = observe(impl, make_probe(dithered(probe.problem), probe.options))
    if moved is None or moved.against_oracle is None:
        return False
    on_state = _worst_metric(obs) == "state"
    e0, e1 = _error_vector(obs, on_state), _error_vector(moved, on_state)
    energy = 0.5 * (float(e0 @ e0) + float(e1 @ e1))
    return energy > 0 and float(e0 @ e1) <= REDRAWN * energy


def _reference(problem: Problem) -> tuple[tuple, tol.Tolerance]:
    ref = numpy_oracle(problem)
    return ref, tol.tolerance(problem, tol.condition(problem, ref))


def applies(message: str, measurement: Measurement | None, form: str = "native") -> bool:
    """Whether a failure is one the models can explain: a numeric (or non-finite) difference from
    the oracle in the native form, not an exact contract, a crash or a wrong output shape."""
    if form != "native" or message.startswith(("raised ", "output contract")):
        return False
    if measurement is None:
        return "non-finite" in message
    return measurement.bound > 0


def explain(
    impl: Implementation,
    problem: Problem,
    params: dict,
    prop: str,
    message: str,
    measurement: Measurement | None,
    form: str = "native",
    others: Sequence[tuple[Problem, dict]] = (),
) -> Cause:
    """The likely cause of a failure of ``prop`` on the minimal ``problem`` (an empty :class:`Cause`
    when none is identified; never raises: finding a cause must not cost the verdict).

    A model is a candidate when it explains the minimal example; it is named only when it is also
    consistent with every evidence example (``others``, the failing examples before shrinking with
    their own params, and :func:`fresh_examples`): it explains each failure there and predicts none
    where the implementation passes. So a degenerate minimal example (T = 0, all-zero gates), on
    which a missing ``exp`` and any lost state coincide, cannot pick a model that only coincides there.
    """
    contract = form == "native" and message.startswith("output contract")
    if form != "native" or message.startswith("raised ") or problem.lengths.sum() > MAX_TOKENS:
        return Cause()
    try:
        if contract:
            return _layout_cause(impl, problem, params, prop)
        with np.errstate(all="ignore"):  # models overflow by design (exp(exp(g)), a state without decay)
            cause = _explain(impl, problem, params, prop, others) if applies(message, measurement) else Cause()
            # an exact contract's failure too: the detector holds the rows to the oracle itself
            if cause.model:
                return cause
            return _unwritten_after_empty(impl, problem, params) or _empty_state_wrong(impl, problem, params) or cause
    except Exception:  # noqa: BLE001 - see the docstring
        return Cause()


def _run_rows(impl: Implementation, problem: Problem) -> tuple[Result, set[int]] | None:
    """The implementation's result on ``problem`` and the sequences whose outputs or final state
    miss the oracle, each held to the tolerance of its own call (NaN misses it); None when the call
    raises (it shows nothing about which rows are wrong)."""
    try:
        result = impl.run(problem)
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    wrong = set()
    for n in range(problem.num_sequences):
        alone, part = problem.sequence(n), sequence_part(result, problem, n)
        ref, bound = _reference(alone)
        if bound.violations(_errors(part.o, part.final_state, ref, alone, bound.scales)):
            wrong.add(n)
    return result, wrong


def _unwritten_after_empty(impl: Implementation, problem: Problem, params: dict) -> Cause:
    """A varlen failure in sequences after an empty one only, gone without the empty sequences:
    a kernel that mishandles a length-0 sequence in ``cu_seqlens`` (FLA <= 0.4.2's and vLLM's
    ``chunk_gated_delta_rule``, the release matrix of 2026-12-05), whose unwritten or misplaced
    rows (garbage or zeros) no pointwise model reproduces. When the wrong ones are exactly the last
    sequences, one for each empty sequence before them, the text says so: the outputs a kernel
    numbering the sequences over the non-empty ones leaves unwritten."""
    lengths = problem.lengths
    empty = np.flatnonzero(lengths == 0)
    if problem.cu_seqlens is None or gating.options_from_params(params) or not empty.size:
        return Cause()
    run = _run_rows(impl, problem)
    wrong = None if run is None else run[1]
    if not wrong or min(wrong) <= empty[0]:
        return Cause()
    keep = lengths > 0
    compact = problem.replace(
        cu_seqlens=np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64),
        initial_state=None if problem.initial_state is None else problem.initial_state[keep],
    )
    if (compact_run := _run_rows(impl, compact)) is None or compact_run[1]:
        return Cause()
    model = next(m for m in MODELS if m.name == "empty_sequence_shifts_outputs")
    M = int(keep.sum())
    last = {n for n in range(M, len(lengths)) if lengths[n] > 0}
    which = ", ".join(str(n) for n in sorted(wrong))
    many = len(wrong) > 1
    how = (
        f"the last {'ones' if many else 'one'}, one for each empty sequence before them: what a kernel "
        "numbering the sequences over the non-empty ones leaves unwritten"
        if wrong == last
        else f"{'each' if many else 'it'} after an empty one"
    )
    text = (
        f"{model.cause} (lengths {lengths.tolist()}: sequence{'s' if many else ''} {which} "
        f"{'miss' if many else 'misses'} the oracle, {how}; every other sequence matches it, and the same call "
        "without its empty sequences passes)"
    )
    return Cause(text, model.name, model.kind, 2)


def _empty_state_wrong(impl: Implementation, problem: Problem, params: dict) -> Cause:
    """A varlen failure in the final states of empty sequences only: a length-0 sequence's final
    state is its initial state (zeros without one), and a kernel that skips such a sequence without
    storing it hands back whatever its state buffer held (FlashInfer 0.7.2.post1's SM90 prefill:
    ``torch.empty``, H100, 2026-12-05). Garbage, so no pointwise model reproduces it (zeros where an
    initial state was given are ``empty_sequence_state_zeroed``'s, named before this runs)."""
    lengths = problem.lengths
    empty = {int(n) for n in np.flatnonzero(lengths == 0)}
    if not empty or problem.cu_seqlens is None or not problem.output_final_state or gating.options_from_params(params):
        return Cause()
    run = _run_rows(impl, problem)
    if run is None or not run[1] or not run[1] <= empty or not _far_from_start(run[0], problem, run[1]):
        return Cause()
    wrong = run[1]
    which = ", ".join(str(n) for n in sorted(wrong))
    many = len(wrong) > 1
    start = "its initial state" if problem.initial_state is not None else "zeros (no initial state was given)"
    text = (
        f"{EMPTY_STATE_CAUSE} (lengths {lengths.tolist()}: the final state of empty sequence{'s' if many else ''} "
        f"{which} {'miss' if many else 'misses'} {start}, and every other sequence matches the oracle: what a "
        "kernel that skips an empty sequence without storing its final state returns)"
    )
    return Cause(text, "empty_sequence_state_unwritten", LOGIC, 1)


def _far_from_start(result: Result, problem: Problem, sequences: set[int]) -> bool:
    """Whether the final states ``result`` gives ``sequences`` (empty ones) are no rounding of their
    start: not finite, nonzero without an initial state, or off the initial state by more than
    ``UNWRITTEN`` relative RMS (a 16-bit state's rounding is 2^-9; a kernel that stores its state in
    bfloat16 returns a rounded copy, which is written)."""
    for n in sequences:
        state, given = as64(sequence_part(result, problem, n).final_state), problem.sequence(n).initial_state
        if state is None:
            return False
        if not np.all(np.isfinite(state)):
            continue
        start = np.zeros_like(state) if given is None else np.asarray(given, np.float64)
        if np.sqrt(np.mean((state - start) ** 2)) <= UNWRITTEN * np.sqrt(np.mean(start**2)):
            return False
    return True


def _layout_cause(impl: Implementation, problem: Problem, params: dict, prop: str) -> Cause:
    """An output-contract failure explained by its shape alone: the final state returned in the
    other layout by one of the failing property's calls (:func:`probes`: ``state_layout`` also
    makes a v-first one). Where k-first ``(N, HV, K, V)`` was asked (the default), the state came
    back v-first: ``final_state_transposed``, a kernel of the other layout; where ``state_v_first``
    asked for ``(N, HV, V, K)``, it came back k-first: ``state_layout_ignored``. With K != V no other
    mistake gives exactly the transposed shape; with K = V the shape hides it and the numeric models
    of the same names name it instead."""
    for probe in probes(problem, params, prop):
        p, s = probe.problem, probe.problem.shape
        if not p.output_final_state or s["K"] == s["V"]:
            continue
        try:
            result = impl.run(p, options=probe.options or None)
        except Exception:  # noqa: BLE001 - a raising call is the failure itself, not a layout
            continue
        asked = "v-first (N, HV, V, K)" if p.state_v_first else "k-first (N, HV, K, V)"
        other = p.state_shape(not p.state_v_first)
        if result.final_state is not None and tuple(np.shape(result.final_state)) == other:
            name = "state_layout_ignored" if p.state_v_first else "final_state_transposed"
            model = next(m for m in MODELS if m.name == name)
            flag = f"state_v_first={p.state_v_first}" if p.state_v_first else "the default layout"
            came = f"it came back with shape {other}, the other layout's"
            text = f"{model.cause} ({flag} asked for the final state {asked}; {came})"
            return Cause(text, model.name, model.kind, 1)
    return Cause()


def _explain(
    impl: Implementation, problem: Problem, params: dict, prop: str, others: Sequence[tuple[Problem, dict]]
) -> Cause:
    first: Observation | None = None
    evidence: list[Observation] | None = None
    for probe in probes(problem, params, prop):
        obs = observe(impl, probe)
        if obs is None or not obs.failing:
            continue
        first = first or obs
        candidates = [f for model in MODELS if (f := judge(model, obs)) is not None]
        if not candidates:
            continue
        if evidence is None:
            # Each earlier example with its own params: the minimal one's may not fit its shapes (A_log
            # per value head) or may have shrunk away the option that made it fail (allow_neg_eigval).
            examples = [(p, ps) for p, ps in others if p.lengths.sum() <= MAX_TOKENS]
            examples += [(p, params) for p in fresh_examples(problem, params)]
            evidence = [o for e, ps in examples for p in probes(e, ps, prop) if (o := observe(impl, p)) is not None]
        confirmed = [f for f in candidates if all(consistent(f.model, e) for e in evidence)]
        best = _best(confirmed)
        if best is not None:
            failing = 1 + sum(e.failing for e in evidence)
            return Cause(best.text(), best.model.name, best.model.kind, failing, tuple(a.name for a in best.alike))
    return Cause(kind=classify(impl, first)) if first is not None else Cause()
