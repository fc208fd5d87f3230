"""One :class:`~geolens.hf.base.HFAdapter` class per Hugging Face decoder family, built from the
family modules of :mod:`geolens.families` (their ``HF`` layouts), and registered with
:func:`geolens.adapter.register_family`.

>>> from geolens.hf.families import HF_FAMILIES
>>> [cls.__name__ for cls in HF_FAMILIES][:3], HF_FAMILIES[-1].__name__
(['LlamaHF', 'MistralHF', 'Qwen2HF'], 'HFAdapter')

To support another family, add its module to :mod:`geolens.families` (CONTRIBUTING.md, "Where a
family goes"): its class appears here, ahead of :class:`HFAdapter` (the generic fallback, which
assumes Llama's layout and is refused by the load-time check when that assumption is wrong).
"""

from __future__ import annotations

from geolens.adapter import ModelAdapter, register_family
from geolens.families import hf_layouts
from geolens.families.base import HFLayout
from geolens.hf.base import HFAdapter


def adapter_class(layout: HFLayout) -> type[HFAdapter]:
    """The :class:`HFAdapter` subclass of one family's layout."""
    attributes = {"__module__": __name__, "__qualname__": layout.class_name, **layout.class_attributes()}
    return type(layout.class_name, (HFAdapter,), attributes)


HF_FAMILIES: list[type[ModelAdapter]] = [adapter_class(layout) for layout in hf_layouts()] + [HFAdapter]
"""The HF-native families, tried in order by :func:`geolens.adapter.adapter_for` (the generic
:class:`HFAdapter` last)."""

globals().update({cls.__name__: cls for cls in HF_FAMILIES})  # geolens.hf.families.LlamaHF, ...

register_family(*HF_FAMILIES)

__all__ = ["HF_FAMILIES", "HFAdapter", "adapter_class"] + [cls.__name__ for cls in HF_FAMILIES[:-1]]
