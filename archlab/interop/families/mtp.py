"""A checkpoint's multi-token prediction modules (``model.head.mtp``), which transformers' causal-LM classes
leave out (DeepSeek-V3's ``model.layers.61.*``): read from and written to the checkpoint files beside the
model, by the names DeepSeek-V3's and GLM-4.5's checkpoints give them. Module k is layer ``n_layer + k``:
its block by the family's own names for a layer there (the family's layout continued past the last layer),
and beside it ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and copies of the embedding and the
head (``embed_tokens``, ``shared_head.head``), which archlab shares with the model."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.layers import FAMILIES as KIND_FAMILIES
from archlab.config.layers import layer_configs
from archlab.config.model import MTPConfig
from archlab.errors import ConfigError
from archlab.interop.families.tensors import TensorMap
from archlab.nn.mtp import mtp_layer

if TYPE_CHECKING:
    from archlab.interop.families.base import Family

# what a family that reads its checkpoints' modules holds (``Family.features``) and requires of them
MTP_FEATURES = frozenset({"model.head.mtp.depth"})
MTP_RULE = ("model.head.mtp.layer", (None,), " (a module's block has the parts of the model's own layers)")
# archlab's module part -> the checkpoint's name under model.layers.<n_layer + k>
PARTS = {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "norm": "shared_head.norm"}
COPIES = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}


def checkpoint_depth(family: Family, hf_config: Any, state: dict[str, Tensor]) -> int:
    """How many modules a checkpoint of ``family`` holds: its config's count (``Family.mtp_key``) where
    the first module's projection is among its tensors, else 0 (a checkpoint transformers saved drops them)."""
    if family.mtp_key is None:
        return 0
    depth = getattr(hf_config, family.mtp_key, None) or 0
    layer = hf_config.num_hidden_layers
    return depth if depth and f"model.layers.{layer}.eh_proj.weight" in state else 0


def with_depth(cfg: ModelConfig, depth: int) -> ModelConfig:
    """``cfg`` with ``depth`` modules, their blocks the model's own parts."""
    return dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, mtp=MTPConfig(depth=depth)))


def extended(cfg: ModelConfig) -> ModelConfig:
    """``cfg``'s layers and one more per module (its layout continued), without modules: the config a
    family's own maps and checkpoint readers read the modules' blocks by."""
    head = dataclasses.replace(cfg.head, mtp=MTPConfig())
    return dataclasses.replace(cfg, n_layer=cfg.n_layer + cfg.head.mtp.depth, head=head)


def mtp_maps(family: Family, cfg: ModelConfig) -> list[TensorMap]:
    """The modules' tensors and their checkpoint names: each block's by ``family``'s maps of the layer it
    is numbered as, refused where the family's layout would give that layer other parts than the block's."""
    depth, L = cfg.head.mtp.depth, cfg.n_layer
    if not depth:
        return []
    ext = extended(cfg)
    layers = layer_configs(ext)
    parts = [tuple(getattr(c, f) for f in KIND_FAMILIES) for c in (*layers[L:], mtp_layer(cfg))]
    if any(p != parts[-1] for p in parts[:-1]):
        raise ConfigError(
            "model.head.mtp.layer",
            cfg.head.mtp.layer,
            f"the parts {family.title}'s layers after the last have (null: the model's own), as its checkpoints "
            "number the modules' blocks after them",
        )
    out = []
    for m in family.tensors(ext):
        for k in range(depth):
            block = f"blocks.{L + k}."
            if m.archlab.startswith(block):
                out.append(m._replace(archlab=f"mtp.depths.{k}.block.{m.archlab.removeprefix(block)}"))
    for k in range(depth):
        for ours, theirs in PARTS.items():
            out.append(
                TensorMap(f"mtp.depths.{k}.{ours}.weight", (f"model.layers.{L + k}.{theirs}.weight",), "same", ())
            )
    return out


def drop_copies(cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A checkpoint's tensors less each module's copies of the embedding and the head, which must equal
    the model's (archlab holds one of each)."""
    state = dict(state)
    for k in range(cfg.head.mtp.depth):
        for copy, original in COPIES.items():
            name = f"model.layers.{cfg.n_layer + k}.{copy}"
            held = state.pop(name, None)
            model = state.get(original if original in state or not cfg.head.tied else "model.embed_tokens.weight")
            if held is not None and model is not None and not torch.equal(held, model):
                raise ValueError(f"{name} is not the model's {original}: archlab's modules share it")
    return state


def copies(cfg: ModelConfig, hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each module's copies of the embedding and the head, as DeepSeek-V3's checkpoints store them."""
    head = hf_state.get("lm_head.weight", hf_state["model.embed_tokens.weight"])
    held = {"embed_tokens.weight": hf_state["model.embed_tokens.weight"], "shared_head.head.weight": head}
    return {f"model.layers.{cfg.n_layer + k}.{n}": t for k in range(cfg.head.mtp.depth) for n, t in held.items()}
