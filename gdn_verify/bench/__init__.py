"""GPU benchmarks: ``decode`` and ``prefill``, our kernels side by side with FLA and a device copy."""

from __future__ import annotations

from gdn_verify.core import arrays
from gdn_verify.core.implementation import ConfigurationError


def run_bench(what: str = "all") -> str:
    """The decode and/or prefill tables (Markdown); needs a CUDA GPU."""
    if what not in ("decode", "prefill", "all"):
        raise ConfigurationError("what", f"{what!r}: choose from decode, prefill, all")
    try:
        arrays.check_kind("cupy")
    except arrays.ArrayKindUnavailable as exc:
        raise ConfigurationError("device", f"bench needs a CUDA GPU: {exc}") from None
    from gdn_verify.bench import decode, prefill

    tables = []
    if what in ("decode", "all"):
        tables.append("## Decode (recurrent kernel)\n\n" + decode.format_table(decode.decode_bench()))
    if what in ("prefill", "all"):
        tables.append("## Prefill (chunked kernel)\n\n" + prefill.format_table(prefill.prefill_bench()))
    return "\n\n".join(tables)
