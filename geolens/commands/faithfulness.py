"""``geolens faithfulness``: comprehensiveness / sufficiency curves of attribution metrics by causal masking.

The primary protocol (the defaults; docs/method.md §3): every layer masked at once, ``query``
ranking (all (head, source) terms of a query on the inter-head scale), sink and current token
removable, k ∈ {0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9}, every prediction after the first
8 positions scored. Example (the README run)::

    geolens faithfulness --n-sequences 100 --seq-len 128 --out docs/faithfulness/protocol1/smollm2-135m --overwrite

Writes under ``--out``: ``summary.json`` (protocol, clean PPL, range check, AUCs, the paired
differences with their verdicts), ``per_sequence.csv.gz`` (each document's mean NLL under each mask),
``clean.csv``, ``curves.csv``, ``auc.csv``, ``pairs.csv``, ``pairs.md``,
``curves_delta_ppl.png`` and ``curves_delta_logprob.png``. The protocol and the range check are
printed first. Documents are processed in blocks; after each block every table and figure is
rewritten for the documents done so far, and ``--resume`` continues an interrupted run from its
``per_sequence.csv.gz`` (same protocol only). Multiple choice runs with ``geolens mc``: the former
``--mc-task`` is a one-line error that says so.
"""

from __future__ import annotations

import argparse

from geolens.commands._faithfulness_curves import parse_fractions, parse_layers  # noqa: F401 - their home


def _no_mc_task(text: str) -> str:
    """argparse type of the removed ``--mc-task``: ``''`` passes; a task is the one-line error naming ``geolens mc``."""
    if text.strip():
        raise argparse.ArgumentTypeError(
            "multiple choice runs with `geolens mc` (`--masks` for the masked run); protocol 1's masks on "
            "multiple choice remain in Python, geolens.faithfulness.mc_curves"
        )
    return ""


def run(args) -> int:
    if args.protocol:
        from geolens.commands._faithfulness_protocol import run_preregistered

        return run_preregistered(args)
    from geolens.commands._faithfulness_curves import run_curves

    return run_curves(args)


def register(subparsers) -> None:
    from geolens.commands._faithfulness_protocol import V1_OPTIONS
    from geolens.commands._names import FRACTIONS, RANKING_SCOPES, metric_choices
    from geolens.commands._options import add_out, add_run_options, layer_spec, non_negative_int, positive_int

    p = subparsers.add_parser(
        "faithfulness",
        help="comprehensiveness/sufficiency curves of attribution metrics by causal masking (docs/method.md §3)",
    )
    add_run_options(
        p,
        model="smollm2-135m",
        corpus="lee",
        n_sequences=100,
        seq_len=128,
        own={
            "n_sequences": {
                "type": non_negative_int,
                "help": "documents (windows); 0 skips the language-modelling curves",
            },
            "seq_len": {"help": None},
        },
    )
    p.add_argument(
        "--layers",
        type=layer_spec,
        default="all",
        help="layers masked together: 'all' (primary), 'early'/'middle'/'late' (thirds), '29', '20-29', '-2,-1'",
    )
    p.add_argument(
        "--ranking",
        default="query",
        choices=list(RANKING_SCOPES),
        help="terms ranked together: per (layer, head, query) row, per query across heads (primary), per source summed over heads",
    )
    p.add_argument("--fractions", default=",".join(map(str, FRACTIONS)), help="removal fractions k, each in (0, 1)")
    metrics, default_metrics, costly_metrics = metric_choices()
    p.add_argument(
        "--metrics",
        default="",
        help=f"comma-separated metrics, from {', '.join(metrics)} (geolens.metrics; default: "
        f"{','.join(default_metrics)}"
        + "".join(
            f"; not by default: {m} ({text})" for m, text in costly_metrics.items()
        )  # the primary run leaves them out
        + ")",
    )
    p.add_argument(
        "--mode",
        default="inter",
        choices=["intra", "inter"],
        help="output norm of c and the output-normalised metric: the layer's (inter, primary) or the head's",
    )
    p.add_argument("--protect-sink", action="store_true", help="never remove position 0 (secondary protocol)")
    p.add_argument(
        "--protect-current", action="store_true", help="never remove the query's own token (secondary protocol)"
    )
    p.add_argument(
        "--skip-prefix", type=non_negative_int, default=8, help="score every prediction after the first N positions"
    )
    p.add_argument(
        "--mc-task", type=_no_mc_task, default="", help="removed: multiple choice runs with geolens mc (an error)"
    )
    p.add_argument("--chunk-size", type=positive_int, default=12, help="masks per batched forward")
    p.add_argument("--block", type=positive_int, default=5, help="documents per saved block")
    p.add_argument("--resume", action="store_true", help="continue the run already in --out (same protocol)")
    p.add_argument("--n-boot", type=positive_int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    add_run_options(p, threads=0)
    p.add_argument("--replot", action="store_true", help="rewrite tables and figures from the results already in --out")
    p.add_argument(
        "--protocol",
        default="",
        help="run the pre-registered protocol of this twin (docs/faithfulness/protocol.json, "
        "docs/faithfulness/PROTOCOL.md); protocol 1's options above must keep their defaults",
    )
    p.add_argument(
        "--stage", default="all", choices=["all", "per_term", "masking"], help="with --protocol: the endpoint(s) to run"
    )
    p.add_argument(
        "--max-documents",
        type=positive_int,
        default=None,
        help="with --protocol: fewer documents (an exploratory run, no verdicts)",
    )
    add_out(p, resumable=True)
    p.set_defaults(func=run, v1_defaults={a.dest: a.default for a in p._actions if a.dest in V1_OPTIONS})
