"""archlab's Hydra plugins (Hydra finds a launcher inside the ``hydra_plugins`` namespace alone)."""
