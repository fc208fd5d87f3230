"""Token-selection geometry of attention heads (docs/method.md §5–6; Mudarisov et al. 2026).

- :mod:`geolens.selection.scores`: geometric precision P_N, recall R_N and extremal F_N;
- :mod:`geolens.selection.bounds`: inversion count GInv_N, margin γ_N and the lower bounds;
- :mod:`geolens.selection.baseline`: random N-subsets (nested across N) and the paired
  top-N vs random comparison with document-bootstrap confidence intervals;
- :mod:`geolens.selection.analysis`: the corpus analysis (authors' protocol) as a
  :class:`geolens.streaming.CorpusAnalysis`;
- :mod:`geolens.selection.regime`: the sink-aware regime fit (norm spread, coherence, sink norm
  ratio and alignment, exponential decay of similarity with distance);
- :mod:`geolens.selection.effective_set`: the effective set size N* under keep-only-top-N deletion.
"""

from geolens.selection.bounds import bound_violations, inversion_bounds, inversion_count
from geolens.selection.scores import (
    Separation,
    distances,
    head_selection_scores,
    power_of_two_sizes,
    selection_scores,
    separation_from_distances,
    top_n_mask,
)

__all__ = [
    "Separation",
    "bound_violations",
    "distances",
    "head_selection_scores",
    "inversion_bounds",
    "inversion_count",
    "power_of_two_sizes",
    "selection_scores",
    "separation_from_distances",
    "top_n_mask",
]
