"""Parametrisations (``param.kind``): ``sp``, the model and optimizer as configured; ``mup``, μP for width
(Yang et al. 2022, "Tensor Programs V", Table 3 for Adam, in the multiplier form of Cerebras' and
nanoGPT-mup's implementations); ``completep``, μP plus CompleteP's depth rule (Dey et al. 2025, α = 1).

Each rule is relative to a proxy of width ``param.base_d_model`` (and depth ``param.base_n_layer``): at
the proxy's own size every multiplier is 1 and the run is the ``sp`` run. With m = d_model / base_d_model
and l = n_layer / base_n_layer:

- the model (``parametrize``): logits × 1/m (``model.head.logit_scale``), attention scores × sqrt(base
  head dim / head dim) (1/head_dim scaling), a sqrt(d_model) embedding multiplier (Gemma's
  ``model.scale_embedding``) held at sqrt(base_d_model) (``model.embedding_multiplier``), and under
  completep each residual branch × 1/l (``model.block.residual_multiplier``). They are model fields, so checkpoints, generation and exports
  carry them.
- the init (``initialise``): hidden matrices' std × 1/sqrt(m), output matrices' × 1/m; under completep the
  residual projections' GPT-2 factor counts the proxy's depth, not the model's.
- AdamW (``scale_groups``): hidden and output matrices' learning rate × 1/m, Adam's eps × 1/m (× 1/l
  more inside the blocks under completep), and under completep their weight decay × m (η·λ independent
  of width); inputs and vectors keep the learning rate. Muon's and SGD's rates: ``training/mup_rates.py``.

The multipliers and init stds the model sets (``model.head.logit_scale``, ``model.attention.scale``,
``model.embedding_multiplier``, ``model.init_std``, ``model.embedding_init_std``,
``model.block.residual_multiplier``) are read as their values at the proxy, where μTransfer tunes them
(``lr_from`` hands a proxy sweep's best on): the rules above scale them from there, the input layer's not at all.

Every width is taken to grow with d_model (d_ff, heads × head dim, ranks), as a width sweep that sets only
d_model does. Each parameter's role comes from the part that holds it (``Component.param_roles``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, Optional, cast

import torch
from torch import nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.config.layers import kind_config, used_kinds
from archlab.errors import ConfigError
from archlab.nn.component import Component, Role
from archlab.nn.mixers.base import head_dim
from archlab.nn.model import Decoder

KINDS = ("sp", "mup", "completep")
WIDTH_RULES = ("mup", "completep")
# the optimizers each width rule has learning rates for (Muon's and SGD's in training/mup_rates.py)
OPTIMIZERS = {"mup": ("adamw", "muon", "sgd"), "completep": ("adamw", "muon")}


def width_ratio(model: ModelConfig, param: Any) -> float:
    """m: the model's width over the proxy's (1 under sp)."""
    return model.d_model / param["base_d_model"] if param["kind"] in WIDTH_RULES else 1.0


def depth_ratio(model: ModelConfig, param: Any) -> float:
    """l: the model's depth over the proxy's (1 unless completep)."""
    return model.n_layer / param["base_n_layer"] if param["kind"] == "completep" else 1.0


def check_param(param: Any, model: ModelConfig, optim_kind: str) -> None:
    """Raise ConfigError for the first setting of ``param`` that cannot be honoured, before any work: the
    kind, the base sizes it needs (and none it does not read), an optimizer it has rules for (``OPTIMIZERS``),
    and a role for every parameter."""
    checks.choice("param.kind", param["kind"], KINDS)
    kind = param["kind"]
    needs = {"sp": (), "mup": ("base_d_model",), "completep": ("base_d_model", "base_n_layer")}[kind]
    reads = needs + (("base_head_dim",) if kind in WIDTH_RULES else ())
    for name in ("base_d_model", "base_n_layer", "base_head_dim"):
        value = param[name]
        if value is None and name in needs:
            raise ConfigError(f"param.{name}", None, f"a positive integer: param.kind={kind} scales from the proxy's")
        if value is not None and name not in reads:
            users = "completep" if name == "base_n_layer" else "mup or completep"
            raise ConfigError(f"param.{name}", value, f"null: param.kind={kind} does not read it ({users} does)")
        if value is not None:
            checks.integer(f"param.{name}", value)
            checks.positive(f"param.{name}", value)
    if kind == "sp":
        return
    if kind == "completep" and model.residual_init_depth is not None:  # its init counts the proxy's depth
        raise ConfigError("model.residual_init_depth", model.residual_init_depth, "null under param.kind=completep")
    _check_proxy_heads(param, model)
    if optim_kind not in OPTIMIZERS[kind]:
        raise ConfigError(
            "optim.kind",
            optim_kind,
            f"{' or '.join(OPTIMIZERS[kind])} under param.kind={kind} (CompleteP's depth rule is for normalised "
            "updates, AdamW's and Muon's; SGD's rate would have to grow with depth: use param=mup)",
        )
    with torch.device("meta"):
        roles(Decoder(model), kind)


def parametrize(model: ModelConfig, param: Any) -> ModelConfig:
    """``model`` with the parametrisation's forward multipliers (``model`` itself under sp)."""
    if param["kind"] not in WIDTH_RULES:
        return model
    m, depth = width_ratio(model, param), depth_ratio(model, param)
    head = dataclasses.replace(model.head, logit_scale=model.head.logit_scale / m)
    block = dataclasses.replace(model.block, residual_multiplier=model.block.residual_multiplier / depth)
    attention = model.attention
    scale = _temperature(model, param)
    if scale is not None:
        attention = _with_scale(attention, scale)
    scaled = dataclasses.replace(model, head=head, block=block, attention=attention)
    if model.scale_embedding and m != 1.0:  # μP's input layer: a multiplier of the proxy's width, not this one's
        scaled = dataclasses.replace(
            scaled, scale_embedding=False, embedding_multiplier=math.sqrt(param["base_d_model"])
        )
    kinds = {}
    for name, overrides in (model.layers.kinds or {}).items():
        own = dict(overrides.get("attention") or {})
        layer = kind_config(model, name)
        section = _scores(layer.attention)
        # where the score multiplier sits in the kind's overrides: its own, or its attention part's
        holder = own if section is layer.attention else dict(own.get("attention") or {})
        if section is not None and "scale" not in holder:  # a kind's own score multiplier stays
            # a kind of the model's mixer inherits its new scale: it gets the temperature of its own head size
            # instead (or keeps its scale at the proxy's head size), as a kind that swaps in a softmax mixer does
            temperature = _temperature(layer, param)
            wanted = section.scale if temperature is None else temperature
            if wanted != cast(Any, _scores(kind_config(scaled, name).attention)).scale:
                holder["scale"] = wanted
                if holder is not own:
                    own["attention"] = holder
        kinds[name] = {**overrides, "attention": own} if own else dict(overrides)
    if kinds:
        scaled = dataclasses.replace(scaled, layers=dataclasses.replace(model.layers, kinds=kinds))
    return scaled


def _scores(attention: Any) -> Any:
    """The config holding a mixer's softmax score multiplier (``scale``): the mixer's own (causal, mla), or
    that of its attention part (the parallel mixer's, Falcon-H1's); None for a mixer with none (the
    recurrent ones)."""
    if hasattr(attention, "scale"):
        return attention
    part = getattr(attention, "attention", None)
    return part if hasattr(part, "scale") else None


def _with_scale(attention: Any, scale: float) -> Any:
    """``attention`` with its score multiplier (see ``_scores``) set to ``scale``."""
    if hasattr(attention, "scale"):
        return dataclasses.replace(attention, scale=scale)
    return dataclasses.replace(attention, attention=dataclasses.replace(attention.attention, scale=scale))


def _check_proxy_heads(param: Any, model: ModelConfig) -> None:
    """The proxy's head dim of every softmax mixer the model uses (its own, each layer kind's), where it
    comes from ``base_d_model`` (heads splitting the width, no ``base_head_dim``), must be whole:
    base_d_model / n_head floored would scale the scores by a head size the proxy never had."""
    if param["base_head_dim"] is not None:
        return
    layers = [(None, model)] + [(name, kind_config(model, name)) for name in sorted(used_kinds(model))]
    for name, layer in layers:
        section = _scores(layer.attention)
        if section is None or getattr(section, "head_dim", 0) is not None:  # no scores, or a head dim set
            continue
        n_head = layer.attention.n_head
        if param["base_d_model"] % n_head:
            where = "model.attention.n_head" if name is None else f"model.layers.kinds.{name}.attention.n_head"
            raise ConfigError(
                "param.base_d_model",
                param["base_d_model"],
                f"a multiple of {where}={n_head} (the proxy's head dim is base_d_model / n_head), "
                "or param.base_head_dim set to the proxy's head dim",
            )


def _temperature(model: ModelConfig, param: Any) -> Optional[float]:
    """μP's score multiplier for the mixer of ``model`` (a model's or a layer's config): its scale (else
    1/sqrt(head_dim)) times sqrt(base head_dim / head_dim), 1/head_dim attention at the proxy's scale;
    None where the head size is the proxy's or the mixer has no score multiplier (``_scores``)."""
    section = _scores(model.attention)
    if section is None:
        return None
    hd = head_dim(model)
    base = param["base_head_dim"] or head_dim(dataclasses.replace(model, d_model=param["base_d_model"]))
    if hd == base:
        return None
    scale = section.scale if section.scale is not None else 1 / math.sqrt(hd)
    return scale * math.sqrt(base / hd)


def _own_parameters(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Parameter]]:
    """The parameters ``module`` holds itself: its own and those of the children that are no entries."""
    for name, p in module.named_parameters(recurse=False):
        yield prefix + name, p
    for name, child in module.named_children():
        if not isinstance(child, Component):
            yield from _own_parameters(child, f"{prefix}{name}.")


def roles(model: Decoder, kind: str = "mup") -> dict[int, Role]:
    """id(parameter) -> its declared Role, for every parameter of ``model``; ConfigError naming the part
    (and parameter) that declares none."""
    found: dict[int, Role] = {}
    for path, module in model.named_modules():
        if not isinstance(module, (Component, Decoder)):  # a Linear or a container: its entry answers for it
            continue
        declared = module.param_roles()
        part = f"{type(module).__name__} ({path or 'the decoder'})"
        if (why := getattr(module, "mup_refusal", None)) is not None:  # a part no width rule fits (nGPT's block)
            raise ConfigError("param.kind", kind, f"sp: {part} {why}")
        if declared is None:
            raise ConfigError("param.kind", kind, f"sp: {part} declares no μP roles (Component.param_roles)")
        for name, p in _own_parameters(cast(nn.Module, module)):  # every entry is a Module too
            if name not in declared:
                raise ConfigError("param.kind", kind, f"sp: {part} declares no μP role for its parameter {name}")
            found[id(p)] = declared[name]
    return found


def initialise(model: Decoder, param: Any) -> None:
    """Rescale ``model``'s GPT-2 init (``build_model``'s) under the parametrisation, in place: hidden
    matrices × 1/sqrt(m), output ones × 1/m; under completep at another depth than the proxy's, first a
    fresh init whose residual factor counts the proxy's depth. At the proxy's size nothing changes, so the
    run is the sp run; under sp nothing at all."""
    if param["kind"] not in WIDTH_RULES:
        return
    cfg = model.cfg
    if depth_ratio(cfg, param) != 1.0:
        model.init_weights(residual_depth=param["base_n_layer"])
    m = width_ratio(cfg, param)
    factor = {Role.HIDDEN: 1 / math.sqrt(m), Role.OUTPUT: 1 / m}
    by_id = roles(model, param["kind"])
    with torch.no_grad():
        for p in model.parameters():  # a tied table once
            if by_id[id(p)] in factor:
                p.mul_(factor[by_id[id(p)]])


def scale_groups(
    model: Decoder, groups: list[dict[str, Any]], optim: dict[str, Any], param: Any
) -> list[dict[str, Any]]:
    """AdamW's parameter groups under the parametrisation: each of ``groups`` (``training.optim.param_groups``'
    split into decaying and non-decaying parameters) split again by learning rate, weight decay and eps,
    in order of first appearance."""
    cfg, kind = model.cfg, param["kind"]
    m, depth = width_ratio(cfg, param), depth_ratio(cfg, param)
    lr = optim["lr"]
    eps = optim.get("eps") or 1e-8  # torch's default where a recorded config has none
    by_id = roles(model, kind)
    in_block = {id(p) for name, p in model.named_parameters() if name.startswith("blocks.")}
    scaled: dict[tuple[float, float, float], list[nn.Parameter]] = {}
    for group in groups:
        for p in group["params"]:
            matrix = by_id[id(p)] in (Role.HIDDEN, Role.OUTPUT)
            key = (
                lr / m if matrix else lr,
                group["weight_decay"] * (m if kind == "completep" and matrix else 1.0),
                eps / m / (depth if id(p) in in_block else 1.0),
            )
            scaled.setdefault(key, []).append(p)
    return [{"params": ps, "lr": g_lr, "weight_decay": wd, "eps": g_eps} for (g_lr, wd, g_eps), ps in scaled.items()]


def describe(param: Any, model: ModelConfig) -> Optional[str]:
    """One line for the run's log: the ratios and what they set (None under sp)."""
    if param["kind"] not in WIDTH_RULES:
        return None
    m, depth = width_ratio(model, param), depth_ratio(model, param)
    text = f"param={param['kind']}: width ×{m:g} of base_d_model={param['base_d_model']}"
    if param["kind"] == "completep":
        text += f", depth ×{depth:g} of base_n_layer={param['base_n_layer']} (residual branches ×{1 / depth:g})"
    return text + f"; logits ×{1 / m:g}, hidden learning rates ×{1 / m:g}"
