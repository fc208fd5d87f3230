"""The option checks of the commands (geolens.commands._options): argparse types whose messages name
the bound, layer specs resolved against the model and never wrapped, layer selections, indices from
the end, did-you-mean, and the parser whose errors are one-line UsageErrors."""

from __future__ import annotations

import argparse

import pytest

from geolens.commands._options import (
    ArgumentParser,
    check_index,
    check_indices,
    did_you_mean,
    float_in,
    float_list,
    int_at_least,
    int_list,
    layer_selection,
    layer_spec,
    positive_int,
    resolve_layers,
)
from geolens.errors import UsageError


def test_parse_layers_refuses_instead_of_wrapping():
    from geolens.commands.faithfulness import parse_layers
    from geolens.errors import UsageError

    assert parse_layers("-1", 10) == (9,)
    with pytest.raises(UsageError, match="99 is out of range"):
        parse_layers("99", 10)
    with pytest.raises(UsageError, match="empty"):
        parse_layers("5-2", 10)


def test_number_types_name_their_bounds():
    assert int_at_least(2)("2") == 2 and positive_int("7") == 7
    for parse, text, message in [
        (int_at_least(2), "1", "must be at least 2, got 1"),
        (positive_int, "x", "expected an integer, got 'x'"),
        (float_in(0, 1, low_open=True), "0", r"must be in \(0, 1\], got 0"),
        (float_in(0, 1), "nan", "expected a finite number, got 'nan'"),
        (float_in(0, 1), "1.5", r"must be in \[0, 1\], got 1.5"),
        (float_list(0, 1), "0.5, 2", r"every value must be in \[0, 1\], got 2"),
        (float_list(0), "", "expected comma-separated numbers"),
        (int_list(0), "1,-2", "every value must be at least 0, got -2"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(text)
    assert float_in(0, 1, high_open=True)("0") == 0.0 and float_list(0, 1)("0.1, 1") == [0.1, 1.0]
    assert int_list()("3, -1,") == [3, -1]


def test_layer_specs_resolve_against_the_model_and_indices_count_from_the_end():
    assert layer_spec(" late ") == "late" and layer_spec("20-29,-1") == "20-29,-1"
    with pytest.raises(argparse.ArgumentTypeError, match="expected 'all'"):
        layer_spec("3..5")
    assert resolve_layers("all", 10) is None
    assert resolve_layers("-1,2-4,3", 10) == (2, 3, 4, 9)  # sorted, each once
    assert check_index(-3, 10, "layers", "--layer") == 7 and check_indices(None, 4, "heads", "--heads") is None
    with pytest.raises(UsageError, match=r"--heads 4 is out of range: the model has 4 heads \(0…3, or -4…-1"):
        check_indices([0, 4], 4, "heads", "--heads")
    with pytest.raises(UsageError, match="--layer must be an integer, got True"):
        check_index(True, 10, "layers", "--layer")


def test_layer_selections():
    assert layer_selection("all", 4, "--x") == [0, 1, 2, 3] and layer_selection("", 4, "--x") == []
    assert layer_selection("every:2", 5, "--x") == [0, 2, 4] and layer_selection("3, 1", 4, "--x") == [3, 1]
    with pytest.raises(UsageError, match=r"^--x 4 is out of range: the model has 4 layers \(0…3\)$"):
        layer_selection("1,4", 4, "--x")
    with pytest.raises(UsageError, match="--x must be all, none, every:K"):
        layer_selection("every:0", 4, "--x")


def test_parser_errors_are_one_line_usage_errors_with_a_suggestion():
    assert did_you_mean("sinsk", ["sinks", "report"]) == " (did you mean 'sinks'?)"
    assert did_you_mean("zzzz", ["sinks", "report"]) == ""
    parser = ArgumentParser(prog="geolens demo")
    parser.add_argument("--mode", choices=["mean", "median"])
    with pytest.raises(UsageError, match=r"invalid choice: 'medain'.*\(did you mean 'median'\?\)$") as err:
        parser.parse_args(["--mode", "medain"])
    assert err.value.prog == "geolens demo" and "\n" not in str(err.value)
