"""Build the shipped reference sets (geolens/faithfulness/reference_effects/) from protocol 3's
published per-term effects (docs/faithfulness/v3/<model>/per_term_*.csv.gz).

    python scripts/build_reference_set.py [--model smollm2-135m|gemma3-270m] [--verify-documents 1] \
        [--out geolens-runs/reference-effects]

It writes into ``--out`` (by default ``geolens-runs/reference-effects``, outside the package: a run
with the defaults leaves the checkout unchanged); the shipped sets are that folder's files copied
into ``geolens/faithfulness/reference_effects/`` (``--out geolens/faithfulness/reference_effects``
writes them there directly).

For each model it checks, before writing anything:

- the published files against their manifest (SHA-256);
- the windows: protocol 3's windows of the Lee corpus, rebuilt with the model's tokenizer, give
  every position's recorded next token;
- the weights: the first ``--verify-documents`` documents' per-term effects, measured again here
  in float64 as protocol 3 measured them, give the published norms and raw attention within 1e-12
  (relative) and the published KL and Δ log p(next) within 100 times the position's numerical
  floor (bit for bit is not promised: the thread count changes the order of float64 sums);
- the copy: every value written reads back bit for bit.

The published CSVs are read with ``float_precision="round_trip"`` (pandas' default parser can
miss the last bit of a 17-digit float).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "faithfulness" / "v3"


def published_tables(model_name: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    from geolens.resume import sha256_bytes

    folder = PUBLISHED / model_name
    manifest = json.loads((folder / "manifest.json").read_text())
    files = {}
    for name in ("per_term_terms.csv.gz", "per_term_positions.csv.gz"):
        digest = sha256_bytes((folder / name).read_bytes())
        if digest != manifest["files"][name]["sha256"]:
            raise SystemExit(f"{folder / name} does not match its manifest")
        files[f"docs/faithfulness/v3/{model_name}/{name}"] = digest
    terms = pd.read_csv(folder / "per_term_terms.csv.gz", float_precision="round_trip")
    positions = pd.read_csv(folder / "per_term_positions.csv.gz", float_precision="round_trip")
    return terms, positions, files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2-135m", "gemma3-270m"], action="append")
    parser.add_argument("--verify-documents", type=int, default=1, help="documents measured again (default 1)")
    parser.add_argument(
        "--out", type=Path, default=Path("geolens-runs/reference-effects"), help="the folder written (see above)"
    )
    args = parser.parse_args(argv)

    import torch

    from geolens.data import load_corpus
    from geolens.faithfulness.evaluation import float64_model
    from geolens.faithfulness.norm_controlled import norm_controlled_document
    from geolens.faithfulness.preregistered import protocol_windows
    from geolens.faithfulness.reference import POSITION_COLUMNS, TERM_COLUMNS, load_reference, write_reference
    from geolens.models import load_model

    protocol = json.loads((PUBLISHED / "protocol.json").read_text())
    registered = json.loads((PUBLISHED / "REGISTERED.json").read_text())
    for model_name in args.model or ["smollm2-135m", "gemma3-270m"]:
        terms, positions, files = published_tables(model_name)
        model = load_model(model_name)
        windows, sources = protocol_windows(model, protocol, load_corpus("lee"))
        nxt = windows[positions.document.to_numpy(), positions["query"].to_numpy() + 1].numpy()
        if not np.array_equal(nxt, positions.next_token.to_numpy()):
            raise SystemExit(f"{model_name}: the rebuilt windows do not give the recorded next tokens")
        per_doc = int(positions.groupby("document").size().max())
        with float64_model(model):
            for d in range(args.verify_documents):
                t, _ = norm_controlled_document(
                    model,
                    windows[d : d + 1],
                    d,
                    n_positions=per_doc,
                    queries=tuple(protocol["data"]["scored_positions"]),
                )
                want = terms[terms.document == d].reset_index(drop=True)
                floors = want.merge(positions, on=["document", "position"])["floor"].to_numpy()
                for column, bound in (("kl", 100 * floors), ("delta_logp_next", 100 * floors)):
                    gap = np.abs(t[column].to_numpy() - want[column].to_numpy())
                    if not (gap <= bound).all():
                        raise SystemExit(
                            f"{model_name} document {d}: {column} differs from the published beyond 100 floors"
                        )
                for column in ("norm", "raw_attention"):
                    gap = np.abs(t[column].to_numpy() - want[column].to_numpy()) / np.maximum(
                        np.abs(want[column]), 1e-300
                    )
                    if not (gap <= 1e-12).all():
                        raise SystemExit(
                            f"{model_name} document {d}: {column} differs from the published by {gap.max():.2g}"
                        )
                kl_gap = np.abs(t.kl.to_numpy() - want.kl.to_numpy()).max()
                print(
                    f"{model_name}: document {d} measured again ({len(t)} terms, {torch.get_num_threads()} threads): "
                    f"KL within {kl_gap:.2g} of the published (floors {floors.min():.2g}–{floors.max():.2g}), norms and α within 1e-12"
                )
        info = dict(
            model=model_name,
            source_files=files,
            protocol="docs/faithfulness/v3/PROTOCOL.md",
            protocol_sha256=registered.get("text_sha256") or registered.get("sha256"),
            corpus_documents=sources,
            windows="protocol 3's: one per Lee document of at least 127 tokens, BOS + its first 127 tokens",
            verified_documents=list(range(args.verify_documents)),
            command="python scripts/build_reference_set.py",
        )
        path = write_reference(args.out, model_name, windows, positions, terms, info)
        ref = load_reference(model_name, args.out)
        for c in POSITION_COLUMNS:
            assert np.array_equal(ref.positions[c].to_numpy(), positions[c].to_numpy()), c
        for c in TERM_COLUMNS:
            assert np.array_equal(ref.terms[c].to_numpy(), terms[c].to_numpy()), c
        assert torch.equal(ref.tokens, windows)
        print(f"{model_name}: wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {len(terms)} terms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
