"""Pre-registered studies: one home for reading a protocol, checking its registration and
labelling a run (``pre-registered`` or ``exploratory``).

A **protocol** is a text (``PROTOCOL.md``) and its machine-readable twin (``protocol.json``) in
one folder. It is **registered** by ``REGISTERED.json`` beside them (:func:`register`): the
SHA-256 of the text and of the twin as they were fixed, with the date and commit. The studies
that run under a protocol:

=====================  ==============================================  ===========================================
study                  command                                         code
=====================  ==============================================  ===========================================
faithfulness stages    ``geolens faithfulness --protocol P``           :mod:`geolens.faithfulness.preregistered`
multiple choice        ``geolens mc --protocol P``                     :mod:`geolens.faithfulness.multiple_choice`
sink controls          ``geolens sinks --controls-protocol P``         :mod:`geolens.sinks.controls_dose`
flow erasure           ``geolens flow --erasure --protocol P``         :mod:`geolens.flow.erasure`
=====================  ==============================================  ===========================================

(the first three under docs/faithfulness/protocol.json, the last under docs/flow/protocol.json).

A run is **pre-registered** only when both hashes match the registered pair *and* the run
follows the protocol (its models, sample sizes and settings: each study lists where it departs,
its ``differences``); otherwise it is **exploratory** and :func:`preregistration` names every
reason (which file was edited, which setting differs, which model is not in the protocol). An
exploratory run decides nothing: its pairs keep estimates and intervals, and their verdict is
:data:`NOT_DECIDED` (:func:`withhold_verdicts`), never ``holds``/``reversed``. Every summary
records ``preregistration: {status, text_sha256, json_sha256, reasons, ...}``.

The registration is checked against history (:func:`history_check`), since ``REGISTERED.json``
can be rewritten as easily as the files it names. Where git tracks the protocol, the run is
pre-registered only when ``REGISTERED.json``'s ``commit`` exists in the repository, holds the text
and twin with the registered hashes (``git show <commit>:<path>``), and is an ancestor of the
commit checked out (``git merge-base --is-ancestor``). Outside a checkout (an installed package),
the text and twin must be those of a protocol published with geolens: ``registered_protocols.json``,
generated from the ``REGISTERED.json`` files in docs/ (:func:`write_registry`). Anything else is
exploratory, the reason named. Every record also names the registration's commit, what confirmed
it (``checked_against``: ``git`` / ``registry``), the run's commit and whether the working tree
was ``clean`` or ``dirty`` (:func:`source_state`). Not covered: someone who can write the
repository's history (commit an edited protocol and a new registration before the run).

Resuming a run checks what it resumes: :mod:`geolens.resume`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from geolens.files import file_sha256, read_json

PRE_REGISTERED = "pre-registered"
EXPLORATORY = "exploratory"
NOT_DECIDED = "not decided (exploratory)"
REGISTERED = "REGISTERED.json"
DECIDED = ("holds", "reversed", "tie")


@dataclass(frozen=True)
class Preregistered:
    """A protocol's twin (``settings``, the parsed JSON), where it was read, the SHA-256 of its
    text (``sha256``) and of the twin (``json_sha256``), and its registration (``registered``:
    the content of ``REGISTERED.json``, None when there is none)."""

    settings: dict = field(repr=False)
    path: Path
    sha256: str  # of the text (PROTOCOL.md next to the twin)
    json_sha256: str = ""
    registered: dict | None = field(default=None, repr=False)

    @property
    def version(self) -> int:
        return int(self.settings["version"])

    @property
    def text_sha256(self) -> str:
        return self.sha256

    def __getitem__(self, key: str):
        return self.settings[key]

    def hash_reasons(self) -> list[str]:
        """Why the files are not the registered ones (empty: both hashes match ``REGISTERED.json``)."""
        reg = self.registered
        where = self.path.with_name(REGISTERED)
        if reg is None:
            return [f"the protocol is not registered (no {where})"]
        out = []
        if reg.get("text_sha256") != self.sha256:
            out.append(
                f"{self.path.with_name('PROTOCOL.md')} was edited after registration "
                f"(SHA-256 {self.sha256[:12]}…, registered {str(reg.get('text_sha256'))[:12]}…)"
            )
        if reg.get("json_sha256") != self.json_sha256:
            out.append(
                f"{self.path} was edited after registration "
                f"(SHA-256 {self.json_sha256[:12]}…, registered {str(reg.get('json_sha256'))[:12]}…)"
            )
        return out


def load_protocol(path: str | Path) -> Preregistered:
    """The twin at ``path``, the SHA-256 of it and of the text ``PROTOCOL.md`` beside it, and the
    registration ``REGISTERED.json`` beside it (if any).

    Raises ValueError (one line) when either file is missing, the twin is not JSON or the
    registration is unreadable.

    >>> from pathlib import Path
    >>> p = load_protocol(Path(__file__).parents[1] / "docs" / "faithfulness" / "protocol.json")
    >>> p.version, len(p.sha256), p["primary"]["outcome"], p.hash_reasons()
    (2, 64, 'kl', [])
    """
    path = Path(path)
    text = path.with_name("PROTOCOL.md")
    if not path.is_file():
        raise ValueError(f"protocol {path}: no such file")
    if not text.is_file():
        raise ValueError(f"protocol {path}: its text {text} is missing (a protocol is the text and its twin)")
    settings = read_json(path, f"protocol {path}")
    record = path.with_name(REGISTERED)
    registered = read_json(record, f"registration {record}") if record.is_file() else None
    if registered is not None and not isinstance(registered, dict):
        raise ValueError(f"registration {record}: not a JSON object")
    return Preregistered(settings, path, file_sha256(text), file_sha256(path), registered)


def register(path: str | Path, *, registered_at: str, commit: str | None = None) -> dict:
    """Write ``REGISTERED.json`` beside the twin at ``path``: the SHA-256 of the text and of the
    twin as they are now, ``registered_at`` (a date) and ``commit`` (where they were fixed; by
    default the commit checked out, when git tracks both files there unchanged). Commit the text
    and twin first: a run is pre-registered only where git confirms that commit
    (:func:`history_check`). Register a protocol once, before any run under it; a new version of a
    protocol is a new registration (bump ``version`` in the twin). A protocol under geolens's own
    docs/ also updates ``registered_protocols.json`` (:func:`write_registry`)."""
    path = Path(path)
    if commit is None and committed_unchanged([path.with_name("PROTOCOL.md"), path]):
        commit = _git_text(checkout_of(path), "rev-parse", "HEAD")
    record = dict(
        protocol=path.name,
        text="PROTOCOL.md",
        text_sha256=file_sha256(path.with_name("PROTOCOL.md")),
        json_sha256=file_sha256(path),
        version=read_json(path, f"protocol {path}").get("version"),
        registered_at=registered_at,
    )
    if commit:
        record["commit"] = commit
    path.with_name(REGISTERED).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    docs = Path(__file__).resolve().parents[1] / "docs"
    if docs in path.resolve().parents:  # a protocol published with geolens: the registry it carries follows
        write_registry(docs)
    return record


# ---------------------------------------------------------------------------------------------
# Registration checked against history: git where the protocol is committed, else the registry of
# the published protocols that geolens carries (registered_protocols.json)

REGISTRY = Path(__file__).with_name("registered_protocols.json")


def _git(cwd, *args) -> bytes | None:
    """``git -C cwd args`` its stdout, None when it fails or git is not there (never raises)."""
    import os
    import subprocess

    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, env=env, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _git_text(cwd, *args) -> str | None:
    out = _git(cwd, *args)
    return None if out is None else out.decode("utf-8", "replace").strip()


def checkout_of(path) -> Path | None:
    """The top folder of the git checkout holding ``path`` (a file or a folder), None outside one."""
    p = Path(path).resolve()
    top = _git_text(p if p.is_dir() else p.parent, "rev-parse", "--show-toplevel")
    return Path(top).resolve() if top else None


def _tracked(root: Path, paths) -> list[str] | None:
    """``paths`` relative to ``root`` when git tracks every one of them there, else None."""
    try:
        rel = [Path(p).resolve().relative_to(root).as_posix() for p in paths]
    except ValueError:
        return None
    return rel if rel and _git(root, "ls-files", "--error-unmatch", "--", *rel) is not None else None


def committed_unchanged(paths) -> bool:
    """True when git tracks every one of ``paths`` in the checkout holding them and none has
    changed since the last commit (staged or not): the files are the committed ones, so git
    vouches for them (a published run in docs/). False outside a checkout or without git."""
    paths = [Path(p) for p in paths]
    root = checkout_of(paths[0]) if paths else None
    rel = _tracked(root, paths) if root is not None else None
    return rel is not None and _git(root, "diff", "--quiet", "HEAD", "--", *rel) is not None


def source_state(path=None) -> dict:
    """``{run_commit, working_tree}``: the commit checked out where ``path`` lies (else where
    geolens itself lies) and whether its tracked files have changes (``clean`` / ``dirty``);
    both None outside a git checkout (an installed package)."""
    for where in ([path] if path is not None else []) + [Path(__file__).parent]:
        root = checkout_of(where)
        head = _git_text(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}") if root else None
        if head:
            changed = _git(root, "status", "--porcelain", "--untracked-files=no")
            tree = None if changed is None else ("dirty" if changed.strip() else "clean")
            return dict(run_commit=head, working_tree=tree)
    return dict(run_commit=None, working_tree=None)


def registry() -> dict:
    """The published protocols' registrations that geolens carries, by folder under docs/
    (``{"flow/v3": {text_sha256, json_sha256, version, registered_at, commit}, ...}``)."""
    return json.loads(REGISTRY.read_text(encoding="utf-8"))


def registry_from(docs: str | Path) -> dict:
    """:func:`registry` as the ``REGISTERED.json`` files under ``docs`` give it (what
    ``registered_protocols.json`` is generated from: :func:`write_registry`)."""
    docs = Path(docs)
    out = {}
    for path in sorted(docs.rglob(REGISTERED)):
        reg = json.loads(path.read_text(encoding="utf-8"))
        keys = ("text_sha256", "json_sha256", "version", "registered_at", "commit")
        out[path.parent.relative_to(docs).as_posix()] = {k: reg.get(k) for k in keys}
    return out


def write_registry(docs: str | Path = Path(__file__).parents[1] / "docs") -> dict:
    """Regenerate ``geolens/registered_protocols.json`` from the registrations under ``docs``
    (after registering a protocol there); returns it."""
    found = registry_from(docs)
    REGISTRY.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return found


def history_check(protocol: Preregistered) -> tuple[list[str], dict]:
    """(reasons, record) of the registration checked against history (module docstring). Where
    git tracks the protocol's text and twin: ``REGISTERED.json``'s ``commit`` must be in the
    repository, hold the text and twin with the registered hashes, and be an ancestor of the
    commit checked out (the run's). Elsewhere (an installed package, a copy outside any
    checkout): the text and twin must be those of a protocol published with geolens (:func:`registry`).
    The record: ``registered_commit`` (the full commit confirmed, else as registered) and
    ``checked_against`` (``git`` / ``registry``)."""
    reg = protocol.registered
    if reg is None:
        return [], dict(registered_commit=None, checked_against=None)
    files = [protocol.path.with_name("PROTOCOL.md"), protocol.path]
    root = checkout_of(protocol.path)
    rel = _tracked(root, files) if root is not None else None
    if rel is None:
        found = [
            k
            for k, e in registry().items()
            if (e.get("text_sha256"), e.get("json_sha256")) == (protocol.sha256, protocol.json_sha256)
        ]
        if not found and protocol.hash_reasons():  # already exploratory: the edit is the reason named
            return [], dict(registered_commit=reg.get("commit"), checked_against="registry")
        if not found:
            return [
                f"{protocol.path} is not committed in a git checkout and is none of the protocols published "
                f"with geolens ({REGISTRY.name}), so its registration cannot be confirmed"
            ], dict(registered_commit=reg.get("commit"), checked_against="registry")
        return [], dict(registered_commit=registry()[found[0]].get("commit"), checked_against="registry")
    record = dict(registered_commit=reg.get("commit"), checked_against="git")
    commit = str(reg.get("commit") or "")
    where = protocol.path.with_name(REGISTERED)
    if not commit:
        return [f"{where} names no commit, so git cannot confirm the registration"], record
    full = _git_text(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if not full:
        return [
            f"the registration's commit {commit[:12]} is not in the repository {root} (git cat-file finds no such commit)"
        ], record
    record["registered_commit"] = full
    reasons = []
    for name, key in zip(rel, ("text_sha256", "json_sha256")):
        blob = _git(root, "show", f"{full}:{name}")
        if blob is None:
            reasons.append(f"{name} is not in the registration's commit {full[:12]}")
        elif hashlib.sha256(blob).hexdigest() != reg.get(key):
            reasons.append(
                f"{name} at the registration's commit {full[:12]} is not the registered file "
                f"(SHA-256 {hashlib.sha256(blob).hexdigest()[:12]}…, registered {str(reg.get(key))[:12]}…)"
            )
    head = _git_text(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if head and _git(root, "merge-base", "--is-ancestor", full, head) is None:
        reasons.append(f"the registration's commit {full[:12]} is not an ancestor of this run's commit {head[:12]}")
    return reasons, record


def preregistration(protocol: Preregistered | None, differences=()) -> dict:
    """``{status, text_sha256, json_sha256, reasons, registered_commit, checked_against,
    run_commit, working_tree}`` of a run: ``pre-registered`` when the protocol's files are the
    registered ones, git (or, outside a checkout, the registry geolens carries) confirms the
    registration (:func:`history_check`) and the run has no ``differences`` from it, else
    ``exploratory`` with every reason (the edited files first). ``run_commit`` and
    ``working_tree``: :func:`source_state`. ``protocol`` None: a run under no protocol (exploratory)."""
    if protocol is None:
        return dict(
            status=EXPLORATORY,
            text_sha256=None,
            json_sha256=None,
            reasons=["run under no protocol"],
            registered_commit=None,
            checked_against=None,
            **source_state(),
        )
    history, record = history_check(protocol)
    reasons = protocol.hash_reasons() + history + [str(d) for d in differences]
    where = protocol.path if record["checked_against"] == "git" else None
    return dict(
        status=EXPLORATORY if reasons else PRE_REGISTERED,
        text_sha256=protocol.sha256,
        json_sha256=protocol.json_sha256,
        reasons=reasons,
        **record,
        **source_state(where),
    )


def run_label(protocol: Preregistered | None, differences=()) -> str:
    """``"pre-registered"`` or ``"exploratory"`` (:func:`preregistration`'s status)."""
    return preregistration(protocol, differences)["status"]


def withhold_verdicts(pairs: list[dict], *, key: str = "verdict") -> list[dict]:
    """The pairs of an exploratory run: a verdict that would decide (``holds``, ``reversed``,
    ``tie``) or none becomes :data:`NOT_DECIDED`; ``not testable`` and the like stay.

    >>> withhold_verdicts([{"verdict": "holds"}, {"verdict": None}, {"verdict": "not testable"}])
    [{'verdict': 'not decided (exploratory)'}, {'verdict': 'not decided (exploratory)'}, {'verdict': 'not testable'}]
    """
    return [dict(p, **{key: NOT_DECIDED}) if p.get(key) in DECIDED + (None,) else dict(p) for p in pairs]


def status_line(record: dict) -> str:
    """One printed line: ``pre-registered``, or ``exploratory (reason; reason)``."""
    if record["status"] == PRE_REGISTERED:
        return PRE_REGISTERED
    return f"{EXPLORATORY} ({'; '.join(record['reasons'])})"


__all__ = [
    "DECIDED",
    "EXPLORATORY",
    "NOT_DECIDED",
    "PRE_REGISTERED",
    "REGISTERED",
    "REGISTRY",
    "Preregistered",
    "checkout_of",
    "committed_unchanged",
    "history_check",
    "load_protocol",
    "preregistration",
    "register",
    "registry",
    "registry_from",
    "run_label",
    "source_state",
    "status_line",
    "withhold_verdicts",
    "write_registry",
]
