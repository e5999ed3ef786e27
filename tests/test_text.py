"""my_ops.hf.text's decoding and scoring over a step function, with steps whose answers are known: the sampler (greedy
exact at temperature 0, llama.cpp's chain of top-k, top-p and temperature otherwise, repeatable by seed) and
perplexity by llama-perplexity's protocol (which positions are fed and which are scored, BOS in front of each chunk),
computed by hand here."""

import math

import pytest
import torch


@pytest.fixture(scope="module")
def text(aot_ops, python_ops):
    # my_ops imports only once the checkout's ops are built (the fixtures build them); text.py itself needs torch alone
    from my_ops.hf import text

    return text


def test_temperature_zero_is_the_argmax_whatever_else_is_asked(text):
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    for choose in (text.sampler(0.0, top_k=2, top_p=0.5, seed=1), text.greedy):
        assert choose(logits) == 1


@pytest.mark.parametrize("case", ["first of equal maxima", "a NaN", "bfloat16", "a program's [1, 1, vocab]",
                                  "needs grad", "a strided view"])
def test_greedy_picks_the_token_torch_argmax_picks(text, case):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(49152, generator=generator)
    logits[[7, 40000]] = logits.max() + 1  # two equal maxima: the first one is the choice
    if case == "a NaN":
        logits[[30000, 45000]] = float("nan")
    elif case == "bfloat16":
        logits = logits.bfloat16()
    elif case == "a program's [1, 1, vocab]":
        logits = logits.reshape(1, 1, -1)
    elif case == "needs grad":
        logits.requires_grad_(True)
    elif case == "a strided view":
        logits = torch.stack([logits.flip(0), logits], dim=1)[:, 1]
    assert text.greedy(logits) == int(torch.argmax(logits)), case


def test_sampling_draws_in_proportion_to_the_tempered_probabilities(text):
    probabilities = torch.tensor([0.5, 0.3, 0.15, 0.05])
    choose = text.sampler(1.0, top_k=0, top_p=1.0, seed=0)
    counts = torch.bincount(torch.tensor([choose(probabilities.log()) for _ in range(6000)]), minlength=4)
    assert torch.allclose(counts / 6000, probabilities, atol=0.02), counts
    # temperature 2 flattens them: p^(1/2), normalized
    choose = text.sampler(2.0, top_k=0, top_p=1.0, seed=0)
    counts = torch.bincount(torch.tensor([choose(probabilities.log()) for _ in range(6000)]), minlength=4)
    flat = probabilities.sqrt() / probabilities.sqrt().sum()
    assert torch.allclose(counts / 6000, flat, atol=0.02), counts


def test_top_k_and_top_p_keep_only_the_likeliest_tokens(text):
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    drawn = {text.sampler(1.0, top_k=2, top_p=1.0, seed=s)(logits) for s in range(200)}
    assert drawn == {0, 1}
    # top_p 0.7: 0.5 alone is short of it, 0.5 + 0.3 reaches it: tokens 0 and 1
    drawn = {text.sampler(1.0, top_k=0, top_p=0.7, seed=s)(logits) for s in range(200)}
    assert drawn == {0, 1}
    drawn = {text.sampler(1.0, top_k=0, top_p=0.4, seed=s)(logits) for s in range(50)}
    assert drawn == {0}


def test_a_seed_repeats_a_generation_and_another_seed_changes_it(text):
    logits = torch.randn(50, 100, generator=torch.Generator().manual_seed(0))
    draws = lambda seed: [text.sampler(0.8, top_k=40, top_p=0.95, seed=seed)(row) for row in logits]  # noqa: E731
    assert draws(3) == draws(3)
    assert draws(3) != draws(4)
    with pytest.raises(ValueError, match="top_p in"):
        text.sampler(0.8, top_p=0.0)


class KnownStep:
    """A step whose log-probabilities are known: at position p it gives token t the logit p * t (mod 7), and it records
    what it was fed."""

    def __init__(self, vocab: int = 11):
        self.vocab, self.fed = vocab, []

    def logits(self, position: int) -> torch.Tensor:
        return torch.tensor([float((position * t) % 7) for t in range(self.vocab)])

    def __call__(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.fed.append((tokens.reshape(-1).tolist(), int(position)))
        return self.logits(int(position))[None]


def test_perplexity_by_llama_perplexitys_protocol_scores_the_second_half_of_each_chunk(text):
    # 3 chunks of 8 from 26 tokens (the last 2 left out, as llama-perplexity leaves a partial chunk); each chunk fed
    # from position 0 with its first token replaced by BOS; the logits at positions 4, 5 and 6 score tokens 5, 6, 7.
    ids = [(3 * i + 1) % 11 for i in range(26)]
    step = KnownStep()
    value, scored = text.chunked_perplexity(step, ids, 8, bos=10)
    assert scored == 3 * 3
    assert [tokens for tokens, _ in step.fed][::7] == [[10], [10], [10]]  # each chunk starts with BOS
    assert [position for _, position in step.fed] == list(range(7)) * 3  # the last token of a chunk is never fed
    nll = 0.0
    for chunk in range(3):
        for position in (4, 5, 6):
            nll -= float(torch.log_softmax(step.logits(position).double(), 0)[ids[8 * chunk + position + 1]])
    assert math.isclose(value, math.exp(nll / 9), rel_tol=1e-12)
    assert text.chunked_perplexity(KnownStep(), ids, 8, chunks=1)[1] == 3
    with pytest.raises(ValueError, match="fewer than one chunk"):
        text.chunked_perplexity(KnownStep(), ids[:7], 8)


def test_the_libraries_messages_are_kept_apart_from_what_the_user_is_told(tmp_path, text):  # text: the ops built
    # What a library writes to the process's stderr, from C (fd 2) or Python, goes to the log while the block holds;
    # say() reaches the terminal's stderr; the log goes when the block ends well, stays when it ends in an error.
    import subprocess
    import sys

    from helpers import REPO_ROOT

    code = """
import os, sys
from my_ops.hf import session
with session.libraries_quiet() as log:
    os.write(2, b"[cpuinfo_utils.cpp:71] from C\\n")
    print("a Python warning", file=sys.stderr)
    session.say("for the user")
    print(log)
print("kept" if os.path.exists(log) else "removed")
try:
    with session.libraries_quiet() as log:
        os.write(2, b"before the error\\n")
        raise RuntimeError
except RuntimeError:
    print(open(log).read().strip())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={**__import__("os").environ, "PYTHONPATH": REPO_ROOT}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "for the user\n"
    lines = proc.stdout.splitlines()
    assert lines[1:] == ["removed", "before the error"], proc.stdout
