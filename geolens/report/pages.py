"""The HTML pages of the report, rendered from the jinja2 templates in ``geolens/report/templates``.

``base.html.j2`` holds the page frame and the one stylesheet (``style.css``) that both pages use;
``report.html.j2`` (:func:`geolens.report.document.render_html`) and ``compare.html.j2``
(:func:`geolens.report.compare.render_compare_html`) extend it. Every value is HTML-escaped by the
template unless the template marks it ``| safe`` (markup geolens builds itself: circuitsvis views,
pandas tables, citations).
"""

from __future__ import annotations

from functools import lru_cache

import jinja2


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("geolens.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a value the page needs and was not given is an error
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_page(template: str, **context) -> str:
    """``template`` (a file of ``geolens/report/templates``) rendered with ``context``."""
    return _environment().get_template(template).render(**context)
