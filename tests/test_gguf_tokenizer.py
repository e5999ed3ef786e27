"""my_ops.hf.gguf_tokenizer: a GGUF file's SentencePiece-style vocabulary as a `tokenizers` tokenizer, checked against
llama.cpp's algorithm written out step for step (tests/spm_reference.py): on random vocabularies and texts that reach
every rule (the special-token partition, the space prefix, merges by score, byte fallback), and on Gemma 3's file with
a few thousand words of varied text; and SmolLM2's pre-tokenizer against llama.cpp's. Against llama.cpp's own
`llama-tokenize`: `python -m models.tokenizer_check` (the `real` mode)."""

import os
import random

import pytest

from flow import REPO_ROOT
from spm_reference import SpmReference

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
TEXTS = [os.path.join(REPO_ROOT, "examples", name) for name in ("alice_chapter1.txt", "varied_text.txt")]


@pytest.fixture(scope="module")
def gguf_tokenizer(aot_ops, python_ops):
    """my_ops.hf.gguf_tokenizer: importing the my_ops package registers the ops, so once they are built and loaded."""
    from my_ops.hf import gguf_tokenizer

    return gguf_tokenizer


def random_vocabulary(rng: random.Random, space_prefix: bool) -> dict:
    """A small vocabulary in a GGUF header's form: control, unknown, user-defined and byte tokens, and normal tokens
    over a few characters (one character, é, is no token: it falls back to bytes) with distinct random scores."""
    letters = ["a", "b", "c", "\u2581"]
    pieces = set(letters)
    while len(pieces) < 60:
        pieces.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 6))))
    pieces = sorted(pieces)
    tokens = ["<unk>", "<s>", "</s>", "<ctl>", "  ", "<u>", "ab c"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, USER_DEFINED, USER_DEFINED, USER_DEFINED] + [BYTE] * 256
    types += [NORMAL] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(s) for s in rng.sample(range(10_000), len(pieces))]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": space_prefix}


def reference(metadata: dict) -> SpmReference:
    return SpmReference(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.scores"],
                        metadata["tokenizer.ggml.token_type"], bos=metadata["tokenizer.ggml.bos_token_id"],
                        add_bos=metadata["tokenizer.ggml.add_bos_token"],
                        add_space_prefix=metadata["tokenizer.ggml.add_space_prefix"])


@pytest.mark.parametrize("space_prefix", [False, True], ids=["no space prefix", "space prefix"])
@pytest.mark.parametrize("seed", range(4))
def test_random_vocabularies_split_random_text_as_llama_cpp_does(seed, space_prefix, gguf_tokenizer):
    rng = random.Random(seed)
    metadata = random_vocabulary(rng, space_prefix)
    tokenizer, expected = gguf_tokenizer.build(metadata), reference(metadata)
    pieces = ["a", "b", "c", " ", "  ", "é", "ab", "ba", "<s>", "<ctl>", "<u>", "ab c", "\n", "abc", "cab"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        assert tokenizer.encode(text).ids == expected.encode(text), repr(text)


@pytest.mark.parametrize("add_bos, space_prefix", [(True, False), (False, True)],
                         ids=["BOS, no space prefix", "no BOS, space prefix"])
def test_a_vocabulary_written_by_ggufs_own_writer_is_read_field_by_field(add_bos, space_prefix, gguf_tokenizer,
                                                                         tmp_path):
    # The keys as the gguf package writes them (its GGUFWriter, typed arrays and scalars), read back by load() from the
    # file alone: the tokens, scores and token types (the splits equal the reference built from the values written),
    # the BOS and unknown ids (the tokens they name), add_bos_token and add_space_prefix (each seen in the splits).
    import gguf

    metadata = random_vocabulary(random.Random(7), space_prefix)
    metadata["tokenizer.ggml.add_bos_token"] = add_bos
    path = tmp_path / "vocabulary.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_scores(metadata["tokenizer.ggml.scores"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(metadata["tokenizer.ggml.bos_token_id"])
    writer.add_unk_token_id(metadata["tokenizer.ggml.unknown_token_id"])
    writer.add_add_bos_token(add_bos)
    writer.add_add_space_prefix(space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    tokenizer, starts_with_bos = gguf_tokenizer.load(str(path))
    assert starts_with_bos == add_bos
    assert (tokenizer.bos_token, tokenizer.unk_token) == ("<s>", "<unk>")
    expected = reference(metadata)
    for text in ("ab c", "abc cab ba", " a b", "é<ctl>a", "<s>cab  c", ""):
        ids = tokenizer(text).input_ids
        assert ids == expected.encode(text), repr(text)
        assert (ids[:1] == [1]) == (add_bos or text.startswith("<s>")), repr(text)
    prefixed = tokenizer("a", add_special_tokens=False).input_ids
    assert (tokenizer.convert_ids_to_tokens(prefixed)[0][0] == "\u2581") == space_prefix


def test_a_vocabulary_with_tied_normal_scores_is_refused_by_name(gguf_tokenizer):
    metadata = random_vocabulary(random.Random(0), False)
    scores = metadata["tokenizer.ggml.scores"]
    scores[-1] = scores[-2]
    with pytest.raises(ValueError, match="two normal tokens the same score"):
        gguf_tokenizer.build(metadata)


def test_a_damaged_vocabulary_is_refused_by_name(gguf_tokenizer):
    metadata = random_vocabulary(random.Random(0), False)
    for key, value, message in (("tokenizer.ggml.bos_token_id", 10**6, "bos_token_id is 1000000, outside"),
                                ("tokenizer.ggml.scores", None, "the file has no tokenizer.ggml.scores"),
                                ("tokenizer.ggml.token_type", [1], "323 tokens, 323 scores and 1 types")):
        damaged = {k: v for k, v in metadata.items() if not (k == key and value is None)}
        if value is not None:
            damaged[key] = value
        with pytest.raises(ValueError, match=message):
            gguf_tokenizer.build(damaged)


@pytest.fixture(scope="module")
def gemma3(gguf_tokenizer):
    """The file's header, the tokenizer my_ops.hf loads with the model (its `tokenizers` backend), and that tokenizer
    itself (transformers')."""
    from models.real_models import gemma3_path
    from my_ops.hf.gguf_file import check

    path = gemma3_path()  # assembled and hashed once
    header = check(path)
    tokenizer, add_bos = gguf_tokenizer.from_file(path, header, None)  # what load() makes of this file
    assert add_bos
    return header.metadata, tokenizer.backend_tokenizer, tokenizer


def test_gemma3s_vocabulary_splits_varied_text_as_llama_cpp_does(gemma3):
    metadata, tokenizer, _ = gemma3
    expected = reference(metadata)
    words = 0
    for path in TEXTS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        words += len(text.split())
        got = tokenizer.encode(text).ids
        assert got == expected.encode(text), path
        bos = metadata["tokenizer.ggml.bos_token_id"]
        assert got[0] == bos and tokenizer.decode(got[1:], skip_special_tokens=False) == text  # as written
        for line in text.splitlines():  # each line alone: a text's start (BOS, no space prefix) many times over
            assert tokenizer.encode(line).ids == expected.encode(line), repr(line)
    assert words > 3000
    # What llama-tokenize gives for the prompt (its token ids, read off the tool on this file).
    assert tokenizer.encode("The capital of France is").ids == [2, 818, 5279, 529, 7001, 563]


def test_a_perplexity_text_keeps_special_token_names_as_text_as_llama_perplexity_does(gemma3):
    # llama-perplexity tokenizes its file without parsing special tokens: varied_text.txt's "<bos>" and
    # "<start_of_turn>" are text there. Parsed as tokens instead, they scored 1.4% of perplexity on a longer text.
    from my_ops.hf.text import perplexity_ids

    metadata, _, tokenizer = gemma3
    expected = reference(metadata)
    bos = metadata["tokenizer.ggml.bos_token_id"]
    with open(TEXTS[1], encoding="utf-8") as f:
        text = f.read()
    assert "<bos>" in text and "<start_of_turn>" in text
    ids = perplexity_ids(tokenizer, text, bos)
    assert ids == expected.encode(text, parse_special=False)
    assert ids != expected.encode(text) and ids[1:].count(bos) == 0


# llama.cpp's pre-tokenizer of the `smollm` type (llama-vocab.cpp): every number character apart, then GPT-2's regex.
SMOLLM_SPLITS = (r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")


def llama_cpp_pieces(text: str) -> list[str]:
    """llama.cpp's unicode_regex_split: each expression in turn splits every piece into its matches and the text
    between them."""
    import regex

    pieces = [text]
    for expression in SMOLLM_SPLITS:
        split = []
        for piece in pieces:
            at = 0
            for match in regex.finditer(expression, piece):
                split += [piece[at:match.start()]] if match.start() > at else []
                split.append(match.group())
                at = match.end()
            split += [piece[at:]] if at < len(piece) else []
        pieces = split
    return pieces


def byte_level(piece: str) -> str:
    """GPT-2's byte-to-character map: printable Latin-1 bytes stand for themselves, the others from U+0100 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return "".join(table[b] for b in piece.encode())


def test_smollm2s_pre_tokenizer_splits_as_llama_cpps_smollm_type(gguf_tokenizer):
    # transformers' converter applies GPT-2's regex alone: " ¼" stayed one piece, and the ids differed from
    # llama-tokenize's wherever a number character that is not a digit followed a space.
    from models.real_models import gguf_path
    tokenizer, _ = gguf_tokenizer.load(gguf_path())
    pre_tokenizer = tokenizer.backend_tokenizer.pre_tokenizer
    for path in TEXTS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert [p for p, _ in pre_tokenizer.pre_tokenize_str(text)] == [byte_level(p) for p in llama_cpp_pieces(text)]


def test_the_real_modes_long_gemma3_prompt_passes_the_sliding_window(gemma3):
    # The `real` mode's float32 check of Gemma 3 decodes this prompt to show the local layers' window sliding: it must
    # hold more tokens than the window (read from the file) and leave room for the new tokens in the program.
    from models import real_models as real

    metadata, tokenizer, _ = gemma3
    window = metadata["gemma3.attention.sliding_window"]
    tokens = len(tokenizer.encode(real.GEMMA3.prompts[-1][0]).ids)
    assert window < tokens <= real.GEMMA3.max_seq_len - real.NEW_TOKENS, (window, tokens)
