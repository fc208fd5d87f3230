"""Data-parallel corpus runs with ``torch.distributed``.

Each process (rank) streams its own shard of the token windows — a contiguous block of whole
batches, :func:`geolens.runner.shard_bounds` — through :func:`geolens.runner.run_corpus`, then the
analyses' states are gathered and merged with their ``merge`` (Chan et al. parallel update for
:class:`geolens.streaming.Moments`, sums for counts and histograms) in rank order, so that every
rank ends with the same merged state. Merged results equal single-process results: counts and
histogram counts exactly, means and variances up to float64 rounding (~1e-15 relative).

Backends: ``gloo`` on CPU, ``nccl`` when CUDA is available (each rank then uses
``cuda:LOCAL_RANK``). States are exchanged as pickled objects (``all_gather_object``); they are
small (``[layer, head, bin]`` tensors), so this costs nothing next to the forward passes.

Launcher (one line per node)::

    torchrun --standalone --nproc-per-node 2 -m geolens.distributed \\
        --model smollm2-135m --corpus lee --seq-len 128 --n-sequences 800 \\
        --analysis norm-curve --batch-size 8 --out norm_curve.pt

Without ``torchrun`` the same command runs as one process. ``--checkpoint DIR`` makes every
rank resumable (one file per rank: ``DIR/rank{r}-of-{world}.pt``).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from geolens.data import as_token_tensor
from geolens.models import load_any_model
from geolens.runner import run_corpus, shard_bounds
from geolens.streaming import CorpusAnalysis
from geolens.testing import TINY_MODELS


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` when none is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(backend: str | None = None) -> tuple[int, int, torch.device]:
    """Initialise the default process group from ``torchrun``'s environment variables.

    Returns ``(rank, world_size, device)``. ``backend=None`` picks ``nccl`` when CUDA is
    available and ``gloo`` otherwise. Without ``WORLD_SIZE`` in the environment (a plain
    ``python`` launch) nothing is initialised and ``(0, 1, device)`` is returned.
    """
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1 or dist.is_initialized():
        return (*world(), device)
    dist.init_process_group(backend=backend or ("nccl" if cuda else "gloo"))
    return dist.get_rank(), dist.get_world_size(), device


def merge_states(
    analyses: Sequence[CorpusAnalysis], states_per_rank: Sequence[Sequence[dict]]
) -> Sequence[CorpusAnalysis]:
    """Replace ``analyses``' states by the merge, in rank order, of ``states_per_rank``.

    ``states_per_rank[r][k]`` is rank r's ``state_dict`` of analysis k. Rank 0's state is loaded,
    then each further rank's is merged into it through a copy of the analysis.
    """
    for k, analysis in enumerate(analyses):
        template = copy.deepcopy(analysis)
        analysis.load_state_dict(states_per_rank[0][k])
        for states in states_per_rank[1:]:
            other = copy.deepcopy(template).load_state_dict(states[k])
            analysis.merge(other)
    return analyses


def reduce_analyses(analyses: Sequence[CorpusAnalysis], group=None) -> Sequence[CorpusAnalysis]:
    """All-gather every rank's states and merge them; afterwards all ranks hold the same state."""
    _, size = world()
    if size == 1:
        return analyses
    mine = [a.state_dict() for a in analyses]
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    return merge_states(analyses, gathered)


def rank_checkpoint(folder: str | os.PathLike, rank: int, world_size: int) -> Path:
    """The checkpoint file of one rank inside ``folder``."""
    return Path(folder) / f"rank{rank}-of-{world_size}.pt"


def run_corpus_distributed(
    model,
    tokens: torch.Tensor,
    analyses: Sequence[CorpusAnalysis],
    *,
    batch_size: int = 8,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    progress: bool = True,
    desc: str = "corpus",
    **kwargs,
) -> Sequence[CorpusAnalysis]:
    """:func:`geolens.runner.run_corpus` on this rank's shard of ``tokens``, then merge all ranks.

    Every rank passes the full ``[n, seq]`` token tensor (or a memmap of it); each reads only its
    shard. With no process group initialised this is exactly ``run_corpus``.
    """
    rank, size = world()
    start, stop = shard_bounds(int(tokens.shape[0]), batch_size, rank, size)
    checkpoint = rank_checkpoint(checkpoint_dir, rank, size) if checkpoint_dir is not None else None
    run_corpus(
        model,
        tokens[start:stop],
        analyses,
        batch_size=batch_size,
        checkpoint=checkpoint,
        checkpoint_every=checkpoint_every,
        progress=progress and rank == 0,
        desc=f"{desc} (rank {rank}/{size})" if size > 1 else desc,
        shard=(rank, size),
        **kwargs,
    )
    return reduce_analyses(analyses)


# --- launcher ------------------------------------------------------------------------------

ANALYSES: dict[str, str] = {
    "sink-geometry": "geolens.sinks:SinkGeometry",
    "norm-curve": "geolens.sinks:NormCurve",
    "token-types": "geolens.sinks:TokenTypeDecomposition",
    "taxonomy": "geolens.taxonomy:TaxonomyAnalysis",
}


def analysis_factory(spec: str, **kwargs) -> Callable:
    """``model -> analysis`` for a name of :data:`ANALYSES` or ``module:attribute``.

    A class with a ``for_model`` constructor is built with it; another :class:`CorpusAnalysis`
    class with ``(n_layers, n_heads)``; any other attribute is called with the model. ``kwargs``
    (e.g. ``layers=[0, 1]``) are passed on.
    """
    target = ANALYSES.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"unknown analysis {spec!r}: use one of {sorted(ANALYSES)} or 'module:factory'")
    module, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    if hasattr(obj, "for_model"):
        return lambda model: obj.for_model(model, **kwargs)
    if isinstance(obj, type) and issubclass(obj, CorpusAnalysis):
        return lambda model: obj(model.cfg.n_layers, model.cfg.n_heads, **kwargs)
    return lambda model: obj(model, **kwargs)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m geolens.distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help=f"load_model name, or {' / '.join(TINY_MODELS)}")
    p.add_argument("--corpus", default="lee", help="geolens.data.load_corpus name or path")
    p.add_argument("--tokens", default=None, help="a torch.save'd [n, seq] token tensor (instead of --corpus)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--n-sequences", type=int, default=200)
    p.add_argument(
        "--analysis", action="append", default=None, help=f"{sorted(ANALYSES)} or module:factory (repeatable)"
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--checkpoint-dir", default=None, help="resumable run: one state file per rank in this folder")
    p.add_argument("--checkpoint-every", type=int, default=1, help="batches between checkpoints")
    p.add_argument(
        "--device-map", default=None, help='split each process\'s model over its visible GPUs ("auto", "balanced")'
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="model dtype")
    p.add_argument("--backend", default=None, help="gloo / nccl (default: nccl with CUDA, else gloo)")
    p.add_argument("--out", required=True, help="rank 0 writes {'analyses', 'states', 'timing'} here (torch.save)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="do not run one untimed forward pass first")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rank, size, device = init_from_env(args.backend)
    try:
        model = load_any_model(args.model, device, device_map=args.device_map, dtype=getattr(torch, args.dtype))
        if args.tokens:
            tokens = torch.load(args.tokens, weights_only=True)
        else:
            from geolens.data import corpus_windows

            tokens = corpus_windows(model, args.corpus, args.seq_len, args.n_sequences)
        analyses = [analysis_factory(spec)(model) for spec in (args.analysis or ["norm-curve"])]
        if args.warmup and tokens.shape[0]:  # first-call costs (allocator, kernels) out of the timing
            with torch.no_grad():
                model(as_token_tensor(tokens[: args.batch_size]).to(device))
        if size > 1:
            dist.barrier()
        t0 = time.perf_counter()
        run_corpus_distributed(
            model,
            tokens,
            analyses,
            batch_size=args.batch_size,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_every=args.checkpoint_every,
            progress=not args.no_progress,
        )
        seconds = time.perf_counter() - t0
        if rank == 0:
            from geolens.checkpoint import atomic_torch_save

            atomic_torch_save(
                {
                    "analyses": [type(a).__qualname__ for a in analyses],
                    "states": [a.state_dict() for a in analyses],
                    "timing": {"seconds": seconds, "n_sequences": int(tokens.shape[0]), "world_size": size},
                },
                args.out,
            )
            print(
                f"{tokens.shape[0]} sequences on {size} process(es): {seconds:.2f} s, "
                f"{tokens.shape[0] / seconds:.2f} sequences/s -> {args.out}",
                file=sys.stderr,
            )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
