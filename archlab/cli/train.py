"""archlab-train: train any archlab build with Lightning, configured by Hydra (conf/train.yaml).

archlab-train                                     the default: nano learns associative recall on the CPU
archlab-train model=llama2-7b model.n_layer=2 trainer.max_steps=300
archlab-train -m model/position=rope,alibi seed=0,1   a sweep (archlab-report summarises it)
"""

from __future__ import annotations

import time
import warnings

import hydra
from omegaconf import DictConfig

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import run_hydra_command
from archlab.config.store import register_configs
from archlab.config.train import TrainConfig
from archlab.errors import DirectoryHoldsRun, SweepConfigError


@hydra.main(version_base="1.3", config_path="pkg://archlab.conf", config_name="train")
@short_config_errors
def _app(cfg: DictConfig) -> float | None:
    from archlab.training.outputs import settle_hydra_files
    from archlab.training.sweep import objective_value, record_failure
    from archlab.training.validation import validate_train

    # Lightning 2.6 builds torch's deprecated LeafSpec when it moves each batch: one FutureWarning per run
    # that the user can do nothing about (set here: a parallel sweep's worker processes run this, not main)
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
    start = time.time()
    try:
        validate_train(cfg)  # a config mistake fails here, before Lightning is even imported
        from archlab.report.proxy import transfer_lr

        transferred = transfer_lr(cfg)  # lr_from: the proxy sweep's best optim.lr (and tuned multipliers)
        from archlab.training.run import train

        summary = train(cfg, transferred)
    except Exception as err:
        # every run fails at any stage with a failed summary.json, but for an error of this attempt
        # alone: a setting every sweep job shares, or a directory that holds another run
        wrote = None
        if not isinstance(err, (SweepConfigError, DirectoryHoldsRun)):
            wrote = record_failure(cfg, err, start)
        settle_hydra_files(keep=wrote is not None)  # .hydra describes the run whose summary is there
        raise
    return objective_value(cfg.objective, summary) if summary else None  # what a sweeper (Optuna) optimises


def main() -> None:
    from archlab.training.console import end_sweep
    from archlab.training.launcher import register

    register_configs()
    register()  # hydra/launcher=local's class, which Hydra's scan misses under an editable install
    try:
        run_hydra_command("archlab-train", __doc__, "train", TrainConfig, _app)
    finally:
        end_sweep()  # a -m sweep's last line, whether its jobs all completed or not


if __name__ == "__main__":
    main()
