"""The runs of a sweep as the report reads them: each job (``Run``), the variants they form (runs differing
only in seed), and the figures read from each run's summary.json."""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from archlab.training.outputs import EVAL_RESULTS

PERPLEXITY_FIGURES = ("nll", "ppl")  # of a perplexity entry: its counts are no figure to compare


@dataclass
class Run:
    """One job of a sweep: its directory, its command-line overrides and its summary (None if absent);
    ``started`` is False for a job the sweep planned that never got a directory."""

    path: Path
    overrides: dict[str, str]
    summary: Optional[dict[str, Any]]
    started: bool = True

    @property
    def status(self) -> str:
        if not self.started:
            return "not started"
        return "missing" if self.summary is None else self.summary.get("status", "unknown")

    @property
    def seed(self) -> str:
        """What pairs this run with other variants' runs: its ``seed`` override, else the summary's seed."""
        return self.overrides.get("seed", str((self.summary or {}).get("seed")))


@dataclass
class Variant:
    """The runs sharing every swept setting but the seed."""

    settings: dict[str, str]
    runs: list[Run] = field(default_factory=list)

    @property
    def completed(self) -> list[Run]:
        return [r for r in self.runs if r.status == "completed"]

    @cached_property
    def per_seed(self) -> dict[str, dict[str, float]]:
        """Each figure's value per completed seed (seeds in numeric order; runs sharing a seed averaged)."""
        found: dict[str, dict[str, list[float]]] = {}
        for run in sorted(self.completed, key=lambda r: _seed_order(r.seed)):
            for key, value in run_figures(run).items():
                found.setdefault(key, {}).setdefault(run.seed, []).append(value)
        return {k: {seed: statistics.fmean(v) for seed, v in seeds.items()} for k, seeds in found.items()}


def _seed_order(seed: str) -> tuple:
    try:
        return (0, float(seed), seed)
    except ValueError:
        return (1, 0.0, seed)


def finite_number(value: Any) -> Optional[float]:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def run_figures(run: Run) -> dict[str, float]:
    """The numbers of one completed run that the table aggregates."""
    s = run.summary or {}
    out: dict[str, float] = {}
    for key, value in (s.get("metrics", {}).get("final") or {}).items():
        if key != "step" and finite_number(value) is not None:
            out[f"final {key}"] = float(value)
    for key, best in (s.get("metrics", {}).get("best") or {}).items():
        if finite_number(best.get("value")) is not None:
            out[f"best {key}"] = float(best["value"])
    params = (s.get("parameters") or {}).get("analytic") or {}
    for key in ("total", "non_embedding", "active", "active_non_embedding"):
        if key in params:
            out[f"params {key}"] = float(params[key])
    throughput = s.get("throughput") or {}
    tokens, flops = finite_number(throughput.get("tokens_per_s")), finite_number(throughput.get("flops_per_s"))
    # as trained (the training sequence length; the summary's flops_per_token is at context_length, so
    # it is no stand-in where a run trained no step), to the whole FLOP: the two float rates leave
    # rounding noise in the last digits
    if tokens and flops is not None:
        out["flops/token"] = float(round(flops / tokens))
    seconds = finite_number(throughput.get("train_seconds"))
    if flops is not None and seconds is not None:  # the FLOPs of every training step (scaling fits' C)
        out["training FLOPs"] = flops * seconds
    if finite_number(s.get("wall_time_s")) is not None:
        out["wall time (s)"] = float(s["wall_time_s"])
    if tokens is not None:
        out["tokens/s"] = tokens
    if s.get("model"):
        out["KV cache bytes/token"] = float(
            kv_cache_bytes_per_token(s["model"], (s.get("trainer") or {}).get("precision"))
        )
    grad_norm = finite_number((s.get("grad_norm") or {}).get("max"))
    if grad_norm is not None:
        out["max grad norm"] = grad_norm
    match = s.get("match") or {}  # null where nothing was matched: no matched figure then
    if match:
        out[f"matched {match['field']}"] = float(match["value"])
        out["match residual"] = float(match["relative_difference"])
    return {**out, **eval_figures(run.path)}


def eval_figures(run_dir: Path) -> dict[str, float]:
    """``eval <task> <metric>`` of each metric archlab-eval wrote into the run (``acc`` for lm-eval's
    ``acc,none``; another filter stays named, ``exact_match,strict-match``; standard errors left out), and
    ``eval perplexity:<file> nll|ppl``; none where the results file is missing or unreadable."""
    try:
        results = json.loads((run_dir / EVAL_RESULTS).read_text()).get("results") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    out = {}
    for task, metrics in results.items() if isinstance(results, dict) else ():
        for key, value in metrics.items() if isinstance(metrics, dict) else ():
            wanted = key in PERPLEXITY_FIGURES if task.startswith("perplexity:") else "," in key
            if wanted and "_stderr" not in key and finite_number(value) is not None:
                out[f"eval {task} {key.removesuffix(',none')}"] = float(value)
    return out


def run_file(run: Run, recorded: Optional[str]) -> Optional[Path]:
    """A path summary.json records (absolute, where the run was written) as it lies now: beside the run's
    summary when the sweep was moved or copied since, as it was recorded otherwise; None for none."""
    if not recorded:
        return None
    home = Path(((run.summary or {}).get("paths") or {}).get("summary") or run.path / "summary.json").parent
    path = Path(recorded)
    return run.path / path.relative_to(home) if path.is_relative_to(home) else path


def training_losses(run: Run) -> list[tuple[int, float]]:
    """(step, train/loss) of every logged training step, from the run's CSV log (``metrics.csv`` in one of
    the summary's log directories); none where the run kept no CSV log."""
    logs = ((run.summary or {}).get("paths") or {}).get("logs") or []
    for log_dir in (run_file(run, d) for d in logs):
        file = log_dir / "metrics.csv" if log_dir else None
        if file is not None and file.is_file():
            with file.open(newline="") as f:
                rows = [(r.get("step"), finite_number(_float(r.get("train/loss")))) for r in csv.DictReader(f)]
            return [(int(float(step)), loss) for step, loss in rows if step and loss is not None]
    return []


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def kv_cache_bytes_per_token(model: dict[str, Any], precision: Optional[str] = None) -> float:
    """Bytes the KV cache holds per token of a full context (``context_length`` tokens): keys and values
    of every layer, 2 * L * n_kv_head * head_dim elements without sliding windows, at 2 bytes for 16-bit
    precisions and 4 otherwise. The model config as the run recorded it, read as ``recorded_model_config``
    reads an earlier version's (its global_every and dense_layers as layer kinds)."""
    from archlab.accounting import kv_cache_bytes
    from archlab.config import recorded_model_config
    from archlab.precision import compute_dtype

    cfg = recorded_model_config(model)
    size = compute_dtype(precision).itemsize if precision else 4
    return kv_cache_bytes(cfg, cfg.context_length, size) / cfg.context_length
