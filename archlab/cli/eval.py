"""archlab-eval: lm-evaluation-harness tasks, or held-out perplexity, on a trained model, through an lm-eval
adapter over archlab's own model (any layout, exported or not). Results go to results.json in the run's
eval/ directory, which archlab-report reads as columns.

    archlab-eval outputs/run tasks=[hellaswag,arc_easy] batch_size=16       # lm-eval's tasks (they download data)
    archlab-eval outputs/run tasks=[my_task] include_path=tasks/ limit=100   # local task YAMLs
    archlab-eval outputs/run/checkpoints/last.ckpt perplexity=shards/ document_mask=true
    archlab-eval hf/model perplexity=notes.txt seq_len=256 stride=128         # an archlab-export directory

Every setting, the model's files (an export's config.json against its weights' shapes) and the tasks (each
built from its config, its data read) are checked before any weights are read.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from archlab import checks
from archlab.cli.errors import short_config_errors
from archlab.cli.settings import settings_or_help
from archlab.config.commands import EvalConfig
from archlab.errors import ConfigError
from archlab.evaluation.results import RESULTS, write_results
from archlab.nn.head import head_vocab
from archlab.precision import check_device
from archlab.run_files import EXPORT

TASK_ONLY = ("include_path", "num_fewshot", "limit", "prefix_token_id")


def check(cfg: EvalConfig) -> None:
    """The settings that need no file: one of tasks and perplexity, sizes, the device."""
    if (cfg.tasks is None) == (cfg.perplexity is None):
        raise ConfigError("tasks", cfg.tasks, "a list of lm-eval tasks, or null with perplexity=<text or shards>")
    if cfg.tasks is not None and not cfg.tasks:
        raise ConfigError("tasks", cfg.tasks, "at least one task")
    checks.integer("batch_size", cfg.batch_size, 1, "an integer >= 1")
    if cfg.num_fewshot is not None:
        checks.integer("num_fewshot", cfg.num_fewshot, 0, "null or an integer >= 0")
    if cfg.limit is not None and not (cfg.limit > 0 and (cfg.limit < 1 or float(cfg.limit).is_integer())):
        raise ConfigError("limit", cfg.limit, "null, an integer >= 1 (examples per task) or a fraction in (0, 1)")
    if cfg.prefix_token_id is not None:
        checks.integer("prefix_token_id", cfg.prefix_token_id, 0, "null or a token id >= 0")
    check_device(cfg.device)
    unread = ("seq_len", "stride", "document_mask", "reset_positions") if cfg.tasks is not None else TASK_ONLY
    for name in unread:
        if getattr(cfg, name) not in (None, False):
            mode = "tasks" if cfg.tasks is not None else "perplexity"
            raise ConfigError(name, getattr(cfg, name), f"its default (null or false): {mode} does not read it")
    if cfg.tasks is not None:
        if importlib.util.find_spec("lm_eval") is None:
            raise ConfigError("tasks", cfg.tasks, 'tasks with lm-eval installed: pip install -e ".[eval]"')


def out_dir(cfg: EvalConfig, run: Optional[Path]) -> Path:
    """Where results.json goes: ``out``, else the run's eval/, else eval/ beside the model. Another weights
    file of a run than its model.safetensors (model_ema.safetensors, an archlab-average) gets its own
    eval/<file stem>/, so its results are never taken for the run's."""
    if cfg.out is not None:
        return checks.writable_dir("out", cfg.out)
    source = Path(cfg.source).expanduser()
    home = run if run is not None else source if source.is_dir() else source.parent
    other = run is not None and source.suffix == ".safetensors" and source.name != EXPORT
    return checks.writable_dir("out", str(home / RESULTS.parent / (source.stem if other else "")))


def run(cfg: EvalConfig) -> tuple[Path, dict[str, Any]]:
    """Check everything, evaluate, write results.json; returns it and the per-task metrics."""
    from archlab.evaluation.models import load, read_model

    check(cfg)
    found = read_model(cfg.source, "source")
    if cfg.prefix_token_id is not None and cfg.prefix_token_id >= found.config.vocab_size:
        raise ConfigError("prefix_token_id", cfg.prefix_token_id, f"null or an id below {found.config.vocab_size}")
    directory = out_dir(cfg, found.run)
    if cfg.perplexity is not None:
        from archlab.evaluation.perplexity import check_settings, perplexity, read_held_out

        held_out = read_held_out(cfg.perplexity, found.tokenizer, head_vocab(found.config))
        window, stride = check_settings(
            held_out, found.config.context_length, cfg.seq_len, cfg.stride, cfg.document_mask, cfg.reset_positions
        )
        figures = perplexity(
            load(found), held_out, window, stride, cfg.batch_size, cfg.device, cfg.document_mask, cfg.reset_positions
        )
        results: dict[str, Any] = {"results": {held_out.name: figures}}
    else:
        assert cfg.tasks is not None  # check: tasks or perplexity
        from archlab.evaluation.harness import ArchlabLM, evaluate, load_tasks, rolling_tasks, task_manager

        manager = task_manager(cfg.tasks, cfg.include_path)
        rolling = rolling_tasks(manager, cfg.tasks) if found.eos_id is None and cfg.prefix_token_id is None else []
        if rolling:
            raise ConfigError(
                "prefix_token_id",
                None,
                f"a token id: {', '.join(rolling)} score texts from their start, conditioned on it, and this "
                "model's tokenizer has no EOS to take",
            )
        tasks = load_tasks(manager, cfg.tasks)
        lm = ArchlabLM(load(found), found.tokenizer, cfg.batch_size, cfg.device, found.eos_id, cfg.prefix_token_id)
        results = evaluate(lm, tasks, manager, cfg.num_fewshot, cfg.limit)
    return write_results(results, directory), results["results"]


@short_config_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    cfg = settings_or_help("archlab-eval", __doc__, EvalConfig, sys.argv[1:] if argv is None else argv, "source")
    if cfg is None:
        return
    file, metrics = run(cfg)
    print(json.dumps(metrics, indent=2, default=str))
    print(f"wrote {file}")


if __name__ == "__main__":
    main()
