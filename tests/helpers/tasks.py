"""Local lm-evaluation-harness tasks for the tests (lm-eval's own tasks download their data): a multiple-
choice task's YAML beside the JSONL of its rows."""

from __future__ import annotations

import json
from pathlib import Path

MULTIPLE_CHOICE = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: "{delimiter}"
metric_list:
  - metric: acc
"""


def write_multiple_choice(directory: Path, name: str, rows: list[dict], delimiter: str = " ") -> Path:
    """``<name>.jsonl`` (``rows``: question, choices, answer) and ``<name>.yaml`` in ``directory``, which
    ``include_path`` then names; each choice follows its question after ``delimiter`` (lm-eval's default:
    a space). Returns the JSONL file."""
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / f"{name}.yaml").write_text(MULTIPLE_CHOICE.format(name=name, data=data, delimiter=delimiter))
    return data
