"""The checkpoint of a multiple-choice run under the pre-registered protocol
(:func:`geolens.faithfulness.multiple_choice.run_multiple_choice`): every question's clean row and
masked scores, keyed by task and index within the task (:func:`question_key`) and tied to the
question's text (:func:`question_sha`), saved atomically after each question
(:func:`geolens.resume.write_records`) and checked when a run resumes from it
(:func:`geolens.resume.read_records`: the settings, the model, each record). The checkpoint keeps
its ``writer`` (:func:`geolens.checkpoint.writer_record`: the weights fingerprint and the geolens
version): a resume with other weights is refused (:meth:`MCCheckpoint.check_writer`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from geolens.multiple_choice import Question
from geolens.resume import ResumeRefused as ResumeError
from geolens.resume import read_records, refuse, write_records

CHECKPOINT = "mc_checkpoint.json"


def question_key(question: Question, qid: int) -> str:
    """``task/qid``: a question's key in tables and checkpoints (qid = index within its task)."""
    return f"{question.task}/{qid}"


def question_sha(question: Question) -> str:
    """SHA-256 (16 hex digits) of the prompt, choices and answer: a resumed record must match it."""
    return hashlib.sha256(json.dumps([question.prompt, list(question.choices), question.answer]).encode()).hexdigest()[
        :16
    ]


@dataclass
class MCCheckpoint:
    """Per-question records of a run (clean rows, masked scores), saved atomically at ``path``
    after each question (:meth:`save`); :meth:`open` resumes one written under the same settings."""

    path: Path | None
    settings: dict
    model: dict | None = None
    clean: dict = field(default_factory=dict)
    masked: dict = field(default_factory=dict)
    commands: list = field(default_factory=list)
    writer: dict | None = None  # None: a new checkpoint; else the resumed one's (checked by check_writer)
    verified: bool = False  # its file was checked whole against a SHA-256 a registered protocol names

    FORMAT = 1

    @classmethod
    def open(cls, path, settings, *, resume: bool, verified: bool = False) -> MCCheckpoint:
        """A new checkpoint for ``settings`` (a :class:`~geolens.faithfulness.multiple_choice.MCSettings`:
        its ``fingerprint()``), or with ``resume`` the one at ``path``, checked by
        :func:`geolens.resume.read_records` (:class:`~geolens.resume.ResumeRefused` when it is
        unreadable, a record was edited, or it was written under other settings). ``verified``: the
        file was checked whole against a SHA-256 that a registered protocol names (protocol 3's
        re-analysis of stored records: :func:`~geolens.faithfulness.multiple_choice.seed_from_records`),
        so records saved before digests were kept are read, and their model is checked by
        :meth:`check_model` alone."""
        path = Path(path)
        if not (resume and path.is_file()):
            return cls(path, settings.fingerprint())
        data = read_records(path, ("clean", "masked"), verified=verified)
        if data.get("format") != cls.FORMAT or not isinstance(data.get("settings"), dict):
            raise refuse(
                path, f"not a multiple-choice checkpoint (format {data.get('format')!r}, expected {cls.FORMAT})"
            )
        saved = data["settings"]
        for key, value in settings.fingerprint().items():
            if saved.get(key) != value:
                raise refuse(path, f"it was run with {key} = {saved.get(key)}, not {value}")
        return cls(
            path,
            saved,
            data.get("model"),
            data.get("clean", {}),
            data.get("masked", {}),
            data.get("commands", []),
            data.get("writer") if isinstance(data.get("writer"), dict) else {},
            verified,
        )

    def check_model(self, fingerprint: dict) -> None:
        """Record the model, or refuse (:class:`~geolens.resume.ResumeRefused`) a checkpoint made with another one."""
        if self.model is None:
            self.model = fingerprint
        elif self.model != fingerprint:
            raise refuse(
                self.path,
                f"it was run with another model ({self.model.get('name')}, weights {self.model.get('weights_sha256')}), "
                f"not {fingerprint.get('name')}",
            )

    def check_writer(self, model) -> None:
        """Record this run's writer (:func:`geolens.checkpoint.writer_record` of ``model``), or, for
        a resumed checkpoint, refuse (:class:`~geolens.resume.ResumeRefused`) one written with other
        weights or naming none (unless git vouches for it: :func:`geolens.checkpoint.check_writer`),
        carrying the geolens versions it was resumed across."""
        from geolens.checkpoint import check_writer, writer_record
        from geolens.resume import AGAIN

        if self.writer is None or (self.verified and not self.writer):
            self.writer = writer_record(model)
        else:
            vouch = [self.path] if self.path is not None else []
            self.writer = check_writer(self.path, self.writer, model, vouch=vouch, again=AGAIN)

    def save(self) -> None:
        if self.path is None:
            return
        header = dict(format=self.FORMAT, settings=self.settings, model=self.model, commands=self.commands)
        if self.writer is not None:
            header["writer"] = self.writer
        write_records(self.path, header, {"clean": self.clean, "masked": self.masked})


def keep_record(store: dict, key: str, sha: str, compute):
    """(``store[key]``, False) when the question is already there (its ``sha`` must match:
    :class:`~geolens.resume.ResumeRefused` otherwise), else (``compute()`` with ``sha``, stored,
    True)."""
    if key in store:
        if store[key].get("sha") != sha:
            raise ResumeError(
                f"question {key} of the checkpoint is another question (prompt, choices or answer changed)"
            )
        return store[key], False
    store[key] = dict(compute(), sha=sha)
    return store[key], True
