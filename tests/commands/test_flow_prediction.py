"""``geolens flow "prompt"`` says which token the model predicts at the attributed position, and
with what probability (printed, and in flow.json with --out)."""

from __future__ import annotations

import json
import re

import torch

from geolens.cli import main

TEXT = "the cat sat on the mat"


def _expected(model_name: str):
    import geolens

    model = geolens.load_model(model_name)
    tokens = model.to_tokens(TEXT, prepend_bos=True)
    with torch.no_grad():
        probs = torch.softmax(model(tokens, return_type="logits")[0, -1].float(), -1)
    top = int(probs.argmax())
    words = [model.tokenizer.decode([t]) for t in tokens[0].tolist()]
    return tokens.shape[1] - 1, words[-1], model.tokenizer.decode([top]), float(probs[top])


def test_flow_prints_the_predicted_token_and_its_probability(capsys, tmp_path):
    out_dir = tmp_path / "run"
    assert main(["flow", TEXT, "--model", "tiny-gqa", "--top-k", "2", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    position, last, predicted, p = _expected("tiny-gqa")
    line = re.search(r"^prediction at position (\d+) (.+) → (.+) \(p=([0-9.e-]+)\)$", out, re.M)
    assert line, out
    assert int(line.group(1)) == position
    assert line.group(2) == repr(last) and line.group(3) == repr(predicted)
    assert line.group(4) == f"{p:.2g}"
    record = json.loads((out_dir / "flow.json").read_text(encoding="utf-8"))
    assert record["predicted"]["token"] == predicted
    assert abs(record["predicted"]["p"] - p) < 1e-5
