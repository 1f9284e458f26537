"""``archlab-train``: train any archlab build with Lightning, configured by Hydra (conf/train.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from archlab.cli.errors import short_config_errors
from archlab.config import register_configs


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@short_config_errors
def _app(cfg: DictConfig) -> float | None:
    from archlab.training.config import validate_train

    validate_train(cfg)  # a config mistake fails here, before Lightning is even imported
    from archlab.training.run import train

    summary = train(cfg)
    final = summary.get("metrics", {}).get("final", {})
    return final.get(f"{summary['data']['val_names'][0]}/loss") if final else None  # a sweeper's objective


def main() -> None:
    register_configs()
    _app()


if __name__ == "__main__":
    main()
