"""Tests of geolens.viz (a package, so that test files of different areas may share a name)."""
