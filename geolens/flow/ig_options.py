"""Integrated gradients' options in :func:`geolens.attribute`: the default rule and how each option
is resolved (:func:`ig_settings`), for :func:`geolens.flow.baselines.integrated_gradients`."""

from __future__ import annotations

IG_DEFAULT_GRID, IG_DEFAULT_STEPS, IG_DEFAULT_TOLERANCE, IG_DEFAULT_MAX_STEPS = "local", 8, 0.01, 96
"""Integrated gradients' default: the flow protocol's local grid (docs/flow/v3/PROTOCOL.md) started
at 8 gradients and refined until the relative completeness gap is within 1 %, at most 96 gradients.
Of the rules benchmarks/ig_default.py compared within 25 gradients on the flow protocol's
predictions (midpoints, Gauss–Legendre with 8 to 24 nodes, this grid) it had the smallest median
gap on both models (docs/benchmarks.md); none reached 1 % at the median on SmolLM2 within 25, so
the default refines further where a path needs it."""


def ig_settings(options: dict) -> dict:
    """:func:`geolens.attribute`'s integrated-gradients options (``ig_grid``, ``ig_steps``,
    ``ig_tolerance``, ``ig_max_steps``, ``ig_batch``) resolved with their defaults: ``kwargs`` for
    :func:`integrated_gradients` and the values used. ``"local"`` (the default) refines from
    :data:`IG_DEFAULT_STEPS` until :data:`IG_DEFAULT_TOLERANCE` or :data:`IG_DEFAULT_MAX_STEPS`
    gradients; an explicit ``ig_tolerance`` keeps the flow protocol's start (32) and cap (864);
    ``"even"`` (64 midpoints) and ``"gauss_legendre"`` (16 nodes) refine only with ``ig_tolerance``.

    >>> ig_settings({})["kwargs"]
    {'n_steps': 8, 'batch_size': 8, 'grid': 'local', 'tolerance': 0.01, 'max_steps': 96}
    """
    grid = options.get("ig_grid", IG_DEFAULT_GRID)
    if grid not in ("local", "even", "gauss_legendre"):
        raise ValueError(f"ig_grid must be 'local', 'even' or 'gauss_legendre', got {grid!r}")
    tolerance = options.get("ig_tolerance")
    if grid == "local":  # refined until the gap is within the tolerance (docs/flow/v3), or the cap
        explicit = tolerance is not None
        tolerance = float(tolerance) if explicit else IG_DEFAULT_TOLERANCE
        cap = int(options.get("ig_max_steps", 864 if explicit else IG_DEFAULT_MAX_STEPS))
        steps = int(options.get("ig_steps", 32 if explicit else IG_DEFAULT_STEPS))
    else:
        if "ig_max_steps" in options and tolerance is None:
            raise ValueError("ig_max_steps caps the steps ig_tolerance adds: give ig_tolerance too")
        cap = int(options.get("ig_max_steps", 864))
        steps = int(options.get("ig_steps", 64 if grid == "even" else 16))
    batch = int(options.get("ig_batch", 8))
    out = dict(ig_grid=grid, ig_steps=steps, ig_batch=batch, kwargs=dict(n_steps=steps, batch_size=batch, grid=grid))
    if tolerance is not None:
        out.update(ig_tolerance=float(tolerance), ig_max_steps=cap)
        out["kwargs"].update(tolerance=float(tolerance), max_steps=cap)
    return out


__all__ = ["IG_DEFAULT_GRID", "IG_DEFAULT_MAX_STEPS", "IG_DEFAULT_STEPS", "IG_DEFAULT_TOLERANCE", "ig_settings"]
