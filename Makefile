# The two-command start: each target sets up .venv where it is missing or stale (scripts/bootstrap.py),
# then runs in it. Extra arguments go through ARGS:
#   make train ARGS="trainer.max_steps=10"     archlab-train with these overrides
#   make test ARGS="-k warmup"                 lint, format check, type check, then pytest with these arguments
#   make explore ARGS="-k kv_cache"            the property tests on new random draws, with these pytest arguments
PYTHON ?= python3
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help train test explore setup lint format typecheck

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(firstword $(MAKEFILE_LIST)) | sed -E 's/^([a-z]+):.*## /  make \1\t/' | expand -t 18

train: ## train the default model (ARGS: archlab-train overrides)
	$(PYTHON) scripts/bootstrap.py train $(ARGS)

test: ## ruff check, ruff format --check, basedpyright, then pytest (ARGS: pytest arguments)
	$(PYTHON) scripts/bootstrap.py test $(ARGS)

explore: ## the property tests on new random draws, more of them (ARGS: pytest arguments)
	$(PYTHON) scripts/bootstrap.py explore $(ARGS)

setup: ## create or refresh .venv only
	$(PYTHON) scripts/bootstrap.py setup

lint: ## ruff check and ruff format --check
	$(PYTHON) scripts/bootstrap.py lint

format: ## ruff format, then ruff check --fix
	$(PYTHON) scripts/bootstrap.py format

typecheck: ## basedpyright over archlab/ (settings in pyproject.toml)
	$(PYTHON) scripts/bootstrap.py typecheck
