"""archlab's tokenizers (char, byte, bpe) as Hugging Face fast tokenizers that give the same ids for the
same text and decode them to the same text, so ``AutoTokenizer`` loads an exported model's vocabulary.

Each becomes a ``tokenizers`` library Tokenizer (the tokenizer.json format): char, a word-level vocabulary
over single characters (an unknown character fails, as archlab's does); byte, a byte-level BPE without
merges whose ids are the byte values; bpe, archlab's own Tokenizer, which is already one. None adds
special tokens to a text; the EOS that ended the run's documents is named as the tokenizer's ``eos_token``
where naming it changes no encoding (``eos_token``).
"""

from __future__ import annotations

from typing import Any, Optional

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


def eos_token(tokenizer: Any, eos_id: Optional[int]) -> Optional[str]:
    """The token of ``eos_id`` where Hugging Face may hold it as its special ``eos_token``: one the text is
    already split at (a BPE's added token, a character of a char vocabulary), so that marking it special
    changes no encoding. None for a byte or a merged BPE token (transformers would match its symbol, "Ċ" for
    a newline, in the text): config.json's ``eos_token_id`` alone names those."""
    if eos_id is None:
        return None
    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.chars[eos_id] if eos_id < tokenizer.vocab_size else None
    if isinstance(tokenizer, BPETokenizer):
        added = tokenizer.tok.get_added_tokens_decoder().get(eos_id)
        return added.content if added is not None else None
    return None


def to_hf_tokenizer(tokenizer: Any, model_max_length: int, eos_id: Optional[int] = None) -> Any:
    """A ``transformers.PreTrainedTokenizerFast`` of ``tokenizer`` (``save_pretrained`` writes tokenizer.json
    and tokenizer_config.json); ``model_max_length`` is the model's context, ``eos_id`` the EOS of its data
    (its ``eos_token`` where ``eos_token`` allows one). Decoding leaves spaces as they are
    (``clean_up_tokenization_spaces`` off), as archlab's decode does."""
    from transformers import PreTrainedTokenizerFast

    token = eos_token(tokenizer, eos_id)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend(tokenizer),
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        **({} if token is None else {"eos_token": token}),
    )
