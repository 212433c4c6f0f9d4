"""A deterministic byte-level tokenizer for catalog models (random weights, no tokenizer of their own).

Built with the `tokenizers` library, nothing downloaded: the 256 byte symbols
first, then byte pairs, then byte triples, until every id of the model's
vocabulary has a token, so any id a random model emits decodes to text and
any text encodes. The model's special ids (BOS, EOS, PAD) become special
tokens at those same ids. A simple ChatML-style template makes chat work.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _special_ids(config: dict) -> dict[str, int]:
    """Special token name -> id, for the ids the model config names (first name wins an id)."""
    specials: dict[str, int] = {}
    for name, key in (("</s>", "eos_token_id"), ("<s>", "bos_token_id"), ("<pad>", "pad_token_id")):
        value = config.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and value >= 0 and value not in specials.values():
            specials[name] = value
    return specials


def build_byte_tokenizer(folder: str | Path) -> None:
    """Write tokenizer.json and tokenizer_config.json into a model folder (its config.json sets the sizes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    vocab_size = int(config["vocab_size"])
    specials = _special_ids(config)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: ord(c))
    if vocab_size < len(alphabet) + len(specials):
        raise ValueError(f"{folder}: a vocabulary of {vocab_size} ids cannot hold the 256 byte tokens")

    taken = set(specials.values())
    free_ids = (i for i in range(vocab_size) if i not in taken)
    vocab: dict[str, int] = {name: i for name, i in specials.items()}
    merges: list[tuple[str, str]] = []
    for ch in alphabet:
        vocab[ch] = next(free_ids)
    # Longer tokens: pairs, then a pair plus a byte, in a fixed order.
    pairs = ((a, b) for a, b in itertools.product(alphabet, repeat=2))
    triples = ((a + b, c) for a, b, c in itertools.product(alphabet, repeat=3))
    for left, right in itertools.chain(pairs, triples):
        if len(vocab) >= vocab_size:
            break
        vocab[left + right] = next(free_ids)
        merges.append((left, right))

    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="</s>" if "</s>" in specials else None,
        bos_token="<s>" if "<s>" in specials else None,
        pad_token="<pad>" if "<pad>" in specials else None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=int(config.get("max_position_embeddings", 2048)),
    )
    fast.save_pretrained(folder)
