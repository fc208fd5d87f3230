"""Subcommands of the ``geolens`` CLI, one module each (see :mod:`geolens.cli`)."""
