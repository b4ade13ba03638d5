"""vLLM's GDN conventions per release: one table, read from what an ops folder shows.

vLLM's GDN ops folder has no version file, and its conventions changed between releases
(surveyed from every wheel 0.10.2 ... 0.34.0, 2026-12-04; ``docs/adapters.md`` has the table with
file references). :func:`identify` takes a loaded ops namespace (``vllm.load_ops``) and returns
the :class:`Release` whose conventions the adapters follow, in this order:

1. the release's version: the installed vllm's (``importlib.metadata``) when the folder is
   inside it, else the folder's fingerprint (:data:`FINGERPRINTS`, a hash of its three
   recurrent-state kernel files, known for every surveyed wheel); the row whose range holds it;
2. the folder's features (:func:`features`): the state layout each kernel file indexes, the
   padding test its ``ssm_state_indices`` loads go through, which entry points exist; the row
   whose conventions match (rows are keyed by conventions, so a release newer than the table
   whose files match a row is handled);
3. a probe (:func:`probe`): the kernel run on small known problems that tell a k-first from a
   v-first state and one padding convention from another.

When none settles it, :class:`ConfigurationError` names the folder and what was looked at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import re
from pathlib import Path
from typing import Any

from gdn_verify.core.conventions import VLLM_SPEC, SpecRules
from gdn_verify.core.implementation import ConfigurationError

PADDINGS = ("none", "negative", "null")


@dataclasses.dataclass(frozen=True)
class Conventions:
    """One row: what the ops of a range of vLLM releases expect, and what vLLM's layer passes.

    ``state_v_first``: the recurrent kernels' state (pool) is ``[.., V, K]`` (k-last), else
    ``[.., K, V]``. ``chunk_v_first``: the same for ``chunk_gated_delta_rule``'s initial/final state.
    ``padding``: how ``fused_recurrent``'s ``ssm_state_indices`` mark a slot to skip: ``"none"``
    (no test: vLLM never hands the kernel a padded row; it cuts ``cu_seqlens`` before them),
    ``"negative"`` (``PAD_SLOT_ID = -1``: an entry ``< 0`` is never read or written) or ``"null"``
    (``NULL_BLOCK_ID = 0``: an entry ``<= 0``; slot 0 is the sacrificial null block).
    ``packed_decode`` / ``sigmoid_gating``: ``fused_recurrent_gated_delta_rule_packed_decode``
    and ``ops/fused_sigmoid_gating.py`` exist.
    ``beta_float32``: the Qwen GDN layer hands ``chunk``/``fused_recurrent`` ``beta`` in float32
    (``fused_post_conv_prep``); else in the model dtype (``b.sigmoid()``). ``g`` is float32 in
    every release (``fused_gdn_gating``), and the raw gates ``a, b`` of the fused kernels are in
    the model dtype, strided column halves of the ``ba`` projection, with ``A_log`` float32 and
    ``dt_bias`` in the model dtype.
    """

    name: str
    first: str
    last: str
    state_v_first: bool
    chunk_v_first: bool
    padding: str
    packed_decode: bool
    sigmoid_gating: bool
    beta_float32: bool
    folder: str
    layer: str

    def covers(self, version: str) -> bool:
        return _key(self.first) <= _key(version) <= _key(self.last)

    @property
    def spec_rules(self) -> SpecRules:
        """The speculative-decoding rules of ``fused_recurrent`` with ``num_accepted_tokens``."""
        if self.padding == "null":
            return dataclasses.replace(VLLM_SPEC, pool_v_first=self.state_v_first)
        # PAD_SLOT_ID: slot 0 is live, a negative entry is neither read nor written, a padding
        # request returns before writing its (new_empty) output rows. "none" has the same rules
        # for what it is handed; the spec adapter refuses padding it has no test for.
        return SpecRules(
            f"vllm-{self.name}",
            padding="negative",
            skip_entries=True,
            padding_output="any",
            padding_entries="negative",
            pool_v_first=self.state_v_first,
        )

    def label(self) -> str:
        layout = "v-first [.., V, K]" if self.state_v_first else "k-first [.., K, V]"
        pad = {"none": "no padding test", "negative": "PAD_SLOT_ID -1", "null": "null block 0"}[self.padding]
        return f"vLLM {self.first}..{self.last} conventions: state {layout}, {pad}"


OLD_DIR = "model_executor/layers/fla"
NEW_DIR = "third_party/flash_linear_attention"
QWEN3_NEXT = "model_executor/models/qwen3_next.py"

# Ranges are the releases surveyed; ``last`` of the newest row is the newest surveyed wheel.
TABLE = (
    Conventions("k-first", "0.10.2", "0.15.1", False, False, "none", False, False, False, OLD_DIR, QWEN3_NEXT),
    Conventions("pad-slot", "0.16.0", "0.17.1", True, True, "negative", False, False, False, OLD_DIR, QWEN3_NEXT),
    Conventions("fused-decode", "0.18.0", "0.19.1", True, True, "negative", True, True, False, OLD_DIR, QWEN3_NEXT),
    Conventions(
        "null-block",
        "0.20.0",
        "0.34.0",
        True,
        True,
        "null",
        True,
        True,
        True,
        f"{OLD_DIR} (0.20-0.25), {NEW_DIR} (0.26-)",
        "model_executor/layers/mamba/gdn_linear_attn.py (0.20-0.25), layers/mamba/gdn/qwen_gdn_linear_attn.py (0.26-)",
    ),
)


# sha256 (first 16 hex digits) of fused_recurrent.py, chunk_delta_h.py and fused_sigmoid_gating.py
# (:func:`fingerprint`) -> the releases shipping exactly those files (first, last), from the wheels.
FINGERPRINTS = {
    "d76f7b1a5ad1ad3e": ("0.10.2", "0.10.2"),
    "b7716bfa3744f337": ("0.11.0", "0.11.0"),
    "2f71a4ccd1aa1d73": ("0.11.1", "0.13.0"),
    "f6e6d34145e7f1a7": ("0.14.0", "0.15.1"),
    "a60f529f3562862b": ("0.16.0", "0.17.1"),
    "97fcffc6f60836a3": ("0.18.0", "0.18.1"),
    "00a023b1de4d39cc": ("0.19.0", "0.19.1"),
    "73982bfa6153ee61": ("0.20.0", "0.21.0"),
    "3fd8b2c1dbbe047e": ("0.22.0", "0.24.0"),
    "8b020fdd7a348a2a": ("0.25.0", "0.26.0"),
    "98956f407e9529c5": ("0.27.0", "0.27.1"),
    "a6a76bd783c5e96c": ("0.28.0", "0.28.0"),
    "02a0c1db03daa79c": ("0.29.0", "0.31.0"),
    "c58a37bc9d0ba001": ("0.32.0", "0.32.0"),
    "677c2be9de0a0911": ("0.33.0", "0.33.0"),
    "b9e09584f2716ba0": ("0.34.0", "0.34.0"),
}
FINGERPRINT_FILES = ("fused_recurrent.py", "chunk_delta_h.py", "fused_sigmoid_gating.py")


def fingerprint(ops_dir: Path) -> str:
    """The hash :data:`FINGERPRINTS` is keyed by (files that are absent are left out)."""
    h = hashlib.sha256()
    for name in FINGERPRINT_FILES:
        path = ops_dir / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


@dataclasses.dataclass(frozen=True)
class Release:
    """The conventions an ops folder is run with, and how they were found."""

    conventions: Conventions
    how: str  # "version 0.34.0", "features", "probe"

    def label(self) -> str:
        return f"{self.conventions.label()} (by {self.how})"


_LAYOUT = {
    # fused_recurrent.py / fused_sigmoid_gating.py: the state tile's address
    "k": re.compile(r"o_k\[:, None\] \* V \+ o_v\[None, :\]"),
    "v": re.compile(r"o_v\[:, None\] \* K \+ o_k\[None, :\]"),
}
_CHUNK_LAYOUT = {
    # chunk_delta_h.py: block pointers (K, V) with strides (V, 1), or a [V, K] tile
    "k": re.compile(r"\(K, V\), \(V, 1\)"),
    "v": re.compile(r"\(V, K\), \((?:1, V|K, 1)\)|o_v\[:, None\] \* K \+ o_k"),
}


def _layout(text: str, patterns: dict[str, re.Pattern]) -> bool | None:
    """True: v-first; False: k-first; None: neither or both patterns found."""
    found = {name for name, p in patterns.items() if p.search(text)}
    return {frozenset("v"): True, frozenset("k"): False}.get(frozenset(found))


def features(ops_dir: Path) -> dict[str, Any]:
    """What ``<root>/ops`` shows: layouts per kernel file (None: undecided), padding, entry points."""
    recurrent = (ops_dir / "fused_recurrent.py").read_text()
    chunk = (ops_dir / "chunk_delta_h.py").read_text()
    sigmoid_file = ops_dir / "fused_sigmoid_gating.py"
    padding: str | None
    if re.search(r"state_idx\s*<=\s*0", recurrent):
        padding = "null"
    elif re.search(r"state_idx\s*<\s*0", recurrent):
        padding = "negative"
    elif "state_idx" not in recurrent and "ssm_state_indices" in recurrent:
        padding = "none"
    else:
        padding = None
    state = _layout(recurrent, _LAYOUT)
    if sigmoid_file.is_file() and _layout(sigmoid_file.read_text(), _LAYOUT) not in (state, None):
        state = None  # the two recurrent files disagree: let the probe decide
    return dict(
        state_v_first=state,
        chunk_v_first=_layout(chunk, _CHUNK_LAYOUT),
        padding=padding,
        packed_decode="def fused_recurrent_gated_delta_rule_packed_decode" in recurrent,
        sigmoid_gating=sigmoid_file.is_file(),
    )


def match(found: dict[str, Any]) -> Conventions | None:
    """The newest row whose conventions equal ``found`` (None where a feature is undecided)."""
    keys = ("state_v_first", "chunk_v_first", "padding", "packed_decode", "sigmoid_gating")
    rows = [row for row in TABLE if all(getattr(row, k) == found[k] for k in keys)]
    return rows[-1] if rows else None


def installed_version(root: Path) -> str | None:
    """The installed vllm's version when ``root`` lies inside that installed package, else None."""
    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    base = Path(str(dist.locate_file("vllm"))).resolve()
    return dist.version if base in Path(root).resolve().parents else None


def identify(ops: Any, run_probe: Any = None) -> Release:
    """The :class:`Release` of a loaded ops namespace (``root``, kernels); see the module doc.

    ``run_probe``: ``probe``'s stand-in for tests (called with ``ops``, returns its dict).
    """
    root = Path(ops.root)
    version = installed_version(root)
    how = f"installed version {version}"
    if version is None and fingerprint(root / "ops") in FINGERPRINTS:
        first, last = FINGERPRINTS[fingerprint(root / "ops")]
        version, how = first, f"fingerprint of vllm {first}..{last}"
    if version is not None:
        rows = [row for row in TABLE if row.covers(version)]
        if rows:
            return Release(rows[0], how)
    found = features(root / "ops")
    row = match(found)
    if row is not None:
        return Release(row, "features")
    probed = dict(found)
    try:
        probed.update((run_probe or probe)(ops))
    except Exception as exc:  # noqa: BLE001 - any failure of the probe leaves it unsettled
        probed["probe_error"] = f"{type(exc).__name__}: {exc}"
    row = match(probed)
    if row is not None:
        return Release(row, "probe")
    shown = ", ".join(f"{k}={v}" for k, v in probed.items())
    where = f"vllm {version}" if version else "an ops folder of no known release"
    raise ConfigurationError(
        "impl", f"{root}: {where}; its conventions match no row of vllm_releases.TABLE (probed: {shown})"
    )


def probe(ops: Any) -> dict[str, Any]:
    """Run ``fused_recurrent_gated_delta_rule`` (and ``chunk``) on known problems; what they show.

    Layout: one token with ``k = v = 0``, ``beta = 0``, ``g = 0`` leaves the state as it is and
    outputs ``S^T q``; with ``q = e_0``, ``scale = 1`` and a state tile ``M = arange(D*D)`` that is
    not symmetric, a k-first kernel outputs ``M[0, :]`` and a v-first one ``M[:, 0]``. Padding:
    one token writes ``k = e_0, v = 1, beta = 1`` through index 0 and then -1 of a pool that is a
    view one slot into a larger buffer (so -1 is memory the kernel may touch): the null block
    leaves slot 0 alone, ``PAD_SLOT_ID`` leaves the slot before the view alone, no test writes both.
    Needs a device the kernels run on (a CUDA GPU, or CPU tensors under Triton's interpreter).
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    D = 16
    tile = torch.arange(D * D, dtype=torch.float32, device=device).reshape(D, D)
    e0 = torch.zeros(1, 1, 1, D, device=device)
    e0[..., 0] = 1.0
    zero = torch.zeros(1, 1, 1, device=device)
    one = torch.ones(1, 1, 1, device=device)
    cu = torch.tensor([0, 1], dtype=torch.int64, device=device)

    def layout(o: torch.Tensor) -> bool | None:
        o = o.reshape(-1).float()
        return True if torch.equal(o, tile[:, 0]) else False if torch.equal(o, tile[0]) else None

    def recurrent(pool, index, k, v, beta):
        return ops.fused_recurrent_gated_delta_rule(
            q=e0.clone(),
            k=k,
            v=v,
            g=zero.clone(),
            beta=beta,
            scale=1.0,
            initial_state=pool,
            inplace_final_state=True,
            cu_seqlens=cu,
            ssm_state_indices=torch.tensor([index], dtype=torch.int32, device=device),
        )

    found: dict[str, Any] = {}
    pool = tile.reshape(1, 1, D, D).repeat(3, 1, 1, 1)
    o, _ = recurrent(pool, 1, torch.zeros_like(e0), torch.zeros_like(e0), zero.clone())
    found["state_v_first"] = layout(o)
    buffer = torch.zeros(3, 1, D, D, device=device)
    view = buffer[1:]
    recurrent(view, 0, e0.clone(), torch.ones_like(e0), one.clone())
    slot0 = bool(view[0].abs().sum() > 0)
    recurrent(view, -1, e0.clone(), torch.ones_like(e0), one.clone())
    before = bool(buffer[0].abs().sum() > 0)
    found["padding"] = "null" if not slot0 else ("none" if before else "negative")
    half = torch.float16  # vLLM's chunk refuses float32 inputs
    o, _ = ops.chunk_gated_delta_rule(
        q=e0.to(half),
        k=torch.zeros_like(e0, dtype=half),
        v=torch.zeros_like(e0, dtype=half),
        g=zero.clone(),
        beta=zero.to(half),
        scale=1.0,
        initial_state=tile.reshape(1, 1, D, D).clone(),
        output_final_state=True,
        cu_seqlens=cu,
    )
    found["chunk_v_first"] = layout(o)
    return found


def row_named(name: str) -> Conventions:
    """The table row called ``name`` (ValueError naming it otherwise)."""
    for row in TABLE:
        if row.name == name:
            return row
    raise ValueError(f"name: no row {name!r} in vllm_releases.TABLE ({', '.join(r.name for r in TABLE)})")
