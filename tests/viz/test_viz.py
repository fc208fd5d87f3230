"""geolens.viz as a whole: every figure function returns what its name and docstring say (HTMLView or
PlotView). Each module's own tests: tests/viz/test_<module>.py."""

from __future__ import annotations

from pathlib import Path

HELPERS = {  # public functions of geolens.viz that draw nothing: they prepare what the figures show
    "str_tokens",
    "coinciding_curves",
    "fraction_ticks",
    "shown_token",
    "attribution_figure",  # the matplotlib Figure of Attribution.plot()
    "score_unit",  # the axis label of a method's scores, from the registry
    "drift_title",  # the line a drift figure's title reads
}


def test_every_viz_function_returns_what_its_name_and_docstring_say():
    """geolens.viz's rule (its module docstring): figure functions return HTMLView or PlotView,
    ``*_html`` and ``*_page`` functions a str, attribution_figure a matplotlib Figure."""
    import importlib
    import inspect
    import pkgutil
    import typing

    import geolens.viz

    wrong = []
    for info in pkgutil.iter_modules(geolens.viz.__path__):
        module = importlib.import_module(f"geolens.viz.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("_") or fn.__module__ != module.__name__ or info.name == "common":
                continue
            returns = typing.get_type_hints(fn).get("return") if fn.__annotations__.get("return") else None
            if name in HELPERS:
                continue
            if name.startswith("save_"):
                ok = returns is Path
            elif name.endswith(("_html", "_page")):
                ok = returns is str
            else:
                ok = returns in (geolens.viz.HTMLView, geolens.viz.PlotView) or (
                    typing.get_origin(returns) is tuple and geolens.viz.PlotView in typing.get_args(returns)
                )
            if not ok:
                wrong.append(f"geolens.viz.{info.name}.{name} -> {returns}")
    assert not wrong, wrong
