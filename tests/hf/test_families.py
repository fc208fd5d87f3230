"""The HF-native adapter classes (geolens.hf.families): one class per family layout of
geolens.families, named after it, with the layout's attributes, registered ahead of the generic
HFAdapter, which stays last; adapter_class builds the class of any layout."""

from __future__ import annotations

import geolens.hf.families as hf_families
from geolens.adapter.registry import FAMILIES
from geolens.families import FAMILIES as FAMILY_MODULES
from geolens.families.base import HFLayout
from geolens.hf.base import HFAdapter
from geolens.hf.families import HF_FAMILIES, adapter_class


def test_one_class_per_family_layout_then_the_generic_adapter():
    layouts = [module.HF for module in FAMILY_MODULES.values()]
    assert [cls.__name__ for cls in HF_FAMILIES[:-1]] == [layout.class_name for layout in layouts]
    assert HF_FAMILIES[-1] is HFAdapter
    for cls, layout in zip(HF_FAMILIES, layouts):
        assert issubclass(cls, HFAdapter) and cls.family == layout.family and cls.__doc__ == layout.doc
        assert getattr(hf_families, layout.class_name) is cls and cls.__module__ == "geolens.hf.families"
    positions = [FAMILIES.index(cls) for cls in HF_FAMILIES]
    assert positions == sorted(positions)  # registered in this order, the generic adapter tried last


def test_adapter_class_builds_the_class_of_any_layout():
    layout = HFLayout("hf-x", "XHF", "X models.", ("x",), output_name="out", post_norm_name="post_ln")
    cls = adapter_class(layout)
    assert cls.__name__ == cls.__qualname__ == "XHF" and issubclass(cls, HFAdapter)
    assert (cls.family, cls.model_types, cls.output_name, cls.post_norm_name) == ("hf-x", ("x",), "out", "post_ln")
    assert cls.post_attention_norm and cls.__doc__ == "X models." and cls not in FAMILIES  # not registered
