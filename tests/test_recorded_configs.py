"""Checkpoints and exports written by earlier versions stay usable: a recorded model config lacking the
fields added since, or with swiglu's ignored ``approximate: tanh``, reads as the model it described."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from archlab import build_model, compose_model
from archlab.config import model_config_dict
from archlab.training.checkpoints import check_checkpoint
from archlab.weights import CONFIG_KEY, load_weights


def old_record(cfg) -> dict:
    """``cfg`` as an earlier archlab recorded it: no kind for attention and head, none of the newer
    fields, and the tanh a GPT-2-based preset left on swiglu."""
    d = model_config_dict(cfg)
    for family, fields in {
        "attention": ("kind", "qk_norm", "scale", "softcap", "window", "global_every"),
        "head": ("kind", "softcap"),
        "norm": ("unit_offset",),
        "position": ("scaling", "factor", "low_freq_factor", "high_freq_factor", "original_context"),
    }.items():
        for name in fields:
            del d[family][name]
    del d["scale_embedding"]
    d["mlp"]["approximate"] = "tanh"
    return d


def test_an_old_checkpoint_continues_under_the_same_command(tmp_path):
    cfg = compose_model(["model=nano", "model/mlp=swiglu", "model.n_layer=1"])  # the option now resets tanh
    path = tmp_path / "old.ckpt"
    torch.save({"hyper_parameters": {"model": old_record(cfg)}, "global_step": 7}, path)
    assert check_checkpoint(path, model_config_dict(cfg)) == 7


def test_an_old_export_loads_as_the_same_model(tmp_path):
    cfg = compose_model(["model=nano", "model/mlp=swiglu", "model.n_layer=1"])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    path = tmp_path / "old.safetensors"
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "head.weight"}  # tied
    save_file(state, str(path), metadata={CONFIG_KEY: json.dumps(old_record(cfg))})
    loaded = load_weights(path).eval()
    idx = torch.randint(0, cfg.vocab_size, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))
