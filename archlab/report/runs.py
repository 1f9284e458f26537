"""The runs of a sweep as the report reads them: each job (``Run``: its directory's summary.json and
command-line overrides, ``load_runs``, or a job the sweep planned that never started), the axes they
sweep, the variants they form (runs differing only in seed), and the figures read from each run's
summary.json."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Optional

import yaml

from archlab.errors import ConfigError
from archlab.figures import as_numbers, ordered
from archlab.report.stats import higher_is_better
from archlab.run_files import EVAL_RESULTS, HYDRA_FILES, PENDING_HYDRA_FILES, SUMMARY, continues_run

PERPLEXITY_FIGURES = ("nll", "ppl")  # of a perplexity entry: its counts are no figure to compare
EVAL_FIGURE = "eval "  # how archlab-eval's figures start (eval/results.json): eval <task> <metric>


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


SEED_KEYS = ("seed",)
CONTINUATION_KEYS = ("resume",)  # how a run was continued, not what it is: never a swept axis


def _settings(items: list[str], run_dir: Path, cwd: Optional[str] = None) -> dict[str, str]:
    """``key=value`` overrides as a dict, less Hydra's own and those that only continue a run:
    ``resume``, and a ``ckpt_path`` inside the run's own directory (a relative one is relative to
    ``cwd``, where the run was started)."""
    pairs = ((k.lstrip("+~"), v) for k, v in (item.split("=", 1) for item in items or [] if "=" in item))
    return {
        k: v
        for k, v in pairs
        if not k.startswith("hydra")
        and k not in CONTINUATION_KEYS
        and not (k == "ckpt_path" and continues_run(v, run_dir, cwd))
    }


HYDRA_DIRS = (HYDRA_FILES, PENDING_HYDRA_FILES)  # a job's config files: its own, or those of one killed early


def _overrides(run_dir: Path) -> dict[str, str]:
    """The run's command-line overrides (``.hydra/overrides.yaml``, else the pending copy Hydra wrote
    for a job that never got as far as its summary)."""
    for name in HYDRA_DIRS:
        file = run_dir / name / "overrides.yaml"
        if file.exists():
            hydra_file = file.with_name("hydra.yaml")
            hydra = (yaml.safe_load(hydra_file.read_text()) or {}).get("hydra") if hydra_file.exists() else None
            cwd = ((hydra or {}).get("runtime") or {}).get("cwd")
            return _settings(yaml.safe_load(file.read_text()), run_dir, cwd)
    return {}


def planned_jobs(sweep_dir: Path) -> list[list[str]]:
    """Every job's overrides as Hydra's basic sweeper expands the sweep recorded in ``multirun.yaml``
    (``hydra.sweeper.params``, then the command line); none for another sweeper (Optuna) or no record."""
    from omegaconf import OmegaConf

    file = sweep_dir / "multirun.yaml"
    if not file.is_file():
        return []
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from archlab.hydra_private import BasicSweeper

        hydra = OmegaConf.load(file).hydra
        if hydra.sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
            return []
        params = [f"{k}={v}" for k, v in (hydra.sweeper.get("params") or {}).items()]
        overrides = OverridesParser.create().parse_overrides([*params, *hydra.overrides.task])
        return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    except Exception:  # a record this Hydra cannot read: report the jobs that have directories
        return []


def load_runs(sweep_dir: str | Path) -> list[Run]:
    """Every job directory under ``sweep_dir``: those with a summary, those Hydra started (``.hydra/``,
    or ``.hydra.pending/``) that never wrote one (killed or still running), and the jobs the sweep's
    ``multirun.yaml`` planned that never got a directory; in the order that sweep planned them where it
    planned them all."""
    root = Path(sweep_dir)
    if not root.is_dir():
        why = "this path is a file" if root.exists() else "nothing is there"
        raise ConfigError(
            "sweep_dir", str(root), f"a directory of runs: a Hydra multirun directory or any folder ({why})"
        )
    dirs = {p.parent for p in root.rglob(SUMMARY)}
    dirs |= {p.parent.parent for name in HYDRA_DIRS for p in root.rglob(f"{name}/overrides.yaml")}
    runs = []
    for d in sorted(dirs, key=_natural):
        summary_file = d / SUMMARY
        try:
            summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(
                "sweep_dir",
                str(root),
                f"runs whose summary.json is JSON ({summary_file}: {err}; move that run aside to report the others)",
            ) from None
        runs.append(Run(d, _overrides(d), summary))
    planned = [_settings(job, root) for job in planned_jobs(root)]
    started = [r.overrides for r in runs]
    # multirun.yaml is the latest sweep started here: it plans these runs only if it names every one
    # (Hydra rewrites it before any job, also for a re-run whose jobs are all refused)
    if all(settings in planned for settings in started):
        for num, settings in enumerate(planned):
            if settings not in started:  # planned, but the sweep stopped before Hydra made its directory
                runs.append(Run(root / f"job {num}", settings, None, started=False))
        # in the sweep's own order (its first axis outermost), not the directories' names' order
        runs.sort(key=lambda r: planned.index(r.overrides))
    return runs


def _natural(path: Path) -> list:
    """A directory's path with its numbers compared as numbers: job 2 before job 10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", str(path))]


def swept_axes(runs: list[Run], ignore: tuple[str, ...] = ()) -> list[str]:
    """Override keys whose values differ between runs, the seed and ``ignore`` left out, in first-seen order."""
    keys: dict[str, set[str]] = {}
    for run in runs:
        for k, v in run.overrides.items():
            keys.setdefault(k, set()).add(v)
    return [
        k
        for k, values in keys.items()
        if k not in SEED_KEYS and k not in ignore and (len(values) > 1 or any(k not in r.overrides for r in runs))
    ]


def group_variants(runs: list[Run], axes: list[str]) -> list[Variant]:
    """Runs sharing every swept setting but the seed, as variants; an axis whose values are all numbers
    has one value per number (``3e-3`` and ``0.003`` from combined sweeps are one) and its variants in
    ascending order (3e-3, 1e-2, 2e-2), other axes in first-seen order."""
    values = {k: list(dict.fromkeys(r.overrides.get(k, "(default)") for r in runs)) for k in axes}
    spelled: dict[str, dict[float, str]] = {}  # per numeric axis: each number as first spelled
    for k, vs in values.items():
        for number, v in zip(as_numbers(vs) or [], vs):
            spelled.setdefault(k, {}).setdefault(number, v)
    variants: dict[tuple, Variant] = {}
    for run in runs:
        settings = {k: run.overrides.get(k, "(default)") for k in axes}
        settings = {k: spelled[k][float(v)] if k in spelled else v for k, v in settings.items()}
        variants.setdefault(tuple(settings.items()), Variant(settings)).runs.append(run)
    order = {k: ordered(list(dict.fromkeys(v.settings[k] for v in variants.values()))) for k in axes}
    return sorted(variants.values(), key=lambda v: [order[k].index(x) for k, x in v.settings.items()])


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
    for key, value in ((s.get("ema") or {}).get("final") or {}).items():  # the weights' average (callbacks.ema)
        if key != "step" and finite_number(value) is not None:
            out[f"ema {key}"] = float(value)
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
    router = s.get("router_load") or {}  # a mixture of experts' last window of loads (RouterLoad)
    for key, figure in (("max_over_mean", "router max/mean"), ("cv", "router cv")):
        if finite_number(router.get(key)) is not None:
            out[figure] = float(router[key])
    match = s.get("match") or {}  # null where nothing was matched: no matched figure then
    if match:
        out[f"matched {match['field']}"] = float(match["value"])
        out["match residual"] = float(match["relative_difference"])
    return {**out, **training_eval_figures(s), **eval_figures(run.path)}


def figure_of(metric: str) -> str:
    """The figure a ``metric=`` names: archlab-eval's ``eval <task> <metric>`` as it is, any other metric's
    final value (``final val/loss``, ``final eval/web/ppl``)."""
    return metric if metric.startswith(EVAL_FIGURE) else f"final {metric}"


def training_evaluations(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Every evaluation during training (``callbacks.evaluation``): step and ``eval/<set or task>/<metric>``."""
    history = (summary.get("evaluation") or {}).get("history") or []
    return [h for h in history if isinstance(h, dict) and isinstance(h.get("step"), int)]


def training_eval_figures(summary: dict[str, Any]) -> dict[str, float]:
    """``final`` and ``best`` of each metric evaluated during training (highest accuracy, lowest loss or
    perplexity: ``higher_is_better``), as the validation metrics' are."""
    out: dict[str, float] = {}
    for key, value in ((summary.get("evaluation") or {}).get("final") or {}).items():
        if finite_number(value) is not None:
            out[f"final {key}"] = float(value)
    for entry in training_evaluations(summary):
        for key, value in entry.items():
            if key.startswith("eval/") and finite_number(value) is not None:
                best = out.get(f"best {key}")
                better = max if higher_is_better(key) else min
                out[f"best {key}"] = float(value) if best is None else better(best, float(value))
    return out


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
                out[f"{EVAL_FIGURE}{task} {key.removesuffix(',none')}"] = float(value)
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
    return _kv_cache_bytes_per_token(json.dumps(model, sort_keys=True), precision)


@cache
def _kv_cache_bytes_per_token(model: str, precision: Optional[str]) -> float:
    """``kv_cache_bytes_per_token`` of a recorded config as JSON: read once per config (a sweep's seeds and
    the report's every table share it; reading one is the report's largest cost)."""
    from archlab.accounting import kv_cache_bytes
    from archlab.config import recorded_model_config
    from archlab.precision import compute_dtype

    cfg = recorded_model_config(json.loads(model))
    size = compute_dtype(precision).itemsize if precision else 4
    return kv_cache_bytes(cfg, cfg.context_length, size) / cfg.context_length
