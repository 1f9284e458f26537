"""Per-layer health during training (``callbacks.health``): every K optimizer steps, each block's output RMS
(as the coordinate check computes it), its attention's entropy and largest logit (where its mixer has
scores), the gradient norm and the update/weight ratio per block and per μP role, logged and written one
line per step to the run's ``health.jsonl``, which archlab-report draws as a layer × step heatmap. Between
those steps it costs next to nothing: no block hook, no tensor copied (an attention mixer's hook returns
at once)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.nn.mixers.base import Mixer, ScoreStats
from archlab.nn.model import Decoder
from archlab.run_files import HEALTH
from archlab.training.module import LitModel
from archlab.training.parametrization import roles

OTHER = "other"  # the parameters outside the blocks: embeddings, final norm, head
Reduce = Callable[[Tensor, str], Tensor]  # (tensor, "sum" | "mean" | "max") over the processes


def _local(tensor: Tensor) -> Tensor:
    """This process's shard of a DTensor (FSDP2), the tensor itself otherwise."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


class Probe:
    """One model's measurements, in the order a step makes them: ``watch`` before its forward (hooks on
    every block and its mixer), ``gradients`` after its backward (norms, and a copy of the weights),
    ``updates`` after the optimizer step (the copy compared). ``reduce`` sums or averages over the
    processes: the activations are each process's batch (averaged; the largest logit the largest), a sharded
    parameter's squares are summed; replicated ones are whole."""

    def __init__(self, model: Decoder, role_of: dict[int, Role], reduce: Optional[Reduce] = None):
        self.model = model
        self.reduce = reduce
        blocks = list(model.blocks)
        in_blocks = {id(p) for b in blocks for p in b.parameters()}
        self.groups: dict[str, list[nn.Parameter]] = {str(i): list(b.parameters()) for i, b in enumerate(blocks)}
        self.groups[OTHER] = [p for p in model.parameters() if id(p) not in in_blocks]
        self.by_role: dict[str, list[nn.Parameter]] = {}
        for p in model.parameters():
            self.by_role.setdefault(role_of[id(p)].value, []).append(p)
        self.sharded = any(hasattr(p, "to_local") for p in model.parameters())
        self._squares: dict[str, list[Tensor]] = {}
        self._scores: dict[str, list[ScoreStats]] = {}
        self._handles: list[Any] = []
        # the same hook functions every time: a compiled block then finds the graph it traced with them
        self._hooks = [self._keep(str(i)) for i in range(len(blocks))]
        # a mixer with scores keeps its hook, idle unless watching: a compiled block traces a hook of a
        # module inside it only when first compiled (dynamo does not guard a submodule's hooks), its flag then
        self._watching = False
        for i, mixer in enumerate(cast(Mixer, b.attn) for b in blocks):
            if type(mixer).score_stats is not Mixer.score_stats:
                mixer.register_forward_pre_hook(self._keep_scores(str(i)))
        self._before: Optional[list[Tensor]] = None

    def watch(self) -> None:
        """Hook every block: the mean square of its output, and its mixer's score statistics of its input,
        over each forward until ``gradients``."""
        self._watching = True
        if self._handles:
            return
        for block, hook in zip(self.model.blocks, self._hooks):
            self._handles.append(block.register_forward_hook(hook))

    def _keep(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Tensor) -> None:
            if torch._C._current_graph_task_id() == -1:  # not activation checkpointing's recomputation
                self._squares.setdefault(name, []).append(output.detach().float().pow(2).mean())

        return hook

    def _keep_scores(self, name: str) -> Callable[..., None]:
        def hook(mixer: nn.Module, inputs: tuple) -> None:
            x, rotary, mask, cache = inputs[:4]
            if self._watching and cache is None and torch._C._current_graph_task_id() == -1:
                stats = cast(Mixer, mixer).score_stats(x.detach(), rotary, mask)
                if stats is not None:
                    self._scores.setdefault(name, []).append(stats)

        return hook

    def gradients(self) -> dict[str, dict[str, float]]:
        """Stop watching; the block outputs' RMS (the mean square over this step's forwards), the blocks'
        attention entropy (the mean over the forwards) and largest logit (the largest), the gradient norms
        per block and per role, and a copy of the weights for ``updates``."""
        self._watching = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        names = sorted(self._squares, key=int)
        squares = torch.stack([torch.stack(self._squares[n]).mean() for n in names]) if names else None
        self._squares = {}
        if squares is not None and self.reduce is not None:
            squares = self.reduce(squares, "mean")
        scored = sorted(self._scores, key=int)
        entropy = max_logit = torch.zeros(0)
        if scored:
            entropy = torch.stack([torch.stack([s.entropy for s in self._scores[n]]).mean() for n in scored])
            max_logit = torch.stack([torch.stack([s.max_logit for s in self._scores[n]]).max() for n in scored])
        self._scores = {}
        if scored and self.reduce is not None:
            entropy, max_logit = self.reduce(entropy, "mean"), self.reduce(max_logit, "max")
        grads = {k: [p.grad for p in ps if p.grad is not None] for k, ps in self.groups.items()}
        role_grads = {k: [p.grad for p in ps if p.grad is not None] for k, ps in self.by_role.items()}
        self._before = [p.detach().clone() for p in self.model.parameters()]
        return {
            "rms": {} if squares is None else dict(zip(names, squares.sqrt().tolist())),
            "attn_entropy": dict(zip(scored, entropy.tolist())),
            "attn_max_logit": dict(zip(scored, max_logit.tolist())),
            "grad_norm": self._norms(grads),
            "grad_norm_role": self._norms(role_grads),
        }

    def updates(self) -> dict[str, dict[str, float]]:
        """‖W after − W before‖ / ‖W before‖ per block and per role, over the step since ``gradients``."""
        assert self._before is not None, "Probe.updates follows Probe.gradients"
        delta = {id(p): p.detach() - b for p, b in zip(self.model.parameters(), self._before)}
        before = {id(p): b for p, b in zip(self.model.parameters(), self._before)}
        self._before = None
        out = {}
        for key, groups in (("update_ratio", self.groups), ("update_ratio_role", self.by_role)):
            change = self._norms({k: [delta[id(p)] for p in ps] for k, ps in groups.items()})
            size = self._norms({k: [before[id(p)] for p in ps] for k, ps in groups.items()})
            out[key] = {k: change[k] / size[k] if size[k] > 0 else float("nan") for k in change}
        return out

    def _norms(self, tensors: dict[str, list[Tensor]]) -> dict[str, float]:
        """The L2 norm of each group's tensors together (over every shard), in one reduction."""
        keys = [k for k, ts in tensors.items() if ts]
        if not keys:
            return {}
        squares = torch.stack([torch.stack([_local(t).float().pow(2).sum() for t in tensors[k]]).sum() for k in keys])
        if self.sharded and self.reduce is not None:
            squares = self.reduce(squares, "sum")
        return dict(zip(keys, squares.sqrt().tolist()))


class LayerHealth(Callback):
    """Every ``every_n_steps`` optimizer steps (0: off, the default), the ``Probe``'s figures of that step:
    logged (``health/<figure>/<block or role>``) and appended to ``<dirpath>/health.jsonl`` (rank 0), one
    line per step; a resumed run first drops the lines after its checkpoint's step. summary.json's
    ``health`` names the file and the number of lines."""

    def __init__(self, every_n_steps: int = 0, dirpath: str | Path = "."):
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 0:
            raise ConfigError("callbacks.health.every_n_steps", every_n_steps, "a whole number of steps, 0 = off")
        self.every_n_steps = every_n_steps
        self.file = Path(dirpath) / HEALTH
        self.probe: Optional[Probe] = None
        self.record: dict[str, Any] = {}
        self.lines = 0

    def due(self, step: int) -> bool:
        return self.every_n_steps > 0 and step % self.every_n_steps == 0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.every_n_steps:
            return
        if not isinstance(pl_module, LitModel):
            raise TypeError(f"LayerHealth needs archlab's LitModel, not {type(pl_module).__name__}")
        model = pl_module.decoder
        try:
            role_of = roles(model)
        except ConfigError as err:  # a part without μP roles: no figure per role to give
            raise ConfigError("callbacks.health.every_n_steps", self.every_n_steps, f"0 ({err.allowed})") from None

        def reduce(tensor: Tensor, op: str) -> Tensor:
            return trainer.strategy.reduce(tensor, reduce_op=op)

        self.probe = Probe(model, role_of, reduce)
        if trainer.is_global_zero and self.file.exists():  # a resumed run: the steps it will do again go
            kept = [ln for ln in self.file.read_text().splitlines() if json.loads(ln)["step"] <= trainer.global_step]
            self.file.write_text("".join(f"{ln}\n" for ln in kept))
            self.lines = len(kept)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.probe is not None and self.due(trainer.global_step + 1):
            self.probe.watch()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self.probe is not None and self.due(trainer.global_step + 1):
            self.record = {"step": trainer.global_step + 1, **self.probe.gradients()}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self.probe is None or not self.record or trainer.global_step != self.record["step"]:
            return
        record, self.record = {**self.record, **self.probe.updates()}, {}
        logged = {
            f"health/{figure}/{k}": v
            for figure, values in record.items()
            if figure != "step"
            for k, v in values.items()
        }
        pl_module.log_dict(logged)
        if trainer.is_global_zero:
            with self.file.open("a") as f:
                f.write(json.dumps(record) + "\n")
            self.lines += 1

    def summary_fields(self) -> dict[str, Any]:
        if not self.every_n_steps:
            return {}
        return {"health": {"every_n_steps": self.every_n_steps, "file": str(self.file), "steps": self.lines}}
