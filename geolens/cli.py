"""``geolens`` command line: one subcommand per module of :mod:`geolens.commands`.

Each module ``geolens/commands/<name>.py`` defines ``register(subparsers)`` (adds its parser
and sets ``func``), so capabilities add commands without touching this file.

User errors (:class:`geolens.commands._options.UsageError`, argparse errors included) are printed
as one line ``geolens <command>: error: <message>`` on stderr, with exit code 2 and no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import geolens
import geolens.commands
from geolens.commands._options import ArgumentParser, UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="geolens", description="Geometry of attention for TransformerLens models.")
    parser.add_argument("--version", action="version", version=f"geolens {geolens.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(geolens.commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"geolens.commands.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            command = getattr(args, "command", None)
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}", prog=f"geolens {command}" if command else None)
    except UsageError as err:
        print(f"{err.prog or parser.prog}: error: {err}", file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    import torch

    grad = torch.is_grad_enabled()  # commands turn autograd off; a caller's setting is restored
    try:
        return int(args.func(args) or 0)
    except UsageError as err:
        print(f"{err.prog or f'geolens {args.command}'}: error: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_grad_enabled(grad)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
