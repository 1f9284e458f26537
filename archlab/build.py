"""The public entry points: compose a model config as the command line does, count it, build it."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from archlab.accounting import check_build, count
from archlab.config import ModelConfig, to_model_config
from archlab.config.store import CONF_DIR, register_configs
from archlab.nn.model import Decoder
from archlab.nn.ngram_embedding import NGramEmbedding
from archlab.nn.validation import resolve, validate


def compose(config_name: str, overrides: Sequence[str] = (), return_hydra_config: bool = False) -> Any:
    """Compose ``conf/<config_name>.yaml`` with command-line style ``overrides`` (a DictConfig);
    ``return_hydra_config`` keeps the ``hydra`` node (e.g. the group choices a run records)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    kwargs = {"overrides": list(overrides), "return_hydra_config": return_hydra_config}
    if GlobalHydra.instance().is_initialized():  # e.g. called from inside a Hydra app
        return hydra_compose(config_name, **kwargs)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name, **kwargs)


def compose_model(overrides: Sequence[str] = ()) -> ModelConfig:
    """The model config that ``archlab-check``/``archlab-train`` would build for these overrides,
    e.g. ``["model=llama2-7b", "model/position=alibi", "model.n_layer=2"]``."""
    return validate(to_model_config(compose("check", overrides).model))


def count_params(cfg: Any) -> dict[str, int]:
    """Closed-form parameter counts per component, ``total`` and FLOPs per token, from ``cfg`` alone."""
    return count(cfg)


def build_model(
    cfg: Any, device: str | torch.device = "cpu", dtype: Optional[torch.dtype] = None, check: bool = True
) -> Decoder:
    """Build the decoder on the meta device, check it against the formulas, then (unless ``device``
    is ``"meta"``) allocate it on ``device`` and apply the GPT-2 initialisation."""
    resolved = resolve(to_model_config(cfg))  # validated once; counting and building read it
    with torch.device("meta"):
        model = Decoder(resolved.cfg, resolved.layers)
    if check:
        check_build(resolved, model)
    if str(device) != "meta":
        model = model.to_empty(device=device)
        model.head.tie(model.tok_emb)  # to_empty gives each module its own storage: tie again
        model.init_weights()
    if dtype is not None:
        model = model.to(dtype)
    return model


def model_from_state(cfg: Any, state: dict[str, torch.Tensor]) -> Decoder:
    """The decoder of ``cfg`` holding ``state``'s tensors, built on the meta device so nothing is initialised
    twice; the buffers no state dict holds (not persistent: a MoE's load count, the n-gram hash constants)
    made again where the weights are, and a tied head tied again."""
    model = build_model(cfg, device="meta")
    model.load_state_dict(state, strict=True, assign=True)
    device = model.tok_emb.weight.device
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_meta:
                setattr(module, name, torch.zeros_like(buffer, device=device))
        if isinstance(module, NGramEmbedding):  # its hash constants, from the config
            module.reset_constants()
    if model.cfg.head.tied:  # assign replaced both parameters: make the head the embedding again
        model.head.tie(model.tok_emb)
    return model
