"""The coordinate check (Yang et al. 2022, Fig. 5): train copies of one model at several widths (or depths)
for a few AdamW steps on one fixed batch, and record the RMS of each layer's output and of the logits
after each step. Under a parametrisation that transfers, the curves against width (depth) stay flat;
under sp they grow. The slope of log RMS against log width is the number to read."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from archlab import checks
from archlab.build import build_model
from archlab.config import ModelConfig, to_model_config
from archlab.config.fields import plain_dict
from archlab.errors import ConfigError
from archlab.nn.validation import validate
from archlab.training.optim import build_optimizer
from archlab.training.parametrization import check_param, initialise, parametrize


def _sized(model: ModelConfig, axis: str, size: int) -> ModelConfig:
    """``model`` at ``size`` along ``axis`` (``d_model`` or ``n_layer``), checked."""
    return validate(dataclasses.replace(model, **{axis: size}))


ADAMW = {"kind": "adamw", "weight_decay": 0.0, "betas": [0.9, 0.99], "eps": 1e-8}  # the check's default optimizer
# archlab-coord's optimizer=: each without weight decay, the rest at conf/optim's settings
OPTIMIZERS = {
    "adamw": ADAMW,
    "muon": {
        **ADAMW,
        "kind": "muon",
        "momentum": 0.95,
        "nesterov": True,
        "ns_steps": 5,
        "adjust_lr_fn": "match_rms_adamw",
        "adamw_lr": None,
    },
    "sgd": {"kind": "sgd", "weight_decay": 0.0, "momentum": 0.9, "nesterov": False},
}


def activation_rms(
    model: ModelConfig, param: dict[str, Any], batch: Tensor, steps: int, lr: float, optim: Optional[dict] = None
) -> list[dict]:
    """Per step 0..``steps`` (0: at init), the RMS of the embeddings entering the first block, of each
    block's output (the last one's also as "last block") and of the logits on ``batch``, training on
    ``batch`` itself at ``lr`` with ``optim`` (``build_optimizer``'s settings; default AdamW, no decay)."""
    cfg = parametrize(model, param)
    net = build_model(cfg)
    initialise(net, param)
    optimizer = build_optimizer(net, {**(optim or ADAMW), "lr": lr}, torch.device("cpu"), param=param)
    seen: dict[str, float] = {}

    def keep(name: str):
        def hook(module, inputs, output):
            x = inputs[0] if name == "embeddings" else output
            seen[name] = float(x.detach().float().pow(2).mean().sqrt())

        return hook

    handles = [net.blocks[0].register_forward_hook(keep("embeddings"))]
    handles += [block.register_forward_hook(keep(f"block {i}")) for i, block in enumerate(net.blocks)]
    handles.append(net.blocks[-1].register_forward_hook(keep("last block")))  # the same name at every depth
    handles.append(net.head.register_forward_hook(keep("logits")))
    inputs, targets = batch[:, :-1], batch[:, 1:]
    records = []
    for step in range(steps + 1):
        logits = net(inputs)
        records.append({"step": step, **seen})
        if step == steps:
            break
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for h in handles:
        h.remove()
    return records


def slope(sizes: list[int], values: list[float]) -> float:
    """The least-squares slope of log(value) against log(size): 0 flat, 1 proportional."""
    return statistics.linear_regression([math.log(s) for s in sizes], [math.log(v) for v in values]).slope


def coordinate_check(
    model: ModelConfig,
    param: dict[str, Any],
    sizes: list[int],
    axis: str = "d_model",
    steps: int = 4,
    lr: float = 1e-2,
    batch_size: int = 8,
    seq_len: int = 64,
    seed: int = 0,
    optim: Optional[dict] = None,
) -> dict[str, Any]:
    """The check along ``axis`` (d_model or n_layer) at ``sizes``: ``check_models`` of ``model`` at each."""
    models = {size: _sized(model, axis, size) for size in sizes}
    return check_models(models, param, axis, steps, lr, batch_size, seq_len, seed, optim)


def check_models(
    models: dict[int, ModelConfig],
    param: dict[str, Any],
    axis: str,
    steps: int = 4,
    lr: float = 1e-2,
    batch_size: int = 8,
    seq_len: int = 64,
    seed: int = 0,
    optim: Optional[dict] = None,
) -> dict[str, Any]:
    """The check of ``models``, one per size along ``axis`` (a layout whose other widths follow d_model
    too, sized by the caller), trained with ``optim`` (default AdamW): per size, the records of
    ``activation_rms``, one random batch of tokens for all of them; per measured tensor (the layers the
    smallest model has, and the logits), the slope at the last step."""
    sizes = list(models)
    generator = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, models[sizes[0]].vocab_size, (batch_size, seq_len + 1), generator=generator)
    runs = {}
    for size, sized in models.items():
        torch.manual_seed(seed)
        runs[size] = activation_rms(sized, param, batch, steps, lr, optim)
    last = {size: records[-1] for size, records in runs.items()}
    names = [n for n in last[sizes[0]] if n != "step" and all(n in r for r in last.values())]
    return {
        "axis": axis,
        "param": param["kind"],
        "optim": (optim or ADAMW)["kind"],
        "sizes": sizes,
        "steps": steps,
        "lr": lr,
        "runs": runs,
        "slopes": {n: slope(sizes, [last[s][n] for s in sizes]) for n in names},
    }


def draw(result: dict[str, Any], path: Path) -> Path:
    """RMS against size on log-log axes, one panel per step, one line per measured tensor."""
    from archlab.figures import PANEL, colours, pyplot, save_figure

    plt = pyplot()
    sizes, steps = result["sizes"], result["steps"]
    names = [n for n in result["runs"][sizes[0]][0] if n != "step" and n in result["slopes"]]
    palette = colours(names)
    fig, axes = plt.subplots(
        1, steps + 1, sharey=True, figsize=(PANEL[0] * (steps + 1) * 0.8 + 1.6, PANEL[1] + 0.6), layout="constrained"
    )
    for step, ax in enumerate(axes):
        for n in names:
            ax.plot(sizes, [result["runs"][s][step][n] for s in sizes], marker="o", ms=3, color=palette[n], label=n)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"step {step}", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    title = f"coordinate check, param={result['param']}, {result['optim']}"
    fig.suptitle(f"{title}: RMS of each layer's output against {result['axis']}")
    fig.supxlabel(result["axis"], fontsize=9)
    fig.supylabel("RMS", fontsize=9)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right", fontsize=7)
    return save_figure(fig, path)


def check_settings(cfg: Any) -> None:
    """Raise ConfigError for the first unusable setting of ``archlab-coord``, before any training."""
    model = validate(to_model_config(cfg.model))
    checks.choice("optimizer", cfg.optimizer, OPTIMIZERS)
    try:
        check_param(plain_dict(cfg.param, resolve=True), model, cfg.optimizer)
    except ConfigError as err:  # training's field is optim.kind; this command's is optimizer
        raise ConfigError("optimizer" if err.field == "optim.kind" else err.field, err.value, err.allowed) from None
    if not cfg.widths and not cfg.depths:
        raise ConfigError("widths", cfg.widths, "at least two d_model values (or depths: two n_layer values)")
    for name, axis in (("widths", "d_model"), ("depths", "n_layer")):
        if cfg[name] is None:
            continue
        sizes = list(cfg[name])
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) or len(set(sizes)) < 2:
            raise ConfigError(name, sizes, "null, or two or more distinct positive integers (a slope needs two sizes)")
        for size in sizes:  # each size a model of its own: one that cannot be built fails here, not after training
            try:
                _sized(model, axis, size)
            except ConfigError as err:
                raise ConfigError(name, sizes, f"sizes at which {axis}={size} is a valid model: {err}") from None
    for name in ("steps", "batch_size", "seq_len"):
        checks.integer(name, cfg[name])
    checks.positive("lr", cfg.lr)
    if cfg.seq_len > model.context_length:
        raise ConfigError("seq_len", cfg.seq_len, f"at most model.context_length={model.context_length}")
    checks.choice("format", cfg.format, ("table", "json"))
    checks.png_file("plot", cfg.plot)


def run_coord(model: ModelConfig, param: dict[str, Any], settings: Any, plot: Optional[str]) -> dict[str, Any]:
    """The check ``archlab-coord`` runs: along width (``settings.widths``) and, where given, depth."""
    out = {}
    for axis, sizes in (("d_model", settings.widths), ("n_layer", settings.depths)):
        if sizes:
            out[axis] = coordinate_check(
                model,
                param,
                list(sizes),
                axis,
                settings.steps,
                settings.lr,
                settings.batch_size,
                settings.seq_len,
                optim=OPTIMIZERS[settings.optimizer],
            )
            if plot is not None:
                target = Path(plot).expanduser()
                if axis == "n_layer" and settings.widths:  # both checks: the depth one beside the width one
                    target = target.with_name(f"{target.stem}_depth{target.suffix}")
                out[axis]["plot"] = str(draw(out[axis], target))
    return out
