"""archlab's Hydra configs. The repository keeps them at the top level (conf/); the package installs them as
``archlab.conf`` (pyproject.toml's package-dir), where the commands find them with ``pkg://archlab.conf``."""
