"""The TF32 variant run end to end through ``check``: the one run both its cause and its tolerance tests read."""

from __future__ import annotations

from gdn_verify.api import check


def check_tf32_variant(cases_dir):
    """``numpy-chunk-tf32`` at float32 under ``matches_reference`` (30 examples, seed 1): the whole result."""
    return check(
        "numpy-chunk-tf32",
        dtype="float32",
        properties=["matches_reference"],
        max_examples=30,
        seed=1,
        cases_dir=cases_dir,
    )
