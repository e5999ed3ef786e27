"""Greedy decoding of a model's program, the same loop wherever it runs: in eager PyTorch, in ExecuTorch's Python
runtime, and in a C++ runner's decode loop (`--prompt`/`--new_tokens`: the ExecuTorch runner, the AOTInductor runner),
each giving the tokens and the logits of every step; what two decodings differ in first; and the setup every model
flow shares (every declared op registered with PyTorch, a command-line list checked against what is known)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Sequence

import torch


def register_ops(build_dir: str) -> None:
    """Every declared op known to PyTorch, C++ ones from the build's AOT library (a model calls several)."""
    from flow import registration

    registration.register_build(build_dir)


@dataclass
class Decoded:
    tokens: list[int]
    logits: torch.Tensor  # [steps, vocab], prefill first
    prefill_us: float = 0.0  # the runner's averages over its generations
    decode_tokens_per_s: float = 0.0


def greedy_decode(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompt: Sequence[int],
                  new_tokens: int, choose: Callable[[torch.Tensor], int] | None = None) -> Decoded:
    """Greedy decoding with any implementation of the model's forward, step(tokens [1, T], input_pos [1]) -> logits
    [1, vocab]: the prompt at position 0, then each argmax fed back at the next position (or what `choose` picks:
    another decoding's tokens, to follow its path)."""
    from my_ops.hf.text import greedy

    choose = choose or greedy
    tokens = torch.tensor([list(prompt)], dtype=torch.int64)
    position = torch.tensor([0], dtype=torch.int64)
    generated, logits = [], []
    for _ in range(new_tokens):
        out = step(tokens, position)
        logits.append(out.reshape(-1).clone())  # a runtime may reuse the output's memory in the next step
        generated.append(choose(out))
        position = position + tokens.shape[1]
        tokens = torch.tensor([[generated[-1]]], dtype=torch.int64)
    return Decoded(generated, torch.stack(logits))


def decode_eager(model: torch.nn.Module, prompt: Sequence[int], new_tokens: int) -> Decoded:
    with torch.no_grad():
        return greedy_decode(model, prompt, new_tokens)


def decode_runtime(pte: str, prompt: Sequence[int], new_tokens: int, *, generations: int = 1) -> Decoded:
    """In ExecuTorch's Python runtime (the kernel library loaded first: flow.runtime.load_kernel_library),
    `generations` times on the same method (each starts over at position 0 on the caches the last one filled); the
    last generation."""
    from flow.runtime import load_method_checked

    method = load_method_checked(pte)
    for _ in range(generations):
        decoded = greedy_decode(lambda tokens, position: method.execute([tokens, position])[0], prompt, new_tokens)
    return decoded


def decode_runner(runner: str, pte: str, prompt: Sequence[int], new_tokens: int, *, generations: int = 1) -> Decoded:
    """In the C++ runner's decode loop (--prompt/--new_tokens), `generations` times; the last generation."""
    return decode_command([runner, f"--model_path={pte}"], prompt, new_tokens, generations=generations)


def decode_command(command: Sequence[str], prompt: Sequence[int], new_tokens: int, *, generations: int = 1) -> Decoded:
    """decode_runner for any runner with the same decoding flags and output (custom_ops_aoti_runner too): `command`
    is the runner and the flags that name the model."""
    from flow.runner import RunnerError

    with tempfile.TemporaryDirectory() as tmp:
        logits_path = os.path.join(tmp, "logits.bin")
        proc = subprocess.run(
            [*command, f"--prompt={','.join(map(str, prompt))}", f"--new_tokens={new_tokens}",
             f"--num_executions={generations}", f"--logits_path={logits_path}"],
            capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RunnerError(f"runner exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        with open(logits_path, "rb") as f:
            logits = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(new_tokens, -1)
    timing = re.search(r"^Prefill: \d+ tokens in ([\d.]+) us; decode: .*\(([\d.]+) tokens/s\)", proc.stdout, re.M)
    return Decoded(printed_tokens(proc.stdout), logits, float(timing.group(1)), float(timing.group(2)))


def printed_tokens(runner_output: str) -> list[int]:
    """The tokens the runner's decode loop printed (its "Tokens:" line)."""
    return [int(t) for t in re.search(r"^Tokens:(.*)$", runner_output, re.M).group(1).split()]


def difference(actual: Decoded, expected: Decoded, tolerance: dict) -> str | None:
    """None when `actual` has the expected tokens and logits within `tolerance`; else what differs first."""
    if actual.tokens != expected.tokens:
        step = next(i for i, (a, e) in enumerate(zip(actual.tokens + [None], expected.tokens)) if a != e)
        return f"tokens differ from step {step}: {actual.tokens} where eager gives {expected.tokens}"
    try:
        torch.testing.assert_close(actual.logits, expected.logits, **tolerance)
    except AssertionError as err:
        return f"logits differ beyond {tolerance}: {err}"
    return None


def chosen(listed: str, known, what: str) -> list[str] | None:
    """The names of a comma-separated command-line list, or None after one error line naming the unknown ones."""
    names = listed.split(",")
    if unknown := [n for n in names if n not in known]:
        print(f"error: unknown {what}(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return None
    return names
