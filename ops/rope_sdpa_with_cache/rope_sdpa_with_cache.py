"""Step 1 of the rope_sdpa_with_cache flow: registers my_ops::rope_sdpa_with_cache with PyTorch from Python, a decoder
layer's attention from its fused q/k/v projection in one op:

  rope_sdpa_with_cache(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) key_cache, Tensor(b!) value_cache,
                       SymInt start_pos, float? scale=None, int window=0) -> Tensor

qkv [B, T, (H + 2 H_kv) D] holds each new position's H query heads, then H_kv key heads, then H_kv value heads; cos and
sin [B or 1, T, D] their rotary embedding. q and k are rotated (my_ops::rope's rotate-half form), k and v written into
the caches [B, S, H_kv, D] at positions start_pos.., and the rotated q attends over them causally (within the last
`window` positions when window > 0), as my_ops::sdpa_with_cache does; the result is [B, T, H, D]. Where a program ran a
split, two ropes, two update_caches and sdpa_with_cache, it runs this op once (my_ops.hf's export pass, fuse.py, puts it
there). The runtime kernel is rope_sdpa_with_cache_out.cpp.

Importing this module registers the op and does nothing else (it imports only torch and the new positions' checks
it shares with decoder_layer, cache_positions.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

if __package__ == "my_ops":  # the wheel, or an editable install: the shared module is carried beside this one
    from .cache_positions import check_positions, llama_rotation, start_of
else:  # the repository
    from ops.rope_sdpa_with_cache.cache_positions import check_positions, llama_rotation, start_of

DTYPES = (torch.float32, torch.bfloat16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _heads(qkv, key_cache) -> tuple[int, int, int]:
    """(query heads, kv heads, head_dim): qkv's last dimension holds (heads + 2 * kv_heads) * head_dim."""
    kv_heads, head_dim = key_cache.shape[2:]
    return qkv.shape[2] // head_dim - 2 * kv_heads, kv_heads, head_dim


def _check(op: str, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out=None) -> None:
    """The runtime kernel's checks and messages, in its order (rope_sdpa_with_cache_out.cpp), so both refuse alike."""
    torch._check(qkv.dtype in DTYPES, lambda: f"{op}: qkv has unsupported dtype {_name(qkv.dtype)}; supported: "
                                              f"{', '.join(map(_name, DTYPES))}")
    for name, t in (("cos", cos), ("sin", sin), ("key_cache", key_cache), ("value_cache", value_cache), ("out", out)):
        torch._check(t is None or t.dtype == qkv.dtype,
                     lambda: f"{op}: {name} has dtype {_name(t.dtype)} but qkv has {_name(qkv.dtype)}; they must "
                             "match")
    torch._check(qkv.dim() == 3 and key_cache.dim() == 4,
                 lambda: f"{op}: qkv {list(qkv.shape)} must be [batch, length, (heads + 2 * kv_heads) * head_dim] and "
                         f"key_cache {list(key_cache.shape)} [batch, positions, kv_heads, head_dim]")
    torch._check(value_cache.shape == key_cache.shape,
                 lambda: f"{op}: value_cache {list(value_cache.shape)} must have key_cache's shape "
                         f"{list(key_cache.shape)}")
    batch, length, width = qkv.shape
    torch._check(key_cache.shape[0] == batch,
                 lambda: f"{op}: key_cache {list(key_cache.shape)} holds batch {key_cache.shape[0]} but qkv "
                         f"{list(qkv.shape)} has batch {batch}")
    positions, kv_heads, head_dim = key_cache.shape[1:]
    torch._check(head_dim > 0 and head_dim % 2 == 0 and kv_heads > 0,
                 lambda: f"{op}: key_cache {list(key_cache.shape)} must have kv heads and an even head_dim (the rotary "
                         "embedding rotates its halves)")
    heads = _heads(qkv, key_cache)[0]
    torch._check(width % head_dim == 0 and heads >= kv_heads and heads % kv_heads == 0,
                 lambda: f"{op}: qkv's last dimension {width} is not (heads + 2 * {kv_heads}) * {head_dim} for a "
                         f"number of query heads that is a multiple of the cache's {kv_heads} kv heads")
    check_positions(op, cos, sin, batch, length, head_dim, positions, start_pos, scale)
    torch._check(window >= 0, lambda: f"{op}: window {window} is negative; pass the sliding window's length in "
                                      "positions, or 0 to attend to every earlier position")


def rope_sdpa_with_cache_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, key_cache: torch.Tensor,
                                   value_cache: torch.Tensor, start_pos: int, scale: float | None = None,
                                   window: int = 0):
    """The op in ATen ops, declared as its reference: transformers' rotate_half on q and k, the caches written by
    slice assignment, then ATen's SDPA in float32 over the filled positions, causally masked (and to the window),
    rounded once. Mutates the caches like the op."""
    batch, length, width = qkv.shape
    kv_heads, head_dim = key_cache.shape[2:]
    heads = width // head_dim - 2 * kv_heads
    q, k, v = qkv.view(batch, length, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=2)
    cos, sin, half = cos[:, :, None], sin[:, :, None], head_dim // 2

    def rotated(x):
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    q = rotated(q)
    key_cache[:, start_pos:start_pos + length] = rotated(k)
    value_cache[:, start_pos:start_pos + length] = v
    end, group = start_pos + length, heads // kv_heads
    keys = key_cache[:, :end].float().transpose(1, 2).repeat_interleave(group, dim=1)
    values = value_cache[:, :end].float().transpose(1, 2).repeat_interleave(group, dim=1)
    key_positions, query_positions = torch.arange(end)[None, :], (start_pos + torch.arange(length))[:, None]
    allowed = key_positions <= query_positions
    if window > 0:
        allowed &= query_positions - key_positions < window
    out = F.scaled_dot_product_attention(q.float().transpose(1, 2), keys, values, attn_mask=allowed, scale=scale)
    return out.transpose(1, 2).to(qkv.dtype)


def _rotate_write_attend(op: str, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window):
    """PyTorch's kernel: the rotations and writes in ATen ops (rope's bits), then my_ops::sdpa_with_cache's own C++
    kernel, so that eager PyTorch gives the runtime's bits, fused or not."""
    batch, length, _ = qkv.shape
    heads, kv_heads, head_dim = _heads(qkv, key_cache)
    q, k, v = qkv.view(batch, length, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=2)
    cos, sin, half = cos[:, :, None], sin[:, :, None], head_dim // 2
    q, k = (x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin for x in (q, k))
    key_cache[:, start_pos:start_pos + length] = k
    value_cache[:, start_pos:start_pos + length] = v
    if not hasattr(torch.ops.my_ops, "sdpa_with_cache"):
        raise RuntimeError(f"{op}: PyTorch's kernel attends with my_ops::sdpa_with_cache, which is registered from "
                           "C++: load the build's libcustom_ops_aot_lib.so (torch.ops.load_library) first")
    return torch.ops.my_ops.sdpa_with_cache(q.contiguous(), key_cache, value_cache, start_pos, scale, window)


def _register() -> torch.library.Library:
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define("rope_sdpa_with_cache(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) key_cache, "
               "Tensor(b!) value_cache, SymInt start_pos, float? scale=None, int window=0) -> Tensor")
    lib.define("rope_sdpa_with_cache.out(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) key_cache, "
               "Tensor(b!) value_cache, SymInt start_pos, float? scale=None, int window=0, *, Tensor(c!) out) "
               "-> Tensor(c!)")
    functional, out_variant = "my_ops::rope_sdpa_with_cache", "my_ops::rope_sdpa_with_cache.out"

    def output_shape(qkv, key_cache):
        heads, _, head_dim = _heads(qkv, key_cache)
        return (*qkv.shape[:2], heads, head_dim)

    def compute(qkv, cos, sin, key_cache, value_cache, start_pos, scale=None, window=0):
        _check(functional, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window)
        return _rotate_write_attend(functional, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window)

    def compute_out(qkv, cos, sin, key_cache, value_cache, start_pos, scale=None, window=0, *, out):
        _check(out_variant, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out)
        result = _rotate_write_attend(out_variant, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window)
        return out.resize_(result.shape).copy_(result)

    def fake(qkv, cos, sin, key_cache, value_cache, start_pos, scale=None, window=0):
        _check(functional, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window)
        return qkv.new_empty(output_shape(qkv, key_cache))

    def fake_out(qkv, cos, sin, key_cache, value_cache, start_pos, scale=None, window=0, *, out):
        _check(out_variant, qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out)
        return out.resize_(output_shape(qkv, key_cache))

    torch.library.impl(functional, "CompositeExplicitAutograd", lib=lib)(compute)
    torch.library.impl(out_variant, "CompositeExplicitAutograd", lib=lib)(compute_out)
    torch.library.register_fake(functional, fake, lib=lib)
    torch.library.impl(out_variant, "Meta", lib=lib)(fake_out)
    return lib


MAX_SEQ, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 8  # grouped: two query heads per kv head


class FusedAttentionExample(torch.nn.Module):
    """A decoder layer's attention after its fused projection: rotate, write the caches at `position`, attend."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, MAX_SEQ, KV_HEADS, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(1, MAX_SEQ, KV_HEADS, HEAD_DIM))

    def forward(self, qkv, cos, sin, position):
        start = start_of(position, qkv.shape[1], MAX_SEQ)
        return torch.ops.my_ops.rope_sdpa_with_cache(qkv, cos, sin, self.k_cache, self.v_cache, start,
                                                     1 / math.sqrt(HEAD_DIM) * 0.9)


def example():
    """(model, runs): three steps of two new positions each (0-1, 2-3, 4-5): each reads what the previous wrote, at
    Llama's angles."""
    generator = torch.Generator().manual_seed(5)
    runs = []
    for step in range(3):
        qkv = torch.randn(1, 2, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator)
        runs.append((qkv, *llama_rotation(2 * step, 2, HEAD_DIM), torch.tensor([2 * step])))
    return FusedAttentionExample(), runs


# Once per process: a copy of this module registered first (e.g. the my_ops wheel's) leaves the op defined.
_lib = None if hasattr(torch.ops.my_ops, "rope_sdpa_with_cache") else _register()
