"""Shared helpers of the viz tests: ``component_props``, a circuitsvis component's props as the page
reads them (imported as ``from viz.conftest import component_props``)."""

from __future__ import annotations

import json
import re

from geolens.viz.common import Component


def component_props(component: Component) -> dict:
    """The props as the page will read them (through the JSON in the script tag)."""
    markup = component.markup()
    body = re.search(r"CircuitsVis\.render\(\"[^\"]+\", CircuitsVis\.\w+, (.*)\);</script>", markup, re.S).group(1)
    return json.loads(body)
