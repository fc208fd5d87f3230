"""The one home of hooks in geolens.

Every intervention is a list of TransformerLens ``fwd_hooks`` ``(hook_name, fn)`` built by a
function of this package, and applied either with ``model.run_with_hooks(..., fwd_hooks=...)`` or
with the :func:`applied` context manager, which removes them on exit even when an exception
escapes. Modules:

- :mod:`geolens.interventions.base`: :func:`applied`, :func:`active_hook_count`.

One intervention needs no hook: :mod:`geolens.interventions.value_zeroing` zeroes each value
vector v_j and measures the layer output's turn from one clean forward (the pattern does not
change, so the edited output is the clean one minus source j's terms).
"""

from geolens.interventions.base import active_hook_count, applied

__all__ = ["active_hook_count", "applied"]
