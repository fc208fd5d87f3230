"""The text argument of ``geolens analyze`` / ``geolens flow``: tokenised, never cut silently.

A text longer than the model's context is refused in one line giving its token count and the
limit; ``--truncate`` keeps its first ``n_ctx`` tokens, and the command then says so.
"""

from __future__ import annotations


def add_truncate_option(parser) -> None:
    parser.add_argument(
        "--truncate",
        action="store_true",
        help="a text longer than the model's context: keep its first n_ctx tokens (and say so) instead of refusing it",
    )


def command_text_tokens(model, text: str, *, truncate: bool):
    """``([1, pos] token ids of text with BOS first, its full length)`` (:func:`geolens.validation.text_tokens`);
    a :class:`~geolens.errors.UsageError` for a text beyond the context without ``--truncate``.
    When ``--truncate`` cut it, one line on stdout says so (the full length exceeds ``pos``)."""
    import warnings

    from geolens.errors import UsageError
    from geolens.validation import text_tokens

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            tokens = text_tokens(model, text, prepend_bos=True, truncate=truncate)
        except ValueError as err:
            raise UsageError(str(err).replace("pass truncate=True", "pass --truncate")) from None
    n_full = int(tokens.shape[1])
    for w in caught:
        if "truncated to the model's context" in str(w.message):
            print(f"note: {w.message} (--truncate); the later tokens are not analysed")
            n_full = int(str(w.message).split(" tokens long")[0].rsplit(" ", 1)[-1])
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return tokens, n_full
