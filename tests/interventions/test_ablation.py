"""Head ablation (geolens.interventions.ablation): zero ablation zeroes the chosen heads only, mean
ablation uses the reference mean (merged over batches as in one pass), per-row head sets equal
separate forwards, and no hook is left after an exception."""

from __future__ import annotations

import pytest
import torch

from geolens.interventions import active_hook_count, applied
from geolens.interventions.ablation import MeanHeadZ, ablated_heads, head_ablation_hooks, mean_head_z


def _z_and_out(model, tokens, hooks, layer):
    got = {}

    def save(name):
        def hook(x, hook):
            got[name] = x.detach().clone()

        return hook

    with torch.no_grad(), applied(model, list(hooks) + [(f"blocks.{layer}.attn.hook_z", save("z"))]):
        logits = model(tokens, return_type="logits")
    return got["z"], logits


def test_zero_ablation_zeroes_chosen_heads_only(tiny):
    model, tokens, cache = tiny
    layer = model.cfg.n_layers - 1
    z, _ = _z_and_out(model, tokens, head_ablation_hooks(model, [(layer, 1), (layer, 3)], "zero"), layer)
    clean = cache[f"blocks.{layer}.attn.hook_z"]
    assert z[:, :, [1, 3]].abs().max() == 0
    assert torch.allclose(z[:, :, [0, 2]], clean[:, :, [0, 2]], atol=1e-6)


def test_mean_ablation_equals_reference_mean(tiny):
    model, tokens, cache = tiny
    cfg = model.cfg
    means = mean_head_z(model, tokens, batch_size=1)
    for l in range(cfg.n_layers):  # naive float64 mean over rows and positions
        z = cache[f"blocks.{l}.attn.hook_z"].double()
        want = torch.zeros(cfg.n_heads, cfg.d_head, dtype=torch.float64)
        for b in range(z.shape[0]):
            for i in range(z.shape[1]):
                want += z[b, i]
        want /= z.shape[0] * z.shape[1]
        assert torch.allclose(means[l].double(), want, atol=1e-6)
    layer = cfg.n_layers - 1
    z, _ = _z_and_out(model, tokens, head_ablation_hooks(model, [(layer, 2)], "mean", means), layer)
    assert torch.allclose(z[:, :, 2], means[layer, 2].expand_as(z[:, :, 2]), atol=1e-7)


def test_mean_head_z_merge_equals_one_pass(tiny_gqa):
    model, tokens, _ = tiny_gqa
    from geolens.runner import run_corpus

    a, b, both = (MeanHeadZ.for_model(model) for _ in range(3))
    run_corpus(model, tokens[:1], [a], progress=False)
    run_corpus(model, tokens[1:], [b], progress=False)
    run_corpus(model, tokens, [both], progress=False, batch_size=2)
    assert torch.allclose(a.merge(b).result(), both.result(), atol=1e-6)


def test_ablation_hooks_removed_even_on_exception(tiny_gqa):
    model, tokens, _ = tiny_gqa
    before = active_hook_count(model)
    with pytest.raises(RuntimeError, match="boom"):
        with ablated_heads(model, [(0, 0), (1, 2)], "zero"):
            assert active_hook_count(model) == before + 2
            raise RuntimeError("boom")
    assert active_hook_count(model) == before
    with pytest.raises(ValueError, match="means"):
        head_ablation_hooks(model, [(0, 0)], "mean")
    with pytest.raises(IndexError):
        head_ablation_hooks(model, [(5, 0)], "zero")
    with pytest.raises(ValueError, match="mode"):
        head_ablation_hooks(model, [(0, 0)], "half")


def test_per_row_head_sets_equal_separate_forwards(tiny):
    model, tokens, _ = tiny
    H = model.cfg.n_heads
    seq = tokens[:1]
    table = {0: torch.eye(H, dtype=torch.bool)}
    with torch.no_grad(), applied(model, head_ablation_hooks(model, table, "zero")):
        rows = model(seq.expand(H, -1), return_type="logits")
    for h in range(H):
        with torch.no_grad(), ablated_heads(model, [(0, h)], "zero"):
            one = model(seq, return_type="logits")
        assert torch.allclose(rows[h], one[0], atol=1e-5)
