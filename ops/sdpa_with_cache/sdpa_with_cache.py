"""my_ops::sdpa_with_cache's Python side: the op is registered from C++ (sdpa_with_cache.cpp, in
libcustom_ops_aot_lib.so); this module holds its reference in ATen ops (PyTorch's scaled_dot_product_attention on the
filled, causally masked cache positions) and the example the flow exports: a KV cache written step by step and read
with the op. It imports only torch.

Layout, as ExecuTorch's llama::custom_sdpa and optimum-executorch use it: query [B, T, H, D], key and value caches
[B, S, H_kv, D] (S positions; update_cache writes along dimension 1). Query t (0 <= t < T) sits at position
q = start_pos + t and attends to cache positions 0 .. q, or with window > 0 (a sliding window: Mistral's, Gemma's
local layers) to the last `window` of them, q - window + 1 .. q (transformers' rule: a key is seen while
q - key < window).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def sdpa_with_cache_reference(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, start_pos: int,
                              scale: float | None = None, window: int = 0) -> torch.Tensor:
    """The same attention with ATen's SDPA over the positions some query may see (from the first query's window
    start: nothing before it is read), in float32 (the op accumulates in float32 too), rounded once."""
    batch, length, heads, _ = query.shape
    end = start_pos + length
    begin = max(0, start_pos - window + 1) if window > 0 else 0
    group = heads // key_cache.shape[2]
    q = query.float().transpose(1, 2)  # [B, H, T, D]
    k = key_cache[:, begin:end].float().transpose(1, 2).repeat_interleave(group, dim=1)  # [B, H, end - begin, D]
    v = value_cache[:, begin:end].float().transpose(1, 2).repeat_interleave(group, dim=1)
    keys, queries = torch.arange(begin, end)[None, :], (start_pos + torch.arange(length))[:, None]
    allowed = keys <= queries  # [T, end - begin]
    if window > 0:
        allowed &= queries - keys < window
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    return out.transpose(1, 2).to(query.dtype)


MAX_SEQ, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 8  # grouped: two query heads per kv head


class CachedAttentionExample(torch.nn.Module):
    """A decoder layer's attention with its cache: write the new keys and values at `position`, then attend. (The
    writes are a slice assignment so that the example needs no other custom op: its flow's build selects this op
    alone. examples/decoder.py writes its caches with my_ops::update_cache.)"""

    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, MAX_SEQ, KV_HEADS, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(1, MAX_SEQ, KV_HEADS, HEAD_DIM))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        start = position.item()
        torch._check(start >= 0)
        torch._check(start + q.shape[1] <= MAX_SEQ)
        self.k_cache[:, start:start + k.shape[1]] = k
        self.v_cache[:, start:start + v.shape[1]] = v
        return torch.ops.my_ops.sdpa_with_cache(q, self.k_cache, self.v_cache, start, 1 / math.sqrt(HEAD_DIM) * 0.9)


def example():
    """(model, runs): three steps of two new positions each (0-1, 2-3, 4-5): each reads what the previous wrote."""
    generator = torch.Generator().manual_seed(5)
    runs = []
    for step in range(3):
        q, k, v = (torch.randn(1, 2, h, HEAD_DIM, generator=generator) for h in (HEADS, KV_HEADS, KV_HEADS))
        runs.append((q, k, v, torch.tensor([2 * step])))
    return CachedAttentionExample(), runs
