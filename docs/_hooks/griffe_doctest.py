"""Griffe extension for the documentation site: doctest blocks and reST literal blocks as code.

geolens docstrings carry runnable ``>>>`` examples (run by tests/test_public_api.py) outside any
"Examples:" section. Markdown would read their ``>>>`` prefixes as nested block quotes; this
extension wraps each run of doctest lines (prompts, continuations and the expected output up to
the next blank line) in a ``pycon`` code fence before mkdocstrings parses the docstring, and each
reST literal block (``Example::`` then an indented block) in a ``python`` fence, without the
``::``. It changes only how the site shows the docstrings, never the docstrings themselves.
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


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def fence_literal_blocks(text: str) -> str:
    """reST literal blocks (a paragraph ending in ``::``, then an indented block) as ``python`` fences.

    As reST reads them: ``Example::`` shows as ``Example:``, ``Example ::`` as ``Example``, and a
    line that is only ``::`` disappears.
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if not in_fence and stripped.endswith("::") and not stripped.startswith(">>>"):
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            end = j
            while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > _indent(line)):
                end += 1
            while end > j and not lines[end - 1].strip():
                end -= 1
            if j > i + 1 and end > j:  # a blank line, then an indented block
                pad = line[: _indent(line)]
                depth = min(_indent(b) for b in lines[j:end] if b.strip())
                head = (
                    stripped[:-2].rstrip() + (":" if not stripped.endswith(" ::") else "") if stripped != "::" else ""
                )
                out += [pad + head, ""] if head else []
                out += [f"{pad}```python", *(pad + b[depth:] for b in lines[j:end]), f"{pad}```"]
                i = end
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestFences(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None and "::" in obj.docstring.value:
            obj.docstring.value = fence_literal_blocks(obj.docstring.value)
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
