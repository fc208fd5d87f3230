"""Griffe extension for the documentation site: the lazy public names of ``geolens``.

``geolens/__init__.py`` imports nothing at import time: a PEP 562 ``__getattr__`` loads each public
name from the module its ``_PUBLIC`` dict names. Static analysis sees only that dict, so this
extension reads it and makes every ``geolens.<name>`` an alias of the object that defines it, so
that the API page can say ``::: geolens.<name>`` and the heading id is ``geolens.<name>``.

Where a package re-exports a function from a submodule of the same name
(``geolens.faithfulness.value_zeroing``), Python's attribute is the function while griffe's member
is the submodule; the alias then goes to the function inside that submodule.
"""

from __future__ import annotations

import ast
from typing import Any

from griffe import Alias, Extension, Module, Object


def public_names(pkg: Module) -> dict[str, str]:
    """The ``_PUBLIC`` dict of ``pkg`` (name -> defining module), or {} when it has none."""
    member = pkg.members.get("_PUBLIC")
    if member is None or getattr(member, "value", None) is None:
        return {}
    return ast.literal_eval(str(member.value))


def defining_object(pkg: Module, module_path: str, name: str) -> Object | None:
    try:
        obj = pkg.modules_collection[module_path].members[name]
        obj = obj.final_target if obj.is_alias else obj
        if obj.is_module and name in obj.members:  # the submodule shadowing its own function
            obj = obj.members[name]
            obj = obj.final_target if obj.is_alias else obj
    except Exception:  # a module or name griffe does not know: leave the member as it is
        return None
    return obj


class LazyExports(Extension):
    def on_package(self, *, pkg: Module, **kwargs: Any) -> None:
        for name, module_path in public_names(pkg).items():
            target = defining_object(pkg, module_path, name)
            if target is not None:
                pkg.set_member(name, Alias(name, target, parent=pkg))
