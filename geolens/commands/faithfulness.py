"""``geolens faithfulness``: comprehensiveness / sufficiency curves and MC accuracy under masks.

The primary protocol (the defaults; docs/method.md §3): every layer masked at once, ``query``
ranking (all (head, source) terms of a query on the inter-head scale), sink and current token
removable, k ∈ {0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9}, every prediction after the first
8 positions scored. Example (the README run)::

    geolens faithfulness --n-sequences 100 --seq-len 128 --out docs/faithfulness/protocol1/smollm2-135m --overwrite

Writes under ``--out``: ``summary.json`` (protocol, clean PPL, range check, AUCs, the paired
differences with their verdicts), ``per_sequence.csv.gz`` (each document's mean NLL under each mask),
``clean.csv``, ``curves.csv``, ``auc.csv``, ``pairs.csv``, ``pairs.md``,
``curves_delta_ppl.png``, ``curves_delta_logprob.png`` and, with ``--mc-task``, ``mc.csv`` and
``mc.png``. The protocol and the range check are printed first. Documents are processed in
blocks; after each block every table and figure is rewritten for the documents done so far, and
``--resume`` continues an interrupted run from its ``per_sequence.csv.gz`` (same protocol only).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def parse_layers(text: str, n_layers: int) -> tuple[int, ...] | None:
    """``"all"``, ``"early"``/``"middle"``/``"late"`` (thirds), ``"28,29"``, ``"20-29"`` or negative
    indices (``"-2,-1"``), checked, never wrapped (a layer outside [−n, n) is a UsageError)."""
    from geolens.commands._options import resolve_layers
    from geolens.faithfulness import LAYER_GROUPS, layer_group

    text = text.strip()
    if text != "all" and text in LAYER_GROUPS:
        return layer_group(text, n_layers)
    return resolve_layers(text, n_layers, "--layers")


def parse_fractions(text: str, option: str = "--fractions") -> tuple[float, ...]:
    """Comma-separated fractions, each in the open interval (0, 1), sorted; else UsageError."""
    from geolens.errors import UsageError

    try:
        fr = tuple(float(k) for k in text.split(","))
    except ValueError:
        raise UsageError(f"{option} must be comma-separated numbers, got {text!r}") from None
    bad = [k for k in fr if not 0.0 < k < 1.0]
    if bad:
        raise UsageError(f"{option} must lie in (0, 1), got {bad}")
    return tuple(sorted(set(fr)))


def _language_modelling(model, args, protocol, metrics, out: Path):
    from geolens.commands._options import corpus_windows
    from geolens.errors import UsageError
    from geolens.faithfulness.result import FaithfulnessResult, ResumeError, resume_state
    from geolens.pipelines.faithfulness import FaithfulnessParams, run_faithfulness
    from geolens.pipelines.faithfulness_text import range_text, save_protocol1

    tokens = corpus_windows(model, args.corpus, args.seq_len, args.n_sequences)  # UsageError if too few
    t0 = time.time()
    done, spent = None, 0.0
    if args.resume:
        try:
            per, clean = resume_state(out, protocol.to_dict(model))
        except ResumeError as err:
            raise UsageError(str(err)) from None
        if per is not None:
            done = (per, clean)
            spent = float(json.loads((out / "summary.json").read_text()).get("meta", {}).get("seconds", 0.0))
            print(f"resuming after {len(clean)} documents already in {out}", flush=True)
    checks = None

    def meta(n_done: int) -> dict:
        return dict(
            n_sequences=n_done,
            n_sequences_requested=int(tokens.shape[0]),
            seq_len=int(tokens.shape[1]),
            metrics=list(metrics),
            seed=args.seed,
            model=args.model,
            corpus=args.corpus,
            seconds=round(spent + time.time() - t0, 1),
            complete=n_done == tokens.shape[0],
            command="geolens faithfulness " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "geolens faithfulness",
        )

    def save(result) -> None:  # every block: an interrupted run keeps a consistent set
        nonlocal checks
        checks = save_protocol1(result, out)
        print(f"  {len(result.clean)} / {tokens.shape[0]} documents, {time.time() - t0:.0f} s (saved)", flush=True)

    params = FaithfulnessParams(
        protocol=protocol,
        metrics=metrics,
        chunk_size=args.chunk_size,
        seed=args.seed,
        n_boot=args.n_boot,
        block=args.block,
    )
    run = run_faithfulness(model, tokens, params, done=done, meta=meta, on_block=save)
    if run is None:  # everything was already done: rewrite the tables from the saved results
        result = FaithfulnessResult.load(out, n_boot=args.n_boot)
        checks = save_protocol1(result, out)
    else:
        result = run.result
    print(result)
    print(range_text(result.range_check()))
    for c in checks:
        print(
            f"order of Cunningham & Muça Cirone 2026, raw < value-weighted < output-normalised < contribution, {c['direction']} {c['quantity']}: "
            f"{'holds' if c['holds'] else 'does NOT hold'} {c['pairs']}"
        )
    return result


# The options of protocol 1; under --protocol they must keep their defaults (the protocol fixes them).
V1_OPTIONS = (
    "layers",
    "ranking",
    "fractions",
    "metrics",
    "mode",
    "protect_sink",
    "protect_current",
    "skip_prefix",
    "mc_task",
    "mc_questions",
    "mc_fractions",
    "n_sequences",
    "seq_len",
    "chunk_size",
    "mc_chunk_size",
    "block",
    "n_boot",
    "seed",
    "replot",
)


def run_preregistered(args) -> int:
    """``geolens faithfulness --protocol PATH``: the pre-registered protocol's endpoints, resumable
    per document, into ``--out`` (docs/faithfulness/PROTOCOL.md). Stage ``per_term``: §2."""
    from geolens.commands._options import check_corpus, check_model_name, out_folder
    from geolens.errors import UsageError
    from geolens.preregistration import load_protocol, preregistration, status_line

    try:
        protocol = load_protocol(args.protocol)
    except ValueError as err:
        raise UsageError(f"--protocol: {err}") from None
    changed = [name for name in V1_OPTIONS if getattr(args, name) != args.v1_defaults[name]]
    if changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise UsageError(f"--protocol fixes the design; drop {flags} (protocol 1's options)")
    model_name = check_model_name(args.model, tiny=True)
    check_corpus(args.corpus)
    data = protocol["data"]
    n_documents = int(data["n_documents"]) if args.max_documents is None else int(args.max_documents)
    differences = []
    if model_name not in data["models"]:
        differences.append(f"model {model_name} is not one of the protocol's {data['models']}")
    if args.corpus != data["corpus"]:
        differences.append(f"corpus {args.corpus}, not {data['corpus']}")
    if n_documents != int(data["n_documents"]):
        differences.append(f"{n_documents} documents, not {data['n_documents']}")
    out = out_folder(args, "faithfulness", resumable=True)
    start = time.time()
    import torch

    from geolens.adapter import model_mode
    from geolens.checkpoint import atomic_write_bytes
    from geolens.data import load_corpus
    from geolens.faithfulness.preregistered import protocol_windows, run_stages, write_json
    from geolens.models import load_model
    from geolens.pipelines.faithfulness_text import masking_markdown, per_term_text, protocol_markdown

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(model_name)
    if data.get("model_mode") and model_mode(model) != data["model_mode"]:
        differences.append(f"model mode {model_mode(model)}, not {data['model_mode']}")
    registration = preregistration(protocol, differences)
    label = registration["status"]
    try:
        windows, sources = protocol_windows(model, protocol, load_corpus(args.corpus), n_documents=n_documents)
    except ValueError as err:
        raise UsageError(f"--corpus {args.corpus}: {err}") from None
    print(
        f"protocol {protocol.path} (version {protocol.version}, sha256 {protocol.sha256[:16]}…): {label}"
        + "".join(f"\n  differs: {d}" for d in registration["reasons"]),
        flush=True,
    )
    print(
        f"model {model_name} ({model_mode(model)}), corpus {args.corpus}: {n_documents} documents × {windows.shape[1]} tokens; "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    summary = dict(
        command=f"geolens faithfulness --protocol {args.protocol} --model {model_name} --corpus {args.corpus} --stage {args.stage}"
        + (f" --max-documents {args.max_documents}" if args.max_documents is not None else "")
        + f" --out {out}",
        protocol_version=protocol.version,
        protocol_sha256=protocol.sha256,
        label=label,
        differences=registration["reasons"],
        preregistration=registration,
        model=model_name,
        model_mode=model_mode(model),
        corpus=args.corpus,
        n_documents=n_documents,
        corpus_indices=sources,
        stages={},
        protocol=dict(
            masking_scope=protocol["secondary"].get("masking_scope"),  # protocol 3: none (per-term only)
            outcome=protocol["primary"]["outcome"],
            fractions=protocol["secondary"].get("fractions"),
            primary_endpoint=protocol["primary"]["endpoint"],
            positions_per_document=protocol["primary"]["positions_per_document"],
        ),
        multiple_comparison=protocol["statistics"]["multiple_comparison"],
    )
    stages = ("per_term", "masking") if args.stage == "all" else (args.stage,)
    summary.update(
        run_stages(
            model,
            windows,
            protocol,
            out,
            stages,
            corpus=args.corpus,
            model_name=model_name,
            resume=args.resume,
            progress=lambda text: print(text, flush=True),
        )
    )
    summary["seconds"] = round(time.time() - start, 1)
    if label != "pre-registered":  # an exploratory run gets no verdicts (PROTOCOL.md, preamble)
        from geolens.preregistration import withhold_verdicts

        for key in ("per_term_effects", "masking"):
            if key in summary:
                summary[key] = dict(summary[key], pairs=withhold_verdicts(summary[key]["pairs"]))
                if "exploratory_pairs" in summary[key]:  # the secondary outcome's pairs decide nothing either
                    summary[key]["exploratory_pairs"] = withhold_verdicts(summary[key]["exploratory_pairs"])
                if "norm_controlled" in summary[key]:  # protocol 3 keeps its family there too
                    nc = summary[key]["norm_controlled"]
                    summary[key]["norm_controlled"] = dict(
                        nc, pairs=summary[key]["pairs"], claimed_order_beyond_norm=None
                    )
        summary["pairs"] = [
            p for key in ("per_term_effects", "masking") if key in summary for p in summary[key]["pairs"]
        ]
        summary["note"] = "exploratory: " + "; ".join(registration["reasons"]) + ", so no verdict is given"
    write_json(summary, out / "summary.json")
    atomic_write_bytes(out / "README.md", protocol_markdown(summary).encode("utf-8"))
    if "per_term_effects" in summary:
        print(per_term_text(summary))
    if "masking" in summary:
        print(masking_markdown(summary["masking"]))
    print(
        f"{status_line(registration)}: wrote {out}/summary.json ({summary['seconds']:.0f} s; stages {summary['stage_seconds']})"
    )
    return 0


def run(args) -> int:
    from geolens.commands._options import check_corpus, check_model_name, check_multiple_choice, out_folder
    from geolens.errors import UsageError
    from geolens.faithfulness import MaskingConfig
    from geolens.metrics import metric_names
    from geolens.pipelines.faithfulness_text import mc_outputs, save_protocol1

    if args.protocol:
        return run_preregistered(args)
    if args.stage != "all" or args.max_documents is not None:
        raise UsageError(f"{'--stage' if args.stage != 'all' else '--max-documents'} needs --protocol")

    fractions = parse_fractions(args.fractions)
    mc_fractions = parse_fractions(args.mc_fractions, "--mc-fractions")
    metrics = (
        tuple(m.strip() for m in args.metrics.split(",") if m.strip())
        if args.metrics
        else metric_names(default_only=True)
    )
    unknown = [m for m in metrics if m not in metric_names()]
    if unknown:
        raise UsageError(f"--metrics: unknown metric {unknown[0]!r} (choose from {', '.join(metric_names())})")
    if args.skip_prefix >= args.seq_len - 1:
        raise UsageError(f"--skip-prefix {args.skip_prefix} leaves no prediction in {args.seq_len} tokens")
    if (args.replot or args.resume) and not args.out:
        raise UsageError(f"{'--replot' if args.replot else '--resume'} needs --out, the folder of the run")
    out = Path(args.out) if args.out else None
    if args.replot:  # tables and figures again from the saved per-document results, no model
        from geolens.faithfulness import FaithfulnessResult, per_sequence_path

        missing = [n for n in ("summary.json", "per_sequence.csv.gz", "clean.csv") if not (out / n).is_file()]
        if "per_sequence.csv.gz" in missing and per_sequence_path(out).is_file():
            missing.remove("per_sequence.csv.gz")
        has_mc = (out / "mc_questions.csv").is_file() and (out / "mc_progress.json").is_file()
        if missing and not has_mc:
            raise UsageError(f"--replot: {out} holds no saved results (missing {', '.join(missing)})")
        out = out_folder(args, "faithfulness", resumable=True)
        if not missing:
            result = FaithfulnessResult.load(out, n_boot=args.n_boot)
            for c in save_protocol1(result, out):
                print(c)
            print(result)
        if has_mc:  # multiple choice, also from a run still under way (the questions answered so far)
            import pandas as pd

            mc_outputs(pd.read_csv(out / "mc_questions.csv"), out, n_boot=args.n_boot, seed=args.seed)
        return 0
    model_name = check_model_name(args.model)
    out = out_folder(args, "faithfulness", resumable=True)  # a later usage error removes it again
    if args.n_sequences > 0:
        check_corpus(args.corpus)
    questions = None
    if args.mc_task and args.mc_questions > 0:
        questions = check_multiple_choice(args.mc_task)[: args.mc_questions]
        if not questions:
            raise UsageError(f"--mc-task {args.mc_task}: no question")
    import torch

    from geolens.models import load_model

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(model_name)
    protocol = MaskingConfig(
        layers=parse_layers(args.layers, model.cfg.n_layers),
        ranking=args.ranking,
        allow_sink=not args.protect_sink,
        allow_current=not args.protect_current,
        mode=args.mode,
        fractions=fractions,
        skip_prefix=args.skip_prefix,
    )
    print(protocol.describe(model))
    print(
        f"model {args.model}, corpus {args.corpus}: {args.n_sequences} documents × {args.seq_len} tokens; metrics {list(metrics)}; "
        f"{args.chunk_size} masks per forward; torch threads {torch.get_num_threads()}",
        flush=True,
    )
    if args.n_sequences > 0:
        _language_modelling(model, args, protocol, metrics, out)
    if questions:
        from geolens.faithfulness.result import ResumeError, questions_in_blocks
        from geolens.multiple_choice import mc_under_masks_per_question

        mc_protocol = MaskingConfig(
            layers=protocol.layers,
            ranking=protocol.ranking,
            allow_sink=protocol.allow_sink,
            allow_current=protocol.allow_current,
            mode=protocol.mode,
            fractions=mc_fractions,
        )
        print(f"multiple choice: {args.mc_task}, {len(questions)} questions; " + mc_protocol.describe(model))
        t1 = time.time()
        try:
            per_q = questions_in_blocks(
                mc_under_masks_per_question,
                model,
                questions,
                mc_protocol,
                metrics,
                out,
                task=args.mc_task,
                seed=args.seed,
                chunk_size=args.mc_chunk_size,
                block=args.block,
                resume=args.resume,
                progress=lambda text: print(text, flush=True),
            )
        except ResumeError as err:
            raise UsageError(str(err)) from None
        mc_outputs(per_q, out, n_boot=args.n_boot, seed=args.seed, seconds=round(time.time() - t1, 1))
    print(f"results in {out}/")
    return 0


def register(subparsers) -> None:
    from geolens.commands._names import COSTLY_METRICS, DEFAULT_METRICS, FRACTIONS, METRICS, RANKING_SCOPES
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
    p.add_argument(
        "--metrics",
        default="",
        help=f"comma-separated metrics, from {', '.join(METRICS)} (geolens.metrics; default: "
        f"{','.join(DEFAULT_METRICS)}"
        + "".join(
            f"; not by default: {m} ({text})" for m, text in COSTLY_METRICS.items()
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
        "--mc-task",
        default="",
        help="bigbench:<task>, hf:boolq|winogrande|mmlu, a .jsonl, several of them comma-separated, or '' to skip (default)",
    )
    p.add_argument("--mc-questions", type=non_negative_int, default=25)
    p.add_argument(
        "--mc-fractions", default="0.1,0.5,0.9", help="removal fractions of the multiple-choice part, each in (0, 1)"
    )
    p.add_argument("--chunk-size", type=positive_int, default=12, help="masks per batched forward")
    p.add_argument("--mc-chunk-size", type=positive_int, default=60)
    p.add_argument(
        "--block", type=positive_int, default=5, help="documents (multiple choice: questions) per saved block"
    )
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
