"""Corpora and token windows (geolens.data): local .txt and .jsonl corpora and their one-line errors,
the offline corpora, token windows against the documents tokenised and cut by hand, batching, and
the rows of a padded batch regrouped without their padding."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from geolens.data import (
    as_token_tensor,
    batches,
    corpus_label,
    load_corpus,
    n_batches,
    token_windows,
    unpadded_groups,
)
from geolens.testing import tiny_tokenizer


class _Tiny:
    """What token_windows reads of a model: its tokenizer and its context."""

    tokenizer = tiny_tokenizer()
    cfg = type("cfg", (), {"n_ctx": 128})()


def test_local_text_and_jsonl_corpora(tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_text("first doc\nstill first\n\n  \n\nsecond doc\n\n", encoding="utf-8")
    assert load_corpus(str(txt)) == ["first doc\nstill first", "second doc"]
    assert load_corpus(str(txt), one_per_line=True) == ["first doc", "still first", "second doc"]
    assert load_corpus(str(txt), max_docs=1) == ["first doc\nstill first"]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"text": "one"}\n\n{"text": "  "}\n{"text": "two", "id": 3}\n', encoding="utf-8")
    assert load_corpus(str(jsonl)) == ["one", "two"]
    assert corpus_label(str(jsonl)) == "c" and corpus_label("lee") == "lee"


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "has no documents"),
        (b"a\x00b", "binary"),
        (b"caf\xe9", r"not UTF-8 text \(byte 0xe9 at offset 3\)"),
    ],
)
def test_bad_text_files_are_one_line_errors(tmp_path, content, match):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as err:
        load_corpus(str(path))
    assert "\n" not in str(err.value)


def test_bad_jsonl_lines_missing_files_and_folders(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match='line 2: expected an object with a string "text" field'):
        load_corpus(str(bad))
    bad.write_text('{"text": "ok"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: not JSON"):
        load_corpus(str(bad))
    with pytest.raises(FileNotFoundError, match="neither an offline corpus"):
        load_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="is a folder"):
        load_corpus(str(tmp_path))


@pytest.mark.skipif(importlib.util.find_spec("gensim") is None, reason="the offline corpora ship in the gensim wheel")
def test_the_offline_corpora():
    lee = load_corpus("lee")
    assert len(lee) == 300 and all(d == d.strip() and d for d in lee)
    enwiki = load_corpus("enwiki", max_docs=5)
    assert len(enwiki) == 5 and all(len(d.split()) >= 50 and "[[" not in d and "{{" not in d for d in enwiki)


def _ids(text: str) -> list[int]:
    return _Tiny.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_token_windows_cut_each_document_after_bos():
    docs = ["abcdefghij", "xyz", "klmnopq"]  # one character per token
    got = token_windows(_Tiny(), docs, seq_len=4)
    want = []
    for doc in docs:  # per document: ⌊len / 3⌋ windows of 3 tokens, the tail dropped
        ids = _ids(doc)
        want += [[0] + ids[k : k + 3] for k in range(0, len(ids) - 2, 3)]
    assert got.dtype == torch.long and got.tolist() == want and len(want) == 3 + 1 + 2
    assert token_windows(_Tiny(), docs, seq_len=4, n_sequences=2).tolist() == want[:2]
    stream = sum((_ids(d) + [1] for d in docs), [])  # concatenated, EOS (1) between documents
    joined = token_windows(_Tiny(), docs, seq_len=4, per_document=False)
    assert joined.tolist() == [[0] + stream[k : k + 3] for k in range(0, len(stream) - 2, 3)]
    assert token_windows(_Tiny(), docs, seq_len=4, bos_id=7)[:, 0].tolist() == [7] * 6


def test_token_windows_refuse_what_they_cannot_give():
    with pytest.raises(ValueError, match="seq_len must be at least 2"):
        token_windows(_Tiny(), ["abc"], seq_len=1)
    with pytest.raises(ValueError, match="no window of 9 tokens"):
        token_windows(_Tiny(), ["abc"], seq_len=9)
    with pytest.raises(ValueError, match="gave 1 windows of 4 tokens, fewer than n_sequences=2"):
        token_windows(_Tiny(), ["abcd"], seq_len=4, n_sequences=2)
    with pytest.raises(ValueError, match="context"):
        token_windows(_Tiny(), ["abc" * 100], seq_len=129)


def test_batches_and_token_tensors():
    tokens = torch.arange(14).reshape(7, 2)
    parts = list(batches(tokens, 3))
    assert [p.shape[0] for p in parts] == [3, 3, 1] and torch.equal(torch.cat(parts), tokens)
    assert [n_batches(n, 3) for n in (0, 1, 3, 4, 7)] == [0, 1, 1, 2, 3]
    memmap_like = np.arange(6, dtype=np.int32).reshape(3, 2)
    t = as_token_tensor(memmap_like[1:])
    assert t.dtype == torch.int64 and t.tolist() == [[2, 3], [4, 5]]
    assert as_token_tensor(tokens) is tokens


def test_unpadded_groups_strip_left_and_right_padding_and_group_by_length():
    model = _Tiny()  # the tokenizer gives the pad id (2)
    batch = torch.tensor([[2, 2, 0, 5, 6], [0, 7, 8, 9, 10], [0, 11, 12, 2, 2], [2, 0, 13, 14, 15]])
    mask = (batch != 2).long()
    groups = unpadded_groups(model, batch, mask)
    assert [g.tolist() for g in groups] == [[[0, 5, 6], [0, 11, 12]], [[0, 7, 8, 9, 10]], [[0, 13, 14, 15]]]
    row = batch[1:2]
    assert unpadded_groups(model, row, None)[0] is row  # unpadded, no mask: the batch itself
    with pytest.raises(ValueError, match="padded"):  # padded, no mask: refused
        unpadded_groups(model, batch, None)
    assert unpadded_groups(model, batch, torch.ones_like(batch))[0] is batch
    holes = torch.tensor([[1, 0, 1, 1, 1]])
    with pytest.raises(ValueError, match="row 0 has padding between real tokens"):
        unpadded_groups(model, batch[1:2], holes)
