"""Study 9 redone with μTransfer's multipliers: μP at the proxy's tuned setting (tuned/runs) against sp tuned
per width (study 9's runs, each width at its own best rate by the mean over seeds) and against study 9's μP
at the transferred rate alone, paired by seed; and whether μP's wider models are better at fixed settings.

    python experiments/mup_width/tuned/compare.py
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from archlab.report.stats import paired_difference, t_interval

HERE = Path(__file__).parent
METRIC = "val/loss"


def runs(root: Path) -> list[dict]:
    """Each completed run's param kind, width, rate, seed and final metric."""
    out = []
    for path in sorted(root.rglob("summary.json")):
        s = json.loads(path.read_text())
        if s["status"] != "completed":
            continue
        c = s["config"]
        out.append(
            {
                "param": c["param"]["kind"],
                "d_model": c["model"]["d_model"],
                "lr": c["optim"]["lr"],
                "seed": s["seed"],
                "loss": s["metrics"]["final"][METRIC],
            }
        )
    return out


def by_seed(rows: list[dict]) -> dict[int, float]:
    return {r["seed"]: r["loss"] for r in rows}


def fmt(i) -> str:
    return f"{i.mean:+.3f} ± {i.half_width:.3f}"


def main() -> None:
    study9 = runs(HERE.parent / "runs")
    tuned = runs(HERE / "runs")
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in study9:
        cells[(r["param"], r["d_model"], r["lr"])].append(r)
    print(
        "| d_model | sp at its own best rate | μP, rate alone (1.6e-2) | μP, tuned setting | tuned − sp | tuned − rate alone |"
    )
    print("|---|---|---|---|---|---|")
    tuned_by_width = defaultdict(list)
    for r in tuned:
        tuned_by_width[r["d_model"]].append(r)
    for width in sorted(tuned_by_width):
        sp_rates = {lr: rows for (p, d, lr), rows in cells.items() if p == "sp" and d == width}
        best_lr = min(sp_rates, key=lambda lr: statistics.fmean(r["loss"] for r in sp_rates[lr]))
        sp, rate_alone = by_seed(sp_rates[best_lr]), by_seed(cells[("mup", width, 0.016)])
        ours = by_seed(tuned_by_width[width])
        sp_i, alone_i, ours_i = (t_interval(x.values()) for x in (sp, rate_alone, ours))
        print(
            f"| {width} | {sp_i.mean:.3f} ± {sp_i.half_width:.3f} (lr {best_lr:g}) | {alone_i.mean:.3f} ± "
            f"{alone_i.half_width:.3f} | {ours_i.mean:.3f} ± {ours_i.half_width:.3f} | "
            f"{fmt(paired_difference(ours, sp))} | {fmt(paired_difference(ours, rate_alone))} |"
        )
    widths = sorted(tuned_by_width)
    print("\nμP at the tuned setting, each width minus the next narrower (paired by seed):")
    for narrow, wide in zip(widths, widths[1:]):
        d = paired_difference(by_seed(tuned_by_width[wide]), by_seed(tuned_by_width[narrow]))
        print(f"  {wide} − {narrow}: {fmt(d)}")


if __name__ == "__main__":
    main()
