"""Diagnosis: localisation of the first bad token, and attribution of a planted bug to its stage."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.core.problem import Problem
from gdn_verify.implementations import planted, resolve
from gdn_verify.properties.strategies import GATE_REGIMES, beta_values, gate_values, unit_rows
from gdn_verify.runners.diagnose import NumpyStaged, _chunks, _unchunks, diagnose, localise, replay_diagnosis


def problem(seed=0, regime="mild", lengths=(70, 80), HV=2, K=32, V=16, state=True) -> Problem:
    rng = np.random.default_rng(seed)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(cu[-1])
    return Problem(
        q=rng.standard_normal((1, T, 1, K)),
        k=unit_rows(rng, (1, T, 1, K)),
        v=rng.standard_normal((1, T, HV, V)),
        g=gate_values(rng, (1, T, HV), regime),
        beta=beta_values(rng, (1, T, HV)),
        cu_seqlens=cu,
        initial_state=rng.standard_normal((len(lengths), HV, K, V)).astype(np.float32) if state else None,
    ).astype(np.float32)


class FirstOrderSolve(NumpyStaged):
    def solve_tril(self, A):  # (I + A)^-1 ~ I - A: only first order
        Ac = _chunks(np.asarray(A, np.float32), self.chunk_size)
        return _unchunks(np.eye(self.chunk_size, dtype=np.float32) - Ac)


class WWithoutGates(NumpyStaged):
    def w_u(self, k, v, beta, Ai, G):
        W, _ = super().w_u(k, v, beta, Ai, np.zeros_like(G))
        return W, super().w_u(k, v, beta, Ai, G)[1]


class StateWithoutChunkDecay(NumpyStaged):
    def fwd_h(self, k, W, U, G, initial_state):
        G_flat = _chunks(np.asarray(G, np.float32), self.chunk_size)
        G_no_total = _unchunks(G_flat - G_flat[..., -1:])  # exp(G_last) == 1: the chunk's decay dropped
        h, _, final = super().fwd_h(k, W, U, G_no_total, initial_state)
        return h, super().fwd_h(k, W, U, G, initial_state)[1], final


class OutputWithoutDiagonal(NumpyStaged):
    def _gamma(self, G):
        return np.tril(super()._gamma(G), -1)


@pytest.mark.parametrize("regime", GATE_REGIMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_correct_staged_implementation_is_clean(regime, seed):
    d = diagnose(NumpyStaged(), problem(seed, regime))
    assert d.first_divergent is None, d.describe()
    assert max(s.error / s.bound for s in d.stages) < 0.2


@pytest.mark.parametrize(
    "staged, stage",
    [
        (FirstOrderSolve(), "solve_tril"),
        (WWithoutGates(), "w_u"),
        (StateWithoutChunkDecay(), "fwd_h"),
        (OutputWithoutDiagonal(), "fwd_o"),  # kkt masks the diagonal out anyway: only the output changes
    ],
)
def test_planted_stage_bug_is_attributed_to_its_stage(staged, stage):
    d = diagnose(staged, problem(2, "moderate"))
    assert d.first_divergent == stage, d.describe()
    assert [s.stage for s in d.stages if s.diverges][0] == stage


def test_output_stage_bug_alone_is_attributed_to_fwd_o():
    class ScaleIgnored(NumpyStaged):
        def fwd_o(self, q, k, v_new, h, G, scale):
            return super().fwd_o(q, k, v_new, h, G, 1.0)

    d = diagnose(ScaleIgnored(), problem(3).replace(scale=0.25))
    assert d.first_divergent == "fwd_o" and [s.stage for s in d.stages if s.diverges] == ["fwd_o"]


def test_localise_names_the_first_bad_token_chunk_and_head():
    p = problem(0, "mild", lengths=(40, 100))
    loc = localise(planted.implementation("chunk_state_without_decay"), p)  # a 16-token chunked loop
    assert loc.kind == "output"
    assert (loc.sequence, loc.position, loc.chunk) == (0, 16, 0)  # first token after the first chunk boundary
    assert loc.token == 16 and loc.head in (0, 1)
    assert "sequence 0, token 16" in loc.describe()


def test_localise_state_only_and_clean():
    p = problem(1)
    assert localise(planted.implementation("off_by_one_final_state"), p).kind == "state"
    clean = localise(resolve("numpy"), p)
    assert clean.kind == "none" and clean.error < clean.bound


def test_replay_diagnosis_reads_a_case(tmp_path):
    path = problem(0, lengths=(30, 50)).save(tmp_path / "case.npz", property="matches_reference")
    line = replay_diagnosis(str(path), planted.implementation("chunk_state_without_decay"))
    assert line.startswith("diagnosis: first token over the tolerance: sequence 0, token 16")


def test_replay_diagnose_names_the_stage_of_a_plugin_that_exposes_its_stages(tmp_path):
    """End to end through the CLI: a chunked plug-in with a planted solve_tril bug, stages exposed."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "staged_plugin.py").write_text(
        "import numpy as np\n"
        "from gdn_verify.implementations import numpy_impl\n"
        "from gdn_verify.runners.diagnose import NumpyStaged, _chunks, _unchunks\n"
        "class FirstOrderSolve(NumpyStaged):\n"
        "    def solve_tril(self, A):\n"
        "        Ac = _chunks(np.asarray(A, np.float32), self.chunk_size)\n"
        "        return _unchunks(np.eye(self.chunk_size, dtype=np.float32) - Ac)\n"
        "def kernel(**kw):\n"
        "    return numpy_impl.chunk_gated_delta_rule(**kw)\n"
        "kernel.stages = FirstOrderSolve()\n"
    )
    path = problem(0).save(tmp_path / "case.npz", property="matches_reference")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "cli.py"), "replay", str(path), "--impl", "staged_plugin:kernel", "--diagnose"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{root}:{tmp_path}", "PATH": "/usr/bin:/bin"},
    )
    assert "first divergent stage: solve_tril" in done.stdout, done.stdout + done.stderr
