"""The text argument of geolens analyze / flow (geolens.commands._text): a text within the context
is tokenised with BOS first; one beyond it is a one-line UsageError naming --truncate, or with
--truncate cut to the context with one printed note giving the full length."""

from __future__ import annotations

import argparse

import pytest
from conftest import make_tiny

from geolens.commands._text import add_truncate_option, command_text_tokens
from geolens.errors import UsageError


@pytest.fixture(scope="module")
def model():
    return make_tiny("gqa")  # n_ctx = 128, one token per character


def test_a_text_within_the_context(model, capsys):
    tokens, n_full = command_text_tokens(model, "the cat sat", truncate=False)
    assert tuple(tokens.shape) == (1, 12) and int(tokens[0, 0]) == model.tokenizer.bos_token_id and n_full == 12
    assert tokens[0, 1:].tolist() == model.tokenizer("the cat sat", add_special_tokens=False)["input_ids"]
    assert capsys.readouterr().out == ""


def test_a_text_beyond_the_context_is_refused_or_cut_on_request(model, capsys):
    text = "x" * 200
    with pytest.raises(UsageError, match="201 tokens long .* pass --truncate to keep its first 128 tokens") as err:
        command_text_tokens(model, text, truncate=False)
    assert "truncate=True" not in str(err.value)
    tokens, n_full = command_text_tokens(model, text, truncate=True)
    assert tuple(tokens.shape) == (1, 128) and n_full == 201
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("note: the text is 201 tokens long") and "(--truncate)" in out[0]


def test_the_truncate_option():
    parser = argparse.ArgumentParser()
    add_truncate_option(parser)
    assert parser.parse_args(["--truncate"]).truncate and not parser.parse_args([]).truncate
