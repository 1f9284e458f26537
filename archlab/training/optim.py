"""Optimizers (``optim.kind``): AdamW or SGD over two parameter groups (decay on 2-D weights only), or Muon
on the blocks' hidden matrices with AdamW on the rest; and the warm-up that must fit the schedule."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, cast, overload

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from archlab.errors import ConfigError
from archlab.nn.model import Decoder
from archlab.training import mup_rates, parametrization
from archlab.training.schedules import build_scheduler, lr_factor, warmup_limit

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "param_groups", "muon_groups", "MuonAdamW", "fit_warmup"]

log = logging.getLogger("archlab.train")

# the fields each kind reads beside lr and weight_decay; the others must be null (see validate_train)
OPTIMIZERS = {
    "adamw": ("betas", "eps"),
    "sgd": ("momentum", "nesterov"),
    "muon": ("momentum", "nesterov", "ns_steps", "adjust_lr_fn", "betas", "eps", "adamw_lr"),
}
NULLABLE = ("adamw_lr",)  # muon: null means AdamW's part takes optim.lr
KIND_FIELDS = ("betas", "eps", "momentum", "nesterov", "ns_steps", "adjust_lr_fn", "adamw_lr")


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every trainable parameter, a tied head (the token table itself) listed once."""
    seen: dict[int, tuple[str, nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            seen.setdefault(id(p), (name, p))
    return list(seen.values())


def _decays(name: str, p: nn.Parameter) -> bool:
    """Matrices and embedding tables decay; biases (stacked experts' [E, out] ones too) and norm scales do
    not (GPT-2/nanoGPT)."""
    return p.dim() >= 2 and not name.endswith("bias")


def param_groups(
    model: nn.Module, weight_decay: float, named: Optional[list[tuple[str, nn.Parameter]]] = None
) -> list[dict[str, Any]]:
    """The decaying and the non-decaying parameters (``_decays``) of ``named`` (default: all of ``model``)."""
    named = _trainable(model) if named is None else named
    return [
        {"params": [p for n, p in named if _decays(n, p)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if not _decays(n, p)], "weight_decay": 0.0},
    ]


def muon_groups(model: nn.Module, weight_decay: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Muon's group (every 2-D weight inside ``model.blocks``: the attention and MLP matrices, routers
    included) and AdamW's groups for the rest: embeddings, head, norms, biases, and stacked routed experts
    ([E, out, in]: ``torch.optim.Muon`` orthogonalises 2-D parameters only), split by ``param_groups``."""
    hidden, other = [], []
    for name, p in _trainable(model):
        (hidden if name.startswith("blocks.") and p.dim() == 2 and _decays(name, p) else other).append((name, p))
    return [{"params": [p for _, p in hidden], "weight_decay": weight_decay}], param_groups(model, weight_decay, other)


class MuonAdamW(torch.optim.Optimizer):
    """Muon and AdamW stepped together, one optimizer to Lightning. The wrapper's ``param_groups`` are the
    two optimizers' own group dicts and all three share one ``state``, so the schedule, gradient clipping
    and the base class's ``state_dict``/``load_state_dict`` see one optimizer, and a resume is exact."""

    def __init__(self, hidden: list[dict[str, Any]], other: list[dict[str, Any]], muon: dict, adamw: dict):
        self.muon = torch.optim.Muon(hidden, **muon)
        self.adamw = torch.optim.AdamW(other, **adamw)
        super().__init__([*self.muon.param_groups, *self.adamw.param_groups], {})
        self._share()

    def _share(self) -> None:
        """Point both optimizers at the wrapper's groups and state (``load_state_dict`` replaces them)."""
        n = len(self.muon.param_groups)
        self.muon.param_groups, self.adamw.param_groups = self.param_groups[:n], self.param_groups[n:]
        self.muon.state = self.adamw.state = self.state

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()


def build_optimizer(
    model: nn.Module,
    optim: dict[str, Any],
    device: torch.device,
    mixed_precision: bool = False,
    param: Optional[dict[str, Any]] = None,
) -> torch.optim.Optimizer:
    """The optimizer ``optim`` names (no ``kind``: adamw, as earlier versions recorded it). AdamW and SGD
    use fused kernels on CUDA and CPU (one pass over each tensor per step instead of a dozen foreach
    passes), except under ``mixed_precision``: Lightning's autocast plugin refuses to clip the gradients of
    a fused optimizer."""
    kind = optim.get("kind", "adamw")
    # None: torch's default (its foreach or per-parameter path)
    fused: Optional[bool] = True if device.type in ("cuda", "cpu") and not mixed_precision else None
    lr, decay = optim["lr"], optim["weight_decay"]
    # betas and eps as given; records of earlier versions may lack them (torch's defaults then)
    adamw = {"lr": lr, **{k: tuple(optim[k]) if k == "betas" else optim[k] for k in ("betas", "eps") if k in optim}}
    scaled = param is not None and param["kind"] != "sp"  # μP's groups (validated: the kinds it has rules for)
    if kind == "adamw" and scaled:
        groups = parametrization.scale_groups(cast(Decoder, model), param_groups(model, decay), optim, param)
        return torch.optim.AdamW(groups, **adamw, fused=fused)
    if kind == "adamw":
        return torch.optim.AdamW(param_groups(model, decay), **adamw, fused=fused)
    if kind == "sgd":
        sgd = {"momentum": optim["momentum"], "nesterov": optim["nesterov"]}
        groups = param_groups(model, decay)
        if scaled:
            groups = mup_rates.scale_sgd_groups(cast(Decoder, model), groups, lr, param)
        return torch.optim.SGD(groups, lr=lr, **sgd, fused=fused)
    if kind == "muon":
        muon = {k: optim[k] for k in ("momentum", "nesterov", "ns_steps", "adjust_lr_fn")}
        hidden, other = muon_groups(model, decay)
        adamw["lr"] = optim["adamw_lr"] if optim.get("adamw_lr") is not None else lr
        if scaled:
            hidden, other = mup_rates.scale_muon_groups(cast(Decoder, model), hidden, other, optim, adamw["lr"], param)
        return MuonAdamW(hidden, other, {"lr": lr, **muon}, {**adamw, "fused": fused})
    raise ConfigError("optim.kind", kind, f"one of {list(OPTIMIZERS)}")


def command_line_sets(cfg: DictConfig, key: str) -> bool:
    """Whether this run's command line sets ``key`` (Hydra's task overrides: those of the ``hydra`` node
    of a config composed with ``return_hydra_config=True``, else the running Hydra job's). True where
    neither is known: a value of unknown origin is taken as chosen."""
    from hydra.core.hydra_config import HydraConfig

    task = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    if task is None and HydraConfig.initialized():
        task = HydraConfig.get().overrides.task
    if task is None:
        return True
    return any(str(o).split("=", 1)[0].lstrip("+~") == key for o in task)


def fit_warmup(cfg: DictConfig) -> None:
    """Where ``scheduler.warmup_steps`` would not end before the decay begins (``warmup_limit``) and the
    command line did not set it (a default or an experiment's value, made for longer runs), shorten it in
    ``cfg`` to a tenth of the decay steps (rounded down; for wsd at most the start of its decay) and log
    the change; a value set on the command line is kept, for validation to reject."""
    s = cfg.scheduler
    decay = s.decay_steps if s.decay_steps is not None else cfg.trainer.max_steps
    limit, _ = warmup_limit(s, cfg.trainer.max_steps)
    if decay <= 0 or s.warmup_steps <= limit or command_line_sets(cfg, "scheduler.warmup_steps"):
        return
    fitted = max(0, min(decay // 10, limit))
    field = "scheduler.decay_steps" if s.decay_steps is not None else "trainer.max_steps"
    log.info(
        "scheduler.warmup_steps: %d -> %d (%s of %s=%d: the warm-up must end before the decay begins; "
        "set scheduler.warmup_steps to choose it)",
        s.warmup_steps,
        fitted,
        "a tenth" if fitted == decay // 10 else "the start of the decay",
        field,
        decay,
    )
    s.warmup_steps = fitted
