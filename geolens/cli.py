"""``geolens`` command line: one subcommand per module of :mod:`geolens.commands`.

Each module ``geolens/commands/<name>.py`` defines ``register(subparsers)`` (adds its parser
and sets ``func``), so capabilities add commands without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import geolens.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geolens", description="Geometry of attention for TransformerLens models.")
    parser.add_argument("--version", action="version", version=f"geolens {geolens.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(geolens.commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"geolens.commands.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
