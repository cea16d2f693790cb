"""The method catalog the command line answers from (``ropekit methods``, ``extend``'s early checks) is the
registry itself, and its checks say what the registry says — before any model loads."""

from __future__ import annotations

import pytest

from ropekit import RopekitError
from ropekit.cli import catalog
from ropekit.methods import get_method, list_methods
from ropekit.models.tiny import build_tiny_model


def test_the_catalog_is_the_registry():
    assert catalog.load() == catalog.build(), "regenerate it: python -m ropekit.cli.catalog"


@pytest.mark.parametrize("method,params", [
    ("yarnn", {}),                          # a typo'd method
    ("yarn", {"beta_fst": "32"}),           # a typo'd parameter
    ("yarn", {"beta_fast": "-1"}),          # out of range
    ("yarn", {"beta_fast": "fast"}),        # not a number
    ("ntk_by_parts", {"ramp": "nope"}),     # not one of the choices
    ("self_extend", {"group_size": "2.5"}),  # not an integer
])
def test_early_checks_give_the_registrys_own_message(method, params):
    with pytest.raises(RopekitError) as early:
        catalog.check(method, params)
    # the reference: the registry's own resolution on a real model (what `extend` would say after loading it)
    from ropekit.install.model_rope import base_info

    with pytest.raises(RopekitError) as full:
        get_method(method).resolve(base_info(build_tiny_model("llama").config), params)
    assert early.value.one_line() == full.value.one_line()


def test_every_methods_valid_example_passes():
    for m in list_methods():
        info_free = {p.name: p.default for p in m.params if p.default is not None and not callable(p.default)}
        assert catalog.check(m.name.upper(), info_free) == m.name
