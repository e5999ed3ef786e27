"""What my_ops::rope_sdpa_with_cache and my_ops::decoder_layer share about the new positions. The checks, as their
kernels share attention::positions_problem (qkv_rows.h): the rotation tables, where the positions go in the cache, the
scale; both ops' Python sides call them after their own shape checks, in the kernels' order, so each refuses as its
kernel does. And their example programs' halves: the start position a program reads from its input, and Llama's
rotation tables at it. The wheel carries it as my_ops.cache_positions. Imports only the standard library and torch."""

from __future__ import annotations

import math

import torch


def check_positions(op: str, cos, sin, batch: int, length: int, head_dim: int, positions: int, start_pos,
                    scale) -> None:
    """cos and sin [1 or batch, length, head_dim] of one shape; positions [start_pos, start_pos + length) within the
    cache's `positions`; a finite scale or none."""
    for name, t in (("cos", cos), ("sin", sin)):
        torch._check(t.dim() == 3 and t.shape[0] in (1, batch) and t.shape[1] == length and t.shape[2] == head_dim,
                     lambda: f"{op}: {name} {list(t.shape)} must be [1 or {batch}, {length}, {head_dim}]: a row per "
                             "new position, shared by the heads")
    torch._check(cos.shape == sin.shape,
                 lambda: f"{op}: cos {list(cos.shape)} and sin {list(sin.shape)} differ; give both the same shape")
    torch._check(start_pos >= 0 and start_pos + length <= positions,
                 lambda: f"{op}: {length} positions at start_pos {start_pos} need cache positions up to "
                         f"{start_pos + length} but the cache holds {positions}"
                         f"{' (start_pos is negative)' if start_pos < 0 else ''}; start_pos + length must be within "
                         "[0, positions]")
    torch._check(scale is None or math.isfinite(scale),
                 lambda: f"{op}: scale {scale} is not finite; pass a finite scale or None for 1/sqrt(head_dim)")


def start_of(position: torch.Tensor, length: int, positions: int):
    """The first new position, read from a one-element tensor in an exported program: an unbacked integer that export
    must know puts `length` positions within a cache of `positions`."""
    start = position.item()
    torch._check(start >= 0)
    torch._check(start + length <= positions)
    return start


def llama_rotation(start: int, length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [1, length, head_dim] for positions [start, start + length) at Llama's angles (base 10000), each
    frequency twice: once for either half of a head, as the ops rotate."""
    positions = torch.arange(start, start + length, dtype=torch.float32)
    frequencies = 10000.0 ** (-torch.arange(0, head_dim // 2, dtype=torch.float32) / (head_dim // 2))
    angles = positions[:, None] * frequencies
    angles = torch.cat((angles, angles), dim=-1)[None]
    return angles.cos(), angles.sin()
