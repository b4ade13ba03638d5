"""``run_bench``: the decode and prefill benchmarks run together, as Markdown tables and JSON rows."""

from __future__ import annotations

from typing import Any

from gdn_verify.core import arrays
from gdn_verify.core.implementation import ConfigurationError


def run_bench(what: str = "all") -> tuple[str, dict[str, Any]]:
    """The decode and/or prefill tables (Markdown) and their rows (``{"decode", "prefill",
    "prefill_accuracy"}`` lists of dicts, for JSON); needs a CUDA GPU."""
    if what not in ("decode", "prefill", "all"):
        raise ConfigurationError("what", f"{what!r}: choose from decode, prefill, all")
    try:
        arrays.check_kind("cupy")
    except arrays.ArrayKindUnavailable as exc:
        raise ConfigurationError("device", f"bench needs a CUDA GPU: {exc}") from None
    from gdn_verify.bench import decode, prefill

    tables, document = [], {}
    if what in ("decode", "all"):
        document["decode"] = decode.decode_bench()
        tables.append("## Decode (recurrent kernel)\n\n" + decode.format_table(document["decode"]))
    if what in ("prefill", "all"):
        document["prefill"] = prefill.prefill_bench()
        document["prefill_accuracy"] = prefill.prefill_accuracy()
        tables.append(
            "## Prefill (chunked kernel)\n\n" + prefill.format_table(document["prefill"], document["prefill_accuracy"])
        )
    return "\n\n".join(tables), document
