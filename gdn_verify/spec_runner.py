"""``check --convention spec`` and ``replay --convention spec``: run the speculative-decoding property."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import TextIO

from gdn_verify.runners.check import CheckOptions, run_property
from gdn_verify.implementations.spec import resolve_spec
from gdn_verify.implementations import ConfigurationError
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.properties.native import Violation
from gdn_verify.properties.spec import SPEC_PROPERTIES


def check_spec(impl_name: str, array: str | None = None, dtype: str | None = None, max_examples: int | None = None,
               seed: int | None = None, database: str | None = None, out: TextIO = sys.stdout) -> int:
    """Run ``spec_decode_slots`` on a spec-convention implementation; exit code 0 or 1."""
    impl = resolve_spec(impl_name, array)
    dtype = dtype or impl.default_dtype
    if dtype not in DTYPES:
        raise ConfigurationError(f"--dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    if max_examples is not None and max_examples < 1:
        raise ConfigurationError("--max-examples must be at least 1")
    seed = seed if seed is not None else random.randrange(2**31)
    options = CheckOptions(dtype=dtype, max_examples=max_examples, seed=seed, database=database)
    print(f"gdn-verify check --convention spec: impl={impl.name}, arrays={impl.array}, dtype={dtype}, seed={seed}",
          file=out)
    failed = 0
    for prop in SPEC_PROPERTIES.values():
        r = run_property(prop, impl, options)
        print(f"  {r.name:<24} {r.status:<11} {r.examples:4d} examples  {r.seconds:.1f}s", file=out)
        if r.status == "failed":
            failed += 1
            f = r.failure
            print(f"FAILED {r.name}: {f.message}\n  minimal example: {f.problem.describe()}\n"
                  f"  parameters: {f.params}", file=out)
            if f.case_path is not None:
                print(f"  replay: python cli.py replay {f.case_path} --impl {impl.name} --convention spec", file=out)
    return 1 if failed else 0


def replay_spec(case: str, impl_name: str, array: str | None = None, out: TextIO = sys.stdout) -> int:
    """Rerun a saved ``spec_decode_slots`` case; exit code 0 (passes) or 1 (fails)."""
    impl = resolve_spec(impl_name, array)
    if not Path(case).is_file():
        raise ConfigurationError(f"replay: no case file {case!r}")
    problem, meta = Problem.load(case)
    prop = SPEC_PROPERTIES.get(meta.get("property", ""))
    if prop is None:
        raise ConfigurationError(f"replay: {case} is not a --convention spec case")
    try:
        m = prop.check(impl, problem, meta["params"])
    except Violation as exc:
        print(f"replay {case} with {impl.name}: failed: {exc}", file=out)
        return 1
    print(f"replay {case} with {impl.name}: passed (error {m.error:.3e}, bound {m.bound:.3e})", file=out)
    return 0
