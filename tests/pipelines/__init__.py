"""Tests of geolens.pipelines (a package, so that test files of different areas may share a name)."""
