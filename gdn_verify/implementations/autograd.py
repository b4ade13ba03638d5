"""A functional backward from any autograd-capable torch forward in FLA's convention.

``check --grad`` on ``fla-chunk`` (or an ``--array torch`` plug-in) verifies what training stacks
call: the forward's ``torch.autograd.Function`` and its backward kernels, reached through
``torch.autograd.grad``. Every input is a fresh leaf that requires a gradient; the gradient
buffers the kernel allocates come from torch's caching allocator, which is first left holding
NaN blocks of the gradients' sizes, so a gradient the kernel never writes (the tokens after
``cu_seqlens[-1]``, say) reads as NaN, not as a lucky zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Blocks of each gradient's size left in the caching allocator (NaN) before the backward runs:
# a few, because autograd allocates temporaries of the same sizes before the outputs.
POISON_BLOCKS = 3


def poison_allocator(*like: Any) -> None:
    """Leave ``POISON_BLOCKS`` NaN blocks of each tensor's size and dtype in torch's CUDA cache
    (nothing on the CPU, whose allocator caches nothing)."""
    import torch

    if not like or like[0].device.type != "cuda":
        return
    blocks = [torch.full_like(x, float("nan")) for x in like for _ in range(POISON_BLOCKS)]
    del blocks


def autograd_backward(forward: Callable) -> Callable:
    """The functional backward of ``forward`` (FLA's convention, torch tensors):
    ``fn(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False,
    cu_seqlens=None, *, do, dht=None, **options) -> (dq, dk, dv, dg, dbeta, dh0)``.

    The forward runs with ``output_final_state`` exactly when ``dht`` is given; an input the
    forward never reads (every input of a call with no tokens) gets a zero gradient.
    ``options`` (FLA 0.6's in-kernel gate keywords) are passed to the forward unchanged.
    """

    def backward(
        q,
        k,
        v,
        g,
        beta,
        scale=None,
        initial_state=None,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        *,
        do,
        dht=None,
        **options,
    ):
        import torch

        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        h0 = None if initial_state is None else initial_state.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            o, ht = forward(
                *leaves,
                scale=scale,
                initial_state=h0,
                output_final_state=dht is not None,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                cu_seqlens=cu_seqlens,
                **options,
            )
            outputs, cotangents = [o], [do.to(o.dtype)]
            if dht is not None:
                if ht is None:
                    raise TypeError("the forward returned no final state although output_final_state=True")
                outputs.append(ht)
                cotangents.append(dht.to(ht.dtype))
            inputs = leaves + ([h0] if h0 is not None else [])
            if not any(x.requires_grad for x in outputs):
                # nothing reaches the outputs (no tokens, no final state): every gradient is zero
                grads = tuple(torch.zeros_like(x) for x in inputs)
            else:
                poison_allocator(*inputs)
                # an input the forward never reads has gradient zero, not None
                grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True, materialize_grads=True)
        dh0 = grads[5] if h0 is not None else None
        return (*grads[:5], dh0)

    backward.__name__ = f"autograd_backward({getattr(forward, '__name__', 'forward')})"
    return backward
