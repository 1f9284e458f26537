"""Text <-> token ids for the text data, prepared shards and generation: char, byte or local BPE.

A tokenizer serialises to a small JSON dict (``to_dict``) that travels in safetensors metadata and
beside token shards, so ``archlab-generate`` decodes with exactly the vocabulary a model was trained on.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from archlab.registry import Registry

# kind -> tokenizer class; each has fit(text, vocab_size), from_dict(spec), to_dict(), encode(), decode()
TOKENIZERS: Registry[type] = Registry("tokenizer", ("fit", "from_dict", "to_dict", "encode", "decode"))


@TOKENIZERS.register("char")
class CharTokenizer:
    """One id per distinct character of the training text, in sorted order (nanoGPT's shakespeare_char)."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        self.chars = "".join(sorted(set(chars)))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def fit(cls, text: str, vocab_size: Optional[int] = None) -> CharTokenizer:
        """The vocabulary is the text's characters: ``vocab_size`` is not a choice."""
        return cls(text)

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> CharTokenizer:
        return cls(spec["chars"])

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        missing = sorted(set(text) - self.index.keys())
        if missing:
            raise ValueError(f"characters not in the vocabulary: {missing[:10]!r}")
        return [self.index[c] for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": self.chars}


@TOKENIZERS.register("byte")
class ByteTokenizer:
    """The 256 byte values of UTF-8 text: no fitting, any text."""

    kind = "byte"
    vocab_size = 256

    @classmethod
    def fit(cls, text: str, vocab_size: Optional[int] = None) -> ByteTokenizer:
        return cls()

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> ByteTokenizer:
        return cls()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


@TOKENIZERS.register("bpe")
class BPETokenizer:
    """Byte-level BPE trained locally with the ``tokenizers`` library (no downloads)."""

    kind = "bpe"

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer

    @classmethod
    def fit(cls, text: str, vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        tok.train_from_iterator([text], trainer=trainer)
        return cls(tok)

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(spec["tokenizer"]))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(list(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokenizer": self.tok.to_str()}


def tokenizer_from_dict(spec: dict[str, Any]):
    """Inverse of ``to_dict``."""
    return TOKENIZERS.get(spec.get("kind")).from_dict(spec)
