"""Faithfulness of attribution metrics by causal masking (docs/method.md §3).

One module per idea:

- :mod:`~geolens.faithfulness.protocol`: the masking :class:`MaskingConfig` of the curves, its
  constants and the verdict rule;
- :mod:`~geolens.faithfulness.value_zeroing`: the Value Zeroing metric (Mohebbi et al. 2023);
- :mod:`~geolens.faithfulness.masks`: each metric's scores on a sequence and the masks they give;
- :mod:`~geolens.faithfulness.curves`: :func:`faithfulness_curves` over a corpus;
- :mod:`~geolens.faithfulness.result`: :class:`FaithfulnessResult` (statistics, save, load, resume);
- :mod:`~geolens.faithfulness.mc_curves`: multiple choice under the curves' masks (protocol 1);
- the pre-registered protocol (docs/faithfulness/PROTOCOL.md): :mod:`~geolens.faithfulness.preregistered`,
  the per-layer masking endpoint :mod:`~geolens.faithfulness.layer_masking` and its statistics
  :mod:`~geolens.faithfulness.masking_summary`, the per-term endpoint
  :mod:`~geolens.faithfulness.ground_truth`, and multiple choice :mod:`~geolens.faithfulness.multiple_choice`.

The names below are the package's interface; everything else is imported from its module.
"""

from geolens.faithfulness.curves import faithfulness_curves
from geolens.faithfulness.masks import curve_masks, metric_scores, ranked_removals, sink_only_mask
from geolens.faithfulness.protocol import (
    ALL_METRICS,
    CLAIMED_ORDER,
    CLAIMED_STEPS,
    DIRECTIONS,
    FRACTIONS,
    LAYER_GROUPS,
    MIN_DOCUMENTS,
    MIN_RANGE,
    MODES,
    PAIRS,
    QUANTITIES,
    MaskingConfig,
    faithfulness_sign,
    layer_group,
    layer_span,
    masking_scope,
    same_ranking_by_construction,
    verdict,
)
from geolens.faithfulness.result import (
    PER_SEQUENCE,
    FaithfulnessResult,
    area_under_curve,
    auc_ci,
    claimed_order_holds,
    per_sequence_path,
)
from geolens.faithfulness.value_zeroing import value_zeroing

__all__ = [
    "ALL_METRICS",
    "CLAIMED_ORDER",
    "CLAIMED_STEPS",
    "DIRECTIONS",
    "FRACTIONS",
    "LAYER_GROUPS",
    "MIN_DOCUMENTS",
    "MIN_RANGE",
    "MODES",
    "PAIRS",
    "PER_SEQUENCE",
    "QUANTITIES",
    "FaithfulnessResult",
    "MaskingConfig",
    "area_under_curve",
    "auc_ci",
    "claimed_order_holds",
    "curve_masks",
    "faithfulness_curves",
    "faithfulness_sign",
    "layer_group",
    "layer_span",
    "masking_scope",
    "metric_scores",
    "per_sequence_path",
    "ranked_removals",
    "same_ranking_by_construction",
    "sink_only_mask",
    "value_zeroing",
    "verdict",
]
