"""Command-line entry points (console scripts in pyproject.toml)."""
