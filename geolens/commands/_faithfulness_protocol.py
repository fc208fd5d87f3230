"""``geolens faithfulness --protocol PATH``: the pre-registered protocol's endpoints, resumable per
document (docs/faithfulness/PROTOCOL.md; :mod:`geolens.preregistration` decides whether the run is
pre-registered, :mod:`geolens.resume` checks what it resumes)."""

from __future__ import annotations

import time

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
    "n_sequences",
    "seq_len",
    "chunk_size",
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
    from geolens.threads import apply

    apply(args.threads or None)  # --threads, else GEOLENS_THREADS, else the free cores
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
            positions_per_document=protocol["primary"].get("positions_per_document"),
        ),
        multiple_comparison=protocol["statistics"]["multiple_comparison"],
    )
    registered = protocol.settings.get("stages", ["per_term", "masking"] if protocol.version < 3 else ["per_term"])
    stages = tuple(registered) if args.stage == "all" else (args.stage,)
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
