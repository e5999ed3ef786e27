"""A program decoding greedily in ExecuTorch's Python runtime, timed: what `bench hf`, `bench real` and `bench presets`
share. Either side's program (the project's, or optimum-executorch's, whose method takes every position of its input and
returns every position's logits) steps through one function; both sides' kernels load into one process. The
benchmarks import it by its file name: each runs as a script with benchmark/ on its path."""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch


def step_of(method, peer: bool):
    """step(tokens [1, T], input_pos [1]) -> last logits, for either program: the peer's takes cache_position [T]
    and returns the logits of every position it was given."""
    if not peer:
        return lambda tokens, position: method.execute([tokens, position])[0]

    def step(tokens, position):
        positions = position + torch.arange(tokens.shape[1], dtype=torch.int64)
        logits = method.execute([tokens, positions])[0]
        return logits.reshape(-1, logits.shape[-1])[-1:]

    return step


def time_one(pte: str, peer: bool, ids: list[int], new_tokens: int, warm_prefill: bool = True) -> dict:
    """Load, prefill and decode once in this process; the times and the tokens. Then (warm_prefill) the prompt once more
    from position 0: the warm prefill, what llama-bench's pp measures (it runs a warm-up first), so the comparison with
    llama.cpp uses it; the first prefill (caches cold, buffers allocated) is what a user's first prompt meets."""
    from flow.runtime import load_method_checked
    from my_ops.hf.text import greedy

    start = time.perf_counter()
    method = load_method_checked(pte)
    loaded = time.perf_counter()
    step = step_of(method, peer)
    tokens, position, generated, marks = torch.tensor([ids]), torch.tensor([0]), [], []
    for _ in range(new_tokens):
        out = step(tokens, position)
        generated.append(greedy(out))
        marks.append(time.perf_counter())
        position = position + tokens.shape[1]
        tokens = torch.tensor([[generated[-1]]])
    timings = {"load_ms": (loaded - start) * 1e3, "prefill_us": (marks[0] - loaded) * 1e6,
               "prefill_tokens_per_s": len(ids) / (marks[0] - loaded),
               "decode_tokens_per_s": (new_tokens - 1) / (marks[-1] - marks[0]), "tokens": generated}
    if warm_prefill:
        again = time.perf_counter()
        step(torch.tensor([ids]), torch.tensor([0]))
        timings["warm_prefill_tokens_per_s"] = len(ids) / (time.perf_counter() - again)
    return timings


def load_runtimes(kernel_library: str) -> None:
    """Both programs' kernels in this process: the project's library and ExecuTorch's LLM ops (llama::*)."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    from flow.runtime import load_kernel_library

    load_kernel_library(kernel_library)


@contextlib.contextmanager
def native_output_silenced():
    """The LLM runner logs each generation to stderr and prints its text to stdout from C++: kept out of the table."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
