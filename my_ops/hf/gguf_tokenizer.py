"""A GGUF file's tokenizer, splitting text as llama.cpp does (llama-vocab.cpp); my_ops.hf.checkpoint loads it with
the model, `load(path)` alone.

    tokenizer, add_bos = my_ops.hf.gguf_tokenizer.load("gemma-3-270m-q4_k_m.gguf")   # a PreTrainedTokenizerFast

A GPT-2-style vocabulary (SmolLM2's) comes from transformers' converter, with llama.cpp's pre-tokenizer where it
differs (DIGITS_APART). A SentencePiece-style vocabulary (`tokenizer.ggml.model` "llama": Gemma's, Llama 2's) is
built here (`build`) from the file's tokens, scores and token types: transformers' converter reads Gemma's as a
Unigram model, which splits " capital" into four pieces where llama.cpp gives one. What llama.cpp does, and what
stands for it in the `tokenizers` tokenizer:
- control, unknown and user-defined tokens (Gemma's newline and space runs, HTML tags) are cut out of the raw text
  first, the longest first: added tokens, matched on the raw text (control ones are special: skipped when decoding);
- in the text between them spaces become U+2581 (and, with `add_space_prefix`, one is put in front): the normalizer;
- then, starting from single characters, the adjacent pair whose concatenation is the token with the highest score is
  merged, the leftmost first, until no pair is a token: a BPE model whose merges are every split of every token into
  two tokens, ranked by the whole token's score;
- a character that is no token becomes its UTF-8 bytes' <0xXX> tokens: BPE's byte fallback;
- the BOS token in front when the file says `add_bos_token`: the post-processor.
"""

from __future__ import annotations

import os

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types (gguf's too)
SPACE = "\u2581"


def is_sentencepiece(metadata: dict) -> bool:
    return metadata.get("tokenizer.ggml.model") == "llama"


def merges_by_score(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every way to split a token into two tokens, ranked as llama.cpp merges: by the whole token's score, highest
    first (one token's splits by their pieces' scores, which only breaks ties)."""
    index = {token: i for i, token in enumerate(tokens)}  # the last of equal texts, as llama.cpp's map keeps it
    ranked = []
    for token, i in index.items():
        for cut in range(1, len(token)):
            left, right = index.get(token[:cut]), index.get(token[cut:])
            if left is not None and right is not None:
                ranked.append((-scores[i], -scores[left], -scores[right], tokens[left], tokens[right]))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build(metadata: dict):
    """The `tokenizers.Tokenizer` of a GGUF file's SentencePiece-style vocabulary (its header's metadata, as
    my_ops.hf.gguf_file.check reads it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    missing = [key for key in ("tokens", "scores", "token_type") if f"tokenizer.ggml.{key}" not in metadata]
    if missing:
        raise ValueError(f"the file has no {', '.join('tokenizer.ggml.' + key for key in missing)}: a SentencePiece "
                         "vocabulary needs its tokens, scores and token types")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    scores = list(metadata["tokenizer.ggml.scores"])
    types = list(metadata["tokenizer.ggml.token_type"])
    if not len(tokens) == len(scores) == len(types):
        raise ValueError(f"the vocabulary has {len(tokens)} tokens, {len(scores)} scores and {len(types)} types")
    for key in ("unknown_token_id", "bos_token_id"):
        index = metadata.get(f"tokenizer.ggml.{key}")
        if index is not None and not 0 <= index < len(tokens):
            raise ValueError(f"tokenizer.ggml.{key} is {index}, outside the vocabulary's {len(tokens)} tokens")
    normal_scores = [score for score, kind in zip(scores, types) if kind == NORMAL]
    if len(set(normal_scores)) != len(normal_scores):
        # llama.cpp merges the leftmost of two equally scored pairs; a ranked merge list cannot say "leftmost".
        raise ValueError("the vocabulary gives two normal tokens the same score; only vocabularies whose scores rank "
                         "every normal token (SentencePiece BPE: Gemma's, Llama 2's) are supported")
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    model = BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges_by_score(tokens, scores),
                unk_token=tokens[unknown] if unknown is not None else None, byte_fallback=True)
    tokenizer = Tokenizer(model)
    space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))  # llama.cpp's default for SPM
    steps = [normalizers.Prepend(SPACE)] if space_prefix else []
    tokenizer.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
                          if k == USER_DEFINED])
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
                                  if k in (CONTROL, UNKNOWN)])
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if space_prefix else []))
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if metadata.get("tokenizer.ggml.add_bos_token", True) and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A",
                                                                 pair=f"{tokens[bos]} $A $B",
                                                                 special_tokens=[(tokens[bos], bos)])
    return tokenizer


def load(path: str) -> tuple[object, bool]:
    """A GGUF file's tokenizer alone (no model), as load() builds it, and whether its text starts with BOS. A
    SentencePiece-style vocabulary is read from the header alone (transformers' reader takes tens of seconds on
    Gemma's 262k tokens)."""
    from .gguf_file import check, check_and_parse

    path = os.path.abspath(path)
    header = check(path)
    if is_sentencepiece(header.metadata):
        return from_file(path, header, None)
    return from_file(*check_and_parse(path, header))


def from_file(path: str, header, parsed: dict | None) -> tuple[object, bool]:
    """The tokenizer from the file's vocabulary: `parsed` (transformers' reading of the file) is needed for the
    vocabularies transformers' converter builds, not for a SentencePiece-style one."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.ggml import convert_gguf_tokenizer

    from .swap import UnsupportedModelError

    metadata = header.metadata
    if is_sentencepiece(metadata):
        try:
            backend, extra = build(metadata), {}
        except ValueError as error:
            raise UnsupportedModelError(f"{path}: its tokenizer: {error}") from None
    else:
        backend, extra = convert_gguf_tokenizer(parsed["config"].get("model_type", "llama"), parsed["tokenizer"])
        if metadata.get("tokenizer.ggml.pre") in DIGITS_APART:
            from tokenizers import pre_tokenizers

            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)])
    tokens = metadata["tokenizer.ggml.tokens"]
    # The converter names the beginning-of-text token as the end one; the file says which is which.
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        if (index := metadata.get(f"tokenizer.ggml.{key}_token_id")) is not None and 0 <= index < len(tokens):
            extra[f"{role}_token"] = tokens[index]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=metadata.get("tokenizer.chat_template"),
                                        **extra)
    # llama.cpp's rule: the file's add_bos_token, else true for SentencePiece-style vocabularies (llama-vocab.cpp).
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", is_sentencepiece(metadata))
    return tokenizer, bool(add_bos)


# llama.cpp's pre-tokenizer types that split every number character (\p{N}: digits, and also ¼ or ⅔) from the text
# before GPT-2's regex (llama-vocab.cpp); transformers' converter applies GPT-2's alone, which keeps " ¼" together.
DIGITS_APART = {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva", "mellum2"}
