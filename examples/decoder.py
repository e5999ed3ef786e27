"""The example ops in a real model: a small Llama-style decoder (seeded random weights, nothing downloaded) whose norms
are my_ops::rms_norm, whose K/V caches are mutable buffers written with my_ops::update_cache and whose attention over
them is my_ops::sdpa_with_cache. Its linear layers go to the XNNPACK delegate (models/example_decoder.py lowers and
runs it); the custom ops stay on this project's CPU kernels.

One method, forward(tokens [1, T], input_pos [1]) -> logits of the last position [1, VOCAB], serves prefill (T = the
prompt's length, input_pos 0) and each decode step (T = 1, input_pos = tokens so far): the caches carry the state from
one execution to the next. With custom_ops=False the same model writes every op as ATen ops (the eager reference and
the benchmark's baseline); with fused_attention=False it keeps the norms and cache writes on the custom ops but attends
with ATen ops (slice, bmm, softmax, bmm: the attention before my_ops::sdpa_with_cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import ops.update_cache.update_cache  # noqa: F401  (registers my_ops::update_cache; the C++ ops come from the AOT library)
from ops.rms_norm.rms_norm import rms_norm_reference


@dataclass(frozen=True)
class Config:
    vocab: int = 256
    dim: int = 128
    layers: int = 2
    heads: int = 4
    hidden: int = 352  # the MLP's width, ~8/3 * dim as in Llama
    max_seq: int = 256  # cache positions: a prompt and its generated tokens together
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class RMSNorm(torch.nn.Module):
    def __init__(self, config: Config, custom_ops: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(config.dim))
        self.eps = config.eps
        self.custom_ops = custom_ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.custom_ops:
            return torch.ops.my_ops.rms_norm(x, self.weight, self.eps)
        return rms_norm_reference(x, self.weight, self.eps)


class Attention(torch.nn.Module):
    def __init__(self, config: Config, custom_ops: bool, fused: bool):
        super().__init__()
        self.config = config
        self.custom_ops = custom_ops
        self.fused = custom_ops and fused
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(config.dim, config.dim, bias=False) for _ in range(4))
        # Fused: [1, position, head, head_dim], the layout sdpa_with_cache reads (and ExecuTorch's llama ops), which the
        # projections produce without a transpose. ATen: [head, position, head_dim], so each head's filled positions
        # are one contiguous block for bmm. update_cache writes along dimension 1 either way.
        cache_shape = ((1, config.max_seq, config.heads, config.head_dim) if self.fused
                       else (config.heads, config.max_seq, config.head_dim))
        self.register_buffer("k_cache", torch.zeros(cache_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache_shape), persistent=False)

    def _write(self, value: torch.Tensor, cache: torch.Tensor, start: int) -> None:
        if self.custom_ops:
            torch.ops.my_ops.update_cache(value, cache, start)
        else:  # what a model without the op writes: a slice assignment (functionalized into a copy of the cache)
            cache[:, start:start + value.shape[1]] = value

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[1, T, dim] -> [heads, T, head_dim]"""
        return x.view(x.shape[1], self.config.heads, self.config.head_dim).transpose(0, 1)

    def forward(self, x: torch.Tensor, start: int, mask: torch.Tensor) -> torch.Tensor:
        c = self.config
        length = x.shape[1]
        if self.fused:
            split = (1, length, c.heads, c.head_dim)
            torch.ops.my_ops.update_cache(self.wk(x).view(split), self.k_cache, start)
            torch.ops.my_ops.update_cache(self.wv(x).view(split), self.v_cache, start)
            attention = torch.ops.my_ops.sdpa_with_cache(self.wq(x).view(split), self.k_cache, self.v_cache, start)
            return self.wo(attention.view(1, length, c.dim))
        self._write(self._heads(self.wk(x)), self.k_cache, start)
        self._write(self._heads(self.wv(x)), self.v_cache, start)
        # Only the filled positions are read (a decode step's work grows with the tokens so far, not the cache's
        # size). Scores are kept as [heads, position, query], so neither cache is ever transposed.
        end = start + length
        keys, values = self.k_cache[:, :end], self.v_cache[:, :end]  # [H, end, head_dim]
        scores = torch.bmm(keys, self._heads(self.wq(x)).transpose(1, 2)) / math.sqrt(c.head_dim)  # [H, end, T]
        weights = torch.softmax(scores + mask[:end], dim=1)
        attention = torch.bmm(weights.transpose(1, 2), values)  # [H, T, head_dim]
        return self.wo(attention.transpose(0, 1).reshape(1, length, c.dim))


class Block(torch.nn.Module):
    def __init__(self, config: Config, custom_ops: bool, fused_attention: bool):
        super().__init__()
        self.attention_norm = RMSNorm(config, custom_ops)
        self.attention = Attention(config, custom_ops, fused_attention)
        self.mlp_norm = RMSNorm(config, custom_ops)
        self.w1 = torch.nn.Linear(config.dim, config.hidden, bias=False)
        self.w3 = torch.nn.Linear(config.dim, config.hidden, bias=False)
        self.w2 = torch.nn.Linear(config.hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor, start: int, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), start, mask)
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Decoder(torch.nn.Module):
    def __init__(self, config: Config = Config(), custom_ops: bool = True, seed: int = 0, fused_attention: bool = True):
        super().__init__()
        self.config = config
        self.embedding = torch.nn.Embedding(config.vocab, config.dim)
        self.blocks = torch.nn.ModuleList(Block(config, custom_ops, fused_attention) for _ in range(config.layers))
        self.norm = RMSNorm(config, custom_ops)
        self.output = torch.nn.Linear(config.dim, config.vocab, bias=False)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in self.named_parameters():
                if name.endswith("norm.weight"):
                    parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator))
                else:  # wide enough logits that greedy decoding does not hinge on rounding
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        start = input_pos.item()
        torch._check(start >= 0)
        torch._check(start + length <= self.config.max_seq)
        positions = torch.arange(self.config.max_seq)
        queries = start + torch.arange(length)
        mask = torch.where(positions[:, None] <= queries[None, :], 0.0, float("-inf"))  # [position, query]
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x, start, mask)
        return self.output(self.norm(x[:, -1, :]))


PROMPT = (1, 17, 42, 99, 7, 3, 250, 64)  # token ids of the example prompt
NEW_TOKENS = 24


def prompt_inputs(prompt=PROMPT):
    """(tokens, input_pos) of the prefill step."""
    return torch.tensor([list(prompt)], dtype=torch.int64), torch.tensor([0], dtype=torch.int64)


def dynamic_shapes(config: Config = Config()):
    """The prompt length varies from 1 to max_seq: one program serves prefill and decode."""
    return ({1: torch.export.Dim("length", min=1, max=config.max_seq)}, None)
