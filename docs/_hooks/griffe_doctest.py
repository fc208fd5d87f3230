"""Griffe extension for the documentation site: doctest blocks as code.

geolens docstrings carry runnable ``>>>`` examples (run by tests/test_public_api.py) outside any
"Examples:" section. Markdown would read their ``>>>`` prefixes as nested block quotes; this
extension wraps each run of doctest lines (prompts, continuations and the expected output up to
the next blank line) in a ``pycon`` code fence before mkdocstrings parses the docstring. It
changes only how the site shows the docstrings, never the docstrings themselves.
"""

from __future__ import annotations

from typing import Any

from griffe import Extension, Object


def fence_doctests(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].strip())
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestFences(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
