"""Griffe extension for the documentation site: Sphinx roles as cross-references.

geolens docstrings name other objects with Sphinx roles (``:func:`contribution_weights```,
``:class:`~geolens.adapter.AttentionLayer```, ``:mod:`geolens.sinks```, ...). Markdown has no such
syntax and would print them raw. This extension rewrites each role, before mkdocstrings parses the
docstring, into an *optional* autorefs reference whose text is the name in code: a link where the
target is documented on the site, plain code where it is not (an optional reference never fails
the strict build). The target is resolved the way Python would read the name in the docstring's
scope (its object, then the enclosing class and module, then the ``geolens`` package). A leading
``~`` shows only the last component, as in Sphinx. Code fences and ``literal`` spans are left alone. It
changes only how the site shows the docstrings, never the docstrings themselves.
"""

from __future__ import annotations

import html
import re
from typing import Any

from griffe import Extension, NameResolutionError, Object

ROLES = ("func", "meth", "class", "mod", "attr", "data", "exc", "obj", "const")
ROLE = re.compile(r":(?:py:)?(?:" + "|".join(ROLES) + r"):`(?P<target>[^`]+)`")
# Code the rewrite must not touch: fenced blocks and ``literal`` spans. One scan from the left,
# roles first, so a role's own backticks are never taken for code.
TOKEN = re.compile(r"(?P<role>" + ROLE.pattern + r")|(?ms:^[ \t]*```.*?^[ \t]*```[ \t]*$)|``[^\n]+?``")


def _lookup(root: Object, path: str) -> Object | None:
    """The object at the dotted ``path`` under the package ``root``, following aliases."""
    if path != root.path and not path.startswith(root.path + "."):
        return None
    obj = root
    for part in path[len(root.path) + 1 :].split(".") if path != root.path else ():
        try:
            obj = obj.members[part]
            if obj.is_alias:
                obj = obj.final_target
        except Exception:  # an unknown member, or an alias griffe cannot follow
            return None
    return obj


def resolve(scope: Object, name: str) -> str | None:
    """The canonical path of ``name`` as read in ``scope``, or None when it is not in geolens."""
    name = name.lstrip(".")
    root = scope.package
    head, _, rest = name.partition(".")
    candidates = []
    try:
        candidates.append(scope.resolve(head) + ("." + rest if rest else ""))
    except NameResolutionError:
        pass
    candidates += [name, f"{root.path}.{name}"]
    for path in candidates:
        obj = _lookup(root, path)
        if obj is not None:
            return obj.canonical_path
    return None


def rewrite_roles(text: str, scope: Object) -> str:
    """``text`` with every role outside code replaced by an optional autorefs reference."""

    def reference(match: re.Match) -> str:
        target = match["target"].strip()
        short = target.startswith("~")
        target = target.lstrip("~!")
        shown = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
        identifier = resolve(scope, target) or target.lstrip(".")
        return f'<autoref identifier="{html.escape(identifier)}" optional><code>{html.escape(shown)}</code></autoref>'

    return TOKEN.sub(lambda m: reference(m) if m["role"] else m.group(), text)


class SphinxRoles(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = rewrite_roles(obj.docstring.value, obj)
