"""What a sweep needs from each run: a fair size (``match``), a number to optimise (``objective``), the
variant it is (``variant_choices``), and a ``summary.json`` even when the run fails before training starts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional, cast

from omegaconf import DictConfig, OmegaConf

from archlab.build import CONF_DIR
from archlab.config import ModelConfig, left_out, to_model_config, with_fields
from archlab.config.fields import plain_dict
from archlab.errors import ConfigError
from archlab.matching import match_params, matched_steps
from archlab.nn.validation import ignored, uses, validate
from archlab.run_files import SUMMARY, read_summary
from archlab.training.outputs import held_results
from archlab.training.summary import metric_names, run_summary, write_summary


def apply_match(cfg: DictConfig) -> Optional[dict[str, Any]]:
    """With ``match.reference`` set, make ``cfg`` (in place) spend what the reference (this model with the
    reference's fields) spends: size ``match.field`` of ``cfg.model`` so its ``match.quantity`` (total or
    active parameters, or FLOPs per token) matches, or, for ``training_flops``, set ``trainer.max_steps``
    so the run's training FLOPs match the reference's at the same steps; return the match record.

    Call once the data has set vocab_size and context_length: the counts include the embeddings."""
    m = cfg.match
    if m.reference is None:
        return None
    if not isinstance(m.reference, DictConfig):
        raise ConfigError("match.reference", m.reference, "null, or model fields to change, e.g. {mlp: {kind: gelu}}")
    model = validate(to_model_config(cfg.model))
    reference = validate(with_fields(model, cast(dict, OmegaConf.to_container(m.reference)), "match.reference"))
    record = {"reference": OmegaConf.to_container(m.reference)}
    if m.quantity == "training_flops":
        steps = matched_steps(model, reference, cfg.trainer.max_steps)
        record.update(
            quantity=m.quantity, field="trainer.max_steps", value=steps, reference_steps=cfg.trainer.max_steps
        )
        cfg.trainer.max_steps = steps
        return record
    if not uses(model, m.field):
        return None  # this variant has no such field to size: ignored_settings says so
    result = match_params(model, reference, m.field, m.tolerance, m.step, m.quantity)
    OmegaConf.update(cfg.model, m.field, result.value, merge=False)
    return {**record, **result.as_dict()}


def ignored_settings(cfg: DictConfig, model: ModelConfig) -> list[str]:
    """What this variant ignores of what the run sets: model fields its parts do not read
    (``nn.validation.ignored``), and a ``match.field`` it does not have (nothing is matched then). A
    sweep that crosses variants sets such fields for all of them: the run goes on and says so. A mixer's
    field set where another mixer is chosen is left out of the model (``config.left_out``), and said so too."""
    m = cfg.match
    sized = f"model.{m.field}=" if m.reference is not None and m.quantity != "training_flops" else None
    out = left_out(cfg) + [
        str(item._replace(why=f"{item.why}: match.field sets it") if sized and item.why.startswith(sized) else item)
        for item in ignored(model)
    ]
    if m.reference is not None and m.quantity != "training_flops" and not uses(model, m.field):
        family = m.field.rpartition(".")[0]
        kind = getattr(model, family).kind
        out.append(
            f"match.field={m.field} is ignored for this variant (model.{family}.kind={kind} does not use it): "
            "nothing was matched"
        )
    return out


def check_objective(objective: Optional[str], val_names: list[str]) -> None:
    """``objective`` must be null or a metric this data produces (``<val name>/loss|ppl|acc``)."""
    allowed = metric_names(val_names)
    if objective is not None and objective not in allowed:
        raise ConfigError("objective", objective, "null (the first validation loss) or one of " + ", ".join(allowed))


def objective_value(objective: Optional[str], summary: dict[str, Any]) -> Optional[float]:
    """The final value of ``objective`` (default: the first validation set's loss): what a sweeper
    (Optuna) optimises. None when the run has no final metrics."""
    final = summary.get("metrics", {}).get("final") or {}
    name = objective or f"{summary['data']['val_names'][0]}/loss"
    value = final.get(name)
    return float("nan") if final and value is None else value  # a non-finite metric was stored as null


def in_multirun() -> bool:
    """Is this job one point of a ``-m`` sweep (Hydra's multirun, whatever the sweeper and launcher)?"""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def variant_choices(cfg: DictConfig) -> dict[str, Any]:
    """The config-group choices of this run (``model``, ``model/position``, ``data``, ...), Hydra's own left
    out: what archlab-report groups the runs of a sweep by."""
    from hydra.core.hydra_config import HydraConfig

    choices: dict[str, Any]
    if HydraConfig.initialized():
        choices = plain_dict(HydraConfig.get().runtime.choices)
    else:  # composed with return_hydra_config=True, or none known
        known = OmegaConf.select(cfg, "hydra.runtime.choices", default=None)
        choices = plain_dict(known) if known is not None else {}
    tuned = choices.pop("tuned@_global_", None)  # optional: only counts when tuned/<data>_<model>.yaml exists
    choices["tuned"] = tuned if tuned and (CONF_DIR / "tuned" / f"{tuned}.yaml").exists() else None
    return {k: v for k, v in choices.items() if not k.startswith("hydra")}


def _written_since(summary: Path, start: float) -> bool:
    """Whether ``summary`` is from an attempt that started at ``start`` or later."""
    started = (read_summary(summary) or {}).get("start_time")
    return isinstance(started, (int, float)) and started >= start


def record_failure(cfg: DictConfig, error: BaseException, start: float) -> Optional[Path]:
    """Write a failed ``summary.json`` in the Hydra job directory, unless the summary there is this
    attempt's (a failure during fit is recorded by the run itself, with its metrics so far) or the
    directory holds an earlier run's results (a summary with results, the export, checkpoints), which a
    mistyped re-run must not touch (its error is printed anyway). An earlier attempt's failure without
    results is replaced: the summary says why the latest one failed."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    out = Path(OmegaConf.select(cfg, "paths.output_dir") or HydraConfig.get().runtime.output_dir)
    existing = out / SUMMARY
    if held_results(out) or (existing.exists() and _written_since(existing, start)):
        return None
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # the failure may be an unresolvable interpolation
        config = OmegaConf.to_container(cfg, resolve=False)
    info = {
        "stage": "setup",  # before any training step
        "start_time": start,
        "seed": OmegaConf.select(cfg, "seed"),
        "choices": variant_choices(cfg),
        "config": config,
    }
    return write_summary(out, run_summary(out, info, "failed", error, wall_time_s=time.time() - start))
