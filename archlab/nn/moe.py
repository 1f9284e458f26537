"""Mixture of experts, ``model.mlp.kind: moe``: a router sends each token to ``top_k`` of ``n_experts``
MLPs of kind ``expert`` (Shazeer et al. 2017), beside ``n_shared_experts`` every token goes through
(DeepSeekMoE, Dai et al. 2024), their output times ``sigmoid(w·x)`` with ``shared_expert_gate`` (Qwen2-MoE,
Qwen3-Next: one bias-free scalar per token), and with ``out_norm`` their sum through a norm of the model's
kind (A.X K1's ``post_mlp_layernorm``: on the MoE layers alone, the dense ones being other layer kinds); with
``out_bias`` one learned bias of d_model added to that sum (JetMoE's). Dense layers among MoE ones (DeepSeek's first layers) are layer kinds
setting ``mlp.kind`` to the experts' kind (``model.layers``).
SwiGLU experts clamp at ``swiglu_limit``, the shared ones at ``shared_swiglu_limit`` where it is set
(Step-3.5 bounds the two apart; 0: no clamp).

Routing, in float32 (float64 in a float64 model) whatever the compute dtype, as Hugging Face's
Mixtral, Qwen3-MoE, DeepSeek-V2 (greedy) and DeepSeek-V3 routers compute it:

- scores: ``softmax(logits)`` over all experts, or ``sigmoid(logits)`` (DeepSeek-V3), or
  ``sqrt(softplus(logits))`` (DeepSeek-V4's ``sqrtsoftplus``);
- choice: ``scores + router_bias`` (DeepSeek-V3's aux-loss-free correction bias, a buffer: it moves the
  selection only; ``bias_update_speed`` γ > 0 moves it after each optimizer step, ``update_correction_bias``),
  or with ``correction_on: logits`` ``logits + router_bias``, before the softmax or sigmoid (Kolibri-1);
  with ``n_groups > 1`` only the experts of the ``top_groups`` groups whose two best choice scores sum
  highest remain (the others -inf), and of those the ``top_k`` best are chosen;
- with ``selection: hash`` the choice is instead a fixed table over token ids, ``token_experts[id]``
  (Roller et al. 2021's hash layers; DeepSeek-V4's ``hash_moe`` layers, its ``tid2eid``): a buffer [vocab, k]
  of distinct experts per token, drawn at init and saved with the model; the scores still weigh them;
- logits: ``x·Wᵀ``, plus a learned bias with ``router_bias`` (gpt-oss), over the ``n_experts`` and any
  ``zero_experts`` after them (LongCat-Flash: identity experts, each returning its input times its weight);
- weights: the chosen experts' scores (without the correction bias), divided by their sum + 1e-20 when
  ``normalize_top_k``, times ``routed_scale``;
- or, with ``sparsemixer_eps`` ε set, SparseMixer's choice (PhiMoE, Liu et al. 2024, arXiv:2409.12136, as
  transformers' ``sparsemixer`` at inference): k rounds, each choosing the best expert m of the logits
  not yet chosen, its weight the softmax at m over those logits less the ones too far below m's,
  (m − s) / max(|s|, m) > 2ε (the chosen ones -inf); not renormalised. Training takes the same choice and
  the plain gradient through those weights: the Gumbel sampling and Heun's-method gradient estimator
  transformers runs in training mode are not modelled. Each chosen expert's output is summed times its weight,
  or with ``weight_input`` its input is multiplied by the weight and the outputs summed as they are
  (Llama 4: top-1 of sigmoid scores, ``x·σ(logit)`` into the expert).

Dispatch is dropless: the N·k (token, expert) assignments are sorted by expert, each expert's rows go
through it as one matmul (a loop over the experts that received any), and each result is written to its
(token, slot) place, then the k slots are summed with their weights: every output is written once, so
the result does not depend on the order of additions (deterministic on any device).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, mlp_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role
from archlab.nn.mlp import MLP, MLPS, ClampFields, GatedWidthConfig, TanhField, d_ff, dense_kind
from archlab.nn.norms import NORMS, build_norm, l2_norm


@dataclass
class RoutingConfig:
    """``model.mlp.routing``: how the router picks and weighs a token's experts, and its auxiliary losses."""

    n_experts: int = 8  # routed experts per layer
    # identity experts beside them (LongCat-Flash's zero_expert_num): the router scores n_experts + this, and a
    # token routed to one gets its input back times the weight; no parameters, no FLOPs
    zero_experts: int = 0
    top_k: int = 2  # routed experts each token goes through
    # router scores: softmax, sigmoid (DeepSeek-V3) or sqrt(softplus) (DeepSeek-V4)
    scoring: str = choice("softmax", "sigmoid", "sqrtsoftplus")
    normalize_top_k: bool = True  # the top-k weights renormalised to sum to 1 (Mixtral, Qwen3-MoE)
    # how the experts are chosen: the top_k of the scores, or a fixed table over token ids (DeepSeek-V4's hash_moe)
    selection: str = choice("scores", "hash")
    n_groups: int = 1  # experts in this many groups; a token picks from the top_groups best (DeepSeek-V3: 8)
    top_groups: int = 1  # groups a token may pick from, ranked by the sum of their two best scores (V3: 4)
    routed_scale: float = 1.0  # the routed experts' weights times this (DeepSeek-V3: 2.5)
    correction_bias: bool = False  # a per-expert bias added to the scores for selection only (DeepSeek-V3)
    correction_on: str = choice("scores", "logits")  # what that bias is added to: the scores, or the logits (Kolibri-1)
    # γ: after each optimizer step the correction bias moves γ·sign(mean load − load) per expert (DeepSeek-V3's
    # auxiliary-loss-free balancing, γ=0.001); 0: training leaves it where it is
    bias_update_speed: float = 0.0
    router_bias: bool = False  # the router Linear has a learned bias, added to its logits (gpt-oss)
    weight_input: bool = False  # the routing weight scales an expert's input, not its output (Llama 4)
    # ε: SparseMixer's choice and weights (PhiMoE's router_jitter_noise, 0.01): each round the best remaining
    # expert, weighted by the softmax over the logits within 2ε (relative) of its own; None = plain top-k
    sparsemixer_eps: Optional[float] = None
    aux_loss_weight: float = 0.0  # weight of the load-balancing loss (Switch Transformer; Mixtral: 0.02)
    z_loss_weight: float = 0.0  # weight of the router z-loss, mean logsumexp(logits)^2 (ST-MoE: 0.001)
    # the router reads RMS(x)·s·d^-1/2: an RMS norm without a weight (at model.norm.eps), s a learned vector (Gemma 4)
    router_norm: bool = False
    expert_scale: bool = False  # each chosen expert's weight times a learned number of its own (Gemma 4)


@mlp_config("moe")
@dataclass
class MoEConfig(ClampFields, TanhField, GatedWidthConfig):
    """``model.mlp`` with kind moe: experts of kind ``expert`` (each reading the dense fields as that kind
    does: the width rules size them where expert_d_ff is null, and a dense layer kind built from this
    section), any shared experts, and the ``routing``."""

    kind: str = "moe"
    expert: str = choice("swiglu", "geglu", "gelu", "relu", "relu2")  # the kind of every expert
    expert_d_ff: Optional[int] = None  # a routed expert's hidden width; None = the d_ff rules
    n_shared_experts: int = 0  # experts every token goes through, as one MLP of n·expert_d_ff (DeepSeek)
    shared_expert_gate: bool = False  # the shared experts' output times sigmoid(w·x) (Qwen2-MoE, Qwen3-Next)
    # the shared SwiGLU experts' swiglu_limit where it differs from the routed ones' (Step-3.5: 16); 0: no clamp
    shared_swiglu_limit: Optional[float] = None
    out_norm: bool = False  # the output (routed + shared) normed by the model's norm kind (A.X K1's post_mlp_layernorm)
    out_bias: bool = False  # one bias of d_model added to the output (routed + shared) (JetMoE's)
    # a dense MLP of kind expert and width d_ff beside the experts: norm(mlp(x)) + norm(experts(norm(s))), the
    # router and the experts reading the block's unnormed stream s (Gemma 4's enable_moe_block); pre, sandwich only
    beside: bool = False
    routing: RoutingConfig = field(default_factory=RoutingConfig)


def _recomputing() -> bool:
    """Whether this forward is activation checkpointing's recomputation inside backward (it routed these
    tokens once already: counting them again would double the load)."""
    return torch._C._current_graph_task_id() != -1


def shared_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` as the shared experts read it: ``swiglu_limit`` replaced by ``shared_swiglu_limit`` where that
    is set (0: no clamp); unset, they clamp as the routed experts do (what every earlier config meant)."""
    limit = cfg.mlp.shared_swiglu_limit
    if limit is None:
        return cfg
    return dataclasses.replace(cfg, mlp=dataclasses.replace(cfg.mlp, swiglu_limit=limit or None))


def expert_width(cfg: ModelConfig) -> int:
    """A routed (and each shared) expert's hidden width: ``expert_d_ff``, else the d_ff rules."""
    return cfg.mlp.expert_d_ff if cfg.mlp.expert_d_ff is not None else d_ff(cfg)


class Experts(nn.Module):
    """The routed experts, one stacked Parameter per matrix in Hugging Face 5.x's ``[E, out, in]`` layout:
    gated kinds ``gate_up`` [E, 2f, d] (the gate rows, then the up rows) and ``down`` [E, d, f]; plain
    kinds ``fc`` [E, f, d] and ``proj`` [E, d, f]; with ``model.mlp.bias``, ``<name>_bias`` [E, out]."""

    def __init__(self, cfg: ModelConfig, width: int):
        super().__init__()
        entry = dense_kind(cfg.mlp.expert)
        self.gated = entry.gated(cfg)
        self.activation = entry.activation_of(cfg)  # between the matrices: the activation, or the gated product
        E, d = cfg.mlp.routing.n_experts, cfg.d_model
        self.names = ("gate_up", "down") if self.gated else ("fc", "proj")
        shapes = ((E, (2 if self.gated else 1) * width, d), (E, d, width))
        for name, shape in zip(self.names, shapes):
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))
            bias = nn.Parameter(torch.empty(shape[:2])) if cfg.mlp.bias else None
            self.register_parameter(f"{name}_bias", bias)

    def forward(self, x: Tensor, counts: list[int]) -> Tensor:
        """Rows ``x`` [n, d] sorted by expert, ``counts[e]`` of them for expert e, each through its expert."""
        (w_in, w_out), (b_in, b_out) = self.matrices(), self.biases()
        # unbind: one autograd node whose backward stacks the experts' gradients (indexing would
        # allocate a full-size zero gradient per expert)
        w_in, w_out = w_in.unbind(0), w_out.unbind(0)
        b_in = [None] * len(w_in) if b_in is None else b_in.unbind(0)
        b_out = [None] * len(w_in) if b_out is None else b_out.unbind(0)
        outs = []
        for e, rows in enumerate(x.split(counts)):
            if counts[e] == 0:
                continue
            h = self.activation(F.linear(rows, w_in[e], b_in[e]))
            outs.append(F.linear(h, w_out[e], b_out[e]))
        return torch.cat(outs)

    def matrices(self) -> tuple[Tensor, Tensor]:
        """The input-side and output-side stacked matrices."""
        return getattr(self, self.names[0]), getattr(self, self.names[1])

    def biases(self) -> tuple[Optional[Tensor], Optional[Tensor]]:
        return getattr(self, f"{self.names[0]}_bias"), getattr(self, f"{self.names[1]}_bias")


_OWN_FIELDS = frozenset(
    {"expert", "expert_d_ff", "n_shared_experts", "shared_expert_gate", "out_norm", "out_bias", "routing", "beside"}
)


class MoE(MLP):
    """Routed experts (``experts``), their ``router`` and any ``shared`` experts, as the module
    docstring describes. In training it keeps its auxiliary losses (``aux_losses``, those whose weight
    is not zero) for ``Decoder.auxiliary_losses``:

    - ``moe_balance``: the Switch Transformer load-balancing loss (Fedus et al. 2021), ``E·Σ_i f_i·P_i``
      with ``f_i`` the fraction of the tokens that chose expert i among their top-k (not divided by k, so a
      uniform router scores k) and ``P_i`` the mean probability the router gives it: softmax(logits), or
      for sigmoid (or sqrtsoftplus) scores the scores normalised to sum 1 (DeepSeek-V3's balance loss is this / k,
      per sequence).
      Not on a hash-routed layer: no router moves its fixed table's load (transformers' DeepSeek-V4 leaves
      its hash layers out of its balance loss too).
      Per layer this equals Hugging Face's ``load_balancing_loss_func`` for one layer's logits; HF pools
      f and P over all layers before the product, we average the per-layer losses.
    - ``router_z``: the router z-loss (Zoph et al. 2022, ST-MoE), the mean over tokens of
      ``logsumexp(logits)²``.
    """

    router_bias: Optional[Tensor]  # a buffer: DeepSeek-V3's correction bias, else None
    load: Tensor  # a buffer, not saved: (token, expert) assignments per expert since ``update_correction_bias``
    token_experts: Optional[Tensor]  # a buffer [vocab, top_k] with ``selection: hash``: each token id's experts
    out_bias: Optional[Tensor]  # with ``out_bias``: the output's bias [d]

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        m, r, d = cfg.mlp, cfg.mlp.routing, cfg.d_model
        self.n_experts, self.top_k, self.scoring = r.n_experts + r.zero_experts, r.top_k, r.scoring  # choices
        self.n_routed = r.n_experts  # the experts with weights: the choices past them are identities
        self.normalize, self.routed_scale, self.weight_input = r.normalize_top_k, r.routed_scale, r.weight_input
        self.n_groups, self.top_groups = r.n_groups, r.top_groups
        self.corrects_logits = r.correction_on == "logits"
        self.sparsemixer_eps = r.sparsemixer_eps
        self.aux_weights = {"moe_balance": r.aux_loss_weight, "router_z": r.z_loss_weight}
        self.router = nn.Linear(d, self.n_experts, bias=r.router_bias)
        self.register_buffer(
            "router_bias", torch.zeros(self.n_experts, dtype=torch.float32) if r.correction_bias else None
        )
        self.bias_update_speed = r.bias_update_speed
        self.register_buffer("load", torch.zeros(self.n_experts, dtype=torch.long), persistent=False)
        hashed = r.selection == "hash"
        self.register_buffer(
            "token_experts", torch.zeros(cfg.vocab_size, r.top_k, dtype=torch.long) if hashed else None
        )
        self.ids: Optional[Tensor] = None  # the token ids [B, T] of the input, set by the decoder where hashed
        f = expert_width(cfg)
        self.experts = Experts(cfg, f)
        width = m.n_shared_experts * f
        self.shared = dense_kind(m.expert)(shared_config(cfg), layer, width=width) if width else None
        self.shared_gate = nn.Linear(d, 1, bias=False) if m.shared_expert_gate else None
        self.out_norm = build_norm(cfg) if m.out_norm else None
        self.out_bias = nn.Parameter(torch.empty(d)) if m.out_bias else None
        self.aux_losses: dict[str, tuple[float, Tensor]] = {}
        self.router_scale = nn.Parameter(torch.empty(d)) if r.router_norm else None
        self.expert_scale = nn.Parameter(torch.empty(r.n_experts)) if r.expert_scale else None
        self.norm_eps = cfg.norm.eps
        # beside: the dense MLP and its norm after, the experts' norms before and after
        self.reads_stream = m.beside
        if m.beside:
            self.dense = dense_kind(m.expert)(cfg, layer, width=d_ff(cfg))
            self.dense_norm, self.experts_norm, self.experts_out_norm = (build_norm(cfg) for _ in range(3))

    def param_roles(self) -> dict[str, Role]:
        # the experts' stacked matrices are hidden; the router and the shared experts' gate read the width
        # into a value per expert (or one): outputs; the shared experts answer for their own
        return {
            "experts.gate_up": Role.HIDDEN,
            "experts.down": Role.HIDDEN,
            "experts.gate_up_bias": Role.VECTOR,
            "experts.down_bias": Role.VECTOR,
            "router.weight": Role.OUTPUT,
            "router.bias": Role.VECTOR,
            "shared_gate.weight": Role.OUTPUT,
            "out_norm.weight": Role.VECTOR,
            "out_norm.bias": Role.VECTOR,
            "router_scale": Role.VECTOR,
            "expert_scale": Role.VECTOR,
            "out_bias": Role.VECTOR,
        }

    def forward(self, x: Tensor, stream: Optional[Tensor] = None) -> Tensor:
        if self.reads_stream:  # beside its MLP: norm(mlp(x)) + norm(experts(norm(stream))), routed by the stream
            assert stream is not None, "a block hands the stream to an MLP that reads it"
            flat = stream.reshape(-1, stream.shape[-1])
            logits, weights, indices = self.route(flat, self.ids)
            self.aux_losses = self.auxiliary(logits, indices) if self.training else {}
            routed = self.experts_out_norm(self.routed(self.experts_norm(flat), weights, indices))
            return self.dense_norm(self.dense(x)) + routed.view(*stream.shape[:-1], routed.shape[-1])
        flat = x.reshape(-1, x.shape[-1])
        logits, weights, indices = self.route(flat, self.ids)
        self.aux_losses = self.auxiliary(logits, indices) if self.training else {}
        y = self.routed(flat, weights, indices)
        if self.shared is not None:
            shared = self.shared(flat)
            y = y + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * shared)
        if self.out_bias is not None:
            y = y + self.out_bias
        if self.out_norm is not None:
            y = self.out_norm(y)
        return y.view(*x.shape[:-1], y.shape[-1])

    def route(self, x: Tensor, ids: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """Router logits [N, E], routing weights [N, k] and expert indices [N, k] of tokens ``x`` [N, d]
        (logits and weights in float32, or float64 for a float64 ``x``); with hash selection the experts are
        the table's rows of the token ``ids`` (N of them, any shape)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.router.bias is None else self.router.bias.to(dtype)
            x = x.to(dtype)
            if self.router_scale is not None:  # Gemma 4's: RMS(x)·s·d^-1/2
                x = l2_norm(x, self.norm_eps) * self.router_scale.to(dtype) * x.shape[-1] ** -0.5
            logits = F.linear(x, self.router.weight.to(dtype), bias)
        if self.sparsemixer_eps is not None:
            weights, indices = sparsemixer(logits, self.top_k, self.sparsemixer_eps)
            return logits, weights * self.routed_scale, indices
        scores = self.scores(logits)
        if self.token_experts is not None:
            if ids is None:
                raise ValueError("a hash-routed MoE layer needs the token ids of its input (Decoder sets them)")
            indices = self.token_experts[ids.reshape(-1)]
            return logits, self.weigh(scores, indices), indices
        if self.router_bias is None:
            choice = scores
        else:
            choice = (logits if self.corrects_logits else scores) + self.router_bias.to(dtype)
        if self.n_groups > 1:
            groups = choice.unflatten(-1, (self.n_groups, -1))
            group_score = groups.topk(2, dim=-1).values.sum(dim=-1)
            kept = group_score.topk(self.top_groups, dim=-1).indices
            dropped = torch.ones_like(group_score, dtype=torch.bool).scatter_(-1, kept, False)
            choice = groups.masked_fill(dropped.unsqueeze(-1), float("-inf")).flatten(-2)
        indices = choice.topk(self.top_k, dim=-1).indices
        return logits, self.weigh(scores, indices), indices

    def scores(self, logits: Tensor) -> Tensor:
        """The router's scores [N, E] of its ``logits``, by ``scoring``."""
        if self.scoring == "softmax":
            return logits.softmax(dim=-1)
        return logits.sigmoid() if self.scoring == "sigmoid" else F.softplus(logits).sqrt()

    def weigh(self, scores: Tensor, indices: Tensor) -> Tensor:
        """The routing weights [N, k] of the chosen experts ``indices``: their ``scores``, normalised, scaled."""
        weights = scores.gather(-1, indices)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.expert_scale is not None:  # Gemma 4's per expert, after the renormalisation
            weights = weights * self.expert_scale.to(weights.dtype)[indices]
        return weights * self.routed_scale

    def exclude_from_compile(self) -> None:
        """Run ``routed`` eagerly inside a compiled block: its group sizes are data, which a compiled graph
        would specialise on each of. ``Decoder.compile_blocks`` calls it before compiling; doing it here at
        import would import torch._dynamo (about a second) into every process that builds a model."""
        self.__dict__["routed"] = torch.compiler.disable(self.routed)  # the instance's, before the class's

    def routed(self, x: Tensor, weights: Tensor, indices: Tensor) -> Tensor:
        """The routed experts' weighted sum for tokens ``x`` [N, d], in the experts' output dtype:
        ``dispatch``, ``experts``, ``combine`` (``archlab-bench`` splits a step along them). With
        ``weight_input`` each row is multiplied by its weight before its expert, and the sum is unweighted.
        The rows routed to zero experts (sorted last) come back as they went in."""
        rows, order, counts = self.dispatch(x, indices)
        if self.weight_input:
            rows = rows * weights.flatten()[order].unsqueeze(-1).to(rows.dtype)
        routed = sum(counts[: self.n_routed])
        out = self.experts(rows[:routed], counts[: self.n_routed]) if routed else rows[:0]
        if routed < rows.shape[0]:
            out = torch.cat((out, rows[routed:].to(out.dtype)))
        return self.combine(out, order, None if self.weight_input else weights)

    def dispatch(self, x: Tensor, indices: Tensor) -> tuple[Tensor, Tensor, list[int]]:
        """Rows [N·k, d] of ``x`` [N, d] sorted by expert (within one, by token), the sort ``order`` (row i
        is assignment ``order[i]`` = token·k + slot) and the rows each expert got."""
        assignments = indices.flatten()
        order = assignments.argsort(stable=True)
        counts = torch.bincount(assignments, minlength=self.n_experts)
        if self.training and not _recomputing():
            self.load += counts
        return x[order // indices.shape[1]], order, counts.tolist()

    @torch.no_grad()
    def update_correction_bias(self, load: Tensor) -> None:
        """DeepSeek-V3's auxiliary-loss-free step, after an optimizer step: each expert's correction bias
        moves by ``bias_update_speed``·sign(mean load − its load), ``load`` [E] the assignments of the step's
        tokens (every process's, summed); then the count starts again. γ=0 or no correction bias: unchanged."""
        if self.router_bias is not None and self.bias_update_speed > 0:
            load = load.to(self.router_bias.device, torch.float64)
            self.router_bias += self.bias_update_speed * torch.sign(load.mean() - load).to(self.router_bias.dtype)
        self.load.zero_()

    def combine(self, out: Tensor, order: Tensor, weights: Optional[Tensor]) -> Tensor:
        """The experts' outputs ``out`` [N·k, d] (rows in ``order``) back in (token, slot) order, each
        token's k slots summed with their ``weights`` [N, k] (None: as they are); in ``out``'s dtype."""
        k = self.top_k
        slots = torch.empty_like(out).index_copy_(0, order, out).view(-1, k, out.shape[-1])  # (token, slot) order
        if weights is not None:
            slots = slots * weights.unsqueeze(-1)
        return slots.sum(dim=1).to(out.dtype)

    def auxiliary(self, logits: Tensor, indices: Tensor) -> dict[str, tuple[float, Tensor]]:
        """name -> (weight, loss) of the auxiliary losses whose weight is not zero (see the class docstring)."""
        losses = {}
        if self.aux_weights["moe_balance"] > 0 and self.token_experts is None:  # a table's load is fixed
            if self.scoring == "softmax":
                probs = logits.softmax(dim=-1)
            else:
                scores = self.scores(logits)
                probs = scores / scores.sum(dim=-1, keepdim=True)
            chose = torch.zeros_like(probs).scatter_(-1, indices, 1.0).mean(dim=0)  # f_i, summing to k
            balance = self.n_experts * (chose * probs.mean(dim=0)).sum()
            losses["moe_balance"] = (self.aux_weights["moe_balance"], balance)
        if self.aux_weights["router_z"] > 0:
            losses["router_z"] = (self.aux_weights["router_z"], logits.logsumexp(dim=-1).square().mean())
        return losses

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The GPT-2 init of what no Linear holds (``Decoder.init_weights`` calls it): each expert's input
        matrix N(0, std), its output matrix N(0, residual_std), biases zero; the correction bias, the
        load count and the output bias zero; a hash table's rows top_k distinct experts drawn uniformly per token id."""
        self.load.zero_()
        w_in, w_out = self.experts.matrices()
        nn.init.normal_(w_in, 0.0, std)
        nn.init.normal_(w_out, 0.0, residual_std)
        for bias in self.experts.biases():
            if bias is not None:
                nn.init.zeros_(bias)
        if self.router_bias is not None:
            self.router_bias.zero_()
        if self.out_bias is not None:
            nn.init.zeros_(self.out_bias)
        if self.token_experts is not None:
            draws = torch.rand(self.token_experts.shape[0], self.n_experts, device=self.token_experts.device)
            self.token_experts.copy_(draws.argsort(dim=-1)[:, : self.top_k])
        for scale in (self.router_scale, self.expert_scale):  # Gemma 4's start at 1
            if scale is not None:
                nn.init.ones_(scale)

    @staticmethod
    def gated(cfg: ModelConfig) -> bool:
        return dense_kind(cfg.mlp.expert).gated(cfg)

    @staticmethod
    def params(cfg: ModelConfig, routed: int) -> int:
        """Parameters of one MoE layer counting ``routed`` of its routed experts (zero experts have none: a
        router row each); the shared experts' gate d; the output norm's (a norm over d_model) and the output
        bias d; the router norm's scale d and the experts' scales E; beside its MLP, that MLP (of width d_ff)
        and three norms."""
        m, r, entry = cfg.mlp, cfg.mlp.routing, dense_kind(cfg.mlp.expert)
        f, norm = expert_width(cfg), NORMS.get(cfg.norm.kind).num_params(cfg)
        shared = entry.params_at(cfg, m.n_shared_experts * f) if m.n_shared_experts else 0
        shared += cfg.d_model if m.shared_expert_gate else 0
        shared += norm if m.out_norm else 0
        shared += cfg.d_model * m.out_bias
        shared += cfg.d_model * r.router_norm + r.n_experts * r.expert_scale
        shared += entry.params_at(cfg, d_ff(cfg)) + 3 * norm if m.beside else 0
        choices = r.n_experts + r.zero_experts
        return choices * (cfg.d_model + r.router_bias) + routed * entry.params_at(cfg, f) + shared

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        return cls.params(cfg, cfg.mlp.routing.n_experts)

    @classmethod
    def active_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """The router (its bias too), the top_k routed experts a token goes through and the shared experts
        (their gate too). With zero experts, the most: a token routed to j of them runs top_k - j experts."""
        return cls.params(cfg, min(cfg.mlp.routing.top_k, cfg.mlp.routing.n_experts))

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its own fields and its expert kind's (the d_ff rules size the experts where expert_d_ff is null,
        a dense layer kind built from this section, and Hugging Face's ``intermediate_size``);
        ``shared_swiglu_limit`` where shared experts of a kind that reads ``swiglu_limit`` are (and ``swiglu_clamp`` where their limit applies)."""
        entry = dense_kind(cfg.mlp.expert)
        reads = entry.reads(cfg) | _OWN_FIELDS
        if cfg.mlp.n_shared_experts and "swiglu_limit" in reads:
            reads |= entry.reads(shared_config(cfg)) | {"shared_swiglu_limit"}
        return reads

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        m = cfg.mlp
        dense_kind(m.expert).validate(cfg)  # the expert kind's rules (its activation, the d_ff rules)
        if m.sub_norm:
            raise ConfigError("model.mlp.sub_norm", m.sub_norm, "false for moe (its experts hold no sub-norm)")
        _validate_routing(m.routing)
        if m.expert_d_ff is not None:
            checks.integer("model.mlp.expert_d_ff", m.expert_d_ff, allowed="a positive integer or null")
        checks.integer("model.mlp.n_shared_experts", m.n_shared_experts, minimum=0)
        if m.shared_expert_gate and not m.n_shared_experts:
            raise ConfigError(
                "model.mlp.shared_expert_gate",
                m.shared_expert_gate,
                "false, or true with n_shared_experts >= 1 (it gates the shared experts' output)",
            )
        if m.beside and cfg.block.kind not in ("pre", "sandwich"):
            raise ConfigError("model.mlp.beside", True, f"false with block kind {cfg.block.kind} (pre or sandwich)")
        if m.beside and m.out_bias:
            raise ConfigError("model.mlp.out_bias", True, "false with model.mlp.beside (its output is two norms' sum)")
        if m.beside and m.n_shared_experts:  # its forward sums the MLP and the experts alone
            raise ConfigError("model.mlp.n_shared_experts", m.n_shared_experts, "0 with model.mlp.beside")
        if m.beside and m.out_norm:
            raise ConfigError("model.mlp.out_norm", True, "false with model.mlp.beside (the experts' norm is its own)")
        if m.beside and cfg.stream.kind != "plain":
            raise ConfigError("model.mlp.beside", True, f"false with model.stream.kind={cfg.stream.kind}")
        limit = m.shared_swiglu_limit
        if limit is not None and not (isinstance(limit, (int, float)) and 0 <= limit < math.inf):
            raise ConfigError(
                "model.mlp.shared_swiglu_limit",
                limit,
                "a positive number (Step-3.5: 16.0), 0 (no clamp) or null (the routed experts' swiglu_limit)",
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """Routing, experts, their width and form: ``moe top-2 of 8 swiglu experts
        d_ff=14336``; ``, router bias``, ``, weighted inputs`` (Llama 4) where set."""
        f = cfg.mlp
        shared = f" + {f.n_shared_experts} shared" if f.n_shared_experts else ""
        shared += " (sigmoid-gated)" if f.shared_expert_gate else ""
        if f.shared_swiglu_limit is not None and "shared_swiglu_limit" in (MoE.reads(cfg) or ()):
            shared += f" (limit={f.shared_swiglu_limit or None})"
        form = dense_kind(f.expert).form(cfg)
        r = f.routing
        routing = (", router bias" if r.router_bias else "") + (", weighted inputs" if r.weight_input else "")
        routing += f", sparsemixer eps={r.sparsemixer_eps}" if r.sparsemixer_eps is not None else ""
        routing += ", hash-routed" if r.selection == "hash" else ""
        routing += (", normed router" if r.router_norm else "") + (", expert scales" if r.expert_scale else "")
        routing += f", beside a {f.expert} d_ff={d_ff(cfg)}" if f.beside else ""
        experts = f"{f.expert} experts d_ff={expert_width(cfg)}{form}" + (", normed output" if f.out_norm else "")
        zero = f" + {r.zero_experts} zero" if r.zero_experts else ""
        return f"moe top-{r.top_k} of {r.n_experts}{zero}{shared} {experts}{routing}"


MLPS.register("moe")(MoE)  # after the class, not as its decorator: the name keeps MoE's own type for its callers


def sparsemixer(logits: Tensor, k: int, eps: float) -> tuple[Tensor, Tensor]:
    """SparseMixer's weights and experts [N, k] of router ``logits`` [N, E] (the module docstring): k rounds,
    each the best expert left and its masked softmax's weight there."""
    left, weights, indices = logits, [], []
    for _ in range(k):
        best, index = left.max(dim=-1, keepdim=True)
        with torch.no_grad():
            far = (best - logits) / logits.abs().clamp(min=best) > 2 * eps
        weights.append(left.masked_fill(far, float("-inf")).softmax(dim=-1).gather(-1, index))
        indices.append(index)
        left = left.scatter(-1, index, float("-inf"))
    return torch.cat(weights, dim=-1), torch.cat(indices, dim=-1)


def _validate_routing(r: RoutingConfig) -> None:
    """Whole numbers of experts (zero experts too) and groups that fit one another; weights that are not negative."""
    checks.integer("model.mlp.routing.n_experts", r.n_experts)
    checks.integer("model.mlp.routing.zero_experts", r.zero_experts, minimum=0)
    checks.integer("model.mlp.routing.top_k", r.top_k)
    if r.top_k > r.n_experts + r.zero_experts:
        raise ConfigError(
            "model.mlp.routing.top_k", r.top_k, f"at most n_experts + zero_experts={r.n_experts + r.zero_experts}"
        )
    checks.integer("model.mlp.routing.n_groups", r.n_groups)
    if r.zero_experts and r.expert_scale:
        raise ConfigError(
            "model.mlp.routing.expert_scale", True, "false with zero_experts (the scales are the routed experts')"
        )
    if r.zero_experts and r.n_groups > 1:
        raise ConfigError(
            "model.mlp.routing.n_groups", r.n_groups, "1 with zero_experts (groups hold the routed experts alone)"
        )
    if r.n_experts % r.n_groups:
        raise ConfigError("model.mlp.routing.n_groups", r.n_groups, f"a divisor of n_experts={r.n_experts}")
    per_group = r.n_experts // r.n_groups
    if r.n_groups > 1 and per_group < 2:
        raise ConfigError(
            "model.mlp.routing.n_groups",
            r.n_groups,
            f"1, or at most n_experts/2={r.n_experts // 2}: a group is ranked by its two best scores",
        )
    checks.integer("model.mlp.routing.top_groups", r.top_groups)
    if r.top_groups > r.n_groups:
        raise ConfigError("model.mlp.routing.top_groups", r.top_groups, f"at most n_groups={r.n_groups}")
    if r.top_k > r.top_groups * per_group:
        raise ConfigError(
            "model.mlp.routing.top_k",
            r.top_k,
            f"at most top_groups·n_experts/n_groups={r.top_groups * per_group}: the experts a token may pick",
        )
    checks.positive("model.mlp.routing.routed_scale", r.routed_scale)
    checks.non_negative("model.mlp.routing.aux_loss_weight", r.aux_loss_weight)
    checks.non_negative("model.mlp.routing.z_loss_weight", r.z_loss_weight)
    checks.non_negative("model.mlp.routing.bias_update_speed", r.bias_update_speed)
    if r.bias_update_speed > 0 and not r.correction_bias:
        raise ConfigError(
            "model.mlp.routing.bias_update_speed",
            r.bias_update_speed,
            "0, or a speed with correction_bias=true (it moves the correction bias)",
        )
    if r.sparsemixer_eps is not None:
        _validate_sparsemixer(r)
    if r.selection == "hash" and (r.correction_bias or r.n_groups > 1):
        field_, value = ("correction_bias", True) if r.correction_bias else ("n_groups", r.n_groups)
        raise ConfigError(
            f"model.mlp.routing.{field_}", value, "false / 1 with selection=hash (a fixed table chooses the experts)"
        )
    if r.correction_on != "scores" and not r.correction_bias:
        raise ConfigError(
            "model.mlp.routing.correction_on",
            r.correction_on,
            "scores, or logits with correction_bias=true (where the correction bias is added)",
        )


def _validate_sparsemixer(r: RoutingConfig) -> None:
    """SparseMixer's ε is a non-negative number; it ranks softmax logits alone, ungrouped, uncorrected, and
    its weights are not renormalised."""
    field, eps = "model.mlp.routing.sparsemixer_eps", r.sparsemixer_eps
    if not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ConfigError(field, eps, "a non-negative number (PhiMoE: 0.01), or null (plain top-k)")
    clash = next(
        (
            why
            for bad, why in (
                (r.scoring != "softmax", f"scoring={r.scoring} (its weights are masked softmaxes)"),
                (r.normalize_top_k, "normalize_top_k=true (its weights are not renormalised)"),
                (r.correction_bias, "correction_bias=true (it ranks the logits as they are)"),
                (r.n_groups > 1, f"n_groups={r.n_groups} (it ranks every expert)"),
                (r.selection == "hash", "selection=hash (it chooses by the logits, not a table)"),
                (r.expert_scale, "expert_scale=true (its weights are the masked softmaxes alone)"),
            )
            if bad
        ),
        None,
    )
    if clash is not None:
        raise ConfigError(field, eps, f"null with {clash}")
