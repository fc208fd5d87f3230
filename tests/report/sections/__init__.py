"""Tests of geolens.report.sections: one file per section."""
