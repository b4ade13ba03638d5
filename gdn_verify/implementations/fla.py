"""Adapters from the native convention to third-party kernels (translation only).

``fla-chunk`` and ``fla-recurrent``: ``chunk_gated_delta_rule`` and
``fused_recurrent_gated_delta_rule`` of the installed FLA release, 0.1 to 0.6.0 (torch CUDA
tensors, or CPU tensors under Triton's interpreter). FLA's convention is the native one; what
changed between releases (the ``head_first`` keyword, the state layout keyword, GVA, float32,
the gate options) comes from the release's row of ``fla_releases.TABLE``, or from probing a
release no row covers. Every call mirrors ``fla/layers/gated_deltanet.py``
``GatedDeltaNet.forward``: every tensor by keyword, ``g`` in float32, ``cu_seqlens`` a LongTensor.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gdn_verify.core import arrays
from gdn_verify.core.implementation import NATIVE_KEYWORDS, ConfigurationError, Implementation
from gdn_verify.implementations import fla_releases, interpreter


def jit_compiled(**extra: Any) -> dict[str, Any]:
    """``Implementation.extra`` for a kernel compiled per shape class (``gdn_verify.core.shapes``).

    Triton (FLA) and CuTe DSL (FlashInfer) kernels compile one variant per head counts, head
    sizes, dtype, varlen, initial state and l2norm: 25-45 s each for FLA's chunked kernel on an
    H100 with a cold cache. Declared, ``check`` and ``fuzz`` draw shapes from a pool compiled up
    front without first deciding from a timing probe whether a new class is expensive.
    """
    return {"compile_classes": True, **extra}


def cache_triton_autotuning() -> None:
    """Keep Triton's autotuning winners in its cache directory, unless the user has said otherwise.

    FLA (and vLLM's fork of it) autotune every kernel variant in every process, benchmarking each
    config again even when the compiled kernels come from a warm Triton cache; FLA 0.6 passes
    ``cache_results=False``, which Triton ORs with ``TRITON_CACHE_AUTOTUNING``. With it set, a
    later process (a warm ``check``, each ``fuzz --workers`` process) reuses the winners. Must run
    before the library is imported: Triton's autotuner reads it when a kernel is decorated.
    """
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")


def cuda_library(what: str, install: str, load: Callable[[], Any]) -> Any:
    """``load()`` (which imports a torch-based kernel library), or a one-line ConfigurationError.

    Under Triton's interpreter (``TRITON_INTERPRET=1``) a Triton library runs on CPU tensors, so
    no GPU is asked for (``gdn_verify.implementations.interpreter``).
    """
    cache_triton_autotuning()
    try:
        import torch

        loaded = load()
    except ImportError as exc:
        raise ConfigurationError("impl", f"{what} is not installed ({install}): {exc}") from None
    if not torch.cuda.is_available() and not interpreter.requested():
        cpu = f"set {interpreter.ENV}=1 to run Triton kernels on the CPU"
        raise ConfigurationError("impl", f"{what}'s kernels need a CUDA GPU; none is visible ({cpu})")
    return loaded


def wrap(fn):
    """``fn`` (a kernel in FLA 0.6's convention) with ``cu_seqlens`` as a LongTensor and every
    tensor passed by keyword (``fused_recurrent_gated_delta_rule``'s positional order is
    ``(q, k, v, g, gk, gv, beta)``); FlashQLA's adapter calls its kernel so."""

    def call(q, k, v, g, beta, cu_seqlens=None, **kw):
        if cu_seqlens is not None:
            cu_seqlens = cu_seqlens.long()
        return fn(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, **kw)

    return call


def _device() -> str:
    """Where FLA's kernels run: the GPU, or the CPU under Triton's interpreter."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Installed:
    """The installed FLA: its release, the conventions it is called with (its row of
    ``fla_releases.TABLE``, or what a probe found), its entry points by form."""

    dist: str
    version: str
    conventions: fla_releases.Release
    probed: bool
    fns: dict[str, Callable[..., Any]]


_probed: dict[tuple[str, str], fla_releases.Release] = {}


def installed_fla() -> Installed:
    """Import the installed FLA's entry points and pick its conventions (ConfigurationError, one
    line, when FLA is missing, no GPU is visible outside the interpreter, or neither the table
    nor a probe settles them). The row is looked up in ``fla_releases.TABLE`` at each call."""

    def load() -> Installed:
        dist, version, folder = fla_releases.installed()
        row = fla_releases.row(version)
        fns = fla_releases.load(folder, row.ops_only if row is not None else None)
        if row is not None:
            return Installed(dist, version, row, False, fns)
        if (dist, version) not in _probed:
            if interpreter.requested():
                interpreter.install()  # the probe runs kernels before the harness adapts them
            _probed[dist, version] = fla_releases.probe(fns, dist, version, _device())
        return Installed(dist, version, _probed[dist, version], True, fns)

    found: Installed = cuda_library("FLA", "pip install fla-core==0.6.0", load)
    return found


def _widened_gate(g: Any) -> Any:
    """``g`` in float32 when it is narrower: FLA's layers compute the log decay in float32
    (``-A_log.float().exp() * softplus(a.float() + dt_bias)``); widening is exact."""
    import torch

    return g.float() if g.dtype in (torch.float16, torch.bfloat16) else g


def native_call(fn: Callable[..., Any], form: str, release: fla_releases.Release, version: str) -> Callable[..., Any]:
    """``fn`` (one release's entry point) called from the native convention, as that release's
    row says: ``head_first=False`` where the keyword exists, the state layout keyword, the gate
    in float32, ``cu_seqlens`` int64; what the release lacks (GVA, float32 inputs, a v-first
    state, an option) raises NotImplementedError naming the release, so it is reported
    unsupported. The signature names exactly the keywords the release honours."""
    import torch

    entry = release.entry(form)
    where = f"FLA {version}'s {fla_releases.ENTRY_POINTS[form]}"

    def call(
        q,
        k,
        v,
        g,
        beta,
        scale=None,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        state_v_first=False,
        **options,
    ):
        for name in options:
            if name not in entry.options:
                raise NotImplementedError(f"needs {name}= (not in {where})")
        if state_v_first and entry.layout is None:
            raise NotImplementedError(f"needs state_v_first= ({where} has a k-first state only)")
        if v.shape[2] != q.shape[2] and not entry.gva:
            raise NotImplementedError(f"{where} has no GVA (HV = {v.shape[2]} value heads, H = {q.shape[2]})")
        if q.dtype == torch.float32 and not entry.float32:
            raise NotImplementedError(f"{where} refuses float32 inputs")
        kw = dict(
            q=q,
            k=k,
            v=v,
            g=g if options.get("use_gate_in_kernel") else _widened_gate(g),
            beta=beta,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            cu_seqlens=None if cu_seqlens is None else cu_seqlens.long(),
            **options,
        )
        if entry.head_first:
            kw["head_first"] = False  # 0.1 defaults it to True: [B, H, T, K] inputs
        if entry.layout is not None:
            kw[entry.layout] = bool(state_v_first)
        return fn(**kw)

    P = inspect.Parameter
    names = NATIVE_KEYWORDS + (("state_v_first",) if entry.layout is not None else ())
    defaults = dict(scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False)
    params = [
        P(n, P.POSITIONAL_OR_KEYWORD, default=defaults.get(n, False if n == "state_v_first" else None))
        if i >= 5
        else P(n, P.POSITIONAL_OR_KEYWORD)
        for i, n in enumerate(names)
    ]
    params += [P(n, P.KEYWORD_ONLY, default=None) for n in sorted(entry.options)]
    call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    call.__name__ = fla_releases.ENTRY_POINTS[form]
    return call


def _implementation(name: str, form: str, fla: Installed, **extra: Any) -> Implementation:
    row = fla.conventions
    how = f" (conventions probed: {row.notes or 'settled'})" if fla.probed else ""
    # Under the interpreter nothing is compiled per shape class: every call is interpreted anew.
    compiled = {"compile_classes": False, **extra} if interpreter.requested() else jit_compiled(**extra)
    return Implementation(
        name,
        {form: native_call(fla.fns[form], form, row, fla.version)},
        "torch",
        f"FLA {fla.version} {fla_releases.ENTRY_POINTS[form]}{how}",
        "bfloat16",
        extra=dict(
            compiled,
            release=fla.version,
            distribution=fla.dist,
            library="fla",  # its own raise is a refusal; its backend is recorded (Triton, FLA >= 0.6's dispatch)
            version=f"{fla.dist} {fla.version}",
            conventions="probed" if fla.probed else f"table row {row.first}-{row.last}",
            # what the release's entry point lacks, for callers that plan draws around it
            gva=row.entry(form).gva,
            float32=row.entry(form).float32,
        ),
    )


class FlaStaged:
    """FLA 0.6's stage functions on a CUDA GPU (torch); imports FLA on construction."""

    chunk_size = 64
    working_unit_roundoff = 2.0**-24

    def __init__(self):
        cache_triton_autotuning()
        try:
            import torch
            from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
            from fla.ops.common.chunk_o import chunk_fwd_o
            from fla.ops.common.chunk_scaled_dot_kkt import chunk_scaled_dot_kkt_fwd
            from fla.ops.gated_delta_rule.wy_fast import recompute_w_u_fwd
            from fla.ops.utils import chunk_local_cumsum, solve_tril
        except ImportError as exc:
            raise ConfigurationError("impl", f"FLA is not installed (pip install fla-core==0.6.0): {exc}") from None
        self.torch = torch
        self.f = dict(
            cumsum=chunk_local_cumsum,
            kkt=chunk_scaled_dot_kkt_fwd,
            solve=solve_tril,
            wu=recompute_w_u_fwd,
            h=chunk_gated_delta_rule_fwd_h,
            o=chunk_fwd_o,
        )

    def _t(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(_device())

    def _n(self, x):
        return x.float().cpu().numpy()

    def cumsum(self, g):
        return self._n(self.f["cumsum"](self._t(g), chunk_size=64))

    def kkt(self, k, beta, G):
        return self._n(self.f["kkt"](k=self._t(k), g=self._t(G), beta=self._t(beta), output_dtype=self.torch.float32))

    def solve_tril(self, A):
        return self._n(self.f["solve"](A=self._t(A), output_dtype=self.torch.float32))

    def w_u(self, k, v, beta, Ai, G):
        w, u = self.f["wu"](k=self._t(k), v=self._t(v), beta=self._t(beta), A=self._t(Ai), g=self._t(G))
        return self._n(w), self._n(u)

    def fwd_h(self, k, W, U, G, initial_state):
        h, v_new, final = self.f["h"](
            k=self._t(k),
            w=self._t(W),
            u=self._t(U),
            g=self._t(G),
            initial_state=self._t(initial_state),
            output_final_state=True,
        )
        return self._n(h), self._n(v_new), self._n(final)

    def fwd_o(self, q, k, v_new, h, G, scale):
        return self._n(
            self.f["o"](q=self._t(q), k=self._t(k), v=self._t(v_new), h=self._t(h), g=self._t(G), scale=scale)
        )


def fla_chunk() -> Implementation:
    """``chunk_gated_delta_rule`` of the installed FLA release (``fla_releases``)."""
    arrays.check_kind("torch")
    fla = installed_fla()
    staged = {"stages": FlaStaged()} if fla.conventions.stages else {}
    return _implementation("fla-chunk", "chunk", fla, **staged)


def fla_recurrent() -> Implementation:
    """``fused_recurrent_gated_delta_rule`` of the installed FLA release (``fla_releases``)."""
    return _implementation("fla-recurrent", "recurrent", installed_fla())
