"""Text <-> token ids for the text data, prepared shards and generation: char, byte, local BPE, or a
pretrained ``tokenizer.json`` (held as a ``bpe``: both are a ``tokenizers`` library Tokenizer).

A tokenizer serialises to a small JSON dict (``to_dict``) that travels in safetensors metadata and
beside token shards, so ``archlab-generate`` decodes with exactly the vocabulary a model was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from archlab.errors import ConfigError
from archlab.registry import Registry

# kind -> tokenizer class; each has fit(text, vocab_size), from_dict(spec), to_dict(), encode(), decode()
TOKENIZERS: Registry[type] = Registry("tokenizer", ("fit", "from_dict", "to_dict", "encode", "decode"))
SHOWN = 10  # unseen characters an error lists (it counts the rest)


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
            more = f" and {len(missing) - SHOWN} more ({len(missing)} in all)" if len(missing) > SHOWN else ""
            raise ValueError(f"characters not in the vocabulary: {missing[:SHOWN]!r}{more}")
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
    """A ``tokenizers`` library Tokenizer: a byte-level BPE trained locally (no downloads), or a pretrained
    one read from its ``tokenizer.json`` (``load``)."""

    kind = "bpe"

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer

    @classmethod
    def fit(cls, text: str | Iterable[str], vocab_size: int, special_tokens: Sequence[str] = ()) -> BPETokenizer:
        """Trained on ``text``, or on each text of an iterable (a corpus's documents); ``special_tokens``
        take the first ids."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=list(special_tokens),
            show_progress=False,
        )
        tok.train_from_iterator([text] if isinstance(text, str) else text, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: Path, field: str) -> BPETokenizer:
        """The tokenizer a ``tokenizer.json`` holds; ConfigError naming ``field`` when it holds none."""
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # the library raises a bare Exception for any file it cannot read
            raise ConfigError(field, str(path), f"a tokenizer.json the tokenizers library reads ({err})") from None

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


EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")  # the usual names of a special EOS token


def end_of_document(tokenizer: BPETokenizer, file: Path, eos: Optional[str]) -> tuple[str, int]:
    """The token, and its id, that ends each document: ``eos`` when given, else the EOS the model directory
    of ``file`` declares (``tokenizer_config.json``'s ``eos_token``, a ``config.json`` or
    ``generation_config.json`` ``eos_token_id``), else a special token named as EOS tokens usually are."""
    tok = tokenizer.tok

    def declared_by(name: str, key: str) -> Any:
        """``key`` of the JSON object in the file ``name`` beside ``file``; None where any is missing."""
        try:
            found = json.loads((file.parent / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return found.get(key) if isinstance(found, dict) else None

    if eos is not None:
        index = tok.token_to_id(eos)
        if index is None:
            raise ConfigError("eos", eos, f"a token of the vocabulary of {file}")
        return eos, index
    declared = declared_by("tokenizer_config.json", "eos_token")
    declared = declared.get("content") if isinstance(declared, dict) else declared
    if isinstance(declared, str) and tok.token_to_id(declared) is not None:
        return declared, tok.token_to_id(declared)
    for name in ("config.json", "generation_config.json"):
        index = declared_by(name, "eos_token_id")
        index = index[0] if isinstance(index, list) and index else index
        if isinstance(index, int) and tok.id_to_token(index) is not None:
            return tok.id_to_token(index), index
    specials = {added.content for added in tok.get_added_tokens_decoder().values() if added.special}
    for name in EOS_TOKENS:
        if name in specials:
            return name, tok.token_to_id(name)
    raise ConfigError(
        "eos",
        eos,
        f"a token to end each document: {file} declares no EOS (no eos_token in a tokenizer_config.json beside "
        f"it, no special token among {list(EOS_TOKENS)}); name one of its tokens with eos=",
    )


def tokenizer_from_dict(spec: dict[str, Any]):
    """Inverse of ``to_dict``."""
    return TOKENIZERS.get(spec.get("kind")).from_dict(spec)
