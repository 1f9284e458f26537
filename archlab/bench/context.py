"""archlab-bench's context sweep (``contexts=[...]``): how cost grows with the context for the same model
with different token mixers. Per variant (softmax attention, Gated DeltaNet, the 3:1 hybrid, Mamba-2,
Mamba-1, the RG-LRU, the short convolution) and context: a training step at a fixed number of tokens (batch × context = ``tokens_per_step``), its peak
memory, decoding's time per token after a prefill of that context and the decoding state's bytes (the
cache's tensors beside the closed form of ``accounting.kv_cache_bytes``), and a fitted growth exponent.

At fixed tokens a mixer whose work is linear in the tokens keeps its step time as the context doubles,
while attention's scores, quadratic in the context per sequence, double with it. Every (variant,
context) step runs once per round, all of them in one rotation in one process, so a drift in the
machine's speed moves every figure alike rather than bending one variant's curve."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional, Sequence

import torch

from archlab.bench.harness import (
    PRECISIONS,
    StepFns,
    adamw,
    peak_step_bytes,
    resolve_device,
    synchronize,
    time_alternating,
)

if TYPE_CHECKING:
    from archlab.nn.model import Decoder


class Variant(NamedTuple):
    """A variant of the sweep: the config group and option merged onto the composed model (as
    ``model/<group>=<option>`` selects it), and where its linear layers are sized like the composed attention:
    the section ``sized`` (None: nowhere) whose ``fields`` take the attention's head size."""

    group: str
    option: str
    sized: Optional[str] = None
    fields: tuple[str, ...] = ()


DELTANET_SIZES = ("key_head_dim", "v_head_dim")
# name -> its Variant (None: the model as composed)
VARIANTS: dict[str, Optional[Variant]] = {
    "attention": None,
    "gated_deltanet": Variant("attention", "gated_deltanet", "attention", DELTANET_SIZES),
    "hybrid_3_1": Variant("layers", "deltanet_3_1", "layers.kinds.deltanet.attention", DELTANET_SIZES),
    "kda": Variant("attention", "kda", "attention", ("head_dim",)),
    "lightning": Variant("attention", "lightning", "attention", ("head_dim",)),
    "mamba2": Variant("attention", "mamba2"),
    "mlstm": Variant("attention", "mlstm"),
    "rwkv4": Variant("attention", "rwkv4"),
    "mamba": Variant("attention", "mamba"),
    "rglru": Variant("attention", "rglru"),
    "short_conv": Variant("attention", "short_conv"),
}
MEMORY_SHARE = 0.9  # memory_cap_mib=null: this share of the memory free before the sweep
TARGET_RATIO = 1.2  # issue 28: a linear mixer's step time grows at most this much per doubling of context


def selects(name: str) -> str:
    """What variant ``name`` selects, as a command-line override says it."""
    option = VARIANTS[name]
    return "the model as composed" if option is None else f"model/{option.group}={option.option}"


def option_file(conf_dir: Path, group: str, option: str) -> Path:
    return Path(conf_dir) / "model" / group / f"{option}.yaml"


def variant_config(model_cfg: Any, name: str, context_length: int) -> Any:
    """The composed model (a DictConfig) with variant ``name``'s option merged in at its group, as
    ``model/<group>=<option>`` selects it, and ``context_length`` set; a validated ``ModelConfig``. Its
    Gated DeltaNet, KDA and lightning layers get the composed attention's heads: ``n_head`` states (one per
    value head, as many query/key heads) of the attention's head size (``key_head_dim = v_head_dim``, or
    ``head_dim``), so both mixers project d_model to the same widths."""
    from omegaconf import OmegaConf, open_dict

    from archlab.build import CONF_DIR
    from archlab.config import to_model_config
    from archlab.nn.mixers.base import head_dim
    from archlab.nn.validation import validate

    option = VARIANTS[name]
    cfg = OmegaConf.merge(model_cfg, {"context_length": context_length})
    if option is not None:
        size = head_dim(validate(to_model_config(cfg)))
        path = option_file(CONF_DIR, option.group, option.option)  # an option with no file sets its kind alone
        cfg = OmegaConf.merge(cfg, {option.group: OmegaConf.load(path) if path.exists() else {"kind": option.option}})
        if option.sized is not None:
            with open_dict(cfg):  # a layer kind's section is a free-form mapping
                OmegaConf.update(cfg, option.sized, dict.fromkeys(option.fields, size), merge=True)
    return validate(to_model_config(cfg))


def check_sweep(cfg) -> list[str]:
    """Refuse any unusable setting of the sweep before a model is built; return the variants to run."""
    from archlab import checks
    from archlab.errors import ConfigError
    from archlab.precision import check_device

    contexts = list(cfg.contexts)
    if not contexts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in contexts):
        raise ConfigError("contexts", contexts, "null, or a non-empty list of positive integers")
    if contexts != sorted(set(contexts)):
        raise ConfigError("contexts", contexts, "distinct contexts in ascending order")
    checks.integer("tokens_per_step", cfg.tokens_per_step)
    if any(cfg.tokens_per_step % c for c in contexts):
        raise ConfigError("tokens_per_step", cfg.tokens_per_step, f"a multiple of every context {contexts}")
    have = list(VARIANTS)
    names = have if cfg.variants is None else list(cfg.variants)
    if not names or len(set(names)) != len(names) or any(n not in have for n in names):
        raise ConfigError("variants", names, "null, or distinct names among " + ", ".join(have))
    for name in ("decode_tokens", "fit_from", "repeats"):
        checks.integer(name, getattr(cfg, name))
    checks.integer("warmup", cfg.warmup, 0, "an integer >= 0")
    for name in ("threads", "memory_cap_mib"):
        if getattr(cfg, name) is not None:
            checks.integer(name, getattr(cfg, name), 1, "null or a positive integer")
    checks.png_file("plot", cfg.plot)
    if cfg.compile:
        raise ConfigError("compile", cfg.compile, "false with contexts (the sweep times eager steps)")
    checks.choice("precision", cfg.precision, PRECISIONS)
    checks.choice("format", cfg.format, ("json", "table"))
    check_device(cfg.device, auto=True)
    for name in names:  # a model field a variant cannot take is refused here, naming the field
        variant_config(cfg.model, name, contexts[-1] + cfg.decode_tokens)
    return names


def growth_exponents(contexts: Sequence[int], values: Sequence[Optional[float]], fit_from: int) -> dict:
    """How ``values`` grow with ``contexts``: the exponent e of value ∝ context^e, i.e. log2 of the ratio
    per doubling, fitted by least squares on log2-log2 over the contexts >= ``fit_from`` (None with fewer
    than two), and between each pair of neighbouring contexts. A None value (a skipped context) is left
    out."""
    points = [(c, v) for c, v in zip(contexts, values, strict=True) if v is not None and v > 0]
    neighbours = [
        {"from": a, "to": b, "exponent": math.log2(vb / va) / math.log2(b / a)}
        for (a, va), (b, vb) in zip(points, points[1:])
    ]
    for row in neighbours:
        row["ratio_per_doubling"] = 2.0 ** row["exponent"]
    fit = [(math.log2(c), math.log2(v)) for c, v in points if c >= fit_from]
    exponent = None
    if len(fit) >= 2:
        exponent = statistics.linear_regression([x for x, _ in fit], [y for _, y in fit]).slope
    return {
        "exponent": exponent,
        "ratio_per_doubling": None if exponent is None else 2.0**exponent,
        "fitted_over": [c for c, v in points if c >= fit_from],
        "neighbours": neighbours,
    }


def cache_tensors(cache) -> list[torch.Tensor]:
    """A KV cache's tensors: keys and values, convolution inputs and states, any others it keeps in lists."""
    return [
        t for value in vars(cache).values() if isinstance(value, list) for t in value if isinstance(t, torch.Tensor)
    ]


def cache_bytes(cache) -> int:
    """Bytes of a KV cache's tensors' values (what the closed form counts)."""
    return sum(t.nbytes for t in cache_tensors(cache))


def cache_storage_bytes(cache) -> int:
    """Bytes of the storages a KV cache's tensors keep alive: more than ``cache_bytes`` where a tensor is a
    view into a larger one (the convolution's last inputs, sliced from the inputs of the last step)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in cache_tensors(cache)}
    return sum(storages.values())


def free_bytes(device: torch.device) -> Optional[int]:
    """Memory free on ``device`` now: CUDA's free memory, or the CPU's MemAvailable (None if unreadable)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "can't allocate memory" in str(err)


def predicted_peak(measured: list[tuple[int, int]], context: int) -> Optional[float]:
    """A step's peak bytes at ``context`` extrapolated from those measured at smaller contexts: on the
    log-log line through the last two (at least flat), or proportional to the context from one."""
    if not measured:
        return None
    c1, b1 = measured[-1]
    slope = 1.0
    if len(measured) > 1:
        c0, b0 = measured[-2]
        slope = max(0.0, math.log2(max(b1, 1) / max(b0, 1)) / math.log2(c1 / c0))
    return b1 * (context / c1) ** slope


def run_context_sweep(cfg) -> dict:
    """The sweep ``cfg`` asks for: every figure per variant and context, the fitted exponents, and the
    plot written to ``cfg.plot``. A (variant, context) whose step would exceed the memory cap by the
    trend of its smaller contexts, or did, or ran out of memory, is skipped with a note, and so are that
    variant's larger contexts."""
    from archlab.accounting import count, kv_cache_bytes
    from archlab.build import build_model

    names = check_sweep(cfg)
    contexts = list(cfg.contexts)
    n_decode = cfg.decode_tokens
    device = resolve_device(cfg.device)
    dtype, autocast = PRECISIONS[cfg.precision]
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    mcfgs = {n: variant_config(cfg.model, n, contexts[-1] + n_decode) for n in names}
    models = {n: build_model(c, device=device, dtype=dtype) for n, c in mcfgs.items()}
    steps = {n: StepFns(lambda t, m=m: m(t), adamw(m.parameters()), autocast) for n, m in models.items()}
    vocab = mcfgs[names[0]].vocab_size
    data = {}
    for c in contexts:
        b = cfg.tokens_per_step // c
        data[c] = tuple(torch.randint(0, vocab, (b, c), device=device) for _ in range(2))
    free = free_bytes(device)
    if cfg.memory_cap_mib is not None:
        cap: Optional[int] = cfg.memory_cap_mib * 2**20
    else:
        cap = None if free is None else int(MEMORY_SHARE * free)

    rows = {
        (n, c): {"variant": n, "context": c, "batch_size": cfg.tokens_per_step // c} for n in names for c in contexts
    }
    measured: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
    skipped: dict[str, str] = {}  # variant -> why its remaining contexts are skipped
    for m in models.values():
        m.train()
    for c in contexts:  # peak memory first, variants alternating, smaller contexts first: one warm step each
        x, y = data[c]
        for n in names:
            row = rows[(n, c)]
            if n in skipped:
                row["skipped"] = skipped[n]
                continue
            guess = predicted_peak(measured[n], c)
            if cap is not None and guess is not None and guess > cap:
                row["skipped"] = f"predicted peak {guess / 2**20:,.0f} MiB > memory cap {cap / 2**20:,.0f} MiB"
            else:
                try:
                    peak = peak_step_bytes(lambda s=steps[n], x=x, y=y: s.step(x, y), device)
                except (RuntimeError, torch.cuda.OutOfMemoryError) as err:
                    if not out_of_memory(err):
                        raise
                    steps[n].optimizer.zero_grad(set_to_none=True)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    row["skipped"] = f"out of memory ({type(err).__name__})"
                else:
                    row["peak_step_bytes"] = peak
                    measured[n].append((c, peak))
                    if cap is not None and peak > cap:
                        row["skipped"] = f"peak {peak / 2**20:,.0f} MiB > memory cap {cap / 2**20:,.0f} MiB"
            if "skipped" in row:
                skipped[n] = row["skipped"] + f" at context {c}"
    kept = [(n, c) for (n, c), row in rows.items() if "skipped" not in row]

    fns: dict[str, Callable[[], object]] = {}
    for n, c in sorted(kept, key=lambda k: (k[1], names.index(k[0]))):  # each round: every variant, every context
        fns[f"{n}@{c}"] = lambda s=steps[n], xy=data[c]: s.step(*xy)
    times = time_alternating(fns, cfg.warmup, cfg.repeats, device)
    for (n, c), row in rows.items():
        if (n, c) not in kept:
            continue
        secs = times[f"{n}@{c}"]
        row["step_s"] = statistics.median(secs)
        row["step_s_range"] = [min(secs), max(secs)]
        row["tokens_per_s"] = cfg.tokens_per_step / row["step_s"]

    decode = time_decoding(models, kept, n_decode, max(1, cfg.warmup // 2), cfg.repeats, device, autocast, vocab)
    for key, (per_token, state, storage) in decode.items():
        row = rows[key]
        row["decode_s_per_token"] = statistics.median(per_token)
        row["state_bytes"], row["state_storage_bytes"] = state, storage
        width = torch.finfo(models[key[0]].tok_emb.weight.dtype).bits // 8  # the cache's dtype: the weights'
        row["state_bytes_closed_form"] = kv_cache_bytes(mcfgs[key[0]], key[1] + n_decode, width)

    fits = {}
    for n in names:
        series = [rows[(n, c)] for c in contexts]
        fits[n] = {
            measure: growth_exponents(contexts, [r.get(measure) for r in series], cfg.fit_from)
            for measure in ("step_s", "peak_step_bytes", "decode_s_per_token", "state_bytes")
        }
    out: dict[str, Any] = {
        "mode": "context_sweep",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "precision": cfg.precision,
        "tokens_per_step": cfg.tokens_per_step,
        "contexts": contexts,
        "decode_tokens": n_decode,
        "warmup": cfg.warmup,
        "repeats": cfg.repeats,
        "fit_from": cfg.fit_from,
        "memory_cap_bytes": cap,
        "variants": {
            n: {
                "selects": selects(n),
                "params": count(mcfgs[n])["total"],
                "non_embedding_params": count(mcfgs[n])["non_embedding"],
            }
            for n in names
        },
        "rows": list(rows.values()),
        "fits": fits,
        "targets": {
            n: {
                "step_ratio_per_doubling": fits[n]["step_s"]["ratio_per_doubling"],
                f"step_at_most_{TARGET_RATIO}x": None
                if fits[n]["step_s"]["ratio_per_doubling"] is None
                else fits[n]["step_s"]["ratio_per_doubling"] <= TARGET_RATIO,
                "decoding_state_constant": state_constant(fits[n]["state_bytes"]),
            }
            for n in names
        },
        "plot": None,
    }
    if cfg.plot is not None:
        out["plot"] = str(draw(out, Path(cfg.plot).expanduser()))
    return out


def time_decoding(
    models: Mapping[str, Decoder],
    kept: list[tuple[str, int]],
    n_decode: int,
    warmup: int,
    repeats: int,
    device: torch.device,
    autocast: bool,
    vocab: int,
) -> dict[tuple[str, int], tuple[list[float], int, int]]:
    """Per (variant, context): seconds per greedy token over ``n_decode`` tokens decoded one at a time
    after an untimed prefill of ``context`` random tokens at batch 1 (one figure per timed round, the
    pairs alternating within each round), and the cache's bytes after the last token: its values'
    and the storages it keeps."""
    prompts = {c: torch.randint(0, vocab, (1, c), device=device) for c in sorted({c for _, c in kept})}
    per_token: dict[tuple[str, int], list[float]] = {k: [] for k in kept}
    state: dict[tuple[str, int], tuple[int, int]] = {}
    for m in models.values():
        m.eval()
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        for round_ in range(warmup + repeats):
            for n, c in kept:
                model = models[n]
                cache = model.new_cache(1, c + n_decode)
                token = model(prompts[c], cache)[:, -1].argmax(-1, keepdim=True)
                synchronize(device)
                start = time.perf_counter()
                for _ in range(n_decode):
                    token = model(token, cache)[:, -1].argmax(-1, keepdim=True)
                synchronize(device)
                if round_ >= warmup:
                    per_token[(n, c)].append((time.perf_counter() - start) / n_decode)
                state[(n, c)] = cache_bytes(cache), cache_storage_bytes(cache)
                del cache
    for m in models.values():
        m.train()
    return {k: (per_token[k], *state[k]) for k in kept}


MEASURES = (  # (key, panel title, scale to the unit shown)
    ("step_s", "training step (s)", 1.0),
    ("peak_step_bytes", "peak step memory (MiB)", 2.0**-20),
    ("decode_s_per_token", "decoding (ms per token)", 1e3),
    ("state_bytes", "decoding state (MiB)", 2.0**-20),
)


def draw(result: dict, path: Path) -> Path:
    """The sweep's four curves against the context on log-log axes, one panel per measure, one line per
    variant labelled with its fitted step-time ratio per doubling; in the look every archlab figure shares
    (``archlab.figures``)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    from archlab.figures import PANEL, colours, pyplot, save_figure

    plt = pyplot()
    names = list(result["variants"])
    palette = colours(names)
    fig, axes = plt.subplots(2, 2, figsize=(2 * PANEL[0] + 2.2, 2 * PANEL[1] + 0.9), layout="constrained")
    for index, (ax, (key, title, scale)) in enumerate(zip(axes.flat, MEASURES)):
        for n in names:
            points = [(r["context"], r[key] * scale) for r in result["rows"] if r["variant"] == n and key in r]
            if points:
                ax.plot(*zip(*points), marker="o", ms=3, color=palette[n])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(result["contexts"], [f"{c:,}" for c in result["contexts"]])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_title(title, fontsize=8)
        if index >= 2:
            ax.set_xlabel("context (tokens)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    handles = []
    for n in names:
        ratio = result["fits"][n]["step_s"]["ratio_per_doubling"]
        label = n if ratio is None else f"{n}: step ×{ratio:.2f} per doubling (≥{result['fit_from']:,})"
        handles.append(Line2D([], [], color=palette[n], marker="o", label=label))
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, ncols=2)
    fig.suptitle(
        f"Cost against context at {result['tokens_per_step']:,} tokens per step "
        f"({result['device']}, threads {result['threads']}, {result['precision']})",
        fontsize=9,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def state_constant(fit: dict) -> Optional[bool]:
    """Is a measure the same at every context measured (the neighbours' exponents all 0)?"""
    return None if not fit["neighbours"] else all(row["exponent"] == 0 for row in fit["neighbours"])
