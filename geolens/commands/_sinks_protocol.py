"""``geolens sinks --controls-protocol PATH``: the dose-matched sink controls of a pre-registered
protocol (the ``"sink_controls"`` block of ``docs/faithfulness/protocol.json``) on the protocol's
own sample, resumable per window. The run and its files are
:func:`geolens.pipelines.sinks.save_dose_controls`'s (:mod:`geolens.preregistration` decides whether
the run is pre-registered), the printed text :mod:`geolens.pipelines.sinks_text`'s; the options are
declared by :mod:`geolens.commands.sinks`."""

from __future__ import annotations

import sys
import time

CORPUS_SEQ_LEN = 128  # --seq-len's default: the corpus pass's window length, not the protocol's


def run_dose_protocol(args) -> int:
    """``--controls-protocol``: the dose-matched sink controls of the protocol; writes the controls_* files."""
    import torch

    from geolens import data
    from geolens.commands._options import check_corpus, check_model_name, load_run_model, out_folder
    from geolens.errors import UsageError
    from geolens.pipelines.sinks import dose_protocol, dose_registration, save_dose_controls
    from geolens.pipelines.sinks_text import dose_header, dose_text
    from geolens.sinks.controls_dose import controls_sample

    if args.controls_only or args.controls_sequences:
        raise UsageError(
            "--controls-protocol runs the protocol's own sample; leave out --controls-only and --controls-sequences"
        )
    if args.seq_len != CORPUS_SEQ_LEN:
        raise UsageError("--seq-len sets the corpus pass; --controls-protocol takes the protocol's window length")
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the folder of the run")
    try:
        protocol, registered, info, twin = dose_protocol(
            args.controls_protocol, n_documents=args.controls_documents, n_boot=args.n_boot, corpus=args.corpus
        )
    except ValueError as err:
        raise UsageError(f"--controls-protocol: {err}") from None
    model_name = check_model_name(args.model)
    check_corpus(args.corpus)
    out = out_folder(args, "sinks", resumable=True)  # a later usage error removes it again
    t0 = time.time()
    model = load_run_model(args, model_name)
    registration = dose_registration(model, protocol, registered, info, twin, model_name=args.model)
    try:  # data.load_corpus is looked up now: tests replace it
        tokens, documents = controls_sample(
            model,
            data.load_corpus(args.corpus),
            seq_len=protocol.seq_len,
            n_documents=protocol.n_documents,
            per_document=protocol.windows_per_document,
        )
    except ValueError as err:
        raise UsageError(f"--corpus {args.corpus}: {err}") from None
    print(dose_header(info, tokens, documents, registration, threads=torch.get_num_threads()), flush=True)
    res, summary = save_dose_controls(
        model,
        tokens,
        documents,
        protocol,
        out,
        registration=registration,
        info=info,
        meta={"command": " ".join(["geolens"] + sys.argv[1:]), "model": args.model, "corpus": args.corpus},
        t0=t0,
        resume=args.resume,
        rows_per_forward=args.controls_rows,
        batch_size=args.batch_size,
    )
    print(dose_text(res, summary))
    return 0
