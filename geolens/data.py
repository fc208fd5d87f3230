"""Corpora and fixed-length token windows.

Offline corpora ship inside the ``gensim`` wheel (installed with ``--no-deps``; geolens only reads
its test data files and never imports gensim):

- ``"lee"``: the Lee background corpus, 300 Australian news articles (``lee_background.cor``);
- ``"enwiki"``: 206 English Wikipedia articles from a shortened dump, wiki markup stripped.

Any other name is read as a local ``.txt`` file (one document per blank-line separated block, or
per line with ``one_per_line=True``), a ``.jsonl`` file (a ``"text"`` field per line), or, with
the prefix ``hf:`` (``"hf:wikitext:wikitext-103-raw-v1"``), a HF ``datasets`` name, which needs
network access.

:func:`token_windows` turns documents into ``[n, seq_len]`` windows that each start with the
model's BOS token, so the sink is always position 0 and no padding is ever needed.
"""

from __future__ import annotations

import bz2
import html
import importlib.util
import json
import re
from pathlib import Path

import torch

from geolens.validation import check_context, refuse_unmasked_padding

OFFLINE_CORPORA = {
    "lee": "lee_background.cor",
    "enwiki": "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
}


def _gensim_test_data() -> Path:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the offline corpora ship in the gensim wheel: pip install --no-deps gensim")
    return Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"


_WIKI_DROP = [
    (re.compile(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", re.S), " "),
    (re.compile(r"\{\{[^{}]*\}\}"), " "),  # templates (applied repeatedly for nesting)
    (re.compile(r"\{\|.*?\|\}", re.S), " "),  # tables
    (re.compile(r"<[^>]+>"), " "),
    (re.compile(r"\[\[(?:File|Image|Category):[^\]]*\]\]"), " "),
    (re.compile(r"\[\[(?:[^|\]]*\|)?([^\]]*)\]\]"), r"\1"),  # [[target|label]] -> label
    (re.compile(r"\[https?://\S+ ([^\]]*)\]"), r"\1"),
    (re.compile(r"'{2,}"), ""),
    (re.compile(r"^[=*#:;|!].*$", re.M), " "),  # headings, lists, table rows
]


def _strip_wiki(text: str) -> str:
    text = html.unescape(text)
    for _ in range(3):
        text = _WIKI_DROP[1][0].sub(" ", text)
    for pattern, repl in _WIKI_DROP:
        text = pattern.sub(repl, text)
    return re.sub(r"\s+", " ", text).strip()


def _read_enwiki(path: Path) -> list[str]:
    xml = bz2.decompress(path.read_bytes()).decode("utf-8")
    docs = []
    for page in re.findall(r"<text[^>]*>(.*?)</text>", xml, re.S):
        if page.lstrip().upper().startswith("#REDIRECT"):
            continue
        text = _strip_wiki(page)
        if len(text.split()) >= 50:
            docs.append(text)
    return docs


def load_corpus(
    name: str = "lee", *, split: str = "train", one_per_line: bool = False, max_docs: int | None = None
) -> list[str]:
    """Documents of a corpus as a list of strings (see the module docstring for names).

    >>> docs = load_corpus("lee")  # offline, from the gensim wheel
    >>> len(docs), docs[0][:26]
    (300, 'Hundreds of people have be')
    """
    if name in OFFLINE_CORPORA:
        path = _gensim_test_data() / OFFLINE_CORPORA[name]
        if name == "lee":
            docs = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        else:
            docs = _read_enwiki(path)
    elif name.startswith("hf:"):
        from datasets import load_dataset  # needs network access (or a local HF cache)

        dataset, _, config = name[3:].partition(":")
        rows = load_dataset(dataset, config or None, split=split)
        docs = [r["text"] for r in rows if r["text"].strip()]
    else:
        path = Path(name)
        if not path.exists():
            raise FileNotFoundError(
                f"corpus {name!r} is neither an offline corpus ({sorted(OFFLINE_CORPORA)}), nor a "
                "local file, nor 'hf:<dataset>[:<config>]'"
            )
        text = _read_text_file(path, name)
        if path.suffix == ".jsonl":
            docs = _jsonl_texts(text, name)
        else:
            parts = text.splitlines() if one_per_line else re.split(r"\n\s*\n", text)
            docs = [p.strip() for p in parts if p.strip()]
    if not docs:
        raise ValueError(f"corpus {name!r} has no documents")
    return docs[:max_docs] if max_docs else docs


def _read_text_file(path: Path, name: str) -> str:
    """A corpus file's text; a folder, binary data or non-UTF-8 bytes are a ValueError."""
    if path.is_dir():
        raise ValueError(f"corpus {name!r} is a folder, not a .txt or .jsonl file")
    data = path.read_bytes()
    if b"\x00" in data:
        raise ValueError(f"corpus file {name!r} is binary (it holds NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"corpus file {name!r} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})"
        ) from None


def _jsonl_texts(text: str, name: str) -> list[str]:
    """The ``"text"`` field of every non-empty line; a line without one is a ValueError."""
    docs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"corpus file {name!r}, line {number}: not JSON ({err.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(f'corpus file {name!r}, line {number}: expected an object with a string "text" field')
        if row["text"].strip():
            docs.append(row["text"])
    return docs


def corpus_label(corpus: str) -> str:
    """File-name label of a corpus: the name itself, or the stem of a corpus file path."""
    return Path(corpus).stem if ("/" in corpus or Path(corpus).suffix) else corpus


def bos_token_id(model) -> int:
    tok = model.tokenizer
    if tok.bos_token_id is not None:
        return int(tok.bos_token_id)
    raise ValueError("the model's tokenizer has no BOS token; pass bos_id explicitly")


def token_windows(
    model,
    docs: list[str],
    seq_len: int = 128,
    *,
    n_sequences: int | None = None,
    bos_id: int | None = None,
    per_document: bool = True,
) -> torch.Tensor:
    """``[n, seq_len]`` token windows, each ``[BOS] + seq_len − 1`` tokens of text.

    With ``per_document=True`` (default) a window never spans two documents (a document yields
    ⌊len / (seq_len − 1)⌋ windows, its tail is dropped); otherwise documents are concatenated with
    the EOS token between them. The order is deterministic.
    """
    if seq_len < 2:
        raise ValueError("seq_len must be at least 2 (BOS and one token)")
    check_context(model, seq_len, name=f"seq_len {seq_len}: a window")
    tok = model.tokenizer
    bos = bos_token_id(model) if bos_id is None else bos_id
    body = seq_len - 1
    windows: list[list[int]] = []
    stream: list[int] = []
    for doc in docs:
        ids = tok(doc, add_special_tokens=False)["input_ids"]
        if per_document:
            windows += [ids[k : k + body] for k in range(0, len(ids) - body + 1, body)]
        else:
            stream += ids + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
        if n_sequences is not None and len(windows) >= n_sequences:
            break
    if not per_document:
        windows = [stream[k : k + body] for k in range(0, len(stream) - body + 1, body)]
    windows = windows[:n_sequences] if n_sequences is not None else windows
    if not windows:
        raise ValueError(f"the corpus gave no window of {seq_len} tokens")
    if n_sequences is not None and len(windows) < n_sequences:
        raise ValueError(
            f"the corpus gave {len(windows)} windows of {seq_len} tokens, fewer than n_sequences={n_sequences}"
        )
    return torch.tensor([[bos] + w for w in windows], dtype=torch.long)


def corpus_windows(
    model, name: str = "lee", seq_len: int = 128, n_sequences: int | None = 200, **kwargs
) -> torch.Tensor:
    """:func:`load_corpus` then :func:`token_windows`: the usual way to get an analysis batch.

    >>> from geolens.testing import tiny_bridge
    >>> tokens = corpus_windows(tiny_bridge("gqa"), "lee", seq_len=16, n_sequences=4)
    >>> tuple(tokens.shape), tokens[:, 0].tolist()  # BOS first in every window
    ((4, 16), [0, 0, 0, 0])
    """
    return token_windows(model, load_corpus(name), seq_len, n_sequences=n_sequences, **kwargs)


def as_token_tensor(rows) -> torch.Tensor:
    """A batch of token ids as an int64 tensor (numpy slices and memmaps are copied)."""
    if isinstance(rows, torch.Tensor):
        return rows
    import numpy as np

    return torch.from_numpy(np.array(rows, dtype=np.int64))


def batches(tokens: torch.Tensor, batch_size: int):
    """Yield consecutive ``[batch_size, seq_len]`` slices of a token tensor."""
    for start in range(0, tokens.shape[0], batch_size):
        yield tokens[start : start + batch_size]


def n_batches(n_sequences: int, batch_size: int) -> int:
    """⌈n_sequences / batch_size⌉."""
    return (n_sequences + batch_size - 1) // batch_size


def unpadded_groups(model, batch: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """The rows of a batch without their padding, as sub-batches of equal real length.

    Without a mask the batch is returned whole, after refusing one that looks padded
    (:func:`geolens.validation.refuse_unmasked_padding`). With a mask each row's real tokens
    must be contiguous (left or right padding); rows of equal length keep their order.
    """
    if attention_mask is None:
        refuse_unmasked_padding(model, batch)
        return [batch]
    if bool(attention_mask.all()):
        return [batch]
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    first = mask.int().argmax(1)
    stripped = []
    for row, (start, n) in enumerate(zip(first.tolist(), lengths.tolist())):
        if not bool(mask[row, start : start + n].all()):
            raise ValueError(
                f"attention_mask row {row} has padding between real tokens; only left or right padding is supported"
            )
        stripped.append(batch[row, start : start + n])
    groups: dict[int, list[torch.Tensor]] = {}
    for row in stripped:
        groups.setdefault(len(row), []).append(row)
    return [torch.stack(rows) for rows in groups.values()]
