"""Text in, text out over any step function of a program's signature, step(tokens int64 [1, T], input_pos int64 [1])
-> logits [1, vocab] of the last position (an ExecuTorch method, or the eager module it was exported from): a prompt
(through the model's chat template or as it is) to token ids, decoding (greedy, or sampled as llama.cpp samples) with
the text streamed as it forms, and the perplexity of a text, computed by the program itself: over windows from
position 0, or by llama-perplexity's protocol (chunks, the second half of each scored), to hold against llama.cpp's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def prompt_ids(tokenizer, prompt: str, *, chat: bool = False) -> list[int]:
    """The prompt's token ids: as a user's turn through the model's chat template (`chat`), or as it is."""
    if not chat:
        return list(tokenizer.encode(prompt))
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat: this model's tokenizer has no chat template; give the prompt without --chat")
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def perplexity_ids(tokenizer, text: str, bos: int | None = None) -> list[int]:
    """A text's token ids for its perplexity, as llama-perplexity reads a text file: a special token's name written in
    the text (`<bos>`, `<start_of_turn>`) stays text, since llama.cpp tokenizes the file without parsing them; `bos`
    first when given (the model adds one)."""
    ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return ([bos] if bos is not None else []) + list(ids)


class TextStream:
    """Decoded text as tokens arrive: each call returns what the new token adds. Text is decoded from all the tokens so
    far (a token may be part of a character, or change how the previous one reads), and nothing ending in an
    incomplete character is released."""

    def __init__(self, tokenizer):
        self.tokenizer, self.tokens, self.released = tokenizer, [], ""

    def add(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.released):
            return ""
        new, self.released = text[len(self.released):], text
        return new


@dataclass
class Generation:
    tokens: list[int]  # the new tokens (a stop token included when one ended it)
    text: str
    prefill_s: float
    decode_s: float  # the steps after prefill, together

    @property
    def decode_tokens_per_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else float("nan")


Choose = Callable[[torch.Tensor], int]  # logits [vocab] -> the next token


def greedy(logits: torch.Tensor) -> int:
    """The most likely token: the first of equal maxima, a NaN before any number, as torch.argmax picks it. NumPy's
    argmax, where PyTorch's, reducing a whole float32 tensor on one thread, compares one logit at a time: ~130 us a
    step for SmolLM2's 49152 on the AVX2 EPYC against ~9, a sixtieth of the 8-bit program's decode step."""
    return int(logits.detach().reshape(-1).float().numpy().argmax())


def sampler(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> Choose:
    """The next token as llama.cpp's default sampler chain picks it: the top_k most likely (0: all), then the fewest
    whose probabilities reach top_p (1: all), then a draw at `temperature` from those (seeded: the same text for the
    same seed). Temperature 0 is greedy: the argmax, exactly."""
    if temperature <= 0:
        return greedy
    if top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"top_k {top_k} and top_p {top_p}: top_k is 0 (all) or more, top_p in (0, 1]")
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else torch.seed())

    def choose(logits: torch.Tensor) -> int:
        values, tokens = logits.double().sort(descending=True)
        if top_k > 0:
            values, tokens = values[:top_k], tokens[:top_k]
        if top_p < 1:
            cumulative = values.softmax(0).cumsum(0)
            keep = int((cumulative < top_p).sum()) + 1  # the fewest reaching top_p
            values, tokens = values[:keep], tokens[:keep]
        return int(tokens[torch.multinomial((values / temperature).softmax(0), 1, generator=generator)])

    return choose


def generate(step: Step, tokenizer, ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int] = (),
             on_text: Callable[[str], None] | None = None, choose: Choose = greedy) -> Generation:
    """Decoding: the prompt at position 0, then each chosen token fed back (greedy: the argmax), until a stop token or
    max_new_tokens."""
    stream = TextStream(tokenizer)
    tokens, position = torch.tensor([list(ids)], dtype=torch.int64), 0
    new: list[int] = []
    prefill_s = decode_s = 0.0
    for index in range(max_new_tokens):
        start = time.perf_counter()
        logits = step(tokens, torch.tensor([position], dtype=torch.int64))
        token = choose(logits.reshape(-1))
        elapsed = time.perf_counter() - start
        if index == 0:
            prefill_s = elapsed
        else:
            decode_s += elapsed
        new.append(token)
        text = stream.add(token)
        if on_text and text:
            on_text(text)
        if token in stop_ids:
            break
        position += tokens.shape[1]
        tokens = torch.tensor([[token]], dtype=torch.int64)
    return Generation(new, stream.released, prefill_s, decode_s)


def perplexity(step: Step, ids: Sequence[int], window: int) -> tuple[float, int]:
    """(perplexity, tokens scored) of `ids` under the model: windows of `window` tokens, each from position 0, one token
    per step; the logits after token i score token i + 1 (the first token of each window only conditions)."""
    total, scored = 0.0, 0
    for first in range(0, len(ids), window):
        chunk = ids[first:first + window]
        for position, (token, following) in enumerate(zip(chunk, chunk[1:])):
            logits = step(torch.tensor([[token]], dtype=torch.int64), torch.tensor([position], dtype=torch.int64))
            total -= float(torch.log_softmax(logits.reshape(-1).double(), dim=0)[following])
            scored += 1
    return math.exp(total / scored), scored


def chunked_perplexity(step: Step, ids: Sequence[int], ctx: int, chunks: int | None = None,
                       bos: int | None = None) -> tuple[float, int]:
    """(perplexity, tokens scored) by llama-perplexity's protocol: the text's tokens in chunks of `ctx` (at most
    `chunks` of them), each from position 0 with its first token replaced by `bos` when the model adds one; in each,
    the logits at positions ctx / 2 .. ctx - 2 score the following token (the first half only conditions)."""
    count = len(ids) // ctx if chunks is None else min(chunks, len(ids) // ctx)
    if count == 0:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one chunk of {ctx}; give a longer text or a "
                         "smaller --ctx")
    total, scored = 0.0, 0
    for index in range(count):
        chunk = list(ids[index * ctx:(index + 1) * ctx])
        if bos is not None:
            chunk[0] = bos
        for position in range(ctx - 1):
            logits = step(torch.tensor([[chunk[position]]], dtype=torch.int64),
                          torch.tensor([position], dtype=torch.int64))
            if position >= ctx // 2:
                total -= float(torch.log_softmax(logits.reshape(-1).double(), dim=0)[chunk[position + 1]])
                scored += 1
    return math.exp(total / scored), scored


def eager_chunk_log_probs(model: torch.nn.Module, ids: Sequence[int], ctx: int, chunks: int | None = None,
                          bos: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per chunk of chunked_perplexity's protocol, a transformers model's own next-token log-probabilities (float64,
    [the scored positions, vocabulary]) with the chunk's tokens, each chunk in one forward pass."""
    count = len(ids) // ctx if chunks is None else min(chunks, len(ids) // ctx)
    with torch.no_grad():
        for index in range(count):
            chunk = torch.tensor([list(ids[index * ctx:(index + 1) * ctx])], dtype=torch.int64)
            if bos is not None:
                chunk[0, 0] = bos
            logits = model(input_ids=chunk).logits[0, ctx // 2:ctx - 1].double()
            yield torch.log_softmax(logits, dim=-1), chunk[0]


def eager_chunked_perplexity(model: torch.nn.Module, ids: Sequence[int], ctx: int, chunks: int | None = None,
                             bos: int | None = None) -> tuple[float, int]:
    """chunked_perplexity's chunks scored by a transformers model itself, each chunk in one forward pass."""
    total, scored = 0.0, 0
    for log_probs, chunk in eager_chunk_log_probs(model, ids, ctx, chunks, bos):
        total -= float(log_probs.gather(1, chunk[ctx // 2 + 1:, None]).sum())
        scored += ctx - 1 - ctx // 2
    return math.exp(total / scored), scored


def eager_perplexity(model: torch.nn.Module, ids: Sequence[int], window: int) -> tuple[float, int]:
    """The same windows scored by a transformers model itself, each window in one forward pass (its full logits)."""
    total, scored = 0.0, 0
    with torch.no_grad():
        for first in range(0, len(ids), window):
            chunk = torch.tensor([list(ids[first:first + window])], dtype=torch.int64)
            if chunk.shape[1] < 2:
                continue
            logits = model(input_ids=chunk).logits[0, :-1].double()
            total -= float(torch.log_softmax(logits, dim=-1).gather(1, chunk[0, 1:, None]).sum())
            scored += chunk.shape[1] - 1
    return math.exp(total / scored), scored
