"""SmolLM2 (or any local Llama-architecture checkpoint) as a TransformerLens 2.x/3.x ``HookedTransformer``.

The loader lives in :mod:`geolens.models` with the rest of model loading; this module keeps the
import path ``geolens.hooked.hooked_llama_from_checkpoint`` working.
"""

from geolens.models import hooked_llama_from_checkpoint

__all__ = ["hooked_llama_from_checkpoint"]
