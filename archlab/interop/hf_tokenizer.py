"""archlab's tokenizers (char, byte, bpe) as Hugging Face fast tokenizers that give the same ids for the
same text and decode them to the same text, so ``AutoTokenizer`` loads an exported model's vocabulary.

Each becomes a ``tokenizers`` library Tokenizer (the tokenizer.json format): char, a word-level vocabulary
over single characters (an unknown character fails, as archlab's does); byte, a byte-level BPE without
merges whose ids are the byte values; bpe, archlab's own Tokenizer, which is already one. None has
special tokens: archlab's tokenizers add none.
"""

from __future__ import annotations

from typing import Any

from archlab.tokenizer import BPETokenizer, ByteTokenizer, CharTokenizer


def byte_symbols() -> dict[int, str]:
    """The printable character the byte-level pre-tokenizer maps each byte to (GPT-2's bytes_to_unicode):
    the printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` that encodes and decodes exactly as archlab's ``tokenizer``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if isinstance(tokenizer, BPETokenizer):
        return Tokenizer.from_str(tokenizer.tok.to_str())  # a copy: the caller may change it
    if isinstance(tokenizer, CharTokenizer):
        tok = Tokenizer(models.WordLevel(dict(tokenizer.index), unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
        tok.decoder = decoders.Fuse()  # joined without spaces
        return tok
    if isinstance(tokenizer, ByteTokenizer):
        tok = Tokenizer(models.BPE({s: b for b, s in byte_symbols().items()}, []))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()  # invalid UTF-8 decodes to U+FFFD, as errors="replace" does
        return tok
    raise TypeError(f"no Hugging Face form for the tokenizer {type(tokenizer).__name__}")


def to_hf_tokenizer(tokenizer: Any, model_max_length: int) -> Any:
    """A ``transformers.PreTrainedTokenizerFast`` of ``tokenizer`` (``save_pretrained`` writes tokenizer.json
    and tokenizer_config.json); ``model_max_length`` is the model's context. Decoding leaves spaces as
    they are (``clean_up_tokenization_spaces`` off), as archlab's decode does."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=backend(tokenizer), clean_up_tokenization_spaces=False, model_max_length=model_max_length
    )
