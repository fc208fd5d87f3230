"""TransformerLens 4.x bridges over tiny random models of other families (geolens.adapter.bridge and
its subclasses): adapter_for picks the family and each block is rebuilt from its attention output;
the sliding windows read are the ones the forward applies; Value Zeroing on post-norm and parallel
blocks and per-term effects on a uniform window equal reruns."""

from __future__ import annotations

import pytest
import torch

import geolens

N_POS = 12  # longer than the tiny models' sliding window (8)


@pytest.fixture(scope="module")
def support_matrix():
    """tests/support_checks.py (the support matrix's checks): tiny models of each family on each
    backend, and its checks of geolens against naive references and full reruns of the model (each
    raises on a mismatch)."""
    import support_checks as module

    assert module.N_POS == N_POS
    return module


@pytest.fixture(scope="module")
def family_bridge(support_matrix):
    """family → a TransformerBridge over that family's tiny random HF model (built once)."""
    pytest.importorskip("transformer_lens.model_bridge")
    built = {}

    def get(family: str):
        if family not in built:
            built[family] = support_matrix.build(family, "tl4-bridge")
        return built[family]

    return get


def _family_tokens(n_rows: int = 2) -> torch.Tensor:
    tokens = torch.randint(4, 64, (n_rows, N_POS), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 0
    return tokens


@pytest.mark.bridge_only
@pytest.mark.parametrize(
    "family, expected, post_norm, pre_mlp_norm",
    [
        ("llama", "BridgeAdapter", False, True),
        ("gemma2", "GemmaBridgeAdapter", True, True),
        ("gemma3", "GemmaBridgeAdapter", True, True),
        ("olmo2", "Olmo2BridgeAdapter", True, False),
        ("gpt_neox", "BridgeAdapter", False, True),
    ],
)
def test_bridge_family_and_the_block_rebuilt_from_its_attention_output(
    family_bridge, family, expected, post_norm, pre_mlp_norm
):
    """adapter_for picks the family (OLMo 2's post-norm-only blocks are not Gemma's), and
    block_after_attention rebuilds each block's output from its input and its attention sum
    (an identity of the forward pass: post-norms, OLMo 2's MLP without a pre-norm, GPT-NeoX's
    parallel attention and MLP)."""
    from geolens.adapter import adapter_for

    model = family_bridge(family)
    adapter = adapter_for(model)
    assert (type(adapter).__name__, adapter.post_attention_norm, adapter.pre_mlp_norm) == (
        expected,
        post_norm,
        pre_mlp_norm,
    )
    names = [
        n
        for l in range(model.cfg.n_layers)
        for n in (adapter.resid_pre_hook(l), adapter.attn_out_hook(l), adapter.resid_post_hook(l))
    ]
    with torch.no_grad():
        _, cache = model.run_with_cache(_family_tokens(), names_filter=lambda n: n in names)
        for l in range(model.cfg.n_layers):
            rebuilt = adapter.block_after_attention(
                l, cache[adapter.resid_pre_hook(l)], cache[adapter.attn_out_hook(l)]
            )
            torch.testing.assert_close(rebuilt, cache[adapter.resid_post_hook(l)], rtol=1e-5, atol=1e-5)


@pytest.mark.bridge_only
@pytest.mark.parametrize("family", ["olmo2", "gpt_neox"])
def test_value_zeroing_on_post_norm_and_parallel_blocks_equals_reruns(support_matrix, family_bridge, family):
    """Value Zeroing on OLMo 2 (norms after attention and MLP only) and GPT-NeoX (attention and MLP
    in parallel) equals a full rerun of the model with v_j zeroed in hook_v, source by source
    (the support matrix's check)."""
    support_matrix.check_value_zeroing(family_bridge(family))


@pytest.mark.bridge_only
@pytest.mark.parametrize(
    "family, windows",
    [("mistral", [8, 8]), ("phi3", [8, 8]), ("qwen2", [None, 8]), ("gemma2", [8, None]), ("llama", [None, None])],
)
def test_bridge_sliding_windows_are_the_ones_the_model_applies(family_bridge, family, windows):
    """The window geolens reads for each layer is the one the forward applies: the final query's
    last W keys get attention in some head, every earlier key exactly none (Mistral and Phi-3 set
    config.sliding_window without layer_types; Qwen2 and Gemma 2 list layer_types)."""
    from geolens.adapter import adapter_for, sliding_window

    model = family_bridge(family)
    adapter = adapter_for(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(_family_tokens(), names_filter=geolens.names_filter(model))
    for l in range(model.cfg.n_layers):
        last = cache[adapter.pattern_hook(l)][:, :, -1, :]  # [batch, head, key]
        seen = [j for j in range(N_POS) if bool((last[:, :, j] != 0).any())]
        observed = None if len(seen) == N_POS else len(seen)
        assert seen == list(range(N_POS - len(seen), N_POS))  # a contiguous window ending at the query
        assert adapter.sliding_window(l) == sliding_window(model, l) == observed == windows[l]
        c = geolens.contribution_weights(model, cache, l)  # not refused as a padded batch
        torch.testing.assert_close(c.sum(-1), torch.ones_like(c.sum(-1)), rtol=1e-4, atol=1e-4)


@pytest.mark.bridge_only
@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_per_term_effects_on_a_uniform_sliding_window_equal_reruns(support_matrix, family_bridge, family):
    """A window on every layer (config.sliding_window without layer_types) in the single-position
    forwards of per_term_effects: each term's KL equals a full rerun with that α_ij^h set to 0
    (the support matrix's check)."""
    support_matrix.check_per_term(family_bridge(family))
