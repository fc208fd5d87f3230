"""Subcommands of the ``geolens`` CLI, one module each (see :mod:`geolens.cli`).

**The lazy-import rule.** ``geolens --version``, ``geolens --help``, ``geolens <command> --help``
and every argument error answer at once: building the parser and parsing the arguments import
no torch, TransformerLens, transformers, pandas, numpy or matplotlib. So :mod:`geolens.cli`, every
module here and what they import at module level (:mod:`geolens.commands._options`,
:mod:`geolens.commands._names`, :mod:`geolens.errors`) import only the standard library and light
geolens modules; heavy modules are imported inside the functions that run a command (``run``) and
inside the validators that need them. A constant a parser shows (a ``choices`` list, a default,
a help text) comes from :mod:`geolens.commands._names`, a copy that ``tests/test_cli_imports.py``
checks against its source, and that test runs the CLI in subprocesses to check the rule.
"""
