"""Benchmark harness: archlab vs the Hugging Face implementation of the same layout, in one process.

Both sides get the same weights, dtype, threads, batch and loss code; their calls alternate after a
warm-up, with a large dense matmul (the machine's ceiling) in the same rotation, so drift in machine
speed hits all three alike, and each figure is a median over repetitions. A profiled step says how
much of it is spent in matmul and attention kernels: the floor no fusion of the other ops can beat; for
a layout with MoE layers, the same profiled steps split archlab's step into router, permutation, expert
MLPs and the rest, backward included (``part_seconds``).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, cast

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from torch.profiler import profile

PROMPT_TOKENS = 8  # generation starts from this many random tokens
# precision -> (the weights' dtype, bf16 autocast on); the dtype it computes in is precision.compute_dtype's
PRECISIONS = {
    "32-true": (torch.float32, False),
    "bf16-mixed": (torch.float32, True),
    "bf16-true": (torch.bfloat16, False),
}
CEILINGS = {torch.float32: "dense matmul float32", torch.bfloat16: "dense matmul bfloat16"}  # timed entries
# aten ops that are dense matrix products, and name fragments of every SDPA kernel (flash, efficient, math, cuDNN)
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv", "aten::addmv"})
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")
# the split of a MoE layout's step: a MoE layer's methods and submodules -> the part their ops belong to
MOE_PARTS = ("router", "permutation", "experts")
MOE_STAGES = {
    "route": "router",  # router logits, scores, top-k choice and weights
    "auxiliary": "router",  # balance and z losses
    "dispatch": "permutation",  # sort by expert, bincount, gather the rows
    "combine": "permutation",  # scatter back to (token, slot) order, weighted sum of the k slots
    "experts": "experts",  # the routed experts' MLPs: matmuls and activation
    "shared": "experts",  # the shared experts' MLP, where there are any
}
RANGE_PREFIX = "archlab.moe."  # profiler ranges named RANGE_PREFIX + part
BACKWARD_NODE = "autograd::engine::evaluate_function: "  # the profiler's event for one autograd node's backward


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_alternating(
    fns: Mapping[str, Callable[[], object]], warmup: int, repeats: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per call of each function: ``warmup`` untimed rounds, then ``repeats`` timed rounds,
    each round calling every function once, in turn, the order reversed every other timed round: the
    i-th times of two functions are a pair (``paired_ratio``) whose drift in machine speed cancels, and
    none of them always runs first."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats):
        for name, fn in list(fns.items())[:: -1 if i % 2 else 1]:
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def median_rate(seconds: list[float], units_per_call: float) -> float:
    """Units per second of the median call (robust to a stray slow repetition)."""
    return units_per_call / statistics.median(seconds)


def paired_ratio(ours: list[float], theirs: list[float]) -> tuple[float, float, float]:
    """Quartiles (first, median, third) of ``theirs[i] / ours[i]``, our speed-up in round i. The two calls
    of a round run back to back, so a drift in machine speed cancels within each pair, which a ratio of
    the two sides' separate medians (drawn from different rounds) does not."""
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    if len(ratios) == 1:
        return ratios[0], ratios[0], ratios[0]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, median, q3


def ceiling_matmul(device: torch.device, dtype: torch.dtype, n: int) -> Callable[[], object]:
    """An n x n @ n x n matmul (2n³ FLOPs): the machine's dense ceiling for this dtype. It is timed in
    the same alternation as the training steps, so a change in machine speed moves both alike."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return lambda: a @ b


@contextmanager
def c_stderr_silenced() -> Iterator[None]:
    """Send the process's C-level stderr to /dev/null: Kineto prints two lines per profiled call there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def profile_call(fn: Callable[[], object], device: torch.device) -> tuple[list, float]:
    """The profiler's events of one call of ``fn`` (CPU ops; on CUDA with their kernels) and the call's
    wall seconds, profiler overhead included."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with c_stderr_silenced(), profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        synchronize(device)
        wall = time.perf_counter() - start
    return profiled_events(prof), wall


def profiled_events(prof: profile) -> list:
    """The events of a ``torch.profiler.profile`` that has run (its ``with`` block left: they are set)."""
    events = prof.events()
    assert events is not None  # None only before the profiler stops
    return list(events)


def self_seconds(event, device: torch.device) -> float:
    """An event's own time: CPU time outside its child ops, or on CUDA the time of the kernels it launched."""
    return (event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total) / 1e6


def kernel_split(events: list, device: torch.device) -> dict[str, float]:
    """Seconds of ``events`` inside matmul kernels and inside attention kernels (see ``kernel_seconds``)."""
    seconds = {"matmul": 0.0, "attention": 0.0}
    for event in events:
        if event.key in MATMUL_OPS:
            seconds["matmul"] += self_seconds(event, device)
        elif any(fragment in event.key for fragment in ATTENTION_OPS):
            seconds["attention"] += self_seconds(event, device)
    return seconds


def kernel_seconds(fn: Callable[[], object], device: torch.device) -> dict[str, float]:
    """Seconds one profiled call of ``fn`` spends inside matmul kernels and inside attention kernels:
    together the call's floor, its time if every other op (norms, activations, optimizer, framework
    overhead) cost nothing."""
    return kernel_split(profile_call(fn, device)[0], device)


def part_seconds(events: list, device: torch.device, ranges: dict[str, str]) -> dict[str, float]:
    """Seconds of a profiled call that belong to each part named in ``ranges`` (profiler range name ->
    part), forward and backward: every op's own time (``self_seconds``) goes to a part when

    - forward: the op runs inside a range of ``ranges`` (the innermost), the range's own time (the
      Python between its ops) included;
    - backward: the op runs inside the backward of an autograd node created in such a range. The
      profiler tags each node's backward (``BACKWARD_NODE``) with the sequence number of the forward op
      that created it; the creator is the last forward op, in time, recorded with that number (the
      counter moves on once a node is made), so its part is the backward's.

    Everything else (ops in no range, the backward of their nodes, AccumulateGrad, time outside any op)
    is no part's: the caller's "other". Ops run on the profiled call's threads; their own times are
    disjoint, so the parts sum to at most the call's wall time."""
    forward_part: dict[tuple[int, int], tuple[float, str | None]] = {}  # (thread, seq) -> (start, part)
    backward: list[tuple[tuple[int, int], float]] = []
    seconds: dict[str, float] = defaultdict(float)
    for event in events:
        part, node, outer = None, None, event
        while outer is not None:
            if part is None and outer.name in ranges:
                part = ranges[outer.name]
            if outer.name.startswith(BACKWARD_NODE):
                node = outer
            outer = outer.cpu_parent
        spent = self_seconds(event, device)
        if node is not None:
            backward.append(((node.fwd_thread, node.sequence_nr), spent))
            continue
        if event.sequence_nr >= 0:
            key, start = (event.thread, event.sequence_nr), event.time_range.start
            if key not in forward_part or forward_part[key][0] <= start:
                forward_part[key] = (start, part)
        if part is not None:
            seconds[part] += spent
    for key, spent in backward:
        part = forward_part.get(key, (0.0, None))[1]
        if part is not None:
            seconds[part] += spent
    return {part: seconds[part] for part in dict.fromkeys(ranges.values())}


@contextmanager
def moe_ranges(model: torch.nn.Module) -> Iterator[dict[str, str]]:
    """While open, each MoE layer's stages (``MOE_STAGES``: methods, and the forward of its ``experts``
    and ``shared`` modules) run inside profiler ranges named after their part; yields range name ->
    part, empty for a model without MoE layers. The wrappers sit on the instances and are gone when
    the block closes: the timed (unprofiled) steps run the model as it is."""
    from torch.profiler import record_function

    from archlab.nn.moe import MoE

    def in_range(fn: Callable, name: str) -> Callable:
        def labelled(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)

        return labelled

    wrapped = []
    try:
        for module in model.modules():
            if not isinstance(module, MoE):
                continue
            for attr, part in MOE_STAGES.items():
                target = getattr(module, attr)
                if target is None:  # no shared experts
                    continue
                owner, name = (target, "forward") if isinstance(target, torch.nn.Module) else (module, attr)
                setattr(owner, name, in_range(getattr(owner, name), RANGE_PREFIX + part))
                wrapped.append((owner, name))
        yield {RANGE_PREFIX + part: part for part in MOE_PARTS} if wrapped else {}
    finally:
        for owner, name in wrapped:
            delattr(owner, name)


def profile_rounds(
    fns: Mapping[str, Callable[[], object]], rounds: int, device: torch.device, ranges: dict[str, dict[str, str]]
) -> dict[str, dict]:
    """Each function profiled once per round, alternating them for ``rounds`` rounds: medians of its
    ``kernel_split`` and, for a function with ``ranges[name]``, of each part's seconds and share of the
    profiled call (``part_seconds`` / the call's profiled wall time)."""
    summaries: dict[str, list[dict[str, float]]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            events, wall = profile_call(fn, device)
            summary = {**kernel_split(events, device), "wall": wall}
            if ranges.get(name):
                for part, spent in part_seconds(events, device, ranges[name]).items():
                    summary[f"part:{part}"], summary[f"share:{part}"] = spent, spent / wall
            summaries[name].append(summary)
            del events
    return {name: {key: statistics.median(s[key] for s in rows) for key in rows[0]} for name, rows in summaries.items()}


@contextmanager
def saved_activation_bytes(weights: Iterable[torch.Tensor] = ()) -> Iterator[list[int]]:
    """Count the bytes autograd saves for backward inside the block (activation memory on any device);
    the storages of ``weights`` are not activations, nor are views of them (a matmul saves ``W.t()``)."""
    total = [0]
    seen = {w.untyped_storage().data_ptr() for w in weights}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in seen and not isinstance(t, torch.nn.Parameter):
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total


def peak_step_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """The most bytes allocated at once during one call of ``fn``, beyond what was allocated before it.
    CUDA: the allocator's peak; CPU: the profiler's allocation timeline, summed op by op in time order."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with c_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for event in sorted(profiled_events(prof), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


@dataclass
class StepFns:
    """A training step (forward, cross-entropy, backward, AdamW) of one implementation; with
    ``autocast``, forward and loss run under bf16 autocast, as Lightning's bf16-mixed runs them."""

    logits: Callable[[torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    autocast: bool = False

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.logits(x)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def adamw(params) -> torch.optim.Optimizer:
    """The optimizer both sides use: fused AdamW (one kernel per step, on CPU and CUDA alike), which
    is also the Hugging Face Trainer's default (``adamw_torch_fused``) with torch >= 2.8."""
    return torch.optim.AdamW(params, lr=1e-4, fused=True)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_settings(cfg, context_length: int) -> int:
    """Refuse any unusable bench setting before a model is built; return the tokens to generate."""
    from archlab import checks
    from archlab.errors import ConfigError
    from archlab.precision import check_device

    for name in ("batch_size", "repeats"):
        checks.integer(name, getattr(cfg, name))
    checks.integer("warmup", cfg.warmup, 0, "an integer >= 0")
    for name in ("threads", "matmul_size"):
        if getattr(cfg, name) is not None:
            checks.integer(name, getattr(cfg, name), 1, "null or a positive integer")
    if cfg.seq_len is not None and not 1 <= cfg.seq_len <= context_length:
        raise ConfigError("seq_len", cfg.seq_len, f"null or 1 to model.context_length={context_length}")
    room = context_length - PROMPT_TOKENS
    n = room if cfg.generate_tokens is None else cfg.generate_tokens
    if not 1 <= n <= room:
        allowed = f"1 to model.context_length - {PROMPT_TOKENS} prompt tokens = {room}, or null for {room}"
        raise ConfigError("generate_tokens", n, allowed)
    checks.choice("precision", cfg.precision, PRECISIONS)
    checks.choice("format", cfg.format, ("json", "table"))
    check_device(cfg.device, auto=True)
    return n


def attention_path(mcfg, device: torch.device, compute: torch.dtype, seq_len: int) -> str:
    """Which attention code the training step runs (the same choice as ``CausalSelfAttention.forward``),
    with the mask it takes and the output gate it multiplies by."""
    from archlab.nn.mixers.ops import cpu_attention
    from archlab.nn.positions import POSITIONS, Position

    a = mcfg.attention
    window = " with a window mask" if a.window is not None else ""
    window += " with a chunk mask" if a.chunk is not None and seq_len > a.chunk else ""  # else plain causal
    gate = f", a sigmoid {a.gate} output gate" if a.kind == "causal" and a.gate != "none" else ""
    if a.kind != "causal":
        return "SDPA" + window
    if a.softcap is not None:
        sinks = ", sinks in its softmax" if a.sinks else ""
        return "explicit matmuls (soft-capped scores: SDPA cannot cap them)" + sinks + gate
    sinks = ", a sink key first (one more key and head dimension)" if a.sinks else ""
    biased = POSITIONS.get(mcfg.position.kind).bias is not Position.bias  # a float bias (ALiBi) in the mask
    n = seq_len + a.sinks  # the sink's key (and, causal, its first query)
    if cpu_attention.takes(device.type, compute, a.dropout, n, n, True, shared_bool_mask=not biased):
        return "bf16 matmuls and softmax (nn/mixers/ops/cpu_attention.py)" + window + sinks + gate
    return "SDPA" + window + sinks + gate


def attention_paths(mcfg, device: torch.device, compute: torch.dtype, seq_len: int) -> str:
    """``attention_path`` of every layer; where layer kinds (``model.layers``) run different code, each
    kind's with its layers: ``local (layers 0,1,2): bf16 matmuls ...; global (layer 3): SDPA``."""
    from archlab.config.layers import layer_configs, layer_kind

    paths: dict[str, tuple[str, list[int]]] = {}
    for i, c in enumerate(layer_configs(mcfg)):
        name = layer_kind(mcfg, i) or "(model)"
        paths.setdefault(name, (attention_path(c, device, compute, seq_len), []))[1].append(i)
    if len({path for path, _ in paths.values()}) == 1:
        return next(iter(paths.values()))[0]
    return "; ".join(
        f"{name} (layer{'s' if len(layers) > 1 else ''} {','.join(map(str, layers))}): {path}"
        for name, (path, layers) in paths.items()
    )


def run_bench(cfg) -> dict:
    """Time ``cfg.model`` (and its Hugging Face twin) as ``cfg`` asks; return every figure measured.

    For a layout with MoE layers (eager, ``compile=false``), archlab's train row also holds the split of
    its training step (forward, loss, backward, optimizer) into ``router`` (router logits, scores, top-k
    choice and weights, balance and z losses), ``permutation`` (sorting the assignments by expert,
    gathering the rows, scattering the outputs back and the weighted sum of each token's k slots),
    ``experts`` (the routed and any shared experts' MLPs: their matmuls and activation) and ``other``
    (attention, norms, embeddings, dense MLP layers, head, loss, optimizer, framework time), each part
    with its backward (``part_seconds``): ``moe_split_fraction``, the median over the profiled rounds of
    each part's share of a profiled step, and ``moe_split_s``, those shares of the timed median step
    (``step_s``), so the parts and "other" sum to it. Profiling costs a little per op (``profiled_step_s``
    against ``step_s`` says how much), so parts made of many small ops read slightly high."""
    from archlab.accounting import count, flops_per_token
    from archlab.bench.peak_flops import peak_flops
    from archlab.build import build_model
    from archlab.config import to_model_config
    from archlab.config.model import MTPConfig
    from archlab.generate import generate
    from archlab.nn.validation import validate
    from archlab.precision import compute_dtype

    mcfg = validate(to_model_config(cfg.model))
    n = check_settings(cfg, mcfg.context_length)
    T = cfg.seq_len or mcfg.context_length
    device = resolve_device(cfg.device)
    (dtype, autocast), compute = PRECISIONS[cfg.precision], compute_dtype(cfg.precision)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)

    model = build_model(mcfg, device=device, dtype=dtype)
    impls: dict[str, torch.nn.Module] = {"archlab": model}
    hf = None  # the transformers model (compare_hf)
    if cfg.compare_hf:
        from archlab.interop.hf import to_hf

        hf = impls["hf"] = to_hf(model).to(device=device, dtype=dtype)
    # the step timed is the next-token one (as transformers' model runs it): any multi-token prediction
    # modules are built but not run, so their FLOPs are left out of the step's
    stepped = dataclasses.replace(mcfg, head=dataclasses.replace(mcfg.head, mtp=MTPConfig()))
    flops_tok = flops_per_token(stepped, count(mcfg)["active_non_embedding"], T)
    x = torch.randint(0, mcfg.vocab_size, (cfg.batch_size, T), device=device)
    y = torch.randint(0, mcfg.vocab_size, (cfg.batch_size, T), device=device)

    def timed_model(m: torch.nn.Module) -> torch.nn.Module:
        """What a training step runs: with ``compile``, archlab compiled block by block as archlab-train
        compiles it (on a copy: memory and generation below stay eager), Hugging Face's model whole."""
        if not cfg.compile:
            return m
        if m is not model:
            return cast(torch.nn.Module, torch.compile(m))  # a module compiles to an OptimizedModule
        compiled = copy.deepcopy(model)
        compiled.compile_blocks()
        return compiled

    runs = {name: timed_model(m) for name, m in impls.items()}
    logits = {"archlab": lambda t: runs["archlab"](t), "hf": lambda t: runs["hf"](input_ids=t).logits}
    steps = {name: StepFns(logits[name], adamw(run.parameters()), autocast) for name, run in runs.items()}
    for m in (*impls.values(), *runs.values()):
        m.train()
    side = cfg.matmul_size or (8192 if device.type == "cuda" else 2048)
    train_fns = {name: (lambda s=s: s.step(x, y)) for name, s in steps.items()}
    # both ceilings in the same rotation; the step is measured against the one of the dtype it computes in
    timed = {**train_fns, **{name: ceiling_matmul(device, d, side) for d, name in CEILINGS.items()}}
    train_times = time_alternating(timed, cfg.warmup, cfg.repeats, device)
    ceilings = {
        str(d).removeprefix("torch."): median_rate(train_times.pop(n), 2.0 * side**3) for d, n in CEILINGS.items()
    }
    ceiling = ceilings[str(compute).removeprefix("torch.")]
    # the ceilings profiled in the same rounds; archlab's MoE stages labelled for those rounds only (the
    # split is of the eager step: compiled, inductor fuses ops across the stages)
    with moe_ranges(runs["archlab"]) if not cfg.compile else nullcontext({}) as ranges:
        kernels = profile_rounds(timed, cfg.repeats, device, {"archlab": ranges})
    profiled = {d: kernels.pop(n)["matmul"] for d, n in CEILINGS.items()}
    profiled_ceiling = 2.0 * side**3 / profiled[compute]
    peak = peak_flops(device, compute)  # MFU against the peak of the dtype computed in, as archlab-train reports it
    out: dict = {
        "device": str(device),
        "precision": cfg.precision,
        "compute_dtype": str(compute).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "batch_size": cfg.batch_size,
        "seq_len": T,
        "generate_tokens": n,
        "compiled": cfg.compile,
        "flops_per_token": flops_tok,
        "attention_path": attention_paths(mcfg, device, compute, T),
        "matmul_flops": ceiling,
        "matmul_flops_by_dtype": ceilings,
        "profiled_matmul_flops": profiled_ceiling,
        "train": {},
    }
    for name, secs in train_times.items():
        tok_s = median_rate(secs, cfg.batch_size * T)
        row: dict[str, Any] = {"tokens_per_s": tok_s, "step_s": statistics.median(secs), "flops": flops_tok * tok_s}
        row["fraction_of_matmul"] = row["flops"] / ceiling
        row["matmul_s"], row["attention_s"] = kernels[name]["matmul"], kernels[name]["attention"]
        row["floor_s"] = row["matmul_s"] + row["attention_s"]
        row["floor_fraction_of_matmul"] = flops_tok * cfg.batch_size * T / row["floor_s"] / profiled_ceiling
        if peak:
            row["mfu"] = row["flops"] / peak
        shares = {part: kernels[name][f"share:{part}"] for part in MOE_PARTS if f"share:{part}" in kernels[name]}
        if shares:  # the profiled step's shares, applied to the timed step (profiling slows every op a little)
            row["moe_split_fraction"] = {**shares, "other": 1.0 - sum(shares.values())}
            row["moe_split_s"] = {part: f * row["step_s"] for part, f in row["moe_split_fraction"].items()}
            row["profiled_step_s"] = kernels[name]["wall"]
        out["train"][name] = row

    # saved-tensor hooks see eager autograd only: memory is measured on the eager model
    if runs["archlab"] is model:
        eager = StepFns(lambda t: model(t), steps["archlab"].optimizer, autocast)
    else:  # the timed model was a compiled copy: the eager one gets its own optimizer, state allocated first
        eager = StepFns(lambda t: model(t), adamw(model.parameters()), autocast)
        eager.step(x, y)
    out["memory"] = measure_memory(model, eager, x, y, device, cfg.checkpointing)
    for m in impls.values():
        m.eval()
    prompt = torch.randint(0, mcfg.vocab_size, (1, PROMPT_TOKENS), device=device)
    gen_fns = {"archlab": lambda: generate(model, prompt, max_new_tokens=n)}
    if hf is not None:
        gen_fns["hf"] = lambda: hf.generate(
            prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        gen_times = time_alternating(gen_fns, max(1, cfg.warmup // 2), cfg.repeats, device)
    out["generate"] = {name: {"tokens_per_s": median_rate(s, n)} for name, s in gen_times.items()}
    if "hf" in impls:
        for section, times in (("train", train_times), ("generate", gen_times)):
            q1, out[section]["ratio"], q3 = paired_ratio(times["archlab"], times["hf"])
            out[section]["ratio_quartiles"] = [q1, q3]
    return out


def measure_memory(model, step: StepFns, x, y, device: torch.device, checkpointing: bool) -> dict:
    """Activation bytes saved for backward and the step's peak allocation above what was resident
    before it; with ``checkpointing`` the same with activation checkpointing on, to show what it saves."""
    modes = [False, True] if checkpointing else [False]
    weights = list(model.parameters())
    result = {}
    for on in modes:
        model.activation_checkpointing = on
        with saved_activation_bytes(weights) as saved:  # one step gives both figures
            peak = peak_step_bytes(lambda: step.step(x, y), device)
        result["checkpointing" if on else "plain"] = {"saved_activation_bytes": saved[0], "peak_step_bytes": peak}
    model.activation_checkpointing = False
    return result
