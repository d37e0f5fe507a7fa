"""The tokenizer an exported model needs, from the run's token folder (data_scripts/tokenize_corpus.py).

  byte   ids 0..255 are the UTF-8 bytes themselves. Written as a byte-level BPE with no merges: GPT-2's
         byte-to-character table maps each byte to one symbol, whose id is the byte, so `encode(text)`
         is exactly `list(text.encode())` (tested). Id 256, the data's [MASK], is the one special token.
  bpe    the folder's tokenizer.json (byte-level BPE trained by data_scripts/), with its [MASK].
  gpt2   the folder's tokenizer.json: GPT-2's own 50,257 tokens; <|endoftext|> is its end of text.

transformers and lm-evaluation-harness want an end-of-text token. GPT-2's is <|endoftext|>; our byte and
bpe corpora have none, so [MASK] (an id a causal LM never sees in training) is declared as it: generation
then stops only at its length limit. accellib.evaluate scores these corpora after a newline instead.
"""
from __future__ import annotations

from pathlib import Path

MASK = "[MASK]"


def byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table: printable Latin-1 bytes stand for
    themselves, the other 68 bytes take the characters from U+0100 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer():
    """A `tokenizers.Tokenizer` whose ids are the bytes of the text, plus [MASK] = 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {c: b for b, c in byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([MASK])  # takes the next id: 256
    return tok


def hf_tokenizer(data_path: str | Path, m) -> tuple[object | None, str | None, str | None]:
    """(transformers PreTrainedTokenizerFast, its kind, None) for the run's data folder, or (None, None,
    why) when the folder cannot give one: `why` says what is missing, to finish "no tokenizer: ..."."""
    import json
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer
    data_path = Path(data_path)
    if not data_path.is_dir():
        return None, None, f"the data folder {data_path} does not exist"
    try:
        meta = json.loads((data_path / "meta.json").read_text())
        kind = meta["tokenizer"]
    except Exception as e:
        return None, None, f"{data_path / 'meta.json'} cannot be read ({type(e).__name__})"
    try:
        tok = byte_tokenizer() if kind == "byte" else Tokenizer.from_file(str(data_path / "tokenizer.json"))
    except Exception as e:
        return None, None, f"{data_path / 'tokenizer.json'} cannot be read ({type(e).__name__})"
    eos = "<|endoftext|>" if kind == "gpt2" else MASK
    if tok.token_to_id(eos) is None:
        return None, None, f"the {kind} tokenizer of {data_path} has no {eos} token"
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos,
                                   model_max_length=m.seq_len), kind, None
