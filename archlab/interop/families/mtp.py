"""A checkpoint's multi-token prediction modules (``model.head.mtp``), which transformers' causal-LM classes
leave out: read from and written to the checkpoint files beside the model. Each module's block is named as
the family names a layer of its parts (the family's maps of a one-layer model of them), under a prefix of
the family's scheme (``Family.mtp_scheme``):

- ``layers`` (DeepSeek-V3, GLM-4.5, the Sarvam models of their classes, Bailing hybrid, Step-3.5): module k
  is layer ``n_layer + k`` (``model.layers.61`` of DeepSeek-V3), ``enorm``, ``hnorm``, ``eh_proj`` and
  ``shared_head.norm`` beside its block, with copies of the embedding and the head (``embed_tokens``,
  ``shared_head.head``), which archlab shares with the model;
- ``mtp`` (Qwen3-Next, Mellum): one module under ``mtp.``: ``pre_fc_norm_embedding``,
  ``pre_fc_norm_hidden``, ``fc``, ``norm`` and its block as ``mtp.layers.0``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from archlab.config import LayersConfig, ModelConfig
from archlab.config.model import MTPConfig
from archlab.errors import ConfigError
from archlab.interop.families.tensors import TensorMap
from archlab.nn.mtp import mtp_layer

if TYPE_CHECKING:
    from archlab.interop.families.base import Family

# what a family that reads its checkpoints' modules holds (``Family.features``)
MTP_FEATURES = frozenset({"model.head.mtp.depth"})
# a family whose modules' blocks are of the model's own parts requires that of them
MTP_RULE = ("model.head.mtp.layer", (None,), " (a module's block has the parts of the model's own layers)")
# archlab's module part -> its name in each scheme (under the module's prefix, or under mtp.)
PARTS = {
    "layers": {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "norm": "shared_head.norm"},
    "mtp": {"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "eh_proj": "fc", "norm": "norm"},
}
COPIES = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
# the head's copy under the name Step-3.5's published checkpoints give it (SGLang's Step-3.5 MTP loader reads
# ``shared_head.output`` as ``shared_head.head``): read as that copy, written as ``shared_head.head``
READ_COPIES = {**COPIES, "shared_head.output.weight": "lm_head.weight"}
LAYER0 = "model.layers.0."  # a one-layer model's layer, as the families name it


def prefix(family: Family, cfg: ModelConfig, k: int) -> str:
    """Where module ``k``'s tensors sit in the checkpoint."""
    return f"model.layers.{cfg.n_layer + k}." if family.mtp_scheme == "layers" else "mtp."


def block_prefix(family: Family, cfg: ModelConfig, k: int) -> str:
    """Where module ``k``'s block's tensors sit in the checkpoint."""
    return prefix(family, cfg, k) if family.mtp_scheme == "layers" else f"mtp.layers.{k}."


def checkpoint_depth(family: Family, hf_config: Any, state: dict[str, Tensor]) -> int:
    """How many modules a checkpoint of ``family`` holds: its config's count (``Family.mtp_keys``) where
    the first module's projection is among its tensors, else 0 (a checkpoint transformers saved drops them)."""
    depth = next((n for key in family.mtp_keys if (n := getattr(hf_config, key, None))), 0)
    if not depth:
        return 0
    first = (
        f"model.layers.{hf_config.num_hidden_layers}.eh_proj.weight"
        if family.mtp_scheme == "layers"
        else "mtp.fc.weight"
    )
    return depth if first in state else 0


def one_layer(cfg: ModelConfig) -> ModelConfig:
    """A one-layer model of a module's block's parts: the config the family's own maps and checkpoint
    readers name and read the block by."""
    return dataclasses.replace(
        mtp_layer(cfg), n_layer=1, layers=LayersConfig(), head=dataclasses.replace(cfg.head, mtp=MTPConfig())
    )


def check_depth(family: Family, cfg: ModelConfig) -> None:
    """A scheme of one module (``mtp``) holds one."""
    if family.mtp_scheme == "mtp" and cfg.head.mtp.depth > 1:
        raise ConfigError(
            "model.head.mtp.depth",
            cfg.head.mtp.depth,
            f"at most 1 for {family.title} (its checkpoints hold one module)",
        )


def mtp_maps(family: Family, cfg: ModelConfig) -> list[TensorMap]:
    """The modules' tensors and their checkpoint names (as transformers would hold them in memory)."""
    depth = cfg.head.mtp.depth
    if not depth:
        return []
    check_depth(family, cfg)
    block = [m for m in family.tensors(one_layer(cfg)) if m.archlab.startswith("blocks.0.")]
    out = []
    for k in range(depth):
        into = block_prefix(family, cfg, k)
        ours = f"mtp.depths.{k}.block."
        for m in block:
            archlab = ours + m.archlab.removeprefix("blocks.0.")
            others = tuple(ours + n.removeprefix("blocks.0.") for n in m.others)  # a fused tensor's other parts
            hf = tuple(into + h.removeprefix(LAYER0) for h in m.hf)
            out.append(m._replace(archlab=archlab, hf=hf, others=others))
        for ours, theirs in PARTS[family.mtp_scheme].items():
            out.append(
                TensorMap(f"mtp.depths.{k}.{ours}.weight", (f"{prefix(family, cfg, k)}{theirs}.weight",), "same", ())
            )
    return out


def take(family: Family, cfg: ModelConfig, state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A checkpoint's tensors parted into the modules' (their blocks read as the family reads a layer of
    their parts: the experts stacked, its renames made) and the model's; each module's copies of the
    embedding and the head dropped, refused where they are not the model's own (archlab holds one of each)."""
    rest, modules = dict(state), {}
    for k in range(cfg.head.mtp.depth):
        for copy, original in READ_COPIES.items():
            name = f"{prefix(family, cfg, k)}{copy}"
            held = rest.pop(name, None) if family.mtp_scheme == "layers" else None
            model = rest.get(original, rest.get("model.embed_tokens.weight"))
            if held is not None and model is not None and not torch.equal(held, model):
                raise ValueError(f"{name} is not the model's {original}: archlab's modules share it")
        block, into = {}, block_prefix(family, cfg, k)
        for name in [n for n in rest if n.startswith(into)]:
            block[LAYER0 + name.removeprefix(into)] = rest.pop(name)
        read = family.from_checkpoint(one_layer(cfg), block)
        modules.update({into + n.removeprefix(LAYER0): t for n, t in read.items()})
        for theirs in PARTS[family.mtp_scheme].values():
            name = f"{prefix(family, cfg, k)}{theirs}.weight"
            if name in rest:
                modules[name] = rest.pop(name)
    return modules, rest


def copies(family: Family, cfg: ModelConfig, hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each module's copies of the embedding and the head, where the scheme's checkpoints store them."""
    if family.mtp_scheme != "layers":
        return {}
    head = hf_state.get("lm_head.weight", hf_state["model.embed_tokens.weight"])
    held = {"embed_tokens.weight": hf_state["model.embed_tokens.weight"], "shared_head.head.weight": head}
    return {f"{prefix(family, cfg, k)}{n}": t for k in range(cfg.head.mtp.depth) for n, t in held.items()}
