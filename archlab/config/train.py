"""Schemas of ``archlab-train`` (types, checked by Hydra at compose time; values are checked by
``archlab.training.validation`` before any data is read or weight allocated)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import ListConfig

from archlab.config.fields import setting
from archlab.config.model import ModelConfig
from archlab.errors import ConfigError


@dataclass
class TrainerConfig:
    """Arguments of ``lightning.pytorch.Trainer``; training is counted in optimizer steps."""

    _target_: str = "lightning.pytorch.Trainer"
    accelerator: str = "cpu"
    devices: Any = 1  # an int, a list of device ids, or "auto"
    num_nodes: int = 1
    strategy: Any = "auto"  # a Lightning name, or a node with _target_ (a Strategy object)
    precision: str = "32-true"
    max_steps: int = 1000
    val_check_interval: int = 100  # validate every this many training batches
    check_val_every_n_epoch: Optional[int] = None  # None: val_check_interval counts across epochs
    limit_val_batches: Any = None  # null (all), a count of batches (int), or a fraction (float in (0, 1])
    max_time: Optional[str] = None  # "DD:HH:MM:SS"
    gradient_clip_val: Optional[float] = 1.0
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 50
    num_sanity_val_steps: int = 0
    deterministic: Optional[bool] = None
    enable_model_summary: bool = False  # the parameter check logs the per-component table instead


@dataclass
class OptimConfig:
    """The optimizer (``archlab.training.optim``): ``kind`` adamw | sgd | muon; the fields another kind
    reads stay null (the option files conf/optim/<kind>.yaml set those of theirs)."""

    kind: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.1  # on 2-D weights only (muon: its matrices and AdamW's 2-D tables)
    betas: Optional[List[float]] = None  # adamw; muon's AdamW part
    eps: Optional[float] = None  # adamw; muon's AdamW part
    momentum: Optional[float] = None  # sgd, muon
    nesterov: Optional[bool] = None  # sgd, muon
    ns_steps: Optional[int] = None  # muon: Newton-Schulz iterations
    adjust_lr_fn: Optional[str] = None  # muon: original | match_rms_adamw
    adamw_lr: Optional[float] = None  # muon: AdamW's lr for embeddings, head, norms, biases (null: lr)


@dataclass
class ParamConfig:
    """The parametrisation (``archlab.training.parametrization``): ``kind`` sp | mup | completep, and the
    proxy the rules scale from (mup: its width; completep: its width and depth)."""

    kind: str = "sp"
    base_d_model: Optional[int] = None  # mup, completep: the proxy's d_model (width multiplier d_model / this)
    base_n_layer: Optional[int] = None  # completep: the proxy's n_layer (residual branches × this / n_layer)
    base_head_dim: Optional[int] = None  # mup, completep: the proxy's head dim; null = the model's at base_d_model


@dataclass
class SchedulerConfig:
    """Warm-up, then ``kind``: cosine | linear (to ``min_lr_ratio * lr`` at ``decay_steps``), constant, or
    wsd (the peak, then a 1-sqrt decay over the last ``decay_fraction`` of the steps)."""

    kind: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: Optional[float] = None  # cosine, linear, wsd
    decay_steps: Optional[int] = None  # None: trainer.max_steps (constant: always None)
    decay_fraction: Optional[float] = None  # wsd


@dataclass
class PathsConfig:
    output_dir: Optional[str] = None  # None: the Hydra run directory (required outside archlab-train)


@dataclass
class MatchConfig:
    """Size ``field`` so the model spends what a reference spends: this model with ``reference``'s
    fields (e.g. ``{mlp: {kind: gelu}}``) set; null reference: no matching (see archlab.matching)."""

    reference: Any = None  # null, or a dict of model fields
    quantity: str = "total"  # total | active (params) | flops_per_token | training_flops (sets trainer.max_steps)
    field: str = "mlp.d_ff"
    tolerance: float = 0.005
    step: int = 1


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: Dict[str, Any] = field(default_factory=dict)  # a LightningDataModule node with _target_
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    param: ParamConfig = field(default_factory=ParamConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    logger: Optional[Dict[str, Any]] = field(default_factory=dict)  # name -> Logger node with _target_
    callbacks: Optional[Dict[str, Any]] = field(default_factory=dict)  # name -> Callback node with _target_
    paths: PathsConfig = field(default_factory=PathsConfig)
    seed: int = setting(0, "seeds weights, data order and dropout; two runs with one seed match")
    ckpt_path: Optional[str] = setting(None, "continue exactly from this checkpoint, into a new run directory")
    resume: Optional[str] = setting(None, "auto: continue from the newest checkpoint of this run directory")
    branch_from: Optional[str] = setting(
        None, "a stable-phase run directory: start this wsd run from its checkpoint where this run's decay begins"
    )
    compile: bool = setting(False, "torch.compile each block")
    activation_checkpointing: bool = setting(False, "recompute each block's activations in backward (less memory)")
    threads: Optional[int] = setting(None, "torch intra-op threads per process (null: torch's default)")
    match: MatchConfig = field(
        default_factory=MatchConfig, metadata={"help": "size match.field so the model has a reference's parameters"}
    )
    objective: Optional[str] = setting(None, "the final metric a sweeper optimises (null: the first val loss)")
    lr_from: Optional[str] = setting(
        None,
        "a proxy's sweep over optim.lr (and μP's base multipliers): take its best (by objective) for this run",
    )
    lr_from_group: Any = setting(
        None, "the group of a multi-axis lr_from sweep, {axis: value} (null: the one sharing the command line's values)"
    )


def world_size(devices: Any, num_nodes: Any) -> int:
    """Processes in the run: devices per node (a count or a list of ids) times nodes."""
    per_node = len(devices) if isinstance(devices, (list, ListConfig)) else devices
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise ConfigError(
            "trainer.devices", devices, "a number or list of devices (this strategy sizes its mesh from it)"
        )
    return per_node * int(num_nodes)


def sweep_job() -> Optional[tuple[Path, str, str, list[str]]]:
    """In a job of a ``-m`` sweep: the sweep directory (absolute), that directory as given
    (``hydra.sweep.dir``), the job's overrides joined as Hydra names a job (``key=value,...``, sorted)
    and the overrides one by one; None in a single run or outside ``archlab-train``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        return None
    root = (Path(hydra.runtime.cwd) / str(hydra.sweep.dir)).resolve()
    return root, str(hydra.sweep.dir), str(hydra.job.override_dirname), [str(o) for o in hydra.overrides.task]


def sweep_dir_or(run_dir: Any) -> str:
    """The ``archlab.sweep_dir_or`` resolver: the sweep's directory in a job of a ``-m`` sweep, else
    ``run_dir`` (where a tracker keeps one store for the whole sweep)."""
    job = sweep_job()
    return str(job[0]) if job is not None else str(run_dir)
