"""Tests of geolens.report (a package, so that test files of different areas may share a name)."""
