"""archlab-report: one table (report.md), every figure (report.csv) and plots from a sweep's run summaries.

archlab-report multirun/pos_mlp                                  # writes into the sweep directory
archlab-report multirun/pos_mlp out=reports/pos_mlp metric=val/loss
archlab-report multirun/pos_mlp baseline=model/mlp=gelu          # each variant minus gelu, paired by seed
archlab-report multirun/lr best_over=optim.lr                    # each variant at its best learning rate
archlab-report multirun/sizes scaling=model.d_model baseline=model/mlp=gelu   # L(C), L(N) fits, compute multiplier
archlab-report multirun/widths best_over=optim.lr transfer=model.d_model=64   # does the best lr move with the width?
archlab-report multirun/lr spike_factor=1.5 lr_tolerance=0.02    # stability: spikes, the largest lr within 2%
archlab-report multirun/lr ignore=trainer.accelerator            # runs on a GPU and on a CPU pooled as one grid
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import settings_or_help
from archlab.config.commands import ReportConfig


@short_config_errors
def main(argv: Optional[Sequence[str]] = None) -> None:
    cfg = settings_or_help("archlab-report", __doc__, ReportConfig, sys.argv[1:] if argv is None else argv, "sweep_dir")
    if cfg is None:
        return
    from archlab.report.write import write_report  # numpy, yaml and the report's modules: only when there is work

    written = write_report(cfg)
    for kind, path in written.items():
        print(f"{kind:>11}: {path}")


if __name__ == "__main__":
    main()
