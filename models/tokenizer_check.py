"""The tokenizer my_ops.hf builds for each real model's GGUF file against llama.cpp's own on the same file
(`llama-tokenize`, built from the pinned source by models/llama_cpp.py): the ids of examples/alice_chapter1.txt,
examples/alice_chapters1_3.txt (Gemma 3's perplexity text) and examples/varied_text.txt (prose in twenty languages,
numbers, code, markup, whitespace runs, emoji), whole and line by line, must be equal; and each whole text as a
perplexity reads it (special tokens' names left as text, as llama-perplexity tokenizes its file) equal to
`llama-tokenize --no-parse-special`'s. The `real` mode runs it; the suite checks the same tokenizers against
llama.cpp's algorithm written out in Python (tests/test_gguf_tokenizer.py).

    python -m models.tokenizer_check [--models smollm2,gemma3]
"""

from __future__ import annotations

import argparse
import os
import sys

from flow import REPO_ROOT

TEXTS = [os.path.join(REPO_ROOT, "examples", name)
         for name in ("alice_chapter1.txt", "varied_text.txt", "alice_chapters1_3.txt")]


def model_files() -> dict:
    from models.real_models import gemma3_path, gguf_path

    return {"smollm2": gguf_path, "gemma3": gemma3_path}


def differences(path: str) -> tuple[int, list[str]]:
    """(texts compared, one line per text whose ids differ from llama-tokenize's)."""
    from models.llama_cpp import tokenize
    from my_ops.hf import gguf_tokenizer
    from my_ops.hf.text import perplexity_ids

    tokenizer, add_bos = gguf_tokenizer.load(path)
    bos = [tokenizer.bos_token_id] if add_bos else []
    cases, seen = [], set()  # (what, our ids, llama-tokenize's); a line two texts share (chapter one's) once
    for name in TEXTS:
        with open(name, encoding="utf-8") as f:
            text = f.read()
        for piece in [text] + [line for line in text.splitlines() if line and line not in seen]:
            seen.add(piece)
            cases.append((repr(piece[:60]), bos + tokenizer.encode(piece, add_special_tokens=False),
                          tokenize(path, piece)))
        cases.append((f"{os.path.basename(name)} as a perplexity reads it",
                      perplexity_ids(tokenizer, text, bos[0] if bos else None), tokenize(path, text, False)))
    wrong = []
    for what, ours, theirs in cases:
        if ours != theirs:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            wrong.append(f"{what}...: from token {at}, ours {ours[at:at + 5]}, llama.cpp's {theirs[at:at + 5]}")
    return len(cases), wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(model_files()), help=f"of {', '.join(model_files())}")
    args = parser.parse_args()
    from models.decoding import chosen

    if (names := chosen(args.models, model_files(), "model")) is None:
        return 2
    failed = False
    for name in names:
        path = model_files()[name]()
        count, wrong = differences(path)
        print(f"{os.path.basename(path)}: {count - len(wrong)} of {count} texts give llama-tokenize's ids")
        for line in wrong:
            print(f"  {line}")
        failed |= bool(wrong)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
