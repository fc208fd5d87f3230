"""MkDocs hook: the circuitsvis JavaScript bundle, once, for the pages that show a circuitsvis view.

The stored tutorials keep each circuitsvis view (its ``<div>`` and ``CircuitsVis.render(...)``
call, with the numbers) without the 1.3 MB bundle, inside a ``<div data-geolens-needs-bundle>``
(scripts/run_tutorials.py). This hook copies the bundle of the installed circuitsvis package to
``assets/javascripts/circuitsvis.js`` in the built site and loads it in the ``<head>`` of every
page holding such a view, before the views' own scripts run: the views are interactive on the site,
and the bundle is downloaded once, not once per view.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.utils import get_relative_url

BUNDLE_URL = "assets/javascripts/circuitsvis.js"
MARK = "data-geolens-needs-bundle"
_pages: set[str] = set()


def bundle_file() -> Path:
    """``circuitsvis/dist/cdn/iife.js`` of the installed circuitsvis (a geolens dependency)."""
    spec = importlib.util.find_spec("circuitsvis")
    path = Path(spec.origin).parent / "dist" / "cdn" / "iife.js" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise PluginError("docs/_hooks/circuitsvis.py: circuitsvis (with its dist/cdn/iife.js) is not installed")
    return path


def on_pre_build(config) -> None:
    _pages.clear()


def on_post_page(output: str, page, config) -> str:
    if MARK not in output:
        return output
    _pages.add(page.url)
    script = f'<script src="{get_relative_url(BUNDLE_URL, page.url)}"></script>\n'
    return output.replace("</head>", script + "</head>", 1)


def on_post_build(config) -> None:
    if _pages:
        target = Path(config["site_dir"]) / BUNDLE_URL
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle_file(), target)
