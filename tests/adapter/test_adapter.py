"""The adapter: layouts, GQA mapping, missing hooks, shape mismatches, padding."""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.adapter import expand_kv_heads, get_attention_layer, hook_name


def test_expand_kv_heads_is_repeat_interleave():
    v = torch.arange(3 * 2).reshape(1, 3, 2, 1).float()  # kv heads 0, 1
    e = expand_kv_heads(v, 4)
    for h in range(4):
        assert torch.equal(e[:, :, h], v[:, :, h // 2])
    assert expand_kv_heads(v, 2) is v
    with pytest.raises(ValueError, match="does not divide"):
        expand_kv_heads(v, 3)


def test_layer_view_layouts(tiny):
    model, tokens, cache = tiny
    view = get_attention_layer(model, cache, 0)
    b, n = tokens.shape
    cfg = model.cfg
    assert view.pattern.shape == (b, cfg.n_heads, n, n)
    assert view.v.shape == (b, n, cfg.n_heads, cfg.d_head)
    assert view.W_O.shape == (cfg.n_heads, cfg.d_head, cfg.d_model)
    assert view.b_O.shape == (cfg.d_model,)
    assert view.model_mode == geolens.adapter.model_mode(model)


def test_names_filter_keeps_only_what_is_needed(tiny_gqa):
    model, _, cache = tiny_gqa
    assert set(cache.keys()) >= {hook_name(0, "attn.hook_pattern"), hook_name(1, "attn.hook_v")}
    assert all(k.endswith(("hook_pattern", "hook_v", "hook_z")) for k in cache.keys())


def test_missing_cache_entry_names_the_hook_and_the_fix(tiny_gqa):
    model, tokens, _ = tiny_gqa
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    with pytest.raises(KeyError, match=r"blocks\.0\.attn\.hook_v.*names_filter"):
        geolens.contribution_weights(model, cache, 0)


def test_shape_mismatch_is_refused(tiny_gqa):
    model, _, cache = tiny_gqa
    bad = dict(cache.items())
    bad[hook_name(0, "attn.hook_v")] = bad[hook_name(0, "attn.hook_v")][:, :-1]
    with pytest.raises(ValueError, match="does not match hook_pattern"):
        geolens.contribution_weights(model, bad, 0)


def test_padded_batch_is_refused(tiny_gqa):
    model, _, cache = tiny_gqa
    padded = dict(cache.items())
    p = padded[hook_name(0, "attn.hook_pattern")].clone()
    p[1, :, :, 0] = 0  # row 1: the first key is masked out (left padding)
    padded[hook_name(0, "attn.hook_pattern")] = p
    with pytest.raises(ValueError, match="padded"):
        geolens.contribution_weights(model, padded, 0)


def test_model_mode_recorded():
    from conftest import HAS_BRIDGE, make_tiny

    model = make_tiny("gqa")
    assert geolens.adapter.model_mode(model) == ("bridge" if HAS_BRIDGE else "hooked")
    if HAS_BRIDGE:
        assert geolens.adapter.model_mode(make_tiny("mha", compatibility_mode=True)) == "bridge-compat"


# ---------------------------------------------------------------------------------------------
# The adapter object: one family object per model, the one grouped-query rule, hook names


def _expected_family(kind: str):
    from conftest import HAS_BRIDGE

    from geolens.adapter import BridgeAdapter, GemmaBridgeAdapter, HookedAdapter

    if not HAS_BRIDGE:
        return HookedAdapter
    return GemmaBridgeAdapter if kind == "gemma" else BridgeAdapter


@pytest.mark.parametrize("kind", ["gqa", "mha", "gemma"])
def test_adapter_for_picks_the_family(kind):
    from conftest import HAS_BRIDGE, TINY_KINDS, make_tiny

    from geolens.adapter import adapter_for, attn_out_hook, has_post_attention_norm, is_bridge

    if kind not in TINY_KINDS:
        pytest.skip(f"no tiny {kind} model in this TransformerLens")
    model = make_tiny(kind)
    adapter = adapter_for(model)
    assert type(adapter) is _expected_family(kind)
    assert adapter_for(model) is adapter  # cached per model
    assert adapter.model is model
    assert is_bridge(model) == adapter.is_bridge == HAS_BRIDGE
    assert has_post_attention_norm(model) == adapter.post_attention_norm == (kind == "gemma")
    assert adapter.model_mode == geolens.adapter.model_mode(model) == ("bridge" if HAS_BRIDGE else "hooked")
    assert attn_out_hook(model, 1) == ("blocks.1.attn.hook_out" if HAS_BRIDGE else "blocks.1.hook_attn_out")
    assert adapter.n_kv_heads == (2 if kind in ("gqa", "gemma") else 4)
    assert [adapter.sliding_window(l) for l in range(2)] == ([16, None] if kind == "gemma" else [None, None])


def _stand_in(post_norm: bool = False, **attn):
    """A minimal non-bridge model (config + attention weights), as in tests/test_properties.py."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(n_layers=1, n_heads=4, n_key_value_heads=2, d_head=3, d_model=5)
    if post_norm:
        cfg.use_normalization_before_and_after = True
    return SimpleNamespace(cfg=cfg, blocks=[SimpleNamespace(attn=SimpleNamespace(**attn))])


def test_stand_ins_are_hooked_families():
    from geolens.adapter import GemmaHookedAdapter, HookedAdapter, adapter_for

    plain, gemma = adapter_for(_stand_in()), adapter_for(_stand_in(post_norm=True))
    assert type(plain) is HookedAdapter and type(gemma) is GemmaHookedAdapter
    assert plain.attn_out_hook(0) == "blocks.0.hook_attn_out" and plain.model_mode == "hooked"
    with pytest.raises(ValueError, match="norm after attention"):
        gemma.attn_out_hook(0)


def test_adapter_cache_holds_models_weakly():
    import gc
    import weakref
    from types import SimpleNamespace

    from geolens.adapter import HookedAdapter, adapter_for
    from geolens.adapter.registry import _ADAPTERS

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = SimpleNamespace(n_layers=1, n_heads=2, d_head=1, d_model=2)

    model = Model()
    adapter = adapter_for(model)
    assert type(adapter) is HookedAdapter and adapter_for(model) is adapter and model in _ADAPTERS
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None  # the cached adapter did not keep the model alive
    with pytest.raises(ReferenceError):
        adapter.model


def _naive_kv_of(n_heads: int, n_kv: int) -> list[int]:
    """Query head → kv head, written out group by group: heads k·g … k·g + g − 1 read kv head k."""
    g = n_heads // n_kv
    out = []
    for k in range(n_kv):
        for _ in range(g):
            out.append(k)
    return out


def test_the_kv_grouping_rule_against_a_naive_loop():
    from geolens.adapter import kv_group_size, kv_head_of

    for n_kv in range(1, 5):
        for group in range(1, 5):
            n_heads = n_kv * group
            naive = _naive_kv_of(n_heads, n_kv)
            assert kv_group_size(n_heads, n_kv) == group
            assert [kv_head_of(h, n_heads, n_kv) for h in range(n_heads)] == naive
            x = torch.randn(2, 3, n_kv, 4, dtype=torch.float64)
            e = expand_kv_heads(x, n_heads)
            w = expand_kv_heads(x.permute(2, 0, 1, 3), n_heads, dim=0)  # kv heads first
            for h in range(n_heads):
                assert torch.equal(e[:, :, h], x[:, :, naive[h]])
                assert torch.equal(w[h], x[:, :, naive[h]])
    with pytest.raises(ValueError, match="does not divide"):
        kv_group_size(6, 4)


def test_model_kv_grouping_and_value_weights_against_a_naive_loop(tiny):
    from geolens.adapter import adapter_for, output_weights, value_weights
    from geolens.interventions.sink_values import affected_query_heads, kv_heads_of

    model, _, _ = tiny
    adapter = adapter_for(model)
    naive = _naive_kv_of(adapter.n_heads, adapter.n_kv_heads)
    assert [adapter.kv_head_of(h) for h in range(adapter.n_heads)] == naive
    for k in range(adapter.n_kv_heads):
        heads = tuple(h for h in range(adapter.n_heads) if naive[h] == k)
        assert adapter.query_heads_of([k]) == affected_query_heads(model, [k]) == heads
        assert kv_heads_of(model, heads) == (k,)
    attn = model.blocks[0].attn
    raw = getattr(attn, "_W_V", None)  # TL 2.x keeps the kv layout here; W_V is already repeated
    raw = (raw if raw is not None else attn.W_V).detach()
    W_V, b_V = value_weights(model, 0)
    assert W_V.shape == (adapter.n_heads, model.cfg.d_model, model.cfg.d_head)
    assert b_V.shape == (adapter.n_heads, model.cfg.d_head)
    for h in range(adapter.n_heads):
        torch.testing.assert_close(
            W_V[h].detach(), raw[naive[h]] if raw.shape[0] != adapter.n_heads else raw[h], rtol=0, atol=0
        )
    W_O, b_O = output_weights(model, 0)
    torch.testing.assert_close(W_O, attn.W_O, rtol=0, atol=0)


def test_value_weights_fallbacks():
    """A 2-D W_V in nn.Linear layout [kv_head·d_head, d_model] is split per kv head; no b_V → zeros."""
    from geolens.adapter import adapter_for

    weight = torch.randn(2 * 3, 5)
    W_V, b_V = adapter_for(_stand_in(W_V=weight)).value_weights(0)
    naive = _naive_kv_of(4, 2)
    for h in range(4):
        k = naive[h]
        assert torch.equal(W_V[h], weight[k * 3 : (k + 1) * 3].T)
    assert torch.equal(b_V, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="expected \\[head, d_model, d_head\\]"):
        adapter_for(_stand_in(W_V=torch.zeros(2, 3, 5, 1))).value_weights(0)
    with pytest.raises(ValueError, match="W_V has 3 heads, which does not divide"):
        adapter_for(_stand_in(W_V=torch.zeros(3, 5, 3))).value_weights(0)


def test_hook_names_exist_and_hold_what_they_say(tiny):
    from geolens.adapter import adapter_for, hook_layer

    model, tokens, cache = tiny
    adapter = adapter_for(model)
    cfg = model.cfg
    names = [adapter.logits_hook, adapter.unembed_input_hook]
    for l in range(cfg.n_layers):
        names += [
            adapter.pattern_hook(l),
            adapter.value_hook(l),
            adapter.z_hook(l),
            adapter.resid_pre_hook(l),
            adapter.resid_post_hook(l),
            adapter.block_attn_out_hook(l),
        ]
        if not (adapter.post_attention_norm and not adapter.is_bridge):
            names.append(adapter.attn_out_hook(l))
        assert hook_layer(adapter.resid_pre_hook(l)) == l
    missing = [n for n in names if n not in model.hook_dict]
    assert not missing, missing
    assert hook_layer(adapter.logits_hook) is None
    b, n = tokens.shape
    for l in range(cfg.n_layers):
        assert cache[adapter.resid_pre_hook(l)].shape == cache[adapter.resid_post_hook(l)].shape == (b, n, cfg.d_model)
    # block l's output is block l + 1's input
    torch.testing.assert_close(cache[adapter.resid_post_hook(0)], cache[adapter.resid_pre_hook(1)], rtol=0, atol=0)
    assert cache[adapter.unembed_input_hook].shape == (b, n, cfg.d_model)
    with torch.no_grad():
        logits = model(tokens)
    torch.testing.assert_close(adapter.logits_from_cache(cache), logits, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# No family branching outside the adapter (and the loading module)

_FAMILY_NAMES = frozenset(
    {
        "is_bridge",
        "original_model",
        "HookedTransformer",
        "HookedTransformerConfig",
        "TransformerBridge",
        "enable_compatibility_mode",
        "use_normalization_before_and_after",
        "attn_types",
        "layer_types",
        "original_architecture",
        "n_key_value_heads",
        "looks_like_bridge",
    }
)
_FAMILY_STRINGS = _FAMILY_NAMES - {"n_key_value_heads"}  # recorded as a config field by checkpoint/report
_RAW_HOOKS = ("hook_resid", "hook_attn_out", "ln_final", "unembed.hook", "attn.hook_out")
_FAMILY_WORDS = ("gemma", "llama", "gpt2", "gpt-2", "mistral", "qwen", "bridge", "hooked")
_WEIGHTS = frozenset({"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"})
_ALLOWED = ("adapter/", "families/", "models.py")  # geolens/adapter, geolens/families and geolens/models.py
_TINY_KINDS_ALLOWED = {"testing.py"}  # chooses which tiny HF model to build by kind ("gemma")


def family_branching(source: str, name: str = "<source>") -> list[str]:
    """Places in ``source`` that branch on the model family or TransformerLens version, outside
    docstrings and comments: family names (``is_bridge``, ``original_model``, the TL classes, the
    config fields that tell families apart), TransformerLens imports, raw hook names of the
    residual stream / attention output / unembedding, ``.attn.W_V``-style weight reads,
    ``hasattr(model, ...)`` and comparisons with architecture names."""
    import ast

    tree = ast.parse(source)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Name) and node.id in _FAMILY_NAMES:
            found.append(f"{where} {node.id}")
        elif isinstance(node, ast.Attribute):
            if node.attr in _FAMILY_NAMES:
                found.append(f"{where} .{node.attr}")
            if node.attr in _WEIGHTS and isinstance(node.value, ast.Attribute) and node.value.attr == "attn":
                found.append(f"{where} .attn.{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None) else [])
            if any(m.split(".")[0] == "transformer_lens" for m in modules):
                found.append(f"{where} import transformer_lens")
            found += [f"{where} import {a.name}" for a in node.names if a.name in _FAMILY_NAMES]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in _FAMILY_STRINGS or any(h in node.value for h in _RAW_HOOKS):
                found.append(f"{where} {node.value!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
            if node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "model":
                found.append(f"{where} hasattr(model, ...)")
        elif isinstance(node, ast.Compare) and not any(name.endswith(f) for f in _TINY_KINDS_ALLOWED):
            for side in (node.left, *node.comparators):
                if (
                    isinstance(side, ast.Constant)
                    and isinstance(side.value, str)
                    and any(w in side.value.lower() for w in _FAMILY_WORDS)
                ):
                    found.append(f"{where} compares with {side.value!r}")
    return found


def test_the_family_scan_finds_branching():
    """The scan below is not vacuous: each kind of branching it looks for is found."""
    bad = '''
from transformer_lens import HookedTransformer
def f(model, cache, l):
    """is_bridge(model) in a docstring is fine"""
    if is_bridge(model) or hasattr(model, "original_model"):  # a comment: hook_resid_pre is fine
        x = cache[f"blocks.{l}.hook_resid_pre"]
    if model.cfg.original_architecture == "Gemma3ForCausalLM" or getattr(model.cfg, "attn_types", None):
        W = model.blocks[l].attn.W_V
    return model_mode(model) == "bridge-compat"
'''
    found = " ".join(family_branching(bad))
    for needle in (
        "import transformer_lens",
        "import HookedTransformer",
        ":5 is_bridge",
        "hasattr(model",
        "'original_model'",
        "hook_resid_pre",
        ".original_architecture",
        "'Gemma3ForCausalLM'",
        "'attn_types'",
        ".attn.W_V",
        "'bridge-compat'",
    ):
        assert needle in found, needle
    assert ":4 " not in found  # the docstring


def test_no_family_branching_outside_the_adapter():
    """Only the geolens/adapter package (reading models), geolens/families (what geolens knows of
    each family) and geolens/models.py (loading them) may know model families and TransformerLens
    versions."""
    from pathlib import Path

    root = Path(geolens.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix().startswith(_ALLOWED):
            continue
        found += family_branching(path.read_text(encoding="utf-8"), str(path.relative_to(root.parent)))
    assert not found, (
        "family branching outside geolens/adapter/, geolens/families/ and geolens/models.py:\n" + "\n".join(found)
    )


@pytest.mark.bridge_only
def test_the_adapter_modules_examples_run():
    """The ``>>>`` examples of every module of the geolens/adapter package (the family registry, the
    layer view) and of geolens.layout (hook names, the grouped-query rule) run as doctests."""
    import doctest
    import importlib
    import pkgutil

    import geolens.adapter

    attempted = {}
    names = [f"geolens.adapter.{info.name}" for info in pkgutil.iter_modules(geolens.adapter.__path__)] + [
        "geolens.layout"
    ]
    for name in names:
        module = importlib.import_module(name)
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
        attempted[name] = result.attempted
    assert all(attempted[f"geolens.{name}"] > 0 for name in ("layout", "adapter.registry", "adapter.layer")), attempted


# ---------------------------------------------------------------------------------------------
# Adding a family from one file: register_family


def test_a_family_added_in_one_file_serves_contribution_weights():
    """A family written in one place (here: a subclass of the closest family whose cache names the
    pattern, the values and z its own way), registered with register_family, is the one adapter_for
    picks, and geolens.contribution_weights through it equals the naive float64 reference."""
    import weakref

    import reference
    from conftest import HAS_BRIDGE, make_tiny

    from geolens.adapter import BridgeAdapter, HookedAdapter, adapter_for, register_family, unregister_family
    from geolens.adapter.registry import FAMILIES
    from geolens.testing import tiny_tokens

    ours = weakref.WeakSet()
    parent = BridgeAdapter if HAS_BRIDGE else HookedAdapter

    class RenamedHooks(parent):
        family = "renamed-hooks"

        @classmethod
        def matches(cls, model):
            return model in ours

        def pattern_hook(self, layer):
            return f"layer{layer}.alpha"

        def value_hook(self, layer):
            return f"layer{layer}.values"

        def z_hook(self, layer):
            return f"layer{layer}.z"

    model, other = make_tiny("gqa"), make_tiny("gqa")
    ours.add(model)
    register_family(RenamedHooks)
    try:
        assert FAMILIES.index(RenamedHooks) == FAMILIES.index(parent) - 1  # tried just before its parent
        assert type(adapter_for(model)) is RenamedHooks and type(adapter_for(other)) is parent
        tokens = tiny_tokens(model)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens)  # TransformerLens' names
        renamed = {}
        for l in range(model.cfg.n_layers):
            renamed[f"layer{l}.alpha"] = cache[hook_name(l, "attn.hook_pattern")]
            renamed[f"layer{l}.values"] = cache[hook_name(l, "attn.hook_v")]
            renamed[f"layer{l}.z"] = cache[hook_name(l, "attn.hook_z")]
        assert geolens.names_filter(model)("layer1.alpha") and not geolens.names_filter(model)(
            hook_name(1, "attn.hook_pattern")
        )
        for mode in ("intra", "inter"):
            got = geolens.contribution_weights(model, renamed, 1, mode=mode, dtype=torch.float64)
            torch.testing.assert_close(got, reference.contributions(model, cache, 1, mode), rtol=1e-9, atol=1e-9)
        with pytest.raises(KeyError, match="layer1.alpha"):  # the family's names are the ones read
            geolens.contribution_weights(model, cache, 1)
    finally:
        unregister_family(RenamedHooks)
    assert RenamedHooks not in FAMILIES


def test_register_family_places_and_refuses():
    from geolens.adapter import BridgeAdapter, HookedAdapter, ModelAdapter, register_family, unregister_family
    from geolens.adapter.registry import FAMILIES

    class Other(ModelAdapter):  # subclasses no registered family: tried first
        @classmethod
        def matches(cls, model):
            return False

    class Sub(HookedAdapter):
        pass

    class SubSub(Sub):
        pass

    before = list(FAMILIES)
    try:
        register_family(Other)
        register_family(Sub)
        assert FAMILIES[0] is Other and FAMILIES.index(Sub) == FAMILIES.index(HookedAdapter) - 1
        register_family(SubSub)  # tried before its parent Sub, which is tried before HookedAdapter
        assert FAMILIES.index(SubSub) + 1 == FAMILIES.index(Sub) == FAMILIES.index(HookedAdapter) - 1
        unregister_family(SubSub)
        register_family(SubSub, before=BridgeAdapter)
        assert FAMILIES.index(SubSub) == FAMILIES.index(BridgeAdapter) - 1
        with pytest.raises(ValueError, match="already registered"):
            register_family(Sub)
        with pytest.raises(TypeError, match="subclass of geolens.adapter.ModelAdapter"):
            register_family(object)
        with pytest.raises(ValueError, match="not a registered family"):
            register_family(type("Loose", (HookedAdapter,), {}), before=type("Unknown", (ModelAdapter,), {}))
    finally:
        for family in (Other, Sub, SubSub):
            if family in FAMILIES:
                unregister_family(family)
    assert FAMILIES == before
    with pytest.raises(ValueError, match="not a registered family"):
        unregister_family(Sub)


# ---------------------------------------------------------------------------------------------
# TransformerLens 4.x bridges over tiny random models of other families (geolens.hf.tiny)

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
