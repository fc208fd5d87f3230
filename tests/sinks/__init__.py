"""Tests of geolens.sinks (a package, so that test files of different areas may share a name)."""
