"""Padded batches: with ``attention_mask`` every quantity on a row's real positions
equals that prompt run alone, padded positions are 0 and excluded from corpus statistics, and a
padded batch without its mask is refused instead of being read as real tokens."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_tiny
from reference import pad_prompts, padding_prompts, real_span

import geolens
from geolens import attention_metrics, contribution_weights, influence_factors, names_filter
from geolens.contributions import ZeroNormOutputWarning
from geolens.runner import run_corpus
from geolens.sinks.norm_curve import NormCurve
from geolens.testing import tiny_tokenizer


@pytest.fixture(scope="module", params=["gqa", "mha", "gemma"])
def model(request):
    from conftest import TINY_KINDS

    if request.param not in TINY_KINDS:
        pytest.skip(f"no tiny {request.param} model in this TransformerLens")
    return make_tiny(request.param)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_each_prompt_alone(model, side):
    prompts = padding_prompts()
    tokens, mask = pad_prompts(prompts, side)
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=names_filter(model))
    for layer in range(model.cfg.n_layers):
        padded = {
            "intra": contribution_weights(model, cache, layer, "intra", attention_mask=mask),
            "inter": contribution_weights(model, cache, layer, "inter", attention_mask=mask),
            **attention_metrics(model, cache, layer, "inter", attention_mask=mask).as_dict(),
        }
        f = influence_factors(model, cache, layer, attention_mask=mask)
        padded["relative_norm"], padded["alignment"] = f.relative_norm, f.alignment
        for row, prompt in enumerate(prompts):
            _, alone_cache = model.run_with_cache(prompt[None], names_filter=names_filter(model))
            alone = {
                "intra": contribution_weights(model, alone_cache, layer, "intra"),
                "inter": contribution_weights(model, alone_cache, layer, "inter"),
                **attention_metrics(model, alone_cache, layer, "inter").as_dict(),
            }
            fa = influence_factors(model, alone_cache, layer)
            alone["relative_norm"], alone["alignment"] = fa.relative_norm, fa.alignment
            real = real_span(mask[row])
            pad = ~mask[row].bool()
            for name, value in padded.items():
                got = value[row][:, real, real]
                torch.testing.assert_close(got, alone[name][0], atol=1e-5, rtol=1e-4, msg=name)
                # padded queries and keys give exactly 0
                assert bool((value[row][:, pad] == 0).all()), name
                assert bool((value[row][:, :, pad] == 0).all()), name


def test_padded_queries_raise_no_zero_norm_warning(model):
    tokens, mask = pad_prompts(padding_prompts(), "left")
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=names_filter(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroNormOutputWarning)
        contribution_weights(model, cache, 0, attention_mask=mask)


def test_masked_cache_without_mask_is_refused(model):
    tokens, mask = pad_prompts(padding_prompts(), "left")
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=names_filter(model))
    with pytest.raises(ValueError, match="attention_mask="):
        contribution_weights(model, cache, 0)


def test_mask_that_does_not_match_the_cache_is_refused(model):
    tokens, mask = pad_prompts(padding_prompts(), "left")
    _, cache = model.run_with_cache(tokens, names_filter=names_filter(model))  # run WITHOUT the mask
    with pytest.raises(ValueError, match="attend to positions that attention_mask marks as padding"):
        contribution_weights(model, cache, 0, attention_mask=mask)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda n: torch.ones(3, 5, dtype=torch.long), "shape"),
        (lambda n: torch.full((3, n), 2), "only 0"),
        (lambda n: torch.zeros(3, n, dtype=torch.long), "no real token"),
    ],
)
def test_bad_attention_mask(model, bad, match):
    tokens, mask = pad_prompts(padding_prompts(), "right")
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=names_filter(model))
    bad = bad(tokens.shape[1])
    with pytest.raises(ValueError, match=match):
        contribution_weights(model, cache, 0, attention_mask=bad)


# --- run_corpus ----------------------------------------------------------------------------------


def norm_curve(model) -> NormCurve:
    """A real corpus analysis (sink rate binned with ‖o_i^h‖ as payload) over every layer and head."""
    return NormCurve(model.cfg.n_layers, model.cfg.n_heads)


def _tiny_two():
    """Two prompts of 6 and 12 tokens: 5 + 11 = 16 queries i ≥ 1."""
    tok = tiny_tokenizer()
    return [torch.tensor([0] + tok(t, add_special_tokens=False)["input_ids"]) for t in ("a cat", "the dog sat")]


@pytest.mark.parametrize("side", ["left", "right"])
def test_run_corpus_with_mask_equals_prompts_alone(model, side):
    prompts = _tiny_two()
    tokens, mask = pad_prompts(prompts, side)
    [padded] = run_corpus(model, tokens, [norm_curve(model)], attention_mask=mask, progress=False, batch_size=2)
    alone = norm_curve(model)
    for p in prompts:
        run_corpus(model, p[None], [alone], progress=False)
    assert int(padded.per_head.counts[0, 0].sum()) == sum(len(p) - 1 for p in prompts) == 16
    assert torch.equal(padded.per_head.counts, alone.per_head.counts)
    torch.testing.assert_close(padded.per_head.payload_sum, alone.per_head.payload_sum, atol=1e-6, rtol=1e-5)


def test_run_corpus_refuses_unmasked_padding(model):
    tokens, _ = pad_prompts(_tiny_two(), "left")
    with pytest.raises(ValueError, match="looks padded.*attention_mask="):
        run_corpus(model, tokens, [norm_curve(model)], progress=False)
    tokens, _ = pad_prompts(_tiny_two(), "right")
    with pytest.raises(ValueError, match="looks padded"):
        run_corpus(model, tokens, [norm_curve(model)], progress=False)


def test_run_corpus_accepts_equal_rows_and_rejects_holes(model):
    tokens, mask = pad_prompts(_tiny_two(), "left")
    holes = mask.clone()
    holes[1, 3] = 0
    with pytest.raises(ValueError, match="padding between real tokens"):
        run_corpus(model, tokens, [norm_curve(model)], attention_mask=holes, progress=False)
    with pytest.raises(ValueError, match="shape"):
        run_corpus(model, tokens, [norm_curve(model)], attention_mask=mask[:, 1:], progress=False)


def test_gpt2_style_pad_equal_to_bos_is_not_padding():
    """When pad id = BOS id, one leading pad token is the BOS itself, not padding."""
    from types import SimpleNamespace

    from geolens.validation import refuse_unmasked_padding

    model = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=7, bos_token_id=7))
    refuse_unmasked_padding(model, torch.tensor([[7, 1, 2, 3], [7, 4, 5, 6]]))
    with pytest.raises(ValueError, match="looks padded"):
        refuse_unmasked_padding(model, torch.tensor([[7, 7, 2, 3], [7, 4, 5, 6]]))


def test_readme_padded_example_runs():
    """The README's padded-batch example, on a tiny model."""
    model = make_tiny("gqa")
    tokens = model.to_tokens(["a cat", "the dog sat"], padding_side="left") if hasattr(model, "to_tokens") else None
    mask = (tokens != model.tokenizer.pad_token_id).long()
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=geolens.names_filter(model))
    c = geolens.contribution_weights(model, cache, layer=0, attention_mask=mask)
    real = mask.bool()
    sums = c.sum(-1)  # [batch, head, query]
    torch.testing.assert_close(sums[real[:, None, :].expand_as(sums)], torch.ones(int(real.sum()) * model.cfg.n_heads))
