"""The user errors of the command line (geolens.errors): a UsageError is one line whatever its
message, keeps the command it belongs to, and is a ValueError (so Python callers catch it as one);
the refusals of saved work and of folders in use are UsageErrors too. And one error vocabulary: the
same bad argument (a layer or head out of range or of the wrong type, an unknown model name, several
texts where one is taken) gets the same type and message from every entry point, the CLI included."""

from __future__ import annotations

import pytest

from geolens.errors import ResumeRefused, UsageError
from geolens.folder_lock import FolderInUse
from geolens.resume import refuse


def test_a_usage_error_is_one_line_and_keeps_its_command():
    err = UsageError("--layer 99:\n  out of range\t(the model has 30 layers)  ", prog="geolens sinks")
    assert str(err) == "--layer 99: out of range (the model has 30 layers)" and err.prog == "geolens sinks"
    assert UsageError("x").prog is None
    with pytest.raises(ValueError, match="^bad value$"):
        raise UsageError("bad\nvalue")


def test_refusals_are_usage_errors():
    assert issubclass(ResumeRefused, UsageError) and issubclass(FolderInUse, UsageError)
    err = refuse("out/p.json", "its rows\nare damaged")
    assert isinstance(err, ResumeRefused) and "\n" not in str(err)
    assert (
        str(err)
        == "cannot resume from out/p.json: its rows are damaged; rerun with --overwrite (or a new --out) to start again"
    )


# --- one error vocabulary: the same bad argument, the same type and message in every entry point ---
# An index out of range is an IndexError, a wrong type a TypeError, any other bad value a ValueError
# (geolens.validation); the command line prints the same message as ``geolens <cmd>: error: …``, exit 2.

TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def tiny():
    """The 2-layer, 4-head tiny model and a cache of one text."""
    import geolens
    from tests.conftest import make_tiny

    model = make_tiny("gqa")  # a TransformerBridge on TL 4.x, a HookedTransformer on TL 2.x
    tokens = model.to_tokens(TEXT)
    _, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))
    return model, tokens, cache


def _raised(call) -> tuple[type, str]:
    with pytest.raises(Exception) as err:
        call()
    return type(err.value), str(err.value)


def _cli_line(argv, capsys) -> str:
    """``geolens.cli.main(argv)``: exit code 2 and one line on stderr, no traceback; the line."""
    from geolens.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"geolens {argv[0]}: error: "), lines[0]
    return lines[0].removeprefix(f"geolens {argv[0]}: error: ")


def _python_entry_points(model, tokens, cache, **bad):
    """Every Python entry point that takes ``layer=`` (with the bad value), as zero-argument calls."""
    import geolens

    layer = bad["layer"]
    return {
        "attribute": lambda: geolens.attribute(model, TEXT, "contribution", layer=layer),
        "contribution_weights": lambda: geolens.contribution_weights(model, cache, layer=layer),
        "attention_metrics": lambda: geolens.attention_metrics(model, cache, layer=layer),
        "influence_factors": lambda: geolens.influence_factors(model, cache, layer=layer),
        "get_attention_layer": lambda: geolens.get_attention_layer(model, cache, layer),
        "value_zeroing": lambda: geolens.value_zeroing(model, tokens, layers=[layer]),
    }


def test_a_layer_out_of_range_is_one_index_error_everywhere(tiny, monkeypatch, capsys):
    model, tokens, cache = tiny
    expected = "layer=99 is out of range: the model has 2 layers (0…1, or -2…-1 from the end)"
    for name, call in _python_entry_points(model, tokens, cache, layer=99).items():
        assert _raised(call) == (IndexError, expected), name
    import geolens.models

    monkeypatch.setattr(geolens.models, "load_model", lambda *a, **k: model)  # the CLI's model: the tiny one
    line = _cli_line(["analyze", TEXT, "--layer", "99"], capsys)
    assert line == expected.replace("layer=99", "--layer 99")  # the argument as each interface spells it


def test_a_layer_of_the_wrong_type_is_one_type_error_everywhere(tiny):
    model, tokens, cache = tiny
    for name, call in _python_entry_points(model, tokens, cache, layer=1.0).items():
        assert _raised(call) == (TypeError, "layer must be an integer layer index, got 1.0"), name


def test_a_head_out_of_range_is_one_index_error_everywhere(tiny):
    import geolens
    from geolens.validation import check_head
    from geolens.viz.contributions import source_colors

    model, tokens, cache = tiny
    expected = "head=9 is out of range: the model has 4 heads (0…3, or -4…-1 from the end)"
    calls = {
        "attribute": lambda: geolens.attribute(model, TEXT, "contribution", layer=0, head=9),
        "source_colors": lambda: source_colors(model, cache, tokens, 0, head=9),
        "check_head": lambda: check_head(9, 4),
    }
    for name, call in calls.items():
        assert _raised(call) == (IndexError, expected), name
    assert _raised(lambda: geolens.attribute(model, TEXT, "contribution", layer=0, head="0")) == (
        TypeError,
        "head must be an integer head index, got '0'",
    )
    # the command line has no query-head option; its index options share the message (--heads here)
    from geolens.commands._options import check_index
    from geolens.errors import UsageError

    with pytest.raises(UsageError) as err:
        check_index(9, 4, "heads", "--heads")
    assert str(err.value) == expected.replace("head=9", "--heads 9")


def test_an_unknown_model_name_is_one_message_with_did_you_mean(monkeypatch, tmp_path, capsys):
    import geolens
    from geolens.errors import UsageError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is not asked: the answer is the same everywhere
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    for name, hint in [("smollm2", "smollm2-135m"), ("tiny-gq", "tiny-gqa"), ("./no/such/model", None)]:
        calls = {
            "load_model": lambda: geolens.load_model(name),
            "load_model hf": lambda: geolens.load_model(name, backend="hf"),
            "attribute": lambda: geolens.attribute(name, TEXT),
            "evaluate_attribution": lambda: geolens.evaluate_attribution("contribution", name, TEXT),
        }
        found = {label: _raised(call) for label, call in calls.items()}
        kind, message = found["load_model"]
        assert kind is UsageError and issubclass(kind, ValueError)
        assert message.startswith(f"unknown model {name!r}")
        assert (f"(did you mean {hint!r}?)" in message) == (hint is not None) and "\n" not in message
        assert all(f == (UsageError, message) for f in found.values()), found
        # the command line (a command that takes the tiny models, as load_model does): the same text
        assert _cli_line(["taxonomy", "--model", name], capsys) == message


def test_several_texts_are_one_type_error_saying_what_to_use(tiny):
    import geolens
    from geolens.validation import check_text, text_tokens

    model, _, _ = tiny
    expected = (
        "text takes one text per call, got a list of 2 texts: call it once per text (a loop), or for a batch use "
        "the functional API (tokens = model.to_tokens(texts); _, cache = geolens.run_with_cache(model, tokens); "
        "geolens.contribution_weights(model, cache, layer))"
    )
    calls = {
        "attribute": lambda: geolens.attribute(model, ["the cat", "a dog"], "alti"),
        "text_tokens": lambda: text_tokens(model, ["the cat", "a dog"]),
        "check_text": lambda: check_text(["the cat", "a dog"]),
    }
    for name, call in calls.items():
        assert _raised(call) == (TypeError, expected), name
    assert _raised(lambda: geolens.attribute(model, ("the cat",), "alti"))[1].startswith(
        "text takes one text per call, got a tuple of 1 text: "
    )
    assert _raised(lambda: geolens.attribute(model, "", "alti")) == (
        ValueError,
        "text must be a non-empty string, got ''",
    )
    assert _raised(lambda: geolens.attribute(model, 7, "alti")) == (TypeError, "text must be a string, got int")
    # evaluate_attribution takes several texts by design (one document each): a list is no error there
    assert "a text or a list of texts" in geolens.evaluate_attribution.__doc__
