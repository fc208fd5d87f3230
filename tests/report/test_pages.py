"""The report's HTML pages (geolens.report.pages): rendered from the package's templates, values
escaped unless the template marks them safe, the one stylesheet inlined, and a value the page needs
but was not given an error instead of an empty string."""

from __future__ import annotations

import jinja2
import pytest

from geolens.report.pages import render_page


def test_the_base_page_inlines_the_stylesheet_and_escapes_values():
    page = render_page("base.html.j2", page_class='x" onload="alert(1)', references="<ol><li>ref</li></ol>")
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "</style>" in page
    css = (jinja2.PackageLoader("geolens.report", "templates").get_source(jinja2.Environment(), "style.css"))[0]
    assert css.strip() and css.strip() in page  # the stylesheet, inlined once
    assert 'class="x&#34; onload=&#34;alert(1)"' in page  # an attribute value cannot break out
    assert "<ol><li>ref</li></ol>" in page  # markup geolens builds is marked safe by the template


def test_a_missing_value_is_an_error_not_an_empty_string():
    with pytest.raises(jinja2.UndefinedError, match="references"):
        render_page("base.html.j2", page_class="")
    with pytest.raises(jinja2.TemplateNotFound):
        render_page("no_such_page.html.j2")
