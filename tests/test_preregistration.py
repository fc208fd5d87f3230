"""Pre-registered studies (geolens.preregistration) and resume that checks what it resumes (geolens.resume).

A run is "pre-registered" only when the protocol's text and JSON twin are the registered ones
(REGISTERED.json), git confirms the registration (its commit exists, holds those files and precedes
the run's commit; outside a checkout, the registry geolens carries), and the run follows the
protocol; otherwise it is "exploratory", names why, and decides no pair. The git repositories here
are real ones, made in tmp_path. Every resumable run refuses, in one line and without a traceback, a progress
record or saved rows that do not add up (an edited count, a damaged gzip, another model).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import git, git_commit, make_tiny, random_corpus, register_in_git

from geolens.cli import main
from geolens.preregistration import NOT_DECIDED, load_protocol, preregistration, register, withhold_verdicts

ROOT = Path(__file__).resolve().parents[1]
FAITHFULNESS = ROOT / "docs" / "faithfulness"
FLOW = ROOT / "docs" / "flow"
DECIDING = ("holds", "reversed")


def copy_protocol(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("PROTOCOL.md", "protocol.json", "REGISTERED.json"):
        shutil.copy(src / name, dst / name)
    return dst / "protocol.json"


def edit_json(path: Path, change) -> None:
    spec = json.loads(path.read_text(encoding="utf-8"))
    change(spec)
    path.write_text(json.dumps(spec, indent=2), encoding="utf-8")


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------------------------------------
# Registration: both hashes, and the run's own settings


REGISTERED = sorted(p.parent for p in (ROOT / "docs").rglob("REGISTERED.json"))


def test_every_registered_protocol_in_docs_is_checked():
    names = {str(f.relative_to(ROOT / "docs")) for f in REGISTERED}
    assert {"faithfulness", "faithfulness/v3", "faithfulness/v3/masking", "flow", "flow/v2", "flow/v3"} <= names


@pytest.mark.parametrize("folder", REGISTERED, ids=lambda f: str(f.relative_to(ROOT / "docs")))
def test_the_protocols_in_docs_are_registered_and_intact_copies_stay_pre_registered(folder, tmp_path):
    registered = json.loads((folder / "REGISTERED.json").read_text())
    if (folder / "PROTOCOL.sha256").exists():  # the first versions also froze the text in a file of its own
        assert registered["text_sha256"] == (folder / "PROTOCOL.sha256").read_text().strip()
    protocol = load_protocol(folder / "protocol.json")
    assert protocol.json_sha256 == registered["json_sha256"] and protocol.hash_reasons() == []
    in_docs = preregistration(protocol, [])  # git confirms it: the commit, its files, an ancestor of HEAD
    from geolens.preregistration import checkout_of

    if checkout_of(ROOT) == ROOT.resolve() and git(ROOT, "rev-parse", "--is-shallow-repository") != "true":
        assert in_docs["status"] == "pre-registered" and in_docs["checked_against"] == "git", in_docs["reasons"]
        assert in_docs["registered_commit"].startswith(registered["commit"])
    # a shallow clone lacks the registration's commit: git cannot confirm it there (the copy below
    # still checks the registry that geolens carries)
    copy = load_protocol(copy_protocol(folder, tmp_path / "copy"))  # outside any checkout: the registry
    record = preregistration(copy, [])
    assert {k: record[k] for k in ("status", "text_sha256", "json_sha256", "reasons", "checked_against")} == dict(
        status="pre-registered",
        text_sha256=protocol.sha256,
        json_sha256=protocol.json_sha256,
        reasons=[],
        checked_against="registry",
    )
    assert record["registered_commit"] == registered["commit"]


@pytest.mark.parametrize(
    "edit, words",
    [
        ("text", "PROTOCOL.md was edited after registration"),
        ("json whitespace", "protocol.json was edited after registration"),
        ("added model", "protocol.json was edited after registration"),
        ("n_documents", "protocol.json was edited after registration"),
        ("unregistered", "not registered"),
    ],
)
@pytest.mark.parametrize("folder", [FAITHFULNESS, FLOW])
def test_an_edited_protocol_is_exploratory_and_names_the_edit(folder, edit, words, tmp_path):
    path = copy_protocol(folder, tmp_path / "copy")
    if edit == "text":
        (path.parent / "PROTOCOL.md").write_text(
            (path.parent / "PROTOCOL.md").read_text() + "\nEdited.\n", encoding="utf-8"
        )
    elif edit == "json whitespace":  # the same settings, another file: the JSON alone is hashed too
        path.write_text(path.read_text() + "\n", encoding="utf-8")
    elif edit == "added model":
        edit_json(path, lambda s: s["data"]["models"].append("tiny-gqa"))
    elif edit == "n_documents":
        edit_json(path, lambda s: s["data"].update(n_documents=1))
    else:
        (path.parent / "REGISTERED.json").unlink()
    record = preregistration(load_protocol(path), ["model tiny-gqa is not one of the protocol's models"])
    assert record["status"] == "exploratory" and any(words in r for r in record["reasons"]), record
    assert record["reasons"][-1].startswith("model tiny-gqa")  # the run's own differences are named too
    assert len(record["text_sha256"]) == len(record["json_sha256"]) == 64


def test_withheld_verdicts_are_a_word_never_none():
    pairs = [dict(verdict=v, estimate=0.1) for v in ("holds", "reversed", "tie", None, "not testable")]
    out = withhold_verdicts(pairs)
    assert [p["verdict"] for p in out] == [NOT_DECIDED] * 4 + ["not testable"]
    assert all(p["estimate"] == 0.1 for p in out) and pairs[0]["verdict"] == "holds"  # a copy


def test_register_writes_both_hashes(tmp_path):
    path = copy_protocol(FLOW, tmp_path / "p")
    (path.parent / "REGISTERED.json").unlink()
    record = register(path, registered_at="2026-12-06", commit="abc")
    assert json.loads((path.parent / "REGISTERED.json").read_text()) == record
    assert preregistration(load_protocol(path), [])["status"] == "pre-registered"


# ---------------------------------------------------------------------------------------------
# Registration checked against history: real git repositories made in tmp_path


def test_the_registry_geolens_carries_matches_the_registrations_in_docs():
    """registered_protocols.json (checked outside a git checkout) is generated from docs/**/REGISTERED.json:
    regenerate it with ``python -c 'from geolens.preregistration import write_registry; write_registry()'``."""
    from geolens.preregistration import REGISTRY, registry, registry_from

    assert registry() == registry_from(ROOT / "docs")
    assert REGISTRY.name in (ROOT / "pyproject.toml").read_text()  # shipped with the package


@pytest.fixture
def repo(tmp_path):
    """A git repository holding a copy of docs/flow's text and twin, registered as a study does."""
    folder = tmp_path / "repo" / "study"
    copy_protocol(FLOW, folder)
    git(tmp_path / "repo", "init", "-q")
    (folder / "REGISTERED.json").unlink()
    commit = register_in_git(folder / "protocol.json")
    return folder / "protocol.json", commit


def _record(path):
    return preregistration(load_protocol(path), [])


def test_a_registration_that_git_confirms_is_pre_registered_and_names_both_commits(repo):
    path, commit = repo
    record = _record(path)
    assert record["status"] == "pre-registered" and record["reasons"] == []
    assert record["checked_against"] == "git" and record["registered_commit"] == commit
    assert record["run_commit"] == git(path.parent, "rev-parse", "HEAD") != commit  # REGISTERED.json came after
    assert record["working_tree"] == "clean"
    (path.parent / "notes.md").write_text("untracked: still clean\n")
    assert _record(path)["working_tree"] == "clean"
    git_commit(path.parent, "notes")
    (path.parent / "notes.md").write_text("edited\n")
    assert _record(path)["working_tree"] == "dirty"


@pytest.mark.parametrize("commit_it", [False, True], ids=["uncommitted", "committed"])
def test_an_edited_protocol_with_regenerated_registration_naming_the_old_commit_is_exploratory(repo, commit_it):
    """The probe of issue #46: text and JSON edited, REGISTERED.json rewritten with their hashes."""
    path, commit = repo
    (path.parent / "PROTOCOL.md").write_text("# An edited protocol\n", encoding="utf-8")
    edit_json(path, lambda s: s["data"]["models"].append("tiny-gqa"))
    register(path, registered_at="2026-12-06", commit=commit)
    if commit_it:
        git_commit(path.parent, "edit the protocol")
    record = _record(path)
    assert record["status"] == "exploratory" and not any("edited after registration" in r for r in record["reasons"])
    assert [r.split(" at the registration's commit")[0] for r in record["reasons"]] == [
        "study/PROTOCOL.md",
        "study/protocol.json",
    ]
    assert all(f"{commit[:12]} is not the registered file" in r for r in record["reasons"])


def test_a_regenerated_registration_naming_no_commit_is_exploratory(repo):
    path, _ = repo
    (path.parent / "PROTOCOL.md").write_text("# An edited protocol\n", encoding="utf-8")
    record = register(path, registered_at="2026-12-06")  # not committed: no commit to name
    assert "commit" not in record
    reasons = _record(path)["reasons"]
    assert reasons == [f"{path.parent / 'REGISTERED.json'} names no commit, so git cannot confirm the registration"]


def test_a_registration_commit_that_is_not_in_the_history_is_exploratory(repo):
    path, _ = repo
    register(path, registered_at="2026-12-06", commit="3838674")  # the masking addendum's, missing here too
    git_commit(path.parent, "a registration naming a commit this repository does not have")
    record = _record(path)
    assert record["status"] == "exploratory"
    assert record["reasons"] == [
        f"the registration's commit 3838674 is not in the repository {path.parent.parent.resolve()} "
        "(git cat-file finds no such commit)"
    ]


def test_a_registration_commit_that_is_not_an_ancestor_of_the_run_is_exploratory(repo):
    """Registered on a branch the run's commit does not descend from (a rewritten or unmerged history)."""
    path, _ = repo
    folder = path.parent
    main = git(folder, "rev-parse", "--abbrev-ref", "HEAD")
    git(folder, "checkout", "-q", "-b", "side")
    (folder / "side.txt").write_text("only on the side branch\n")
    side = git_commit(folder, "the side branch")
    git(folder, "checkout", "-q", main)
    register(path, registered_at="2026-12-06", commit=side)
    git_commit(folder, "a registration naming the side branch")
    record = _record(path)
    head = git(folder, "rev-parse", "HEAD")
    assert record["reasons"] == [
        f"the registration's commit {side[:12]} is not an ancestor of this run's commit {head[:12]}"
    ]


def test_outside_a_checkout_only_the_published_protocols_are_pre_registered(tmp_path):
    path = copy_protocol(FAITHFULNESS, tmp_path / "copy")
    assert _record(path)["status"] == "pre-registered"  # the registry geolens carries has its hashes
    (path.parent / "PROTOCOL.md").write_text("# An edited protocol\n", encoding="utf-8")
    edit_json(path, lambda s: s["data"].update(n_documents=1))
    register(
        path, registered_at="2026-12-06", commit=json.loads((FAITHFULNESS / "REGISTERED.json").read_text())["commit"]
    )
    record = _record(path)
    assert record["status"] == "exploratory" and record["checked_against"] == "registry"
    assert record["reasons"] == [
        f"{path} is not committed in a git checkout and is none of the protocols published with geolens "
        "(registered_protocols.json), so its registration cannot be confirmed"
    ]


def test_an_edited_and_reregistered_protocol_runs_exploratory_in_a_real_process(repo, tmp_path):
    """The command line, as a user runs it: ``python -m geolens flow --erasure`` on the edited copy."""
    import subprocess
    import sys

    path, commit = repo
    corpus = tmp_path / "docs.txt"
    corpus.write_text(
        "the river rose overnight and the bridge was closed.\n\na new library opened in the town centre today.\n",
        encoding="utf-8",
    )

    def small(p):
        p["data"].update(corpus=str(corpus), n_documents=1, min_documents=1, min_document_tokens=8, seq_len=8)
        p["data"]["models"] = ["tiny-gqa"]
        p["predictions"]["positions"] = [7]
        p["methods"] = ["random", "contribution"]
        p["fractions"] = [0.5]
        p["statistics"]["n_boot"] = 20
        p["induction_check"]["n_tokens"] = 4

    edit_json(path, small)
    register(path, registered_at="2026-12-06", commit=commit)  # REGISTERED.json regenerated, the old commit
    git_commit(path.parent, "edited protocol, registration regenerated")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "geolens", "flow", "--erasure", "--protocol", str(path), "--model", "tiny-gqa"]
    done = subprocess.run(cmd + ["--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "exploratory"
    assert any("study/protocol.json at the registration's commit" in r for r in summary["differences"])
    assert summary["preregistration"]["run_commit"] == git(path.parent, "rev-parse", "HEAD")
    assert "exploratory (" in done.stdout and "is not the registered file" in done.stdout


SHA = re.compile(r"\b[0-9a-f]{7,40}\b")
# Commits the published runs record that are not in the history, each explained where it is recorded.
MISSING_COMMITS = {
    "3838674": "docs/faithfulness/v3/masking/README.md",  # the masking runs' local commit, never pushed
}


def _recorded_commits(value, found: set) -> set:
    if isinstance(value, dict):
        for key, v in value.items():
            if key in ("commit", "run_commit", "registered_commit") and isinstance(v, str) and SHA.fullmatch(v):
                found.add(v)
            else:
                _recorded_commits(v, found)
    elif isinstance(value, list):
        for v in value:
            _recorded_commits(v, found)
    return found


def test_every_commit_the_published_runs_record_is_in_the_history():
    """Every commit in docs/**/summary.json (and docs/**/REGISTERED.json, docs/benchmarks), and every
    ``at <commit>`` in the messages of the commits that published a summary, exists in the history;
    the exceptions are listed above, each explained in the README it names."""
    from geolens.preregistration import checkout_of

    if checkout_of(ROOT) != ROOT.resolve() or git(ROOT, "rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("needs the full git history of this checkout")
    found: set = set()
    for pattern in ("**/summary.json", "**/REGISTERED.json", "benchmarks/*.json"):
        for path in (ROOT / "docs").glob(pattern):
            _recorded_commits(json.loads(path.read_text(encoding="utf-8")), found)
    messages = git(ROOT, "log", "--format=%B", "--", "docs/**/summary.json", "docs/*/summary.json")
    found |= set(re.findall(r"\bat ([0-9a-f]{7,40})\b", messages))
    assert len(found) >= 9  # the registrations, the benchmarks, the runs' "at <commit>"
    missing = {c for c in found if subprocess_ok(ROOT, c) is False}
    assert missing == set(MISSING_COMMITS), "recorded commits not in the history: " + ", ".join(sorted(missing))
    for commit, readme in MISSING_COMMITS.items():
        assert commit in (ROOT / readme).read_text(encoding="utf-8"), f"{readme} does not explain {commit}"


def subprocess_ok(root, commit: str) -> bool:
    """``git cat-file -e <commit>^{commit}`` succeeds."""
    import subprocess

    done = subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return done.returncode == 0


# ---------------------------------------------------------------------------------------------
# The fault probe: a copy of the faithfulness protocol, text and JSON edited, run as a study


@pytest.fixture
def corpus(tmp_path):
    """A local corpus of two long documents (the TL 2.x environment has no gensim, hence no Lee)."""
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
    docs = [" ".join(words[(k * d) % len(words)] for k in range(400)) for d in (1, 2)]
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(docs))
    return str(path)


def faithfulness_args(protocol, corpus, out, *extra) -> list[str]:
    return [
        "faithfulness",
        "--protocol",
        str(protocol),
        "--model",
        "tiny-gqa",
        "--corpus",
        corpus,
        "--stage",
        "per_term",
        "--out",
        str(out),
        *extra,
    ]


def test_an_edited_faithfulness_protocol_runs_exploratory_with_no_verdicts(tmp_path, corpus, capsys):
    path = copy_protocol(FAITHFULNESS, tmp_path / "protocol")
    (path.parent / "PROTOCOL.md").write_text("# An edited protocol, version 2\n", encoding="utf-8")

    def shrink(spec):
        spec["data"].update(n_documents=1, models=spec["data"]["models"] + ["tiny-gqa"])
        spec["data"]["corpus"] = corpus

    edit_json(path, shrink)
    out = tmp_path / "run"
    assert main(faithfulness_args(path, corpus, out)) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    pre = summary["preregistration"]
    assert summary["label"] == pre["status"] == "exploratory"
    assert any("PROTOCOL.md was edited" in r for r in pre["reasons"])
    assert any("protocol.json was edited" in r for r in pre["reasons"])
    assert pre["text_sha256"] == summary["protocol_sha256"] and len(pre["json_sha256"]) == 64
    verdicts = [p["verdict"] for p in summary["pairs"] + summary["per_term_effects"].get("exploratory_pairs", [])]
    assert verdicts and not any(v in DECIDING or v is None for v in verdicts)
    assert "→ None" not in printed and f"→ {NOT_DECIDED}" in printed and "exploratory (" in printed
    readme = (out / "README.md").read_text()
    assert "(exploratory)" in readme and "Exploratory run, no verdicts" in readme and "| None |" not in readme


# ---------------------------------------------------------------------------------------------
# Resume refuses what does not add up: faithfulness stages


def _interrupt_at(monkeypatch, module, name: str, document: int, position: int = 2):
    """Patch ``module.name`` to raise KeyboardInterrupt when called for ``document`` (argument ``position``)."""
    real = getattr(module, name)

    def patched(*args, **kwargs):
        if args[position] == document:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, patched)
    return real


@pytest.fixture(scope="module")
def stage_template(tmp_path_factory):
    """A faithfulness per-term stage over 2 documents, killed after document 0 (run once, copied per test)."""
    import geolens.faithfulness.ground_truth as gt

    root = tmp_path_factory.mktemp("stage")
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
    corpus = root / "docs.txt"
    corpus.write_text("\n\n".join(" ".join(words[(k * d) % len(words)] for k in range(400)) for d in (1, 2)))
    out = root / "run"
    args = faithfulness_args(FAITHFULNESS / "protocol.json", str(corpus), out, "--max-documents", "2")
    with pytest.MonkeyPatch.context() as patch:
        _interrupt_at(patch, gt, "ground_truth_document", 1)
        assert main(args) == 130
    progress = json.loads((out / "per_term_progress.json").read_text())
    assert (
        progress["documents_done"] == 1
        and progress["documents"] == [0]
        and set(progress["rows"])
        == {
            "rows",
            "positions",
        }
    )
    return out, args


@pytest.fixture
def interrupted_stage(stage_template, tmp_path, capsys):
    template, args = stage_template
    out = tmp_path / "run"
    shutil.copytree(template, out)
    capsys.readouterr()
    return out, [str(out) if a == str(template) else a for a in args]


def test_faithfulness_resume_refuses_an_edited_progress_record(interrupted_stage, capsys):
    out, args = interrupted_stage
    path = out / "per_term_progress.json"
    progress = json.loads(path.read_text())
    progress.update(documents_done=2, documents=[0, 1])  # "2 documents done", one document's rows
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "per_term" in err and "documents 1" in err and "--overwrite" in err
    progress.update(documents_done=2, documents=[0])  # the count alone edited
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 2
    assert "says 2 documents done" in one_line_error(capsys)
    assert not (out / "summary.json").exists()


def test_faithfulness_resume_refuses_a_record_without_digests(interrupted_stage, capsys):
    out, args = interrupted_stage
    path = out / "per_term_progress.json"
    progress = json.loads(path.read_text())
    for key in ("documents", "rows"):  # the format of the completed runs in docs/: no digests
        progress.pop(key)
    progress["documents_done"] = 2
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 2
    assert "its progress record has no digests of its rows" in one_line_error(capsys)


@pytest.mark.parametrize("damage", ["truncated progress", "truncated rows", "edited rows", "missing rows"])
def test_faithfulness_resume_refuses_damaged_files(interrupted_stage, capsys, damage):
    out, args = interrupted_stage
    progress, rows = out / "per_term_progress.json", out / "per_term_rows.csv.gz"
    if damage == "truncated progress":
        progress.write_text(progress.read_text()[:40])
        word = "unreadable"
    elif damage == "truncated rows":
        rows.write_bytes(rows.read_bytes()[:100])
        word = "SHA-256 differs"
    elif damage == "edited rows":  # a valid gzip with other rows
        text = gzip.decompress(rows.read_bytes()).decode().splitlines()
        rows.write_bytes(gzip.compress(("\n".join(text[:-1]) + "\n").encode()))
        word = "SHA-256 differs"
    else:
        rows.unlink()
        word = "missing"
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert word in err and ("per_term_progress.json" in err or "per_term_rows.csv.gz" in err)


def test_faithfulness_resume_with_another_model_is_one_line(interrupted_stage, capsys):
    out, args = interrupted_stage
    other = [a if a != "tiny-gqa" else "tiny-mha" for a in args]
    assert main(other + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "other settings" in err and "model tiny-mha, not tiny-gqa" in err


def test_a_progress_record_without_digests_is_refused_even_when_its_rows_add_up(interrupted_stage, capsys):
    """Never trusted as legacy (geolens 0.2 resumed it and wrote fresh digests over any edit)."""
    out, args = interrupted_stage
    path = out / "per_term_progress.json"
    progress = json.loads(path.read_text())
    for key in ("documents", "rows"):
        progress.pop(key)
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "per_term_progress.json: its progress record has no digests of its rows" in err and "--overwrite" in err
    assert "documents" not in json.loads(path.read_text())  # nothing written over it


def test_faithfulness_resume_under_another_geolens_version_goes_on_and_the_summary_says_so(interrupted_stage, capsys):
    import geolens

    out, args = interrupted_stage
    path = out / "per_term_progress.json"
    progress = json.loads(path.read_text())
    assert progress["writer"]["geolens_version"] == geolens.__version__ and progress["writer"]["weights_fingerprint"]
    progress["writer"]["geolens_version"] = "0.0.1"
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 0
    step = f"0.0.1 → {geolens.__version__}"
    assert json.loads((out / "summary.json").read_text())["resumed_across_versions"] == [step]
    assert json.loads(path.read_text())["writer"]["resumed_across_versions"] == [step]


def test_faithfulness_resume_with_other_weights_at_the_same_model_name_is_one_line(interrupted_stage, capsys):
    """New weights saved where the model was: the record's weights fingerprint refuses them."""
    import geolens.models

    out, args = interrupted_stage
    real = geolens.models.load_model

    def other_weights(name, *a, **k):
        model = real(name, *a, **k)
        with torch.no_grad():
            list(model.parameters())[-1].add_(0.25)
        return model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(geolens.models, "load_model", other_weights)
        assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "per_term_progress.json: it was written by a model with other weights" in err and "--overwrite" in err


# ---------------------------------------------------------------------------------------------
# Flow erasure


@pytest.fixture
def flow_protocol(tmp_path) -> Path:
    """docs/flow/protocol.json cut down for a tiny model, registered as such."""
    corpus = tmp_path / "docs.txt"
    corpus.write_text(
        "the river rose overnight and the bridge was closed.\n\na new library opened in the town centre today.\n\n"
        "farmers expect a late harvest after weeks of rain.\n",
        encoding="utf-8",
    )
    path = copy_protocol(FLOW, tmp_path / "flow")

    def small(p):
        p["data"].update(
            corpus=str(corpus), n_documents=2, min_documents=2, min_document_tokens=12, seq_len=12, models=["tiny-gqa"]
        )
        p["predictions"]["positions"] = [6, 11]
        p["methods"] = ["random", "contribution", "grad_x_input"]
        p["fractions"] = [0.1, 0.5]
        p["statistics"]["n_boot"] = 100
        p["induction_check"]["n_tokens"] = 6

    edit_json(path, small)
    return path


def test_flow_erasure_json_edit_alone_is_exploratory_and_resume_checks_its_rows(
    tmp_path, flow_protocol, monkeypatch, capsys
):
    import geolens.flow.erasure as fe

    out = tmp_path / "run"
    args = ["flow", "--erasure", "--protocol", str(flow_protocol), "--model", "tiny-gqa", "--out", str(out)]
    with monkeypatch.context() as patch:
        _interrupt_at(patch, fe, "measure_document", 1)
        assert main(args) == 130
    capsys.readouterr()
    path = out / "erasure_progress.json"
    progress = json.loads(path.read_text())
    path.write_text(json.dumps(dict(progress, documents_done=2, documents=[0, 1])))
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "erasure" in err and "--overwrite" in err
    path.write_text(json.dumps(progress)[:-30])
    assert main(args + ["--resume"]) == 2
    assert "unreadable" in one_line_error(capsys)
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "exploratory" and any("protocol.json was edited" in r for r in s["differences"])
    assert s["preregistration"]["json_sha256"] and s["most_faithful"] == {
        "comprehensiveness": None,
        "sufficiency": None,
    }
    pairs = s["families"]["primary"]["pairs"]
    assert pairs and all(p["verdict"] in (NOT_DECIDED, "not testable") for p in pairs)
    printed = capsys.readouterr().out
    assert "exploratory (" in printed and NOT_DECIDED in printed
    # REGISTERED.json regenerated for the edited files: git cannot confirm it (no commit named)
    register(flow_protocol, registered_at="2026-12-06")
    out1 = tmp_path / "regenerated"
    assert main(args[:-1] + [str(out1)]) == 0
    s1 = json.loads((out1 / "summary.json").read_text())
    assert s1["status"] == "exploratory"
    assert any(
        "is not committed in a git checkout and is none of the protocols published" in r for r in s1["differences"]
    )
    # registered as a study does (text and twin committed, REGISTERED.json naming that commit),
    # the same run is pre-registered and decides its pairs
    commit = register_in_git(flow_protocol)
    out2 = tmp_path / "registered"
    assert main(args[:-1] + [str(out2)]) == 0
    s2 = json.loads((out2 / "summary.json").read_text())
    mode = s2["model_mode"]
    assert s2["status"] == ("pre-registered" if mode == "bridge" else "exploratory")
    pre = s2["preregistration"]
    assert pre["checked_against"] == "git" and pre["registered_commit"] == commit
    assert pre["run_commit"] == git(flow_protocol.parent, "rev-parse", "HEAD") and pre["working_tree"] == "clean"


def test_flow_erasure_resume_is_bound_to_the_digests_the_weights_and_says_the_version_in_real_processes(
    tmp_path, flow_protocol
):
    """The probe of issue #46 as a user runs it (``python -m geolens``): a finished erasure folder
    whose progress record lost its digests and whose numbers were edited is refused, not re-digested
    (geolens 0.2 moved a KL in curves.csv from 0.000276 to 0.000691 that way); a record of other
    weights is refused; a resume under another geolens version goes on and the summary says so."""
    import subprocess
    import sys

    import geolens

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "geolens", "flow", "--erasure", "--protocol", str(flow_protocol)]
    cmd += ["--model", "tiny-gqa", "--out", str(out)]

    def run(*extra):
        return subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=600)

    done = run()
    assert done.returncode == 0, done.stderr[-2000:]
    path, conditions = out / "erasure_progress.json", out / "erasure_conditions.csv.gz"
    record, curves = json.loads(path.read_text()), (out / "curves.csv").read_bytes()
    writer = record["writer"]  # the weights fingerprint run_with_cache stamps, and the geolens version
    assert writer["geolens_version"] == geolens.__version__ and len(writer["weights_fingerprint"]) == 16
    original = conditions.read_bytes()
    lines = gzip.decompress(original).decode().splitlines()
    header, first = lines[0].split(","), lines[1].split(",")
    first[header.index("kl")] = "0.000691"  # an edited number, the digests dropped
    conditions.write_bytes(gzip.compress("\n".join([lines[0], ",".join(first), *lines[2:]]).encode() + b"\n"))
    path.write_text(json.dumps({k: v for k, v in record.items() if k not in ("rows", "documents")}))
    done = run("--resume")
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith(f"geolens flow: error: cannot resume from {path}: its progress record has no digests")
    assert "--overwrite" in done.stderr and (out / "curves.csv").read_bytes() == curves
    conditions.write_bytes(original)
    path.write_text(json.dumps(dict(record, writer=dict(writer, weights_fingerprint="0123456789abcdef"))))
    done = run("--resume")  # new weights saved where the model was
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "it was written by a model with other weights (weights fingerprint 0123456789abcdef" in done.stderr
    path.write_text(json.dumps(dict(record, writer=dict(writer, geolens_version="0.0.1"))))
    done = run("--resume")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_across_versions"] == [f"0.0.1 → {geolens.__version__}"]


# ---------------------------------------------------------------------------------------------
# Multiple choice


@pytest.fixture
def mc_run(tmp_path, capsys):
    rows = [
        dict(prompt="the cat sat on the", choices=["mat", "dog"]),
        dict(prompt="one two", choices=["three", "a"]),
        dict(prompt="we go", choices=["home", "now"]),
    ]
    tasks = []
    for name, answer in (("first", 0), ("second", 1)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(json.dumps(dict(r, answer=answer)) for r in rows))
        tasks.append(str(path))
    out = tmp_path / "mc"
    args = ["mc", "--model", "tiny-gqa", "--tasks", ",".join(tasks), "--n-boot", "50", "--out", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    return out, args


@pytest.mark.parametrize("damage", ["record removed", "record edited", "truncated"])
def test_mc_resume_refuses_an_edited_or_damaged_checkpoint(mc_run, capsys, damage):
    out, args = mc_run
    path = out / "mc_checkpoint.json"
    data = json.loads(path.read_text())
    assert data["records"]["counts"]["clean"] == 6
    if damage == "record removed":
        data["clean"].pop(next(iter(data["clean"])))
        path.write_text(json.dumps(data))
    elif damage == "record edited":
        key = next(iter(data["clean"]))
        data["clean"][key]["margin"] = 99.0
        path.write_text(json.dumps(data))
    else:
        path.write_text(path.read_text()[:200])
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "mc_checkpoint.json" in err and "--overwrite" in err


def test_mc_resume_with_another_model_is_one_line(mc_run, capsys):
    out, args = mc_run
    other = [a if a != "tiny-gqa" else "tiny-mha" for a in args]
    assert main(other + ["--resume"]) == 2
    assert "another model" in one_line_error(capsys)


# ---------------------------------------------------------------------------------------------
# Sink controls (the protocol's dose-matched controls, a 7-layer tiny model behind --model)

PARAGRAPHS = [
    "the cat sat on the mat and looked at the birds in the old tree by the river, then it slept in the sun until the evening came and the light went down.",
    "a dog ran far away over the hills, past the farms and the quiet roads, and came back at noon with a stick that was far too big for it to carry home!",
]


@pytest.fixture
def controls_run(tmp_path, monkeypatch, capsys):
    import geolens.models
    import geolens.sinks.controls_dose as controls

    model = make_tiny("gqa", n_layers=7)
    monkeypatch.setattr(geolens.models, "load_model", lambda name, compatibility_mode=False: model)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(PARAGRAPHS), encoding="utf-8")
    out = tmp_path / "controls"
    args = ["sinks", "--controls-protocol", str(FAITHFULNESS / "protocol.json"), "--corpus", str(corpus)]
    args += ["--controls-documents", "1", "--n-boot", "50", "--out", str(out)]
    real, calls = controls.clean_log_probs, []

    def interrupt_at_second_window(model, window):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(model, window)

    with monkeypatch.context() as patch:
        patch.setattr(controls, "clean_log_probs", interrupt_at_second_window)
        assert main(args) == 130
    capsys.readouterr()
    return out, args


@pytest.mark.parametrize("damage", ["window added", "truncated"])
def test_sink_controls_resume_refuses_an_edited_or_damaged_checkpoint(controls_run, capsys, damage):
    out, args = controls_run
    path = out / "controls_checkpoint.json"
    data = json.loads(path.read_text())
    assert list(data["windows"]) == ["0"] and data["records"]["counts"] == {"windows": 1}
    if damage == "window added":  # as if two windows were done, with one window's numbers
        data["windows"]["1"] = data["windows"]["0"]
        path.write_text(json.dumps(data))
    else:
        path.write_text(path.read_text()[:100])
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "controls_checkpoint.json" in err and "--overwrite" in err


# ---------------------------------------------------------------------------------------------
# Corpus checkpoints (run_corpus)


def test_corpus_checkpoint_refuses_an_edited_batch_index_or_a_damaged_file(tmp_path):
    from geolens.checkpoint import atomic_torch_save
    from geolens.errors import ResumeRefused
    from geolens.runner import run_corpus
    from geolens.sinks.norm_curve import NormCurve

    model = make_tiny("gqa")
    tokens = random_corpus(n=8, seq=10, seed=1)
    path = tmp_path / "ck.pt"
    analysis = lambda: NormCurve(model.cfg.n_layers, model.cfg.n_heads)  # noqa: E731
    run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
    saved = torch.load(path, weights_only=True)
    assert saved["next_batch"] == 4 and len(saved["digest"]) == 64
    atomic_torch_save(dict(saved, next_batch=2), path)  # "2 batches done" with 4 batches' states
    with pytest.raises(ResumeRefused, match="changed after it was saved"):
        run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ResumeRefused, match="not a readable geolens checkpoint"):
        run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
    legacy = {k: v for k, v in saved.items() if k != "digest"}  # a checkpoint from before digests
    atomic_torch_save(legacy, path)
    with pytest.raises(ResumeRefused, match="it has no digest of its batch index and states"):
        run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
