"""lm-evaluation-harness over an archlab Decoder: ``ArchlabLM`` answers lm-eval's three request types
(log-likelihoods, rolling log-likelihoods, greedy generation through archlab's KV-cache ``generate``) from
the model itself, so a layout no Hugging Face class holds is evaluated as an exported one is. Its
tokenisation, truncation and scoring follow lm-eval's own ``hf`` model (``HFLM``), which gives the same
numbers on a model that exports (tests/test_evaluation.py)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from lm_eval import utils
from lm_eval.api.model import TemplateLM

from archlab.errors import ConfigError
from archlab.generate import generate
from archlab.nn.model import Decoder

MAX_GEN_TOKS = 256  # generate_until's default length, as HFLM's


class ArchlabLM(TemplateLM):
    """An lm-eval language model over ``model`` (an archlab Decoder) and its archlab ``tokenizer``.

    ``eos_id`` (None where the tokenizer has no EOS) ends a generation. ``prefix_token_id`` conditions a
    text scored from its start (an empty context, a rolling window's first token): by default the EOS, as
    lm-eval's ``hf`` model takes it; where there is neither, a task asking for one is refused naming it."""

    def __init__(
        self,
        model: Decoder,
        tokenizer: Any,
        batch_size: int = 1,
        device: str = "cpu",
        eos_id: Optional[int] = None,
        prefix_token_id: Optional[int] = None,
    ):
        super().__init__()
        self.model = model.to(device).eval()
        self.archlab_tokenizer = tokenizer
        self.batch_size = batch_size
        self._device = torch.device(device)
        self.eos_id = eos_id
        self._prefix = eos_id if prefix_token_id is None else prefix_token_id

    @property
    def max_length(self) -> int:
        return self.model.cfg.context_length

    @property
    def prefix_token_id(self) -> int:
        if self._prefix is None:
            raise ConfigError(
                "prefix_token_id",
                None,
                "the id a text scored from its start is conditioned on (a rolling log-likelihood, an empty "
                "context): this model's tokenizer has no EOS to take",
            )
        return self._prefix

    @property
    def eot_token_id(self) -> int:
        return self.eos_id if self.eos_id is not None else self.prefix_token_id

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        return list(self.archlab_tokenizer.encode(string))

    def tok_decode(self, tokens: list[int]) -> str:
        return self.archlab_tokenizer.decode(tokens)

    @torch.no_grad()
    def _loglikelihood_tokens(
        self, requests: list[Any], disable_tqdm: bool = False, override_bs: Optional[int] = None, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """(log-probability, greedy?) of each request's continuation ids after its context ids: the
        last ``max_length`` of them are the input (as HFLM truncates), right-padded into batches of
        similar lengths; a causal model's outputs before a row's end do not see its padding."""
        rows = []
        for _, context, continuation in requests:
            if len(continuation) > self.max_length:
                raise ValueError(f"a continuation of {len(continuation)} tokens; the context is {self.max_length}")
            rows.append(((context + continuation)[-(self.max_length + 1) :][:-1], continuation))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        size = override_bs or self.batch_size
        out: list[tuple[float, bool]] = [(0.0, True)] * len(rows)
        for start in range(0, len(order), size):
            batch = [rows[i] for i in order[start : start + size]]
            ids = torch.zeros(len(batch), max(len(inputs) for inputs, _ in batch), dtype=torch.long)
            for r, (inputs, _) in enumerate(batch):
                ids[r, : len(inputs)] = torch.tensor(inputs)
            logprobs = F.log_softmax(self.model(ids.to(self._device)).float(), dim=-1)
            for i, (r, (inputs, continuation)) in zip(order[start : start + size], enumerate(batch)):
                scored = logprobs[r, len(inputs) - len(continuation) : len(inputs)]
                target = torch.tensor(continuation, device=scored.device)
                total = scored.gather(-1, target[:, None]).sum().item()
                out[i] = (total, bool((scored.argmax(-1) == target).all()))
                self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text, in windows of the model's context that each predict
        their tokens once (lm-eval's rolling windows, the first conditioned on ``prefix_token_id``)."""
        out = []
        for (text,) in (req.args for req in requests):
            windows = [
                (None, *utils.make_disjoint_window(w))
                for w in utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            out.append(sum(logprob for logprob, _ in self._loglikelihood_tokens(windows)))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), out[-1])
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, left-padded in batches of requests with the same settings and decoded with
        the KV cache, each cut at the first of its ``until`` strings (and the EOS); the context keeps its
        last ``max_length - max_gen_toks`` tokens, as HFLM's does."""
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out = [""] * len(requests)
        for indices in groups.values():
            kwargs = dict(requests[indices[0]].args[1])
            if kwargs.get("do_sample") or (kwargs.get("temperature") or 0) > 0:
                raise ConfigError("gen_kwargs", kwargs, "greedy decoding (do_sample false, temperature 0)")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            new = int(kwargs.get("max_gen_toks", MAX_GEN_TOKS))
            if new >= self.max_length:
                raise ConfigError("max_gen_toks", new, f"fewer than the model's context, {self.max_length}")
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                prompts = [
                    self.tok_encode(requests[i].args[0])[-(self.max_length - new) :] or [self.prefix_token_id]
                    for i in batch
                ]
                width = max(map(len, prompts))
                ids = torch.zeros(len(prompts), width, dtype=torch.long)
                mask = torch.zeros(len(prompts), width, dtype=torch.long)
                for r, prompt in enumerate(prompts):
                    ids[r, width - len(prompt) :] = torch.tensor(prompt)
                    mask[r, width - len(prompt) :] = 1
                dev = self._device
                tokens = generate(self.model, ids.to(dev), new, attention_mask=mask.to(dev))[:, width:].tolist()
                for i, row in zip(batch, tokens):
                    if self.eos_id in row:
                        row = row[: row.index(self.eos_id)]
                    text = self.tok_decode(row)
                    for stop in until:
                        text = text.split(stop)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out


def task_manager(tasks: list[str], include_path: Optional[str]) -> Any:
    """lm-eval's TaskManager for ``tasks``: the task configs under ``include_path`` alone where they hold
    every task (indexing lm-eval's own 14,000 takes seconds), else lm-eval's too. An unknown task is
    refused naming ``tasks``, with the local tasks and the closest of lm-eval's."""
    from lm_eval.tasks import TaskManager

    local: list[str] = []
    if include_path is not None:
        if not Path(include_path).exists():
            raise ConfigError(
                "include_path", include_path, "null or a directory (or YAML file) of lm-eval task configs"
            )
        manager = TaskManager(include_path=include_path, include_defaults=False)
        local = manager.all_tasks
        if set(tasks) <= set(local):
            return manager
    manager = TaskManager(include_path=include_path)
    for task in tasks:
        if task not in manager.all_tasks:
            close = difflib.get_close_matches(task, manager.all_tasks, n=5)
            raise ConfigError(
                "tasks",
                task,
                f"a task of include_path ({', '.join(local) or 'none given'}) or of lm-eval (closest: "
                f"{', '.join(close) or 'none'}; `lm-eval ls tasks` lists all {len(manager.all_tasks)})",
            )
    return manager


UNKNOWN_FIELD = re.compile(r"unexpected keyword argument '(\w+)'")  # a dataclass's TypeError, as Python words it


def load_tasks(manager: Any, tasks: list[str]) -> list[Any]:
    """lm-eval's Task (or Group) of each of ``tasks``, built (their data read) before any weights are: a
    config lm-eval cannot build (a misspelt field, a value it refuses, data it cannot read) is one ConfigError
    naming ``tasks``, the task's YAML file and, for a field lm-eval does not know, the closest it does."""
    from lm_eval.api.task import TaskConfig

    built = []
    for task in tasks:
        try:
            loaded = manager.load([task])
        except Exception as err:  # noqa: BLE001 - lm-eval raises whatever its config, templates or data raise
            path = getattr(manager.task_index.get(task), "yaml_path", None)
            where = f"{path}" if path is not None else f"lm-eval's config of {task}"
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            unknown = UNKNOWN_FIELD.search(reason) if isinstance(err, TypeError) else None
            if unknown is not None:
                close = difflib.get_close_matches(unknown[1], [f.name for f in dataclasses.fields(TaskConfig)], n=3)
                reason = f"{unknown[1]} is no field of an lm-eval task (closest: {', '.join(close) or 'none'})"
            else:
                reason = f"{type(err).__name__}: {reason}"
            raise ConfigError("tasks", task, f"a task lm-eval builds; {where}: {reason}") from None
        built.extend([loaded["groups"][task]] if task in loaded["groups"] else loaded["tasks"].values())
    return built


def evaluate(
    lm: ArchlabLM, tasks: list[Any], manager: Any, num_fewshot: Optional[int], limit: Optional[float]
) -> dict[str, Any]:
    """lm-eval's results of ``tasks`` (names, or what ``load_tasks`` built of them) on ``lm`` (its results
    dict, per-task metrics under ``results``), without the per-sample log."""
    from lm_eval.evaluator import simple_evaluate

    found = simple_evaluate(
        model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit, task_manager=manager, log_samples=False
    )
    assert found is not None  # None only on processes of rank > 0
    return {k: v for k, v in found.items() if k != "samples"}


def rolling_tasks(manager: Any, tasks: list[str]) -> list[str]:
    """Of ``tasks``, those that score whole texts from their start (lm-eval's ``loglikelihood_rolling``,
    e.g. wikitext), which need a prefix token; read from the task index, before any data is loaded (a
    group's members are not looked into: such a member asks for the prefix when it runs)."""
    return [
        task
        for task in tasks
        if (getattr(manager.task_index.get(task), "cfg", None) or {}).get("output_type") == "loglikelihood_rolling"
    ]
