"""``run_corpus`` on the HF-native backend: the analyses run inside the forward, layer by layer
(geolens.hf.streamed.update_layerwise), and give the numbers of the cached path.

- every built-in CorpusAnalysis, streamed, equals the same analysis run from a cache of every
  layer (``layerwise = False`` puts it there), on a GQA Llama, Mistral (sliding window on every
  layer) and Gemma 3 (sliding window on layer 0, q/k norms, post-attention norms), also on
  left-padded batches with their attention mask, and against each prompt run alone;
- attention entropy, the mean z and the norm curve's histograms against explicit float64 loops
  over what ``transformers`` itself gives (``output_attentions=True``, the output projection's
  input read by the test's own hook);
- memory: the run holds one layer's pattern at a time (weak references to what an analysis
  reads), and the live tensors of the pattern's shape do not grow with depth for any built-in;
- an analysis that raises: the exception comes out, every hook and the attention
  implementation are restored, no analysis thread is left;
- stream_layers and stream_corpus: per-layer results inside the forward equal the cached forward
  (padded rows with their mask too), one layer's pattern alive at a time, every batch accumulated.
"""

from __future__ import annotations

import gc
import math
import threading
import weakref

import pytest
import torch
from conftest import random_corpus

import geolens
import geolens.hf.streamed as streamed
from geolens.hf import prepare
from geolens.hf.backend import sites
from geolens.hf.tiny import WINDOW, tiny_family
from geolens.interventions.ablation import MeanHeadZ
from geolens.pruning import AttentionEntropy
from geolens.report.contrast import ContributionContrast
from geolens.runner import run_corpus
from geolens.selection.analysis import SelectionAnalysis
from geolens.selection.regime import RegimeAnalysis
from geolens.sinks.decomposition import TokenTypeDecomposition
from geolens.sinks.drift import DriftStatistics
from geolens.sinks.geometry import SinkGeometry
from geolens.sinks.norm_curve import NormCurve
from geolens.streaming import CorpusAnalysis
from geolens.taxonomy import TaxonomyAnalysis
from hf.conftest import N_POS, hf_tokens

FAMILIES = ("llama", "mistral", "gemma3")  # GQA (4 heads, 2 kv); sliding on every layer; sliding on layer 0
PAD = 2  # the tiny models' pad id


def _tokens(n_rows: int, n_pos: int = N_POS) -> torch.Tensor:
    return random_corpus(n_rows, n_pos, seed=0)


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):
    return request.param, prepare(tiny_family(request.param))


def _streamable(model, seq_len: int) -> dict:
    """Every built-in analysis that reads block hooks only."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    return {
        "entropy": AttentionEntropy(L, H),
        "mean_z": MeanHeadZ.for_model(model),
        "contrast": ContributionContrast.for_model(model),
        "geometry": SinkGeometry(L, H),
        "norm_curve": NormCurve(L, H, n_bins=10),
        "decomposition": TokenTypeDecomposition(L, H),
        "decomposition_cut": TokenTypeDecomposition(
            L, H, max_sequences=1
        ),  # a batch crossing the limit reads every layer at once
        "taxonomy": TaxonomyAnalysis.for_model(model),
        "taxonomy_final": TaxonomyAnalysis.for_model(model, space="projected", queries="final"),
        "regime": RegimeAnalysis.for_model(model, seq_len),
        "selection": SelectionAnalysis.for_model(model, seq_len, n_random=1),
    }


def _cached(analyses: dict) -> dict:
    for a in analyses.values():
        a.layerwise = False  # the cached path
    return analyses


def _state(analysis) -> dict:
    """The state, without the ``layerwise`` switch the cached runs set on their instances."""
    return {k: v for k, v in analysis.state_dict().items() if k != "layerwise"}


def _assert_same(a, b, where: str = "state") -> None:
    """Equal states: tensors element for element (NaN where NaN), everything else by value."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, where
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, where


@pytest.fixture
def spy(monkeypatch):
    """Counts the streamed forwards run_corpus runs."""
    calls = []
    original = streamed.update_layerwise

    def counted(*args, **kwargs):
        calls.append(len(args[2]))
        return original(*args, **kwargs)

    monkeypatch.setattr(streamed, "update_layerwise", counted)
    return calls


# ---------------------------------------------------------------------------------------------
# Same numbers as the cached path


def test_every_builtin_analysis_streams_to_the_cached_numbers(fam, spy):
    family, model = fam
    tokens = _tokens(3)
    live = run_corpus(model, tokens, list(_streamable(model, N_POS).values()), batch_size=2, progress=False)
    assert spy == [11, 11]  # two batches, each one streamed forward serving the 11 analyses
    cached = run_corpus(model, tokens, list(_cached(_streamable(model, N_POS)).values()), batch_size=2, progress=False)
    assert len(spy) == 2
    for a, b in zip(live, cached):
        _assert_same(_state(a), _state(b), type(a).__name__)
    assert live[5].n_sequences == 3 and live[6].n_sequences == 1


def test_left_padded_batches_stream_to_the_cached_numbers_and_to_each_prompt_alone(spy):
    for family in ("llama", "gemma3"):
        model = prepare(tiny_family(family))
        tokens, lengths = _tokens(4), [12, 7, 9, 7]
        mask = torch.zeros_like(tokens)
        for row, n in enumerate(lengths):
            mask[row, N_POS - n :] = 1
        tokens = tokens.masked_fill(mask == 0, PAD)
        tokens[torch.arange(4), N_POS - torch.tensor(lengths)] = 0  # each prompt starts with its sink

        def make():
            L, H = model.cfg.n_layers, model.cfg.n_heads
            return [
                AttentionEntropy(L, H),
                MeanHeadZ.for_model(model),
                ContributionContrast.for_model(model),
                SinkGeometry(L, H),
                NormCurve(L, H, n_bins=10),
                TokenTypeDecomposition(L, H),
                TaxonomyAnalysis.for_model(model, prefix_lengths=(4,)),
            ]

        n_calls = len(spy)
        live = run_corpus(model, tokens, make(), batch_size=4, attention_mask=mask, progress=False)
        assert spy[n_calls:] == [7, 7, 7]  # one batch, three real lengths: 12, 7 (two rows) and 9
        cached = run_corpus(
            model,
            tokens,
            list(_cached(dict(enumerate(make()))).values()),
            batch_size=4,
            attention_mask=mask,
            progress=False,
        )
        for a, b in zip(live, cached):
            _assert_same(_state(a), _state(b), f"{family} {type(a).__name__}")
        alone = make()
        for row, n in enumerate(lengths):
            run_corpus(model, tokens[row : row + 1, N_POS - n :], alone, progress=False)
        for a, b in zip(live, alone):  # other batch shapes: float32 rounding differs, not the numbers
            for x, y in zip(_tensors(_state(a)), _tensors(_state(b))):
                torch.testing.assert_close(
                    x, y, rtol=1e-5, atol=1e-6, equal_nan=True, msg=f"{family} {type(a).__name__}"
                )


def _tensors(state) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state, key=str) for t in _tensors(state[k])]
    if isinstance(state, (list, tuple)):
        return [t for x in state for t in _tensors(x)]
    return []


def test_an_analysis_that_reads_the_logits_keeps_the_cached_path(spy):
    model = prepare(tiny_family("llama"))
    tokens = _tokens(3)
    drift, entropy = DriftStatistics(2, 4), AttentionEntropy(2, 4)
    assert not streamed.layerwise(drift, model) and streamed.layerwise(entropy, model)
    run_corpus(model, tokens, [drift, entropy], batch_size=2, progress=False)
    assert spy == []  # one analysis reads the logits: the whole run is cached
    alone = run_corpus(model, tokens, [AttentionEntropy(2, 4)], batch_size=2, progress=False)[0]
    assert spy == [1, 1]
    _assert_same(_state(entropy), _state(alone))


def test_a_duck_typed_analysis_is_cached_unless_it_declares_layerwise():
    model = prepare(tiny_family("llama"))

    class Duck:  # the protocol's methods, not its class
        def hook_names(self, model):
            return ["blocks.0.attn.hook_pattern"]

    duck = Duck()
    assert not streamed.layerwise(duck, model)
    duck.layerwise = True
    assert streamed.layerwise(duck, model)
    assert not streamed.hf_native(object()) and streamed.hf_native(model)


def test_transformer_lens_models_never_stream(tiny_gqa, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a TransformerLens model went through the streamed forward")

    model, tokens, _ = tiny_gqa
    monkeypatch.setattr(streamed, "update_layerwise", refuse)
    assert not streamed.hf_native(model)
    [entropy] = run_corpus(
        model, tokens, [AttentionEntropy(model.cfg.n_layers, model.cfg.n_heads)], batch_size=1, progress=False
    )
    assert int(entropy.moments.count[0, 0]) == tokens.shape[0] * (tokens.shape[1] - 1)


# ---------------------------------------------------------------------------------------------
# Against explicit loops over what transformers gives


def _hf_reference(model, tokens):
    """(patterns [layer][b, h, q, k] from output_attentions, z [layer][b, q, h, d] read at the
    output projection's input, W_O [layer][h, d, d_model] sliced from its weight), float64."""
    layers = model.model.layers
    n_heads = model.config.num_attention_heads
    d_head = layers[0].self_attn.o_proj.in_features // n_heads
    z, handles = {}, []
    for l, layer in enumerate(layers):
        keep = lambda mod, args, l=l: z.__setitem__(
            l, args[0].detach().double().reshape(*args[0].shape[:2], n_heads, d_head)
        )
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(keep))
    try:
        with torch.no_grad():
            out = model(tokens, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    W_O = [layer.self_attn.o_proj.weight.detach().double().T.reshape(n_heads, d_head, -1) for layer in layers]
    return [a.double() for a in out.attentions], [z[l] for l in range(len(layers))], W_O


def _sink_visible(model, layer: int, query: int) -> bool:
    """Whether ``query`` sees key 0, from the HF config (a sliding layer sees the last WINDOW keys)."""
    types = getattr(model.config, "layer_types", None)
    sliding = (
        types[layer] == "sliding_attention"
        if types is not None
        else getattr(model.config, "sliding_window", None) is not None
    )
    return not sliding or query < WINDOW


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3"])
def test_streamed_entropy_mean_z_and_norm_curve_equal_explicit_loops(family):
    model = prepare(tiny_family(family))
    tokens = _tokens(3)
    L, H, n_bins = 2, 4, 10
    entropy, mean_z, curve = run_corpus(
        model,
        tokens,
        [AttentionEntropy(L, H), MeanHeadZ.for_model(model), NormCurve(L, H, n_bins=n_bins)],
        batch_size=2,
        progress=False,
    )
    patterns, z, W_O = _hf_reference(model, tokens)
    edges = curve.per_head.edges
    for l in range(L):
        for h in range(H):
            ent, counts, norm_sums, n_unseen = (
                0.0,
                torch.zeros(n_bins, dtype=torch.float64),
                torch.zeros(n_bins, dtype=torch.float64),
                0,
            )
            for b in range(3):
                for i in range(1, N_POS):
                    row = patterns[l][b, h, i]
                    ent -= sum(float(a * math.log(a)) for a in row.tolist() if a > 0)
                    if not _sink_visible(model, l, i):
                        assert float(row[0]) == 0.0  # the reference agrees: the sink is masked out
                        n_unseen += 1
                        continue
                    rate = float(row[0])
                    k = next(
                        k
                        for k in range(n_bins)
                        if edges[k] <= rate < edges[k + 1] or (k == n_bins - 1 and rate == edges[-1])
                    )
                    counts[k] += 1
                    norm_sums[k] += float((z[l][b, i, h] @ W_O[l][h]).norm())
            assert entropy.result()[l, h].item() == pytest.approx(ent / (3 * (N_POS - 1)), rel=1e-6)
            torch.testing.assert_close(mean_z.result()[l, h].double(), z[l][:, :, h].mean((0, 1)), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(curve.per_head.counts[l, h], counts, rtol=0, atol=0)
            torch.testing.assert_close(curve.per_head.payload_sum[l, h], norm_sums, rtol=1e-5, atol=1e-6)
        if family == "llama":
            assert n_unseen == 0


# ---------------------------------------------------------------------------------------------
# Memory: one layer's pattern at a time


class _Probe(CorpusAnalysis):
    """Reads each layer's pattern, keeps a weak reference to it and counts those still alive."""

    def __init__(self, n_layers: int):
        self.n_layers = n_layers
        self.alive: list[int] = []

    def hook_names(self, model):
        return [f"blocks.{l}.attn.hook_{n}" for l in range(self.n_layers) for n in ("pattern", "v")]

    def update(self, model, cache, tokens):
        refs = []
        for l in range(self.n_layers):
            pattern = cache[f"blocks.{l}.attn.hook_pattern"]
            refs.append(weakref.ref(pattern))
            del pattern
            self.alive.append(sum(r() is not None for r in refs))


def test_the_streamed_run_holds_one_layer_pattern_at_a_time(spy):
    model = prepare(tiny_family("llama", n_layers=4))
    tokens = _tokens(4)
    [probe] = run_corpus(model, tokens, [_Probe(4)], batch_size=2, progress=False)
    assert probe.alive == [1, 1, 1, 1] * 2 and len(spy) == 2
    cached = _Probe(4)
    cached.layerwise = False
    run_corpus(model, tokens, [cached], batch_size=2, progress=False)
    assert cached.alive == [1, 2, 3, 4] * 2  # the cache holds every layer read so far


def test_builtin_analyses_hold_as_many_patterns_at_the_last_layer_as_at_the_third():
    """Live tensors of the pattern's shape (captured patterns and what the analysis computes at
    that shape, e.g. a float64 copy), counted when layers 2 and 5 of a 6-layer model compute
    their pattern: the streamed run does not grow with depth, the cached one holds every layer."""
    L = 6
    model = prepare(tiny_family("llama", n_layers=L))
    makers = [
        lambda T: AttentionEntropy(L, 4),
        lambda T: MeanHeadZ.for_model(model),
        lambda T: ContributionContrast.for_model(model),
        lambda T: SinkGeometry(L, 4),
        lambda T: NormCurve(L, 4),
        lambda T: TokenTypeDecomposition(L, 4),
        lambda T: TaxonomyAnalysis.for_model(model),
        lambda T: RegimeAnalysis.for_model(model, T),
        lambda T: SelectionAnalysis.for_model(model, T, n_random=2),
    ]
    runs = [(make, True) for make in makers] + [(makers[0], False)]
    gc.collect()
    gc.disable()  # no collection inside a run: the counts depend on references only
    try:
        for n, (make, layerwise) in enumerate(runs):
            T = 13 + n  # a shape of its own per run: nothing of an earlier run is counted
            shape, counts = (2, 4, T, T), {}

            def count(x, site):
                counts[site.layer()] = len(
                    {t.data_ptr() for t in gc.get_objects() if type(t) is torch.Tensor and t.shape == shape}
                )

            analysis = make(T)
            analysis.layerwise = layerwise
            with model.hooks(fwd_hooks=[(f"blocks.{l}.attn.hook_pattern", count) for l in (2, 5)]):
                run_corpus(model, _tokens(2, T), [analysis], batch_size=2, progress=False)
            name = type(analysis).__name__
            if layerwise:
                assert counts[5] == counts[2] < L, (name, counts)
            else:
                assert (counts[2], counts[5]) == (3, 6), (name, counts)
    finally:
        gc.enable()


# ---------------------------------------------------------------------------------------------
# Errors


class _Raises(CorpusAnalysis):
    """Reads layer 0, then raises when it reads ``at`` (never reads anything when ``at`` < 0)."""

    def __init__(self, at: int):
        self.at = at

    def hook_names(self, model):
        return ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]

    def update(self, model, cache, tokens):
        if self.at < 0:
            raise ValueError("refused before reading")
        for l in range(2):
            cache[f"blocks.{l}.attn.hook_pattern"]
            if l == self.at:
                raise ValueError(f"refused at layer {l}")


class _Backwards(CorpusAnalysis):
    """Reads layer 1's pattern, then layer 0's: the sink share of both, per head."""

    def __init__(self):
        self.total = torch.zeros(2, 4, dtype=torch.float64)

    def hook_names(self, model):
        return ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]

    def update(self, model, cache, tokens):
        for l in (1, 0):
            self.total[l] += cache[f"blocks.{l}.attn.hook_pattern"][:, :, 1:, 0].double().sum((0, 2))


def _hook_state(model):
    return (
        sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
        model.config._attn_implementation,
        list(sites(model).runs),
    )


def _analysis_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("geolens-layerwise")]


@pytest.mark.parametrize("at", [-1, 0, 1])
def test_an_analysis_that_raises_leaves_no_hook_and_no_thread(at):
    model = prepare(tiny_family("gemma3"))
    tokens = _tokens(4)
    before = _hook_state(model)
    waiting = AttentionEntropy(2, 4)  # a second analysis in the same forward, cancelled
    with pytest.raises(ValueError, match="refused"):
        run_corpus(model, tokens, [waiting, _Raises(at)], batch_size=2, progress=False)
    assert _hook_state(model) == before and before[1:] == ("eager", [])
    assert _analysis_threads() == []
    # the model is left as it was: a run now gives the cached numbers
    live = run_corpus(model, tokens, [AttentionEntropy(2, 4)], batch_size=2, progress=False)[0]
    cached = _cached({0: AttentionEntropy(2, 4)})[0]
    run_corpus(model, tokens, [cached], batch_size=2, progress=False)
    _assert_same(_state(live), _state(cached))


def test_reading_an_earlier_layer_is_refused_unless_the_analysis_is_cached():
    model = prepare(tiny_family("mistral"))
    tokens = _tokens(3)
    before = _hook_state(model)
    with pytest.raises(
        RuntimeError, match=r"'blocks\.0\.attn\.hook_pattern' was read after layer 0.*layerwise = False"
    ):
        run_corpus(model, tokens, [_Backwards()], batch_size=3, progress=False)
    assert _hook_state(model) == before and _analysis_threads() == []

    class Cached(_Backwards):
        layerwise = False

    [backwards] = run_corpus(model, tokens, [Cached()], batch_size=3, progress=False)
    patterns, _, _ = _hf_reference(model, tokens)
    for l in range(2):
        torch.testing.assert_close(backwards.total[l], patterns[l][:, :, 1:, 0].sum((0, 2)), rtol=1e-12, atol=1e-12)


def test_the_streamed_cache_has_the_run_names_and_answers_lookups_at_once():
    model = prepare(tiny_family("llama"))
    seen = {}

    class Looks(CorpusAnalysis):
        def hook_names(self, model):
            return ["blocks.1.attn.hook_v", "blocks.0.attn.hook_pattern"]

        def update(self, model, cache, tokens):
            seen["type"] = type(cache).__name__
            seen["keys"] = list(cache)
            seen["in"] = ("blocks.1.attn.hook_v" in cache, "blocks.1.attn.hook_z" in cache)
            seen["missing"] = cache.get("blocks.1.attn.hook_z")  # not in the run: None at once, no wait
            seen["v"] = tuple(cache["blocks.1.attn.hook_v"].shape)

    run_corpus(model, _tokens(2), [Looks(), AttentionEntropy(2, 4)], batch_size=2, progress=False)
    assert seen == {
        "type": "LayerCache",
        "keys": [
            "blocks.0.attn.hook_pattern",
            "blocks.1.attn.hook_pattern",
            "blocks.1.attn.hook_v",
        ],  # both analyses' names, by layer
        "in": (True, False),
        "missing": None,
        "v": (2, N_POS, 2, 8),
    }


@pytest.mark.parametrize("stop, blocks", [(1, 1), (-1, 1), (2, 2), (5, 2)])
def test_stop_at_layer_runs_the_blocks_before_it_only(stop, blocks, monkeypatch):
    """``stop_at_layer`` counts like TransformerLens' (negative: from the end; past the last block:
    every block): on a 2-layer model, 1 and −1 run block 0 only, 2 and 5 both blocks; an analysis
    of the blocks that ran gets the numbers of the whole forward, and no later hook fires."""
    model = tiny_family("qwen3")
    assert model.config.num_hidden_layers == 2
    tokens = torch.tensor([[0, 5, 9, 4, 7, 8]])
    whole, stopped = AttentionEntropy(blocks, 4), AttentionEntropy(blocks, 4)
    streamed.update_layerwise(model, tokens, [whole], whole.hook_names(model))
    fired = []
    real = streamed._Feed.publish

    def publish(self, layer):
        fired.append(layer)
        return real(self, layer)

    monkeypatch.setattr(streamed._Feed, "publish", publish)
    streamed.update_layerwise(model, tokens, [stopped], stopped.hook_names(model), stop_at_layer=stop)
    assert fired == [*range(blocks), None]
    assert torch.equal(stopped.moments.count, whole.moments.count) and int(stopped.moments.count[0, 0]) == 5
    torch.testing.assert_close(stopped.moments.mean, whole.moments.mean, rtol=0, atol=0)


def test_streamed_layers_equal_the_cached_forward(family_cache):
    """Contribution weights computed inside the forward, layer by layer, equal those of a cache."""
    from geolens.hf.streamed import stream_layers

    family, model, tokens, cache = family_cache
    streamed = stream_layers(model, tokens, lambda layer: geolens.layer_metrics(layer).contribution)
    assert sorted(streamed) == [0, 1]
    for l in range(2):
        torch.testing.assert_close(streamed[l], geolens.contribution_weights(model, cache, l), rtol=0, atol=1e-6)
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0  # left padding on row 0, given with its mask
    padded = stream_layers(
        model, tokens, lambda layer: geolens.layer_metrics(layer).contribution, layers=[1], attention_mask=mask
    )
    _, masked = geolens.run_with_cache(model, tokens, attention_mask=mask, names_filter=geolens.names_filter(model))
    torch.testing.assert_close(
        padded[1], geolens.contribution_weights(model, masked, 1, attention_mask=mask), rtol=0, atol=1e-6
    )


def _live_patterns(shape) -> int:
    """Distinct storages of the live tensors of ``shape``."""
    import gc

    gc.collect()
    return len(
        {t.data_ptr() for t in gc.get_objects() if issubclass(type(t), torch.Tensor) and tuple(t.shape) == shape}
    )


def test_streamed_mode_holds_one_layer_pattern_at_a_time():
    from geolens.hf.streamed import stream_layers

    model = prepare(tiny_family("llama", n_layers=4))
    tokens, shape = hf_tokens(3, 13), (3, 4, 13, 13)  # a shape no other test's cache holds
    live = stream_layers(model, tokens, lambda layer: _live_patterns(shape))
    assert live == {0: 1, 1: 1, 2: 1, 3: 1}
    _, cache = geolens.run_with_cache(model, tokens)  # a cached forward holds every layer's
    assert _live_patterns(shape) == 4


def test_stream_corpus_accumulates_every_batch_and_layer():
    from geolens.hf.streamed import stream_corpus

    model = prepare(tiny_family("gemma2"))
    tokens = hf_tokens(5)
    sink = torch.zeros(2, 4, dtype=torch.float64)
    assert (
        stream_corpus(
            model,
            tokens,
            lambda layer: sink[layer.layer].add_(layer.pattern[:, :, 1:, 0].double().sum((0, 2))),
            batch_size=2,
        )
        == 3
    )
    expected = torch.zeros(2, 4, dtype=torch.float64)
    for rows in (slice(0, 2), slice(2, 4), slice(4, 5)):
        _, cache = geolens.run_with_cache(model, tokens[rows])
        for l in range(2):
            expected[l] += cache[f"blocks.{l}.attn.hook_pattern"][:, :, 1:, 0].double().sum((0, 2))
    torch.testing.assert_close(sink, expected, rtol=0, atol=1e-9)
