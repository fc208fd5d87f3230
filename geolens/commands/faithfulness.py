"""``geolens faithfulness``: comprehensiveness / sufficiency curves and MC accuracy under masks.

Example (the README run)::

    geolens faithfulness --n-sequences 100 --seq-len 128 --out docs/faithfulness

Writes ``per_sequence.csv``, ``curves.csv``, ``auc.csv``, ``auc.md``, ``clean.csv``,
``protocol.json``, ``curves_delta_ppl.png``, ``curves_delta_logprob.png`` and, with a
multiple-choice task, ``mc.csv`` and ``mc.png`` under ``--out``. The protocol is printed first.
Sequences are processed in blocks; after each block every table and figure is rewritten for the
sequences done so far (``protocol.json`` records how many), so an interrupted run keeps a
consistent set. ``--n-sequences 0`` runs only the multiple-choice part.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd


def parse_layers(text: str, n_layers: int) -> tuple[int, ...] | None:
    """``"all"``, ``"28,29"``, ``"20-29"`` or negative indices (``"-2,-1"``), checked, never wrapped."""
    from geolens.commands._options import resolve_layers

    return resolve_layers(text, n_layers, "--layers")


def auc_markdown(auc: pd.DataFrame) -> str:
    lines = ["| metric | direction | quantity | AUC | 95% CI |", "|---|---|---|---:|---|"]
    for r in auc.itertuples():
        lines.append(f"| {r.metric} | {r.direction} | {r.quantity} | {r.auc:.4f} | [{r.ci_low:.4f}, {r.ci_high:.4f}] |")
    return "\n".join(lines) + "\n"


def _save_all(result, out: Path) -> None:
    """Tables, AUC (markdown too), the claimed-order check and both curve figures."""
    from geolens.faithfulness import claimed_order_holds, paired_auc_differences
    from geolens.viz.faithfulness import faithfulness_curves_plot

    result.save(out)
    auc = result.auc()
    (out / "auc.md").write_text(result.protocol_text() + "\n\n" + auc_markdown(auc), encoding="utf-8")
    checks = [claimed_order_holds(auc, d, q) for d in ("comprehensiveness", "sufficiency") for q in ("delta_ppl", "delta_logprob")]
    (out / "claimed_order.json").write_text(json.dumps(checks, indent=2))
    paired = paired_auc_differences(result, n_boot=result.n_boot)
    paired.to_csv(out / "auc_paired_vs_raw.csv", index=False)
    lines = ["| metric − raw attention | direction | quantity | ΔAUC | 95% paired CI |", "|---|---|---|---:|---|"]
    lines += [f"| {r.metric} | {r.direction} | {r.quantity} | {r.auc_difference:+.4f} | [{r.ci_low:+.4f}, {r.ci_high:+.4f}] |" for r in paired.itertuples()]
    (out / "auc_paired_vs_raw.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if (out / "mc.csv").exists():
        from geolens.viz.faithfulness import mc_accuracy_plot

        mc = pd.read_csv(out / "mc.csv")
        info = json.loads((out / "mc_protocol.json").read_text()) if (out / "mc_protocol.json").exists() else {}
        p = info.get("protocol", {})
        view = mc_accuracy_plot(mc, subtitle=f"{info.get('task', '')}, {info.get('n_questions', '?')} questions; layers masked {p.get('layers')}, "
                                f"sink removable {p.get('allow_sink')}, current removable {p.get('allow_current')}")  # fmt: skip
        view.save(out / "mc.png", dpi=80)
        view.close()
    for q in ("delta_ppl", "delta_logprob"):
        view = faithfulness_curves_plot(result.curves, q, subtitle=result.protocol_text())
        view.save(out / f"curves_{q}.png", dpi=80)
        view.close()
    return checks


def _language_modelling(model, args, protocol, metrics, out: Path) -> None:
    from geolens.commands._options import corpus_windows
    from geolens.faithfulness import FaithfulnessResult, faithfulness_curves

    tokens = corpus_windows(model, args.corpus, args.seq_len, args.n_sequences)  # UsageError if too few
    t0 = time.time()
    parts, cleans = [], []
    for start in range(0, tokens.shape[0], args.block):
        res = faithfulness_curves(
            model, tokens[start : start + args.block], protocol, metrics,
            chunk_size=args.chunk_size, seed=args.seed + start, progress=True, n_boot=args.n_boot,
        )  # fmt: skip
        res.per_sequence["sequence"] += start
        res.clean["sequence"] += start
        parts.append(res.per_sequence)
        cleans.append(res.clean)
        done = start + len(res.clean)
        result = FaithfulnessResult(
            protocol=protocol.to_dict(model), per_sequence=pd.concat(parts, ignore_index=True),
            clean=pd.concat(cleans, ignore_index=True), n_boot=args.n_boot,
            meta=dict(n_sequences=done, n_sequences_requested=int(tokens.shape[0]), seq_len=int(tokens.shape[1]),
                      metrics=list(metrics), seed=args.seed, model=args.model, corpus=args.corpus,
                      seconds=round(time.time() - t0, 1), complete=done == tokens.shape[0]),
        )  # fmt: skip
        checks = _save_all(result, out)  # every block: an interrupted run keeps a consistent set
        print(f"  {done} / {tokens.shape[0]} sequences, {time.time() - t0:.0f} s (saved)", flush=True)
    print(result)
    for c in checks:
        print(f"paper A order raw < value-weighted < output-normalised < contribution, {c['direction']} {c['quantity']}: "
              f"{'holds' if c['holds'] else 'does NOT hold'} {c['pairs']}")  # fmt: skip


def run(args) -> int:
    import torch

    from geolens.commands._options import UsageError, check_corpus, check_model_name, check_multiple_choice, check_out_dir
    from geolens.faithfulness import ALL_METRICS, Protocol
    from geolens.models import load_model
    from geolens.viz.faithfulness import mc_accuracy_plot

    if args.replot:  # tables and figures again from the saved per-sequence results, no model
        from geolens.faithfulness import FaithfulnessResult

        missing = [n for n in ("protocol.json", "per_sequence.csv", "clean.csv") if not (Path(args.out) / n).is_file()]
        if missing:
            raise UsageError(f"--replot: {args.out} holds no saved results (missing {', '.join(missing)})")
        check_out_dir(args.out)
        result = FaithfulnessResult.load(args.out, n_boot=args.n_boot)
        for c in _save_all(result, Path(args.out)):
            print(c)
        print(result)
        return 0
    model_name = check_model_name(args.model)
    metrics = tuple(m.strip() for m in args.metrics.split(",") if m.strip()) if args.metrics else ALL_METRICS
    unknown = [m for m in metrics if m not in ALL_METRICS]
    if unknown:
        raise UsageError(f"--metrics: unknown metric {unknown[0]!r} (choose from {', '.join(ALL_METRICS)})")
    out = check_out_dir(args.out)
    if args.n_sequences > 0:
        check_corpus(args.corpus)
    questions = None
    if args.mc_task and args.mc_questions > 0:
        questions = check_multiple_choice(args.mc_task)[: args.mc_questions]
        if not questions:
            raise UsageError(f"--mc-task {args.mc_task}: no question")
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(model_name)
    protocol = Protocol(
        layers=parse_layers(args.layers, model.cfg.n_layers),
        allow_sink=args.allow_sink,
        allow_current=args.allow_current,
        mode=args.mode,
        fractions=tuple(args.fractions),
        n_scored=args.n_scored or None,
    )
    print(protocol.describe(model))
    print(f"model {args.model}, corpus {args.corpus}: {args.n_sequences} sequences × {args.seq_len} tokens; metrics {list(metrics)}")
    if args.n_sequences > 0:
        _language_modelling(model, args, protocol, metrics, out)
    if questions:
        from geolens.multiple_choice import mc_accuracy_under_masks

        mc_protocol = Protocol(
            layers=protocol.layers, allow_sink=protocol.allow_sink, allow_current=protocol.allow_current,
            mode=protocol.mode, fractions=tuple(args.mc_fractions),
        )  # fmt: skip
        print(f"multiple choice: {args.mc_task}, {len(questions)} questions; " + mc_protocol.describe(model))
        t1 = time.time()
        mc = mc_accuracy_under_masks(model, questions, mc_protocol, metrics, seed=args.seed, chunk_size=args.mc_chunk_size)
        mc.to_csv(out / "mc.csv", index=False)
        (out / "mc_protocol.json").write_text(json.dumps(dict(task=args.mc_task, n_questions=len(questions), protocol=mc_protocol.to_dict(model), seconds=round(time.time() - t1, 1)), indent=2))
        print(mc.pivot_table(index="metric", columns=["direction", "fraction"], values="accuracy", sort=False).to_string(float_format=lambda v: f"{v:.3f}"))
        view = mc_accuracy_plot(mc, subtitle=f"{args.mc_task}, {len(questions)} questions; " + mc_protocol.describe(model).replace("protocol: ", ""))
        view.save(out / "mc.png", dpi=80)
        view.close()
    print(f"results in {out}/")
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_corpus, add_model, add_out, add_threads, float_list, layer_spec, non_negative_int, positive_int, seq_len_int

    p = subparsers.add_parser("faithfulness", help="comprehensiveness/sufficiency curves of attribution metrics by causal masking (docs/method.md §3)")
    add_model(p)
    add_corpus(p)
    p.add_argument("--n-sequences", type=non_negative_int, default=100, help="0 skips the language-modelling curves")
    p.add_argument("--seq-len", type=seq_len_int, default=128)
    p.add_argument("--layers", type=layer_spec, default="-1", help="layers masked together: 'all', '28,29', '20-29', '=-2,-1' (default: the last layer)")
    p.add_argument("--fractions", type=float_list(0, 1), default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], help="removal fractions in [0, 1] (default 0.1,…,0.9)")
    p.add_argument("--metrics", default="", help="comma-separated subset of the six metrics (default: all)")
    p.add_argument("--mode", default="intra", choices=["intra", "inter"], help="output norm of c and the output-normalised metric")
    p.add_argument("--allow-sink", action="store_true", help="let position 0 be removed")
    p.add_argument("--allow-current", action="store_true", help="let the query's own token be removed")
    p.add_argument("--n-scored", type=non_negative_int, default=16, help="score only the last N predictions of each sequence (0: all)")
    p.add_argument("--mc-task", default="bigbench:general_knowledge", help="bigbench:<task>, hf:boolq|winogrande|mmlu, a .jsonl, or '' to skip")
    p.add_argument("--mc-questions", type=non_negative_int, default=25)
    p.add_argument("--mc-fractions", type=float_list(0, 1), default=[0.1, 0.5, 0.9], help="removal fractions of the multiple-choice part (default 0.1,0.5,0.9)")
    p.add_argument("--chunk-size", type=positive_int, default=108, help="masks per batched forward (108 = a whole curve set)")
    p.add_argument("--mc-chunk-size", type=positive_int, default=60)
    p.add_argument("--block", type=positive_int, default=10, help="sequences per saved block")
    p.add_argument("--n-boot", type=positive_int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    add_threads(p, default=0)
    p.add_argument("--replot", action="store_true", help="rewrite tables and figures from the results already in --out")
    add_out(p, default="docs/faithfulness")
    p.set_defaults(func=run)
