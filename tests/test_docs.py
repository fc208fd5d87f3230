"""The packaging and documentation files: CITATION.cff, LICENSE, CHANGELOG.md, README.md, and the
MkDocs site (``mkdocs build --strict``, then the built pages in headless Chromium).

The site tests skip, with the reason, when mkdocs (the ``docs`` extra) or chromium is not
installed. ``docs/reliability.md`` is written separately; until it exists the site is built from a
shadow of ``docs/`` (symlinks) with a one-line stand-in for that page, and
``test_reliability_page_exists`` says so by skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "tests" / "data" / "cff-1.2.0-schema.json"
MAIN_JOB = "geolens report --quick --out report/"
TEST_COMMAND = "bash scripts/test.sh"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HAS_MKDOCS = all(
    importlib.util.find_spec(m) is not None for m in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter")
)
NEEDS_MKDOCS = pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs is not installed (pip install -e '.[docs]')")


def _version() -> str:
    text = (ROOT / "geolens" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, flags=re.M).group(1)


# --- docs/commands.md against the command-line parsers ------------------------------------------

SHARED_OPTIONS = {"--out", "--name", "--overwrite"}  # every writing command's; commands.md describes them once
CODE_BLOCK_COMMANDS = {"cache"}  # documented by a code block of its actions, not by an option table


def _parser_options() -> dict[str, dict[str, object]]:
    """Command → {option (first flag, or a positional's name): its argparse action}, shared options aside."""
    import argparse

    from geolens.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {
            (a.option_strings[0] if a.option_strings else a.dest): a
            for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and not SHARED_OPTIONS & set(a.option_strings)
        }
        for name, parser in sub.choices.items()
    }


def _documented_options() -> dict[str, dict[str, str]]:
    """Command → {option: its default cell} from the option tables of docs/commands.md (one ``## name`` section each)."""
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    out = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        rows = re.findall(r"^\| `([^`]+)` \| ([^|]*) \|", section, re.M)
        out[section.split()[0]] = {cell.split()[0]: default.strip().strip("`") for cell, default in rows}
    return out


def _default_text(default) -> str:
    return ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)


def test_commands_page_lists_every_option_of_every_command():
    """Each command's option table in docs/commands.md names exactly the options its parser has (the
    shared --out, --name, --overwrite aside), and a default written in the table is the parser's."""
    parsers, documented = _parser_options(), _documented_options()
    assert set(parsers) <= set(documented), sorted(set(parsers) - set(documented))
    for name, options in parsers.items():
        if name in CODE_BLOCK_COMMANDS:
            continue
        table = documented[name]
        assert set(table) == set(options), (
            name,
            "undocumented",
            sorted(set(options) - set(table)),
            "not an option",
            sorted(set(table) - set(options)),
        )
        wrong = {
            opt: (cell, _default_text(options[opt].default))
            for opt, cell in table.items()
            if cell and cell != _default_text(options[opt].default)
        }
        assert not wrong, (name, wrong)


def test_commands_page_names_the_pre_registered_runs():
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    for line in (
        "geolens flow --erasure --protocol docs/flow/protocol.json",
        "geolens flow --erasure --protocol docs/flow/v3/protocol.json",
        "geolens mc --protocol docs/faithfulness/protocol.json",
        "geolens sinks --controls-protocol docs/faithfulness/protocol.json",
        "geolens faithfulness --protocol docs/faithfulness/protocol.json --stage per_term",
    ):
        assert line in text, line
    for path in ("docs/flow/protocol.json", "docs/flow/v3/protocol.json", "docs/faithfulness/protocol.json"):
        assert (ROOT / path).is_file(), path


# --- (a) CITATION.cff ---------------------------------------------------------------------------


def test_citation_cff_validates_against_the_cff_1_2_0_schema():
    yaml = pytest.importorskip("yaml")
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    assert schema["$id"].startswith("https://citation-file-format.github.io/1.2.0/")
    # YAML dates become datetime.date objects; the schema wants strings (its own note says so).
    cff = json.loads(json.dumps(yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8")), default=str))
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(cff)]
    assert not errors, errors
    assert cff["cff-version"] == "1.2.0" and cff["version"] == _version() and cff["license"] == "MIT"
    arxiv = {i["value"] for r in cff["references"] for i in r.get("identifiers", [])}
    assert {"arXiv:2606.07604", "arXiv:2602.01893", "arXiv:2410.10781"} <= arxiv  # papers A, B, Gu et al.
    titles = " | ".join(r["title"] for r in cff["references"])
    assert "Attention is Not Only a Weight" in titles and "Quantifying Context Mixing" in titles


def test_the_cff_schema_rejects_a_broken_citation():
    """The validation has teeth: a citation without authors, or with a bad field, fails."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    good = {"cff-version": "1.2.0", "message": "m", "title": "t", "authors": [{"name": "a"}]}
    jsonschema.validate(good, schema)
    for bad in ({k: v for k, v in good.items() if k != "authors"}, {**good, "version": []}, {**good, "colour": "red"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


# --- (d) README, (e) LICENSE and CHANGELOG -------------------------------------------------------


def test_readme_is_short_and_names_the_main_job_and_the_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200, len(readme.splitlines())
    assert MAIN_JOB in readme and TEST_COMMAND in readme
    assert "docs/reliability.md" in readme


def test_readme_relative_links_point_at_files():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"[a-z]+:", t)]
    assert targets
    # docs/reliability.md is written separately (see the module docstring).
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists() and t != "docs/reliability.md"]
    assert not missing, missing


def _hf_quickstart() -> str:
    """The README's quickstart on the HF-native backend: the Python block with ``backend="hf"``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if 'backend="hf"' in b]
    assert len(blocks) == 1, f'expected one Python block with backend="hf" in README.md, found {len(blocks)}'
    return blocks[0]


def test_readme_has_a_short_hf_quickstart_and_links_the_support_matrix():
    code = _hf_quickstart()
    assert len(code.strip().splitlines()) <= 10, code
    assert "geolens.load_model(" in code and "geolens.run_with_cache(" in code
    assert "](docs/support.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_readme_hf_quickstart_runs():
    """The quickstart as printed, on the shipped SmolLM2: a transformers model, contribution rows
    summing to 1, and the pattern it read equal to transformers' own attention weights."""
    import torch
    from transformers import PreTrainedModel

    scope: dict = {}
    exec(compile(_hf_quickstart(), "README.md (HF quickstart)", "exec"), scope)
    model, tokens, cache, c = scope["model"], scope["tokens"], scope["cache"], scope["c"]
    assert isinstance(model, PreTrainedModel)
    n = tokens.shape[1]
    assert tuple(c.shape) == (1, model.cfg.n_heads, n, n)
    torch.testing.assert_close(c.sum(-1), torch.ones(1, model.cfg.n_heads, n), rtol=0, atol=1e-4)
    with torch.no_grad():
        attentions = model(input_ids=tokens, output_attentions=True).attentions  # the HF forward, not geolens'
    torch.testing.assert_close(cache["blocks.10.attn.hook_pattern"], attentions[10], rtol=0, atol=1e-6)


def test_license_and_changelog():
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "2026 the geolens authors" in license_text
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "Keep a Changelog" in changelog
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, flags=re.M)
    assert versions[:2] == [_version(), "0.1.0"] == ["0.2.0", "0.1.0"]
    for heading in ("### Added", "### Changed"):
        assert heading in changelog


# --- (b) the site builds with --strict -----------------------------------------------------------


def _shadow_docs(tmp: Path) -> Path:
    """A docs folder of symlinks to every entry of docs/, plus a stand-in reliability.md."""
    shadow = tmp / "docs"
    shadow.mkdir()
    for entry in (ROOT / "docs").iterdir():
        (shadow / entry.name).symlink_to(entry)
    (shadow / "reliability.md").write_text("# Reliability\n\nStand-in: docs/reliability.md is not written yet.\n")
    return shadow


def _config(tmp: Path) -> Path:
    """mkdocs.yml itself, or, while docs/reliability.md is missing, a copy of it on a shadow docs/."""
    if (ROOT / "docs" / "reliability.md").exists():
        return ROOT / "mkdocs.yml"
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config["docs_dir"] = str(_shadow_docs(tmp))
    config["hooks"] = [str(ROOT / h) for h in config.get("hooks", [])]
    for plugin in config["plugins"]:  # paths in the config are relative to its folder
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            options = plugin["mkdocstrings"]["handlers"]["python"]["options"]
            options["extensions"] = [str(ROOT / e) if isinstance(e, str) else e for e in options.get("extensions", [])]
    path = tmp / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not HAS_MKDOCS:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    tmp = tmp_path_factory.mktemp("site")
    out = tmp / "site"
    cmd = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--config-file",
        str(_config(tmp)),
        "--site-dir",
        str(out),
    ]
    start = time.perf_counter()
    run = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    )
    seconds = time.perf_counter() - start
    assert run.returncode == 0, (
        f"mkdocs build --strict failed after {seconds:.0f} s:\n{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    )
    return out


@NEEDS_MKDOCS
def test_site_builds_strict_with_every_page(site):
    for page in (
        "index.html",
        "getting-started/index.html",
        "method/index.html",
        "commands/index.html",
        "api/index.html",
        "results/index.html",
        "benchmarks/index.html",
        "reliability/index.html",
        "contributing/index.html",
        "models/index.html",
        "tl-notes/index.html",
    ):
        assert (site / page).is_file(), page
    assert not (site / "_hooks").exists()  # the griffe extension is not published
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    assert size < 60 * 2**20, f"the built site takes {size / 2**20:.1f} MiB"


@NEEDS_MKDOCS
def test_site_renders_the_stored_tutorials_with_their_outputs(site):
    notebooks = sorted((ROOT / "tutorials").glob("*.ipynb"))
    assert len(notebooks) >= 6
    for nb in notebooks:
        html = (site / "tutorials" / nb.stem / "index.html").read_text(encoding="utf-8")
        assert "jp-OutputArea" in html, nb.name  # outputs shown, not only the source
    assert "<img" in (site / "tutorials" / "02_sinks" / "index.html").read_text(encoding="utf-8")


TUTORIAL_01 = Path("tutorials") / "01_contribution_weights" / "index.html"


def _views(html: str) -> dict[str, str]:
    """{component id: its div's inner HTML} of every circuitsvis view on a page (any attribute order)."""
    views = {}
    for div in re.finditer(r'<div ([^>]*class="geolens-circuitsvis"[^>]*)>(.*?)</div>\s*<script>', html, flags=re.S):
        views[re.search(r'id="([^"]+)"', div.group(1)).group(1)] = div.group(2)
    return views


@NEEDS_MKDOCS
def test_tutorial_circuitsvis_views_are_on_the_site(site):
    """Tutorial 01 stores its circuitsvis views without the bundle; the page loads the bundle once
    (docs/_hooks/circuitsvis.py) from the site's assets, a copy of the installed circuitsvis'."""
    from geolens.viz.common import circuitsvis_bundle

    html = (site / TUTORIAL_01).read_text(encoding="utf-8")
    assert "not stored" not in html
    assert len(_views(html)) >= 4 and html.count("var CircuitsVis") == 0
    assert html.count('<script src="../../assets/javascripts/circuitsvis.js"></script>') == 1
    bundle = (site / "assets" / "javascripts" / "circuitsvis.js").read_text(encoding="utf-8")
    assert bundle.replace("</script>", "") == circuitsvis_bundle()
    assert "circuitsvis.js" not in (site / "api" / "index.html").read_text(encoding="utf-8")  # only where needed


@NEEDS_MKDOCS
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (bash scripts/install.sh --browser)")
def test_tutorial_circuitsvis_views_render_in_headless_chromium(site):
    views = _views(_dump_dom(site / TUTORIAL_01))
    assert len(views) >= 4
    empty = [cid for cid, inner in views.items() if len(inner) < 200]
    assert not empty, f"circuitsvis views that did not render: {empty}"
    assert sum(inner.count("<canvas") for inner in views.values()) >= 2 * 10  # two AttentionHeads of 9 heads + zoom
    assert any('class="colored-tokens"' in inner for inner in views.values())


@NEEDS_MKDOCS
def test_api_page_documents_the_public_api(site):
    import ast

    tree = ast.parse((ROOT / "geolens" / "__init__.py").read_text())
    names = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    )
    html = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [n for n in names if f'id="geolens.{n}"' not in html]
    assert not missing, missing
    assert "&gt;&gt;&gt; " in html and "<blockquote>" not in html  # doctests shown as code, not quotes


RAW_ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj|const):`")


def _outside_code(html: str) -> str:
    """``html`` without its ``<pre>`` blocks and ``<code>`` spans (where a role may be shown on purpose)."""
    return re.sub(r"<pre\b.*?</pre>|<code\b.*?</code>", "", html, flags=re.S)


@NEEDS_MKDOCS
def test_site_shows_no_raw_sphinx_role(site):
    """Every ``:func:`x``` (and ``:class:``, ``:mod:``, ...) of the docstrings is a link or code on the
    site (docs/_hooks/griffe_roles.py), on every page, never the raw role."""
    raw = {
        str(page.relative_to(site)): RAW_ROLE.findall(_outside_code(page.read_text(encoding="utf-8")))[:3]
        for page in site.rglob("*.html")
    }
    raw = {page: found for page, found in raw.items() if found}
    assert not raw, raw
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"::\s*</p>", _outside_code(api))  # reST "Example::" shows as "Example:"
    assert 'class="autorefs autorefs-internal"' in api  # roles whose target is on the page are links
    assert 'href="#geolens.contribution_weights"><code>contribution_weights</code></a>' in api


def test_sphinx_roles_become_optional_references():
    """The rewrite itself: resolved in the docstring's scope, ``~`` keeps the last name, code untouched."""
    griffe = pytest.importorskip("griffe")
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        from griffe_roles import rewrite_roles
    finally:
        sys.path.remove(str(ROOT / "docs" / "_hooks"))
    pkg = griffe.load("geolens", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)
    text = "See :func:`contribution_weights`, :class:`~geolens.adapter.AttentionLayer`, ``:func:`x` ``.\n"
    out = rewrite_roles(text + "```pycon\n>>> ':mod:`y`'\n```", pkg["contributions"])
    assert '<autoref identifier="geolens.contributions.contribution_weights" optional>' in out
    assert "<code>contribution_weights</code></autoref>" in out
    assert '<autoref identifier="geolens.adapter.layer.AttentionLayer" optional><code>AttentionLayer</code>' in out
    assert "``:func:`x` ``" in out and ">>> ':mod:`y`'" in out  # literals and code fences are left alone


def test_rest_literal_blocks_become_python_fences():
    pytest.importorskip("griffe", reason="the docs extra (griffe) is not installed here")
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        from griffe_doctest import fence_literal_blocks
    finally:
        sys.path.remove(str(ROOT / "docs" / "_hooks"))
    text = "Keep it.\n\nExample::\n\n    x = f(1)\n    y = 2\n\n>>> f(1)\n3\nNot a block::\nend"
    assert fence_literal_blocks(text) == (
        "Keep it.\n\nExample:\n\n```python\nx = f(1)\ny = 2\n```\n\n>>> f(1)\n3\nNot a block::\nend"
    )


def _signature_width() -> int:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    plugin = next(p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    options = plugin["handlers"]["python"]["options"]
    assert options["separate_signature"] is True
    return options["line_length"]


@NEEDS_MKDOCS
def test_api_signatures_fit_the_page(site):
    """Signatures are formatted (ruff, from the docs extra) to ``line_length``: none runs off the page
    (and docs/stylesheets/extra.css wraps any that would)."""
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"\.doc-signature pre code \{[^}]*white-space: pre-wrap", css)
    assert 'href="../stylesheets/extra.css"' in (site / "api" / "index.html").read_text(encoding="utf-8")
    if importlib.util.find_spec("ruff") is None and importlib.util.find_spec("black") is None:
        pytest.skip("neither ruff nor black is installed: mkdocstrings leaves signatures on one line")
    import html as html_lib

    width = _signature_width()
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    signatures = re.findall(r'<div class="doc-signature highlight"><pre>(.*?)</pre>', api, flags=re.S)
    assert len(signatures) >= 20
    long = {}
    for sig in signatures:
        text = html_lib.unescape(re.sub(r"<[^>]+>", "", sig))
        long.update({line: len(line) for line in text.splitlines() if len(line) > width})
    assert not long, long
    load_model = next(s for s in signatures if "load_model" in s)
    assert "max_memory" in load_model and len(html_lib.unescape(re.sub(r"<[^>]+>", "", load_model)).splitlines()) > 3


def test_reliability_page_exists():
    if not (ROOT / "docs" / "reliability.md").exists():
        pytest.skip("docs/reliability.md is not written yet (the site tests build with a stand-in)")


# --- (c) the built pages in headless Chromium ----------------------------------------------------


def _dump_dom(page: Path) -> str:
    """The DOM of ``page`` after headless Chromium ran its scripts, through the browser tests' one
    launcher (:func:`chromium.run_chromium`: process group killed at its limit, one retry)."""
    from chromium import run_chromium

    run = run_chromium(page, "--dump-dom")
    if run.returncode == 0 and "</html>" in run.stdout:
        return run.stdout
    pytest.fail(f"chromium printed no DOM for {page}: exit {run.returncode}, {run.stderr[-500:]}")


def _headings(dom: str) -> list[str]:
    return [re.sub(r"<[^>]+>|¶", "", h).strip() for h in re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", dom, flags=re.S)]


@NEEDS_MKDOCS
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (bash scripts/install.sh --browser)")
def test_built_pages_in_headless_chromium(site):
    index = _dump_dom(site / "index.html")
    assert {"geolens", "Sources", "Where to go next"} <= set(_headings(index)), _headings(index)
    assert 'class="md-search' in index  # the theme's search, rendered by its scripts
    api = _dump_dom(site / "api" / "index.html")
    headings = _headings(api)
    for expected in (
        "API reference",
        "Contribution weights",
        "Attention sinks",
        "Faithfulness",
        "contribution_weights",
    ):
        assert any(expected in h for h in headings), (expected, headings)
    assert "contribution_weights" in api and "value_zeroing" in api


@pytest.mark.slow
def test_readme_attribute_quickstart_runs():
    """The README's first Python block, as printed, on the shipped SmolLM2: three methods' scores
    of every token, a labelled table and a Figure."""
    from matplotlib.figure import Figure

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "geolens.attribute(" in b]
    scope: dict = {}
    exec(compile(code, "README.md (attribute quickstart)", "exec"), scope)
    att = scope["att"]
    assert att.level == "model" and att.scores.shape == (3, len(att.tokens))
    assert list(att.to_dataframe().columns)[:2] == ["position", "token"]
    assert isinstance(att.plot(), Figure)
