# The two-command start: each target sets up .venv where it is missing or stale (scripts/bootstrap.py),
# then runs in it. Extra arguments go through ARGS:
#   make train ARGS="trainer.max_steps=10"     archlab-train with these overrides
#   make test ARGS="-k warmup"                 ruff check, ruff format --check, then pytest with these arguments
PYTHON ?= python3
ARGS ?=

.PHONY: train test setup

train:
	$(PYTHON) scripts/bootstrap.py train $(ARGS)

test:
	$(PYTHON) scripts/bootstrap.py test $(ARGS)

setup:
	$(PYTHON) scripts/bootstrap.py setup
