"""Registries refuse what does not implement their family: an nn family's entry must derive from the
family's base class (which declares its interface), a tokenizer must have its members; and importing
any one nn module fills every registry (rope, mla and moe register from their own files)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torch import nn

from archlab.config import ModelConfig
from archlab.nn.block import BLOCKS, Block
from archlab.nn.head import HEADS, Head
from archlab.nn.mixers.base import MIXERS, Mixer
from archlab.nn.mlp import MLP, MLPS
from archlab.nn.norms import NORMS, Norm
from archlab.nn.positions import POSITIONS, Position
from archlab.registry import Registry

FAMILIES = [(NORMS, Norm), (POSITIONS, Position), (MIXERS, Mixer), (MLPS, MLP), (BLOCKS, Block), (HEADS, Head)]


class NotANorm(nn.Module):
    """Has every member a norm has, but does not derive from Norm: the old members check let it in."""

    @staticmethod
    def num_params(cfg: ModelConfig, dim: int | None = None) -> int:
        return 0

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        pass


@pytest.mark.parametrize("registry", [r for r, _ in FAMILIES], ids=lambda r: r.field)
def test_registering_a_class_outside_the_family_raises(registry):
    with pytest.raises(TypeError, match=rf"{registry.field}: 'wrong' is .*NotANorm.*, not a subclass of "):
        registry.register("wrong")(NotANorm)
    with pytest.raises(TypeError, match="not a subclass"):
        registry.register("wrong")(lambda cfg: None)  # not a class at all
    assert "wrong" not in registry


def test_an_entry_of_another_family_is_refused():
    with pytest.raises(TypeError, match="model.norm.kind: 'causal' is .*, not a subclass of Norm"):
        NORMS.register("causal")(MIXERS.get("causal"))


def test_a_subclass_of_the_base_registers_and_is_found():
    registry: Registry[type[Norm]] = Registry("test.kind", base=Norm)

    @registry.register("mine")
    class Mine(Norm):
        pass

    assert registry.get("mine") is Mine and registry.names() == ["mine"]


def test_a_family_without_a_base_checks_its_members():
    registry: Registry[type] = Registry("tokenizer", ("encode", "decode"))
    with pytest.raises(TypeError, match="tokenizer: 'half' lacks decode"):
        registry.register("half")(type("Half", (), {"encode": None}))


@pytest.mark.parametrize("registry,base", FAMILIES, ids=[r.field for r, _ in FAMILIES])
def test_every_registered_entry_derives_from_its_family_base(registry, base):
    assert all(issubclass(registry.get(name), base) for name in registry.names())


def test_importing_the_positions_module_alone_registers_rope_mla_and_moe():
    code = (
        "import sys\n"
        "from archlab.nn.positions import POSITIONS\n"
        "print('rope' in POSITIONS, 'archlab.nn.mixers.base' in sys.modules)\n"
        "from archlab.nn.mixers.base import MIXERS\n"
        "from archlab.nn.mlp import MLPS\n"
        "print('mla' in MIXERS, 'moe' in MLPS)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True"] * 4
