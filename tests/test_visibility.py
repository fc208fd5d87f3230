"""Which keys a query sees (geolens.visibility): visible_keys, sink_visible and sink_window_keys
against loops over queries and keys, with and without a window; bad windows and more queries than
keys refused."""

from __future__ import annotations

import pytest

from geolens.visibility import check_window, sink_visible, sink_window_keys, visible_keys

pytestmark = pytest.mark.bridge_only  # the tiny Gemma 3 exists only as a TransformerBridge


def lo(i, window):
    return 0 if window is None else max(0, i - window + 1)


def test_visibility_helpers_match_loops():
    for n_q, n_k, w in [(7, 7, None), (7, 7, 3), (2, 7, 3), (40, 40, 16), (1, 5, 1)]:
        got = visible_keys(n_q, n_k, w)
        for q in range(n_q):
            i = q + n_k - n_q
            assert got[q].tolist() == [lo(i, w) <= j <= i for j in range(n_k)]
        assert sink_visible(n_q, n_k, w).tolist() == [lo(q + n_k - n_q, w) == 0 for q in range(n_q)]
        assert sink_window_keys(n_k, w).tolist() == [1 <= j and (w is None or j < w) for j in range(n_k)]
    for bad in (0, -3, 2.5, True, "16"):
        with pytest.raises((ValueError, TypeError)):
            check_window(bad)
    with pytest.raises(ValueError, match="n_query"):
        visible_keys(5, 3)
