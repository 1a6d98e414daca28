"""Token ids to display text, with the model's own tokenizer, computed once at build time.

Each distinct id is decoded once. A byte-level BPE token can hold part of a UTF-8 character and
decodes alone to U+FFFD; a run of such tokens is decoded together and its text is shown on the
run's first token, so the page reads exactly like ``tokenizer.decode(chain)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"


class TokenText:
    """``table(ids)`` gives id -> text; ``fixups(ids, table)`` repairs split UTF-8 characters."""

    def __init__(self, tokenizer: Any, name: str, vocab_size: int = 0):
        self._tok = tokenizer  # tokenizers.Tokenizer, a transformers tokenizer, or None (ids only)
        self.name = name
        self.vocab_size = vocab_size

    @classmethod
    def load(cls, model_dir: Path | None) -> TokenText:
        """The tokenizer of ``model_dir`` (``tokenizer.json`` directly, else ``transformers``);
        ``None`` shows ids instead of text."""
        if model_dir is None:
            return cls(None, "none (token ids only)")
        model_dir = Path(model_dir)
        if (model_dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            return cls(tok, model_dir.name, tok.get_vocab_size(with_added_tokens=True))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        return cls(tok, model_dir.name, len(tok))

    def _decode(self, seqs: list[list[int]]) -> list[str]:
        if hasattr(self._tok, "decode_batch"):  # tokenizers.Tokenizer
            return self._tok.decode_batch(seqs, skip_special_tokens=False)
        return self._tok.batch_decode(seqs, skip_special_tokens=False)

    def table(self, ids: Iterable[int]) -> dict[int, str]:
        unique = sorted(set(ids))
        if self._tok is None:
            return {i: f"⟨{i}⟩" for i in unique}
        known = [i for i in unique if 0 <= i < self.vocab_size]
        texts = dict(zip(known, self._decode([[i] for i in known]), strict=True))
        return {i: texts.get(i, f"⟨unknown id {i}⟩") for i in unique}

    def fixups(self, ids: Sequence[int], table: dict[int, str]) -> dict[int, str]:
        """Position -> text for runs of tokens that decode to U+FFFD alone but not together."""
        if self._tok is None:
            return {}
        fixed: dict[int, str] = {}
        n, i = len(ids), 0
        while i < n:
            if REPLACEMENT not in table[ids[i]]:
                i += 1
                continue
            j = i
            while j < n and REPLACEMENT in table[ids[j]]:
                j += 1
            if j - i > 1:
                joint = self._decode([list(ids[i:j])])[0]
                if joint.count(REPLACEMENT) < sum(table[t].count(REPLACEMENT) for t in ids[i:j]):
                    fixed[i] = joint
                    fixed.update(dict.fromkeys(range(i + 1, j), ""))
            i = j
        return fixed
