"""The metric registry (geolens.metrics): a metric registered by the user takes part in the
faithfulness curves, multiple choice, the CLI, the figures and the report, like a built-in one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import get_args

import numpy as np
import pytest
import torch
from reference import raw_tensors

import geolens.metrics as metrics
from geolens.adapter import PATTERN, hook_name
from geolens.faithfulness import ALL_METRICS, MaskingConfig, faithfulness_curves, metric_scores
from geolens.interventions import active_hook_count, applied
from geolens.metrics import MetricName, get_metric, metric_names, register_metric, unregister_metric

CUSTOM = "value_norm_only"


def value_norm_only(x: metrics.LayerInputs) -> torch.Tensor:
    """‖ṽ_j‖ of each head, broadcast over the queries: ranks a row's sources by value norm alone."""
    return x.value_norm.expand_as(x.alpha)


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry for one test: whatever the test registers is gone afterwards."""
    monkeypatch.setattr(metrics, "_REGISTRY", dict(metrics._REGISTRY))
    return metrics._REGISTRY


@pytest.fixture
def custom(registry):
    return register_metric(CUSTOM, label="value norm ‖ṽ‖ alone", colour="#8c564b", fn=value_norm_only)


def naive_value_norms(model, tokens, layer) -> torch.Tensor:
    """‖ṽ_j^h‖ = ‖v_j^h W_O^h‖ [head, key] of the first sequence, float64 (tests/reference.py)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    _, v, W_O = raw_tensors(model, cache, layer)  # v [b, key, head, d_head], kv heads expanded
    return torch.stack([(v[0, :, h] @ W_O[h]).norm(dim=-1) for h in range(model.cfg.n_heads)])


def test_builtin_names_and_order():
    assert metric_names() == get_args(MetricName) == ALL_METRICS
    assert "value_zeroing" not in metric_names(default_only=True)
    assert get_metric("output_normalized").same_ranking_as == "value_weighted"


def test_custom_metric_curve_equals_hand_built_masked_forward(tiny_gqa, custom):
    model, tokens, _ = tiny_gqa
    layer, k, skip = 1, 0.6, 2
    protocol = MaskingConfig(layers=(layer,), ranking="row", fractions=(0.3, k), skip_prefix=skip)
    res = faithfulness_curves(model, tokens, protocol, ["raw_attention", CUSTOM], progress=False, n_boot=20)
    df = res.per_sequence
    assert set(df.metric) == {"raw_attention", CUSTOM}
    assert set(res.auc().metric) == {"raw_attention", CUSTOM}
    assert len(df[df.metric == CUSTOM]) == tokens.shape[0] * 2 * 2
    # sequence 1, comprehensiveness at k: in each (head, query i) remove the ⌊k·(i+1) + ½⌋ sources
    # j ≤ i of largest ‖ṽ_j‖ (α_ij = 0, no renormalisation), in a plain forward
    seq = tokens[1:2]
    norms = naive_value_norms(model, seq, layer)
    n = seq.shape[1]
    remove = torch.zeros(model.cfg.n_heads, n, n, dtype=torch.bool)
    for h in range(model.cfg.n_heads):
        for i in range(n):
            top = sorted(range(i + 1), key=lambda j: -float(norms[h, j]))[: int(np.floor(k * (i + 1) + 0.5))]
            remove[h, i, top] = True

    def drop(pattern, hook):
        return pattern.masked_fill(remove.to(pattern.device), 0.0)

    before = active_hook_count(model)
    with torch.no_grad(), applied(model, [(hook_name(layer, PATTERN), drop)]):
        logp = torch.log_softmax(model(seq, return_type="logits")[0].double(), -1)
    nll = -logp[torch.arange(n - 1), seq[0, 1:]][skip:]
    assert active_hook_count(model) == before
    row = df[(df.sequence == 1) & (df.metric == CUSTOM) & (df.direction == "comprehensiveness") & (df.fraction == k)]
    assert row.nll.item() == pytest.approx(float(nll.mean()), rel=1e-5)
    assert row.n_removed.item() == int(remove.sum())
    raw = df[
        (df.sequence == 1) & (df.metric == "raw_attention") & (df.direction == "comprehensiveness") & (df.fraction == k)
    ]
    assert row.same_as.item() == "" and raw.nll.item() != row.nll.item()  # its own ranking, not raw attention's


def test_custom_metric_scores_under_source_ranking(tiny_gqa, custom):
    model, tokens, _ = tiny_gqa
    protocol = MaskingConfig(layers=(0,), ranking="source")
    s = metric_scores(model, tokens[:1], protocol, [CUSTOM, "value_weighted"])
    assert list(s) == [CUSTOM, "value_weighted"]
    norms = naive_value_norms(model, tokens[:1], 0)  # [head, key], summed over heads below
    want = norms.sum(0).expand(tokens.shape[1], -1)
    assert s[CUSTOM].shape == (1, 1, 1, tokens.shape[1], tokens.shape[1])
    torch.testing.assert_close(s[CUSTOM][0, 0, 0].double(), want, rtol=1e-5, atol=1e-6)


def test_custom_metric_is_drawn_with_its_label_and_colour(tiny_gqa, custom):
    from geolens.faithfulness.mc_curves import mc_conditions, mc_under_masks_per_question
    from geolens.multiple_choice import Question
    from geolens.viz.faithfulness import faithfulness_curves_plot, mc_accuracy_plot

    model, tokens, _ = tiny_gqa
    protocol = MaskingConfig(layers=(1,), ranking="row", fractions=(0.3, 0.6), skip_prefix=2)
    res = faithfulness_curves(model, tokens, protocol, ["random", CUSTOM], progress=False, n_boot=20)
    view = faithfulness_curves_plot(res.curves, "delta_ppl")
    assert f"comprehensiveness/{CUSTOM}" in view.data
    lines = {line.get_label(): line for line in view.figure.axes[0].get_lines()}
    assert lines["value norm ‖ṽ‖ alone"].get_color() == "#8c564b"
    assert "value norm ‖ṽ‖ alone" in [t.get_text() for t in view.figure.axes[0].get_legend().get_texts()]
    view.close()
    questions = [Question("the cat sat on the", ("mat", "dog"), 0), Question("one two three", ("four", "ten"), 1)]
    mc = mc_conditions(
        mc_under_masks_per_question(
            model, questions, MaskingConfig(layers=(1,), fractions=(0.5,)), [CUSTOM], progress=False
        )
    )
    assert set(mc.metric) == {"clean", CUSTOM}
    view = mc_accuracy_plot(mc)
    assert "value norm ‖ṽ‖ alone" in [line.get_label() for line in view.figure.axes[0].get_lines()]
    view.close()


def test_custom_metric_in_contribution_heatmaps(tiny_gqa, custom):
    from geolens import viz

    model, tokens, cache = tiny_gqa
    view = viz.contribution_heatmaps(model, cache, tokens, 1, batch_index=0, metrics=["raw_attention", CUSTOM])
    _, drawn = view.components
    torch.testing.assert_close(
        view.data[CUSTOM],
        naive_value_norms(model, tokens, 1)[:, None, :].expand(-1, tokens.shape[1], -1),
        rtol=1e-4,
        atol=1e-6,
    )
    assert drawn.caption.startswith("value norm ‖ṽ‖ alone (intra-head): white 0 … full blue")
    assert view.data[f"{CUSTOM}_scale"]["kind"] == "symmetric" and view.data[f"{CUSTOM}_negative_share"] == 0
    with pytest.raises(ValueError, match=r"\['value_zeroing'\] are computed per sequence"):
        viz.contribution_heatmaps(model, cache, tokens, 1, metrics=["value_zeroing"])


def test_attention_metrics_fields_are_the_registered_metrics(tiny):
    from geolens import attention_metrics, get_attention_layer
    from geolens.factors import AttentionMetrics

    assert AttentionMetrics.METRIC_NAMES == ("raw_attention", "value_weighted", "output_normalized", "contribution")
    model, _, cache = tiny
    for mode in ("intra", "inter"):
        fields = attention_metrics(model, cache, 1, mode, dtype=torch.float64).as_dict()
        inputs = metrics.LayerInputs.from_layer(get_attention_layer(model, cache, 1, dtype=torch.float64), mode)
        for name in AttentionMetrics.METRIC_NAMES:
            torch.testing.assert_close(
                get_metric(name).layer_scores(inputs, summed=False), fields[name], rtol=0, atol=0
            )


def test_custom_metric_in_cli_and_report(tiny_gqa, custom, capsys, tmp_path):
    from geolens.cli import main
    from geolens.report.sections import faithfulness_protocol1 as section  # the full report's appendix

    with pytest.raises(SystemExit):
        main(["faithfulness", "--help"])
    assert f"contribution_abs, value_zeroing, random, {CUSTOM} (geolens.metrics" in " ".join(
        capsys.readouterr().out.split()
    )
    assert main(["faithfulness", "--metrics", "nope", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'nope' (choose from raw_attention" in err and CUSTOM in err and err.count("\n") == 1
    model, tokens, _ = tiny_gqa
    ctx = SimpleNamespace(
        model=model, heldout=tokens[:1], tokens=tokens[:1], config=SimpleNamespace(quick=True, seed=0), progress=False
    )
    assert CUSTOM in section.settings(ctx)["metrics"]
    sec = section.build(ctx, {})
    assert CUSTOM in set(sec.numbers["auc"].metric)
    assert f"comprehensiveness/{CUSTOM}" in sec.figures[0].data


def test_endpoint_labels_come_from_the_registration(custom):
    """The report names a mode-qualified metric of the per-term and masking endpoints
    (``<metric>_intra`` / ``<metric>_inter``) by the metric's registered label and its mode, and
    follows a change of that label."""
    import pandas as pd

    from geolens.faithfulness.layer_masking import MASKING_METRICS
    from geolens.metrics import MODE_QUALIFIERS, metric_label, mode_variant
    from geolens.report.columns import humanise_values

    names = [
        CUSTOM,
        f"{CUSTOM}_intra",
        f"{CUSTOM}_inter",
        "output_normalized_intra",
        "grad_x_act",
        "contribution_abs",
        "nope_intra",
    ]
    shown = humanise_values(pd.DataFrame({"metric": names, "a": names})).metric.tolist()
    assert shown == [
        "value norm ‖ṽ‖ alone",
        "value norm ‖ṽ‖ alone (per head)",
        "value norm ‖ṽ‖ alone (per layer)",
        "output-normalised α‖ṽ‖/‖o‖ (per head)",
        "gradient × activation",
        "|contribution weights| |c|",
        "nope_intra",
    ]
    assert mode_variant(f"{CUSTOM}_inter") == (custom, "inter") and mode_variant("contribution_abs") is None
    assert set(MODE_QUALIFIERS) == {"intra", "inter"} and metric_label("grad_x_act") is None  # not a registered metric
    relabelled = unregister_metric("output_normalized")
    register_metric("output_normalized", label="α‖ṽ‖ over ‖o‖", fn=relabelled.fn)
    assert humanise_values(pd.DataFrame({"b": ["output_normalized_inter"]})).b.item() == "α‖ṽ‖ over ‖o‖ (per layer)"
    # every metric of the masking endpoint is registered or a mode variant of a registered one
    assert all(metric_label(m) is not None for m in MASKING_METRICS)


def test_register_errors_and_unregister(registry):
    before = metric_names()
    with pytest.raises(ValueError, match="already registered") as err:
        register_metric("contribution", label="c again", fn=value_norm_only)
    assert "\n" not in str(err.value)
    for bad in ("Value Norm", "", "1abc", "a,b", "clean", "sink_only", None):
        with pytest.raises(ValueError, match="bad metric name") as err:
            register_metric(bad, label="x", fn=value_norm_only)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="fn must be callable"):
        register_metric("not_callable", label="x", fn=3)
    assert metric_names() == before
    register_metric(CUSTOM, label="value norm", fn=value_norm_only)
    assert metric_names() == (*before, CUSTOM) and CUSTOM in metric_names(default_only=True)
    assert unregister_metric(CUSTOM).fn is value_norm_only
    assert metric_names() == before
    with pytest.raises(ValueError, match="unknown metric 'value_norm_only'"):
        get_metric(CUSTOM)
    with pytest.raises(ValueError, match="unknown metrics"):
        metric_scores(None, torch.zeros(1, 4, dtype=torch.long), MaskingConfig(), [CUSTOM])
