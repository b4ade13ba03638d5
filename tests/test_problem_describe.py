"""Problem.describe: the minimal example's line states the true ranges of g and beta."""

from __future__ import annotations

import numpy as np

from gdn_verify.core.problem import Problem


def test_ranges_are_the_values_not_widened_to_zero():
    z = np.zeros((1, 1, 1, 2))
    p = Problem(z, z, np.zeros((1, 1, 1, 2)), np.full((1, 1, 1), -0.5), np.full((1, 1, 1), 0.935))
    text = p.describe()
    assert "g in [-0.5, -0.5]" in text and "beta in [0.935, 0.935]" in text
    empty = Problem(*(np.zeros((1, 0, 1, 2)),) * 3, np.zeros((1, 0, 1)), np.zeros((1, 0, 1)))
    assert "g: none" in empty.describe() and "beta: none" in empty.describe()
