"""``archlab-report <sweep dir> [--out DIR]``: ablation table and plots from a sweep's summaries."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="archlab-report", description=__doc__)
    parser.add_argument("sweep_dir", help="a Hydra multirun directory (multirun/<date>/<time>) or any folder of runs")
    parser.add_argument(
        "--out", default=None, help="where to write report.md, report.csv and plots (default: sweep_dir)"
    )
    parser.add_argument(
        "--metric",
        default=None,
        help="the metric that leads the table and is plotted, e.g. val/loss (default: the runs' primary metric)",
    )
    args = parser.parse_args(argv)
    from archlab.errors import ConfigError
    from archlab.report import write_report

    try:
        written = write_report(args.sweep_dir, args.out, args.metric)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for kind, path in written.items():
        print(f"{kind:>9}: {path}")


if __name__ == "__main__":
    main()
