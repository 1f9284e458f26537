"""archlab-coord: the coordinate check of a parametrisation. Trains one composed model at several widths (and
depths) for a few optimizer steps (AdamW, or ``optimizer=muon|sgd``) on one batch and prints, per layer, the RMS
of its output at each size and the slope of log RMS against log size: about 0 where the parametrisation
transfers (mup, completep), about 1 or more where it does not (sp). Plots them with ``plot=``.

    archlab-coord param=sp plot=coord_sp.png
    archlab-coord param=mup plot=coord_mup.png
    archlab-coord param=mup optimizer=muon lr=0.1 plot=coord_muon.png
    archlab-coord param=completep widths=null depths=[2,4,8,16] plot=coord_completep.png
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from archlab.cli.errors import short_config_errors
from archlab.cli.settings import run_hydra_command
from archlab.config import to_model_config
from archlab.config.commands import CoordConfig
from archlab.config.fields import plain_dict
from archlab.config.store import register_configs

register_configs()


def _print(result: dict) -> None:
    for check in result.values():
        sizes = check["sizes"]
        last = {s: check["runs"][s][-1] for s in sizes}
        print(
            f"param={check['param']}: RMS after {check['steps']} {check['optim']} steps (lr {check['lr']:g}) against "
            f"{check['axis']}, and the slope of log RMS against log {check['axis']}"
        )
        print(f"{'':>12}" + "".join(f"{s:>10}" for s in sizes) + f"{'slope':>9}")
        for name, value in check["slopes"].items():
            print(f"{name:>12}" + "".join(f"{last[s][name]:>10.4f}" for s in sizes) + f"{value:>9.2f}")
        if "plot" in check:
            print(f"plot: {check['plot']}")


@hydra.main(version_base="1.3", config_path="pkg://archlab.conf", config_name="coord")
@short_config_errors
def coord_app(cfg: DictConfig) -> None:
    from archlab.training.coordcheck import check_settings, run_coord

    model = to_model_config(cfg.model)
    check_settings(cfg)
    result = run_coord(model, plain_dict(cfg.param, resolve=True), cfg, cfg.plot)
    if cfg.format == "json":
        last = {axis: {"last_step": {s: r["runs"][s][-1] for s in r["sizes"]}} for axis, r in result.items()}
        print(
            json.dumps(
                {axis: {**{k: v for k, v in r.items() if k != "runs"}, **last[axis]} for axis, r in result.items()}
            )
        )
    else:
        _print(result)


def main() -> None:
    """The console script: ``--help`` lists this command's settings and groups; the rest is Hydra's."""
    run_hydra_command("archlab-coord", __doc__, "coord", CoordConfig, coord_app)


if __name__ == "__main__":
    main()
