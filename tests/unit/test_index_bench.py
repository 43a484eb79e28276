"""The vector-search bench scenarios are registered and their synthetic data is what they claim."""

from __future__ import annotations

import numpy as np

from gpuprompt.apps.bench import scenarios
from gpuprompt.apps.bench.search import clustered_vectors


def test_scenarios_registered() -> None:
    table = scenarios()
    assert {"search-concurrency", "search-ann"} <= set(table)
    assert "100k x 384" in table["search-concurrency"].description
    assert "recall@10 >= 0.95" in table["search-ann"].description


def test_clustered_vectors_are_embedding_like() -> None:
    x = clustered_vectors(4000, 64, seed=0)
    again = clustered_vectors(4000, 64, seed=0)
    other = clustered_vectors(200, 64, seed=1)
    assert x.dtype == np.float32 and x.shape == (4000, 64)
    assert np.array_equal(x, again) and not np.allclose(x[:200], other)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
    sims = other @ x.T
    nearest = np.sort(sims, axis=1)[:, -1]
    assert nearest.mean() > 0.5  # clustered: every query has close neighbours...
    assert abs(sims.mean()) < 0.1  # ...while random pairs are unrelated (not uniform noise, not one blob)
