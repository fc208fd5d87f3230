"""The works the report cites: short author-year citations in the text, full citations in a list.

The claims of :mod:`geolens.pipelines` keep a machine key in ``Claim.source`` ("paper A §3.2",
"paper B (docs/method.md §6)"): "paper A" and "paper B" are the two source papers of
docs/method.md (§9 gives the full citations, copied here). Nothing a reader sees names them that
way: :func:`cite_text` turns every such nickname into the author-year citation, and
:func:`references_of` gives the full citations a source string refers to.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    key: str  # machine key (also the HTML anchor, "ref-<key>")
    short: str  # author-year citation used in the text
    authors: str
    title: str
    venue: str
    year: int

    @property
    def full(self) -> str:
        return f"{self.authors}. {self.title}. {self.venue}, {self.year}."

    def as_json(self) -> dict:
        return {
            "key": self.key,
            "citation": self.short,
            "authors": self.authors,
            "title": self.title,
            "venue": self.venue,
            "year": self.year,
            "full": self.full,
        }


PAPER_A = Reference(
    key="cunningham2026",
    short="Cunningham & Muça Cirone 2026",
    authors="Cunningham, Muça Cirone",
    title="Contribution Weights: A Geometrical Analysis of Self-Attention Transformers",
    venue="International Conference on Machine Learning (ICML), arXiv:2606.07604",
    year=2026,
)
PAPER_B = Reference(
    key="mudarisov2026",
    short="Mudarisov et al. 2026",
    authors="Timur Mudarisov, Mikhail Burtsev, Tatiana Petrova, Radu State",
    title="Geometric Analysis of Token Selection in Multi-Head Attention",
    venue="arXiv:2602.01893",
    year=2026,
)
KOBAYASHI = Reference(
    key="kobayashi2020",
    short="Kobayashi et al. 2020",
    authors="Goro Kobayashi, Tatsuki Kuribayashi, Sho Yokoi, Kentaro Inui",
    title="Attention is Not Only a Weight: Analyzing Transformers with Vector Norms",
    venue="Proceedings of EMNLP",
    year=2020,
)
MOHEBBI = Reference(
    key="mohebbi2023",
    short="Mohebbi et al. 2023",
    authors="Hosein Mohebbi, Willem Zuidema, Grzegorz Chrupała, Afra Alishahi",
    title="Quantifying Context Mixing in Transformers",
    venue="Proceedings of EACL (Value Zeroing)",
    year=2023,
)
GU = Reference(
    key="gu2024",
    short="Gu et al. 2024",
    authors="Xiangming Gu, Tianyu Pang, Chao Du, Qian Liu, Fengzhuo Zhang, Cunxiao Du, Ye Wang, Min Lin",
    title="When Attention Sink Emerges in Language Models: An Empirical View",
    venue="arXiv:2410.10781 (ICLR 2025)",
    year=2024,
)

SYED = Reference(
    key="syed2023",
    short="Syed et al. 2023",
    authors="Aaquib Syed, Can Rager, Arthur Conmy",
    title="Attribution Patching Outperforms Automated Circuit Discovery",
    venue="arXiv:2310.10348",
    year=2023,
)
ABNAR = Reference(
    key="abnar2020",
    short="Abnar & Zuidema 2020",
    authors="Samira Abnar, Willem Zuidema",
    title="Quantifying Attention Flow in Transformers",
    venue="Proceedings of ACL (attention rollout)",
    year=2020,
)
FERRANDO = Reference(
    key="ferrando2022",
    short="Ferrando, Gállego & Costa-jussà 2022",
    authors="Javier Ferrando, Gerard I. Gállego, Marta R. Costa-jussà",
    title="Measuring the Mixing of Contextual Information in the Transformer",
    venue="Proceedings of EMNLP (ALTI)",
    year=2022,
)
FERRANDO_VOITA = Reference(
    key="ferrando2024",
    short="Ferrando & Voita 2024",
    authors="Javier Ferrando, Elena Voita",
    title="Information Flow Routes: Automatically Interpreting Language Models at Scale",
    venue="Proceedings of EMNLP, arXiv:2403.00824",
    year=2024,
)
DEYOUNG = Reference(
    key="deyoung2020",
    short="DeYoung et al. 2020",
    authors="Jay DeYoung, Sarthak Jain, Nazneen Fatema Rajani, Eric Lehman, Caiming Xiong, Richard Socher, Byron C. Wallace",
    title="ERASER: A Benchmark to Evaluate Rationalized NLP Models",
    venue="Proceedings of ACL (comprehensiveness, sufficiency, AOPC)",
    year=2020,
)
SUNDARARAJAN = Reference(
    key="sundararajan2017",
    short="Sundararajan, Taly & Yan 2017",
    authors="Mukund Sundararajan, Ankur Taly, Qiqi Yan",
    title="Axiomatic Attribution for Deep Networks",
    venue="Proceedings of ICML (integrated gradients)",
    year=2017,
)
HOLM = Reference(
    key="holm1979",
    short="Holm 1979",
    authors="Sture Holm",
    title="A Simple Sequentially Rejective Multiple Test Procedure",
    venue="Scandinavian Journal of Statistics 6(2), 65–70",
    year=1979,
)

REFERENCES: tuple[Reference, ...] = (
    PAPER_A,
    PAPER_B,
    KOBAYASHI,
    MOHEBBI,
    GU,
    SYED,
    ABNAR,
    FERRANDO,
    FERRANDO_VOITA,
    DEYOUNG,
    SUNDARARAJAN,
    HOLM,
)
NICKNAMES = {"A": PAPER_A, "B": PAPER_B}

# "papers A §3.2 and B", "paper A §2.2–3.1", "Paper B's", "paper B"
_PAPERS = re.compile(r"\b[Pp]apers ([AB])((?:\s*§[\d.–-]+)?) and ([AB])\b")
_PAPER = re.compile(r"\b[Pp]aper ([AB])\b('s)?")
_NICKNAME = re.compile(r"\b[Pp]apers? [AB]\b")


def cite_text(text: str) -> str:
    """``text`` with every "paper A"/"paper B" nickname replaced by its author-year citation."""
    if not isinstance(text, str) or not _NICKNAME.search(text):
        return text
    text = _PAPERS.sub(lambda m: f"{NICKNAMES[m.group(1)].short}{m.group(2)} and {NICKNAMES[m.group(3)].short}", text)
    return _PAPER.sub(lambda m: NICKNAMES[m.group(1)].short + ("'s" if m.group(2) else ""), text)


def references_of(text: str) -> list[Reference]:
    """The references a source string names (nicknames or author-year citations), in list order."""
    if not isinstance(text, str):
        return []
    found = set()
    for m in re.finditer(r"\b[Pp]apers? ([AB])\b(?:(?:\s*§[\d.–-]+)? and ([AB])\b)?", text):
        found.update(g for g in m.groups() if g)
    out = {NICKNAMES[k].key for k in found}
    out |= {r.key for r in REFERENCES if r.short.split(" 20")[0] in text}
    return [r for r in REFERENCES if r.key in out]


def full_citation_html(ref: Reference) -> str:
    """``Authors. <i>Title.</i> Venue, year.`` (escaped)."""
    return f"{html.escape(ref.authors)}. <i>{html.escape(ref.title)}.</i> {html.escape(ref.venue)}, {ref.year}."


def source_html(source: str) -> str:
    """A claim's source cell: the author-year citation with its section, each citation a link to
    its entry in the references list (the only place a full citation appears)."""
    text = html.escape(cite_text(source))
    for r in references_of(source):  # the author-year citation links to the references list
        short = html.escape(r.short)
        text = text.replace(short, f'<a href="#ref-{r.key}">{short}</a>', 1)
    return text


def references_html(keys: list[str] | None = None) -> str:
    """The references list (every reference, or those with the given keys), with anchors."""
    refs = [r for r in REFERENCES if keys is None or r.key in keys]
    items = "".join(f'<li id="ref-{r.key}"><b>{html.escape(r.short)}.</b> {full_citation_html(r)}</li>' for r in refs)
    return f'<ul class="references">{items}</ul>'
