"""What the Hugging Face parity tests (test_hf_*.py) share: the tiny sizes, fully randomised weights,
logits, the round trips every family passes (HF -> archlab -> HF -> archlab, a shrunk preset to HF and
back, save_pretrained directories), the check that a part moves the logits, the two generation checks
against HF ``generate``, and cached decoding against HF's full forward (a Mamba-2 layer's time-step clamp,
which HF's own decoding step ignores). transformers is imported only inside the functions that build its models."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from archlab import build_model, count_params
from archlab.generate import generate
from archlab.interop.hf import from_hf, load_hf_dir, save_hf_dir, to_hf

TOL = 1e-4  # max abs logit difference allowed (float32)
V, CTX, WINDOW = 96, 64, 4
IDS = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))  # 12 > WINDOW
ATTN = dict(attn_implementation="eager")  # transformers' eager attention
EAGER = dict(ATTN, experts_implementation="eager")  # and its plain per-expert loop (the MoE families)
NO_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
HF_SIZES = dict(vocab_size=V, max_position_embeddings=CTX, hidden_size=64)  # every tiny HF config's


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter redrawn: matrices, tables and stacked experts N(0, 0.2²); vectors (biases, norm
    scales or Gemma's scale offsets) 0.5 + N(0, 0.3²); a router correction-bias buffer (HF
    ``e_score_correction_bias``, archlab ``router_bias``) N(0, 0.3²), of the size of the sigmoid scores'
    spread, so it moves the choice. A tied tensor is listed, so drawn, once."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "router_bias")):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)
    return model.eval()


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def check_greedy_generation(hf, model=None) -> None:
    """20 new tokens after a 5-token prompt, past every window of 4: the same ids as HF ``generate``, and
    at every step archlab's logits through its KV cache equal the logits HF decoded with (a random model's
    greedy path may settle into a few tokens; the logits compare every step whatever it picks). ``model``:
    the archlab model to compare, by default ``from_hf(hf)``."""
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(5))
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=20,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
    )
    model = from_hf(hf) if model is None else model
    got = generate(model, ids, max_new_tokens=20)
    assert got.shape == out.sequences.shape == (2, 25)
    assert torch.equal(got, out.sequences)
    cache, steps = model.new_cache(2, 25), []
    with torch.no_grad():
        for start, end in [(0, 5), *((t, t + 1) for t in range(5, 24))]:  # the prompt, then one token at a time
            steps.append(model(got[:, start:end], cache)[:, -1])
    assert max_diff(torch.stack(steps, 1), torch.stack(out.logits, 1)) <= TOL


def check_padded_generation(hf, model=None) -> None:
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, with their attention mask: archlab's
    greedy continuation of each row, and its logits at every step, equal HF ``generate``'s on the same batch
    (``model`` as in ``check_greedy_generation``)."""
    prompts = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 3, 5)]
    ids = torch.tensor([[0] * (7 - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (7 - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_logits=True
    )
    model = from_hf(hf) if model is None else model
    got = generate(model, ids, max_new_tokens=12, attention_mask=mask)
    assert torch.equal(got, out.sequences)
    cache, steps = model.new_cache(3, 19), []
    with torch.no_grad():
        for start, end in [(0, 7), *((t, t + 1) for t in range(7, 18))]:
            steps.append(model(got[:, start:end], cache, torch.cat((mask, torch.ones(3, end - 7)), 1).long())[:, -1])
    assert max_diff(torch.stack(steps, 1), torch.stack(out.logits, 1)) <= TOL


def check_decoding_equals_hfs_full_forward_not_its_decoding(hf) -> None:
    """A 5-token prefill then one token at a time to 12: the logits through archlab's cache (``from_hf(hf)``)
    equal HF's full forward at every step, while HF's own cached decoding moves by more than 1e-2 (a
    Mamba-2 layer's ``time_step_limit``, which transformers' one-token step ignores)."""
    model = from_hf(hf)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = hf(ids).logits
        cache, steps = model.new_cache(2, 12), []
        for start, end in [(0, 5), *((t, t + 1) for t in range(5, 12))]:
            steps.append(model(ids[:, start:end], cache))
        out = hf(ids[:, :5], use_cache=True)
        hf_cache, hf_steps = out.cache, [out.logits]
        for t in range(5, 12):
            out = hf(ids[:, t : t + 1], cache=hf_cache, use_cache=True)
            hf_cache = out.cache
            hf_steps.append(out.logits)
    assert max_diff(torch.cat(steps, 1), full) <= TOL
    assert max_diff(torch.cat(hf_steps, 1), full) > 1e-2


def changed_cfg(cfg, **fields):
    """A copy of archlab config ``cfg`` with ``fields`` set: ``attention__window=...`` on the model
    (``mlp__routing__top_k``: a sub-config's; a field the section has not is an error),
    ``kinds__nope__attention__qk_norm=...`` on (or added to) a layer kind (``kinds__nope__position__kind``:
    that option in place of the kind's section, as a kind naming another option swaps the part whole)."""
    cfg = copy.deepcopy(cfg)
    for key, value in fields.items():
        path = key.split("__")
        if path[0] == "kinds" and len(path) == 4 and path[-1] == "kind":
            cfg.layers.kinds[path[1]][path[2]] = {"kind": value}
        elif path[0] == "kinds":
            node = cfg.layers.kinds[path[1]]
            for name in path[2:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = value
        else:
            obj = cfg
            for name in path[:-1]:
                obj = getattr(obj, name)
            assert hasattr(obj, path[-1]), f"{key}: {type(obj).__name__} has no such field"
            setattr(obj, path[-1], value)
    return cfg


def hf_case(cases: dict[str, tuple], case: str, seed: int = 1, **impl: Any) -> Any:
    """The transformers model of ``cases[case]`` (model class, config class, config keys), built with the
    implementation settings ``impl`` and every parameter redrawn (``randomize``)."""
    import transformers

    model_class, config_class, keys = cases[case][:3]
    config = getattr(transformers, config_class)(**keys, **impl)
    return randomize(getattr(transformers, model_class)(config), seed)


def assert_same_tensors(model, other) -> None:
    """The two models hold the same tensor names, each bit for bit."""
    state, state_other = model.state_dict(), other.state_dict()
    assert state.keys() == state_other.keys()
    assert all(torch.equal(state[k], state_other[k]) for k in state)


def check_back_and_again(hf, model, **impl: Any):
    """archlab ``model`` (read from ``hf``) converts back to ``hf``'s class with the same logits, and from
    there to an archlab model with the same config and bit-identical tensors; gives the HF model back."""
    back = to_hf(model, **impl).eval()
    assert type(back) is type(hf)
    assert max_diff(logits(back), logits(model)) <= TOL
    again = from_hf(back)
    assert again.cfg == model.cfg
    assert_same_tensors(model, again)
    return back


def check_to_hf_and_back(model, expected_class: str, reference: Callable = lambda hf: hf, **impl: Any):
    """archlab ``model`` converts to HF class ``expected_class`` with the same logits (those of
    ``reference(hf)``), and back to archlab with every tensor bit for bit and the same counts; gives the HF
    model and the archlab model read back."""
    hf = to_hf(model, **impl).eval()
    assert type(hf).__name__ == expected_class
    assert max_diff(logits(model), logits(reference(hf))) <= TOL
    back = from_hf(hf)
    assert_same_tensors(model, back)
    assert count_params(back.cfg) == count_params(model.cfg)
    return hf, back


def check_directory_round_trip(
    hf, tmp_path: Path, loader: Any = None, edit: Callable[[Path], None] | None = None, **impl: Any
) -> None:
    """save_pretrained (then ``edit`` of the directory) -> load_hf_dir -> save_hf_dir -> ``loader``'s
    from_pretrained (by default transformers' AutoModelForCausalLM): ``hf``'s class and logits throughout."""
    import transformers

    hf.save_pretrained(tmp_path / "hf")
    if edit is not None:
        edit(tmp_path / "hf")
    model = load_hf_dir(tmp_path / "hf").eval()
    assert max_diff(logits(hf), logits(model)) <= TOL
    save_hf_dir(model, tmp_path / "again")
    loader = transformers.AutoModelForCausalLM if loader is None else loader
    back = loader.from_pretrained(tmp_path / "again", **impl).eval()
    assert type(back) is type(hf)
    assert max_diff(logits(hf), logits(back)) <= TOL


def check_changes_logits(model, cfg, what: str = "") -> None:
    """``model``'s weights in a model of config ``cfg`` (one part taken away) give other logits."""
    changed = build_model(cfg, device="meta")
    changed.load_state_dict(model.state_dict(), assign=True)
    assert max_diff(logits(changed.eval()), logits(model)) > 1e-3, what


def families_of_its_mixers(cfg) -> dict[str, Any]:
    """The families (by model_type) whose mixers hold every layer's of ``cfg``: the ones whose problems go
    beyond the mixer (a family of other mixers names the mixer alone)."""
    from archlab.interop.families import FAMILIES

    return {name: f for name, f in FAMILIES.items() if not f.mixer_problems(cfg)}
