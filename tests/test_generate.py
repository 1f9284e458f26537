"""Generation with the KV cache (archlab/generate.py): greedy ids equal Hugging Face ``generate`` and uncached
argmax decoding, past the context too (nanoGPT's reference: each step sees the last context_length tokens);
a left-padded batch with its attention mask computes each prompt as alone, whatever the positions, windows
and soft-caps; sampling follows softmax(logits / T) over the top k, reproducibly; the CLI end to end."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers.parts import EVERY_OTHER_GLOBAL, build, plain

from archlab import ConfigError, build_model, compose_model
from archlab.cli.generate import main as generate_main
from archlab.cli.generate import parse_settings
from archlab.generate import generate, next_token
from archlab.tokenizer import ByteTokenizer
from archlab.weights import load_weights, save_weights

V = 96
TINY = ["model.vocab_size=96", "model.context_length=48", "model.n_layer=2"]
ARCHLAB = {
    "learned": ["model=nano", *TINY, "model.d_model=32", "model.attention.n_head=4"],
    "rope-gqa": [
        "model=llama2-70b",
        *TINY,
        "model.d_model=64",
        "model.attention.n_head=4",
        "model.attention.n_kv_head=2",
    ],
}


pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


def randomize(model, seed):
    """Every parameter N(0, 0.3²) (norm scales around 1), so greedy paths are far from ties."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            if p.dim() == 1 and ("ln" in name or "norm" in name) and name.endswith("weight"):
                p.add_(1.0)
    return model.eval()


def prompt(batch=2, length=5, seed=0):
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def model(name, seed=0):
    return randomize(build_model(compose_model(ARCHLAB[name])), seed)


def uncached_greedy(model, ids, steps):
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_greedy_matches_hugging_face_generate(family):
    transformers = pytest.importorskip("transformers")
    from archlab.interop.hf import from_hf

    special = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager")
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=V, n_positions=48, n_embd=32, n_layer=2, n_head=4, **special)
        hf_model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=V,
            max_position_embeddings=48,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **special,
        )
        hf_model = transformers.LlamaForCausalLM(config)
    hf_model = randomize(hf_model, seed=1)
    ids = prompt()
    expected = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
    got = generate(from_hf(hf_model), ids, max_new_tokens=20)
    assert expected.shape == got.shape == (2, 25)
    assert torch.equal(got, expected)
    assert len(set(got[:, 5:].flatten().tolist())) > 3  # a real continuation, not one repeated token


@pytest.mark.parametrize("name", list(ARCHLAB))
def test_cached_greedy_equals_uncached_argmax(name):
    m, ids = model(name), prompt()
    assert torch.equal(generate(m, ids, max_new_tokens=20), uncached_greedy(m, ids, 20))


CTX = 12  # a short context, so that a few dozen new tokens run far past it
PAST_CONTEXT = {
    "learned": ARCHLAB["learned"],
    "rope-gqa": ARCHLAB["rope-gqa"],
    "alibi": [*ARCHLAB["learned"], "model/position=alibi"],
    "rope-sliding": [*ARCHLAB["rope-gqa"], "model.attention.window=5"],
    "mla": [
        *ARCHLAB["learned"],
        "model/position=rope",
        "model/attention=mla",
        "model.attention.kv_lora_rank=16",
        "model.attention.qk_rope_head_dim=4",
        "model.attention.qk_nope_head_dim=4",
        "model.attention.v_head_dim=8",
    ],
}


def short_context_model(name, seed=0):
    overrides = [o for o in PAST_CONTEXT[name] if not o.startswith("model.context_length=")]
    return randomize(build_model(compose_model([*overrides, f"model.context_length={CTX}"])), seed)


def windowed_greedy(model, ids, steps, context):
    """The no-cache reference (nanoGPT's ``generate``): each step re-runs the last ``context`` tokens
    from position 0 and takes the argmax of the last logits."""
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(ids[:, -context:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.mark.parametrize("name", list(PAST_CONTEXT))
def test_generation_past_the_context_equals_the_no_cache_reference(name):
    m = short_context_model(name)
    for length in (5, CTX, 20):  # a prompt within the context, filling it, longer than it
        ids = prompt(length=length, seed=length)
        got = generate(m, ids, max_new_tokens=30)
        assert got.shape == (2, length + 30)
        assert torch.equal(got, windowed_greedy(m, ids, 30, CTX)), length
    if name == "rope-sliding":  # two layers of window 5 see 9 tokens back, fewer than CTX: the cut is moot
        assert torch.equal(got, uncached_greedy(m, ids, 30))
    elif name != "learned":  # a model without a position table runs past the context; the cut changes its ids
        assert not torch.equal(got, uncached_greedy(m, ids, 30))


@pytest.mark.parametrize("name", ["learned", "alibi", "mla"])
def test_a_padded_batch_continues_each_prompt_as_alone_past_the_context(name):
    m = short_context_model(name)
    prompts = [[5, 9, 2, 7, 1, 3, 8, 4, 6, 10, 12, 14, 16, 1], [4, 4], [11, 3, 6, 2]]  # one longer than CTX
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    together = generate(m, ids, max_new_tokens=25, attention_mask=mask)
    for row, p in enumerate(prompts):
        alone = windowed_greedy(m, torch.tensor([p]), 25, CTX)
        assert together[row, width:].tolist() == alone[0, len(p) :].tolist(), row


def test_top_k_1_sampling_is_greedy():
    m, ids = model("rope-gqa"), prompt()
    g = torch.Generator().manual_seed(0)
    assert torch.equal(generate(m, ids, 20, temperature=1.5, top_k=1, generator=g), generate(m, ids, 20))


def test_sampling_is_reproducible_and_stays_in_top_k():
    m, ids = model("learned"), prompt()

    def run(seed):
        return generate(m, ids, 30, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(seed))

    first = run(0)
    assert torch.equal(first, run(0))
    assert not torch.equal(first, run(1))
    with torch.no_grad():
        logits = m(first[:, :-1])  # logits[:, t] predict token t + 1
    top3 = logits[:, 4:].topk(3, dim=-1).indices  # the positions that produced the 30 new tokens
    chosen = first[:, 5:]
    assert (top3 == chosen[..., None]).any(-1).all()
    assert (chosen != top3[..., 0]).any()  # sampling did leave the argmax sometimes


def test_temperature_and_top_k_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    n, g = 40000, torch.Generator().manual_seed(0)
    for temperature, top_k in [(0.5, None), (2.0, None), (1.0, 2)]:
        draws = next_token(logits.expand(n, 4), temperature, top_k, g).flatten()
        freq = torch.bincount(draws, minlength=4).float() / n
        scaled = logits / temperature
        if top_k:
            scaled[top_k:] = float("-inf")  # logits are sorted: the top k come first
        expected = torch.softmax(scaled, dim=-1)
        assert torch.allclose(freq, expected, atol=0.012), (temperature, top_k, freq, expected)
        if top_k:
            assert freq[top_k:].sum() == 0


def test_bad_arguments_are_refused_before_work():
    m = model("learned")
    with pytest.raises(ConfigError, match="max_new_tokens=-1"):  # any count >= 0 is fine, past the context too
        generate(m, prompt(), max_new_tokens=-1)
    with pytest.raises(ConfigError, match="top_k=0"):
        generate(m, prompt(), 3, temperature=1.0, top_k=0)
    for temperature in (-1.0, math.inf, math.nan):
        with pytest.raises(ConfigError, match=f"temperature={temperature}"):
            generate(m, prompt(), 3, temperature=temperature)
    with pytest.raises(ConfigError, match="prompt_ids=96"):
        generate(m, torch.tensor([[1, 96]]), 3)
    assert torch.equal(generate(m, prompt(), 0), prompt())


@pytest.fixture
def saved(tmp_path):
    m = build_model(compose_model(["model=nano", "model.n_layer=1", "model.context_length=64"]))
    randomize(m, seed=2)
    with_tok = save_weights(
        m, tmp_path / "tok.safetensors", metadata={"archlab_tokenizer": json.dumps(ByteTokenizer().to_dict())}
    )
    without = save_weights(m, tmp_path / "plain.safetensors")
    return with_tok, without


def test_cli_generates_text_from_a_file_with_a_tokenizer(saved):
    path, _ = saved
    text = "Hi, there: 'x'"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "archlab.cli.generate",
            f"ckpt={path}",
            f"prompt={text}",
            "max_new_tokens=12",
            "temperature=0",
        ],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )
    assert result.returncode == 0, result.stderr.decode()
    tok = ByteTokenizer()
    expected = generate(load_weights(path), torch.tensor([tok.encode(text)]), 12)[0].tolist()
    assert result.stdout.decode("utf-8") == tok.decode(expected) + "\n"


@pytest.mark.parametrize("ckpt", ["ckpt={}", "{}"])  # a bare path is the ckpt
def test_cli_prints_ids_without_a_tokenizer(saved, capsys, ckpt):
    _, path = saved
    settings = ["prompt_ids=[1,2,3]", "max_new_tokens=8", "temperature=0.8", "top_k=50", "seed=0"]
    generate_main([*settings[:2], ckpt.format(path), *settings[2:]])
    printed = json.loads(capsys.readouterr().out)
    g = torch.Generator().manual_seed(0)
    expected = generate(load_weights(path), torch.tensor([[1, 2, 3]]), 8, temperature=0.8, top_k=50, generator=g)
    assert printed == expected[0].tolist()


def test_cli_takes_a_run_a_checkpoint_and_an_export_as_eval_and_export_do(saved, tmp_path, capsys):
    """A run directory (its model.safetensors), one of its checkpoints (the run's tokenizer) and its
    archlab-export directory continue a text prompt as the safetensors file they hold does."""
    pytest.importorskip("transformers")
    from archlab.cli.export import main as export
    from archlab.config.model import model_config_dict

    path, _ = saved
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "model.safetensors").write_bytes(path.read_bytes())
    m = load_weights(path)
    state = {f"model.{k}": v for k, v in m.state_dict().items()}
    ckpt = run / "checkpoints" / "last.ckpt"
    torch.save({"hyper_parameters": {"model": model_config_dict(m.cfg)}, "state_dict": state}, ckpt)
    export([str(run), f"out={tmp_path / 'hf'}"])
    capsys.readouterr()
    tok = ByteTokenizer()
    expected = tok.decode(generate(m, torch.tensor([tok.encode("To be")]), 12)[0].tolist())
    for source in (path, run, ckpt, tmp_path / "hf"):
        generate_main([str(source), "prompt=To be", "max_new_tokens=12", "temperature=0"])
        assert capsys.readouterr().out == expected + "\n", source


def test_cli_generates_past_the_context(saved, capsys):
    """The saved model's context is 64 tokens: 100 new ones after a 3-token prompt (docs/generation.md
    asks for 200 after training with data.seq_len=64)."""
    _, path = saved
    generate_main([str(path), "prompt_ids=[1,2,3]", "max_new_tokens=100", "temperature=0"])
    printed = json.loads(capsys.readouterr().out)
    m = load_weights(path)
    assert m.cfg.context_length == 64 and len(printed) == 103
    assert printed == windowed_greedy(m, torch.tensor([[1, 2, 3]]), 100, 64)[0].tolist()


def test_settings_keep_text_verbatim_and_read_the_rest_as_yaml():
    cfg = parse_settings(["out/model.safetensors", "prompt=a=b, ${x}: 'y'", "top_k=5", "seed=null", "device=cpu"])
    assert (cfg.ckpt, cfg.prompt, cfg.top_k, cfg.seed) == ("out/model.safetensors", "a=b, ${x}: 'y'", 5, None)
    for args, message in [
        (["a.safetensors", "--top_k=3"], "--top_k='3' is invalid: allowed key=value with a key among"),
        (["a.safetensors", "b.safetensors"], "ckpt='b.safetensors' is invalid: allowed one value for ckpt"),
        (["ckpt=a.safetensors", "b.safetensors"], "ckpt='b.safetensors' is invalid: allowed one value for ckpt"),
        (["top_k=3", "top_k=4"], "top_k='4' is invalid: allowed one value for top_k (also given as '3')"),
        (["prompt_ids=[1,"], "prompt_ids='[1,' is invalid: allowed a value of type list of int or null"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_settings(args)
        assert str(err.value).startswith(message), err.value


@pytest.mark.parametrize(
    "args, message",
    [
        (["prompt=hi"], "prompt='hi' is invalid: allowed prompt_ids=[...] instead: "),
        (["prompt_ids=[1,2]", "max_new_tokens=abc"], "max_new_tokens='abc' is invalid: allowed a value of type int"),
        (["prompt_ids=[1,2]", "colour=red"], "colour='red' is invalid"),
        (["prompt_ids=[1,2]", "max_new_tokens=-1"], "max_new_tokens=-1 is invalid: allowed an integer >= 0"),
        (["prompt_ids=[]"], "prompt_ids=[] is invalid: allowed a prompt of at least one token"),
        (
            ["prompt_ids=[1]", "seed=99999999999999999999"],
            "seed=99999999999999999999 is invalid: allowed null or an integer",
        ),
        (["prompt_ids=[1]", "device=tpu"], "device='tpu' is invalid: allowed cpu, cuda or cuda:<index>"),
        pytest.param(
            ["prompt_ids=[1]", "device=cuda"],
            "device='cuda' is invalid: allowed cpu: this machine has no CUDA GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present"),
        ),
    ],
)
def test_cli_refuses_bad_settings(saved, capsys, args, message):
    _, path = saved
    with pytest.raises(SystemExit) as exit:
        generate_main([f"ckpt={path}", *args])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_a_file_that_is_not_an_archlab_export(saved, tmp_path, capsys):
    """Not safetensors at all, cut short, or safetensors from elsewhere: one line naming ckpt, no traceback."""
    from safetensors.torch import save_file

    with_tok, _ = saved
    (tmp_path / "notes.txt").write_text("not weights")
    (tmp_path / "cut.safetensors").write_bytes(with_tok.read_bytes()[:100])
    save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    for name, reason in [
        ("notes.txt", "a run directory, a training checkpoint (.ckpt) or a safetensors file"),
        ("cut.safetensors", "this one does not read"),
        ("other.safetensors", "has no 'archlab_model_config' metadata"),
    ]:
        with pytest.raises(SystemExit) as exit:
            generate_main([f"ckpt={tmp_path / name}", "prompt_ids=[1]"])
        err = capsys.readouterr().err
        assert (
            exit.value.code == 2 and err.startswith(f"error: ckpt='{tmp_path / name}' is invalid") and reason in err
        ), err
        assert len(err.strip().splitlines()) == 1


def test_cli_refuses_an_empty_text_prompt(saved, capsys):
    with_tok, _ = saved
    with pytest.raises(SystemExit) as exit:
        generate_main([f"ckpt={with_tok}", "prompt="])
    assert (
        exit.value.code == 2
        and "prompt='' is invalid: allowed a prompt of at least one token" in capsys.readouterr().err
    )


# ---- left-padded batches and their attention mask


def left_padded(prompts, pad=0):
    """A batch of prompts of different lengths, padded on the left, and its attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize(
    "overrides",
    [
        {"position": {"kind": "learned"}},
        {"position": {"kind": "sinusoidal"}},
        {"position": {"kind": "rope"}, "attention": {"n_kv_head": 2}},
        {"position": {"kind": "alibi"}},
        {"position": {"kind": "rope"}, "attention": {"window": 3, "softcap": 5.0}, "layers": EVERY_OTHER_GLOBAL},
    ],
    ids=["learned", "sinusoidal", "rope-gqa", "alibi", "window-softcap"],
)
def test_a_padded_batch_computes_each_prompt_as_alone(overrides):
    """Left padding plus its attention mask: every row's logits at its real tokens, and its greedy
    continuation, equal those of its prompt run alone."""
    cfg = plain(**overrides, context_length=32)
    model = build(cfg)
    prompts = [[5, 9, 2, 7, 1, 3, 8], [4, 4], [11, 3, 6, 2]]
    ids, mask = left_padded(prompts)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            alone = model(torch.tensor([prompt]))
            torch.testing.assert_close(batch[row, -len(prompt) :], alone[0], rtol=1e-9, atol=1e-9)
    together = generate(model, ids, max_new_tokens=12, attention_mask=mask)
    for row, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), max_new_tokens=12)
        assert together[row, ids.shape[1] :].tolist() == alone[0, len(prompt) :].tolist()


def test_generate_refuses_a_mask_of_another_shape():
    model = build(plain())
    with pytest.raises(ConfigError, match="attention_mask"):
        generate(model, torch.ones(2, 4, dtype=torch.long), 3, attention_mask=torch.ones(2, 5))
