"""Hydra configs shipped inside the package; a regular package so `@hydra.main(config_path="../conf")` finds them."""
