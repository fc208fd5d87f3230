"""Tests of geolens.per_term: one file per module."""
