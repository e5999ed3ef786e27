"""Step 1 of the decoder_layer flow: registers my_ops::decoder_layer with PyTorch from Python, a pre-norm decoder layer
(Llama's, SmolLM2's) in one op:

  decoder_layer(Tensor hidden, Tensor input_norm, Tensor qkv_weight, str qkv_format, Tensor cos, Tensor sin,
                Tensor(a!) key_cache, Tensor(b!) value_cache, SymInt start_pos, float? scale, Tensor o_weight,
                str o_format, Tensor post_norm, Tensor gate_up_weight, str gate_up_format, Tensor down_weight,
                str down_format, float eps, Tensor? v_weight=None, str? v_format=None) -> Tensor

  h   = hidden + o_proj(rope_sdpa_with_cache(qkv_proj(rms_norm(hidden, input_norm))))
  out = h + down_proj(silu_mul(gate, up)),  gate | up = gate_up_proj(rms_norm(h, post_norm))

each projection my_ops::linear_blocks of its weight in its format (any the op takes, one per projection; v's apart from
q and k's, in v_weight and v_format, where its format is another: llama-quantize's Q4_K_M and Q5_K_M give some
layers' attn_v more bits). Where a
program ran the layer's nine ops and handed the thread pool five ranges, it runs this op once, in one parallel region
(decoder_layer_out.cpp); my_ops.hf's export pass (fuse.py) puts it there. PyTorch's kernel calls those ops in turn, so
eager gives the runtime's bits.

Importing this module registers the op and does nothing else (it imports only torch, the block formats' layouts,
ops/blocks/block_layouts.py, and the new positions' checks it shares with rope_sdpa_with_cache, cache_positions.py).
"""

from __future__ import annotations

import math

import torch

if __package__ == "my_ops":  # the wheel, or an editable install: the shared modules are carried beside this one
    from .block_layouts import LAYOUTS, ROW_DTYPES
    from .cache_positions import check_positions, llama_rotation, start_of
else:  # the repository, where ops/blocks/ and ops/rope_sdpa_with_cache/ hold them
    from ops.blocks.block_layouts import LAYOUTS, ROW_DTYPES
    from ops.rope_sdpa_with_cache.cache_positions import check_positions, llama_rotation, start_of

OP = "my_ops::decoder_layer"
DTYPES = (torch.float32,)  # its activations' and caches'
ROW_FORMATS = {name: getattr(torch, dtype) for name, dtype in ROW_DTYPES.items()}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _inputs_of(weight: torch.Tensor, fmt: str) -> int:
    if fmt in ROW_FORMATS:
        return weight.shape[1]
    return weight.shape[1] // LAYOUTS[fmt].bytes * LAYOUTS[fmt].weights


def _check_projection(op: str, weight, fmt: str, name: str, inputs: int, outputs: int | None, inputs_are: str):
    """A projection's weight, as linear_blocks checks it (ops/blocks/block_ops.h), the projection named after; the
    formats as ops/blocks/block_layouts.py states them."""
    known = ", ".join([*ROW_FORMATS, *LAYOUTS])
    torch._check(fmt in ROW_FORMATS or fmt in LAYOUTS,
                 lambda: f"{op}: format '{fmt}' is not one this op takes; it takes the GGUF types {known} (i-quants, "
                         f"TQ and MXFP4 are not among them: requantize with llama-quantize) ({name})")
    rows = fmt in ROW_FORMATS
    dtype = ROW_FORMATS.get(fmt, torch.uint8)
    stored = _name(dtype) if rows else "uint8 (the blocks' bytes, packed at export)"
    torch._check(weight.dtype == dtype,
                 lambda: f"{op}: weight has dtype {_name(weight.dtype)} but a {fmt} weight is {stored} ({name})")
    torch._check(weight.dim() == 2,
                 lambda: f"{op}: weight {list(weight.shape)} must have 2 dimensions, [outputs, "
                         f"{'inputs]' if rows else 'bytes per row]'} ({name})")
    if not rows:
        block = LAYOUTS[fmt]
        torch._check(weight.shape[1] % block.bytes == 0,
                     lambda: f"{op}: weight {list(weight.shape)} rows of {weight.shape[1]} bytes are not whole {fmt} "
                             f"blocks of {block.bytes} bytes ({block.weights} weights each); pack it with the op's "
                             f"Python side ({name})")
    torch._check(_inputs_of(weight, fmt) == inputs and (outputs is None or weight.shape[0] == outputs),
                 lambda: f"{op}: {name} {list(weight.shape)} ({fmt}) holds {_inputs_of(weight, fmt)} inputs and "
                         f"{weight.shape[0]} outputs; it must take {inputs} ({inputs_are})"
                         + (f" and give {outputs}" if outputs is not None else ""))


def _check(op: str, hidden, input_norm, qkv_weight, qkv_format, cos, sin, key_cache, value_cache, start_pos, scale,
           o_weight, o_format, post_norm, gate_up_weight, gate_up_format, down_weight, down_format, eps,
           v_weight=None, v_format=None, out=None) -> None:
    """The runtime kernel's checks, in its order (decoder_layer_out.cpp), so both refuse alike."""
    alone = "v_weight is given without v_format" if v_format is None else "v_format is given without v_weight"
    torch._check((v_weight is None) == (v_format is None),
                 lambda: f"{op}: {alone}; give both (v's projection in a format of its own) or neither")
    for name, t in (("hidden", hidden), ("input_norm", input_norm), ("post_norm", post_norm), ("cos", cos),
                    ("sin", sin), ("key_cache", key_cache), ("value_cache", value_cache), ("out", out)):
        torch._check(t is None or t.dtype in DTYPES,
                     lambda: f"{op}: {name} has dtype {_name(t.dtype)}; the layer computes in "
                             f"{', '.join(map(_name, DTYPES))}")
    torch._check(hidden.dim() == 3 and key_cache.dim() == 4,
                 lambda: f"{op}: hidden {list(hidden.shape)} must be [batch, length, model] and key_cache "
                         f"{list(key_cache.shape)} [batch, positions, kv_heads, head_dim]")
    batch, length, model = hidden.shape
    positions, kv_heads, head_dim = key_cache.shape[1:]
    torch._check(value_cache.shape == key_cache.shape and key_cache.shape[0] == batch,
                 lambda: f"{op}: key_cache {list(key_cache.shape)} and value_cache {list(value_cache.shape)} must "
                         f"have one shape, with hidden's batch {batch}")
    for name, t in (("input_norm", input_norm), ("post_norm", post_norm)):
        torch._check(t.dim() >= 1 and t.dim() <= 3 and t.numel() == model and t.shape[-1] == model,
                     lambda: f"{op}: {name} {list(t.shape)} must scale hidden's {model} features; give it shape "
                             f"[{model}]")
    torch._check(head_dim > 0 and head_dim % 2 == 0 and kv_heads > 0,
                 lambda: f"{op}: key_cache {list(key_cache.shape)} must have kv heads and an even head_dim (the rotary "
                         "embedding rotates its halves)")
    _check_projection(op, qkv_weight, qkv_format, "qkv_weight", model, None, "hidden's features")
    parts = 2 if v_weight is None else 1  # k and v's share of qkv_weight's rows, in kv heads
    qkv_outputs = qkv_weight.shape[0]
    heads = qkv_outputs // head_dim - parts * kv_heads
    torch._check(qkv_outputs % head_dim == 0 and heads >= kv_heads and heads % kv_heads == 0,
                 lambda: f"{op}: qkv_weight's {qkv_outputs} outputs are not (heads + {parts} * {kv_heads}) * "
                         f"{head_dim} for a number of query heads that is a multiple of the cache's {kv_heads} kv heads"
                         + (" (q, k and v's rows; with v_weight, q and k's)" if v_weight is None
                            else " (q and k's rows: v_weight holds v's)"))
    if v_weight is not None:
        _check_projection(op, v_weight, v_format, "v_weight", model, kv_heads * head_dim, "hidden's features")
    _check_projection(op, o_weight, o_format, "o_weight", heads * head_dim, model, "the attention's heads * head_dim")
    _check_projection(op, gate_up_weight, gate_up_format, "gate_up_weight", model, None, "hidden's features")
    torch._check(gate_up_weight.shape[0] > 0 and gate_up_weight.shape[0] % 2 == 0,
                 lambda: f"{op}: gate_up_weight {list(gate_up_weight.shape)} must give the gate's outputs, then as "
                         "many of up's: an even, non-zero number")
    _check_projection(op, down_weight, down_format, "down_weight", gate_up_weight.shape[0] // 2, model,
                      "half of gate_up's outputs")
    check_positions(op, cos, sin, batch, length, head_dim, positions, start_pos, scale)
    torch._check(math.isfinite(eps) and eps >= 0, lambda: f"{op}: eps {eps} must be finite and not negative")


def decoder_layer_reference(hidden, input_norm, qkv_weight, qkv_format, cos, sin, key_cache, value_cache, start_pos,
                            scale, o_weight, o_format, post_norm, gate_up_weight, gate_up_format, down_weight,
                            down_format, eps, v_weight=None, v_format=None):
    """The layer in ATen ops, declared as its reference: each part the reference of the op the layer runs (the norms'
    and SwiGLU's math here, the projections' and attention's from their modules). Mutates the caches like the op."""
    from ops.blocks.blocks import linear_blocks_reference
    from ops.rope_sdpa_with_cache.rope_sdpa_with_cache import rope_sdpa_with_cache_reference

    def normalized(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    normed = normalized(hidden, input_norm)
    qkv = linear_blocks_reference(normed, qkv_weight, qkv_format)
    if v_weight is not None:
        qkv = torch.cat([qkv, linear_blocks_reference(normed, v_weight, v_format)], dim=-1)
    attended = rope_sdpa_with_cache_reference(qkv, cos, sin, key_cache, value_cache, start_pos, scale)
    h = hidden + linear_blocks_reference(attended.flatten(2), o_weight, o_format)
    gate, up = linear_blocks_reference(normalized(h, post_norm), gate_up_weight, gate_up_format).chunk(2, dim=-1)
    return h + linear_blocks_reference(torch.nn.functional.silu(gate) * up, down_weight, down_format)


def _layer(op: str, hidden, input_norm, qkv_weight, qkv_format, cos, sin, key_cache, value_cache, start_pos, scale,
           o_weight, o_format, post_norm, gate_up_weight, gate_up_format, down_weight, down_format, eps, v_weight=None,
           v_format=None):
    """PyTorch's kernel: the ops the layer replaces, in turn (the runtime kernel runs their row code: the same bits)."""
    my_ops = torch.ops.my_ops
    for needed in ("rms_norm", "linear_blocks", "rope_sdpa_with_cache", "silu_mul"):
        if not hasattr(my_ops, needed):
            raise RuntimeError(f"{op}: PyTorch's kernel runs my_ops::{needed}, which is not registered: load the "
                               "build's libcustom_ops_aot_lib.so (torch.ops.load_library) and import the op modules "
                               "(models.decoding.register_ops does both)")
    normed = my_ops.rms_norm(hidden, input_norm, eps)
    qkv = my_ops.linear_blocks(normed, qkv_weight, qkv_format)
    if v_weight is not None:
        qkv = torch.cat([qkv, my_ops.linear_blocks(normed, v_weight, v_format)], dim=-1)
    attended = my_ops.rope_sdpa_with_cache(qkv, cos, sin, key_cache, value_cache, start_pos, scale)
    h = hidden + my_ops.linear_blocks(attended.flatten(2), o_weight, o_format)
    gate, up = my_ops.linear_blocks(my_ops.rms_norm(h, post_norm, eps), gate_up_weight, gate_up_format).chunk(2, -1)
    return h + my_ops.linear_blocks(my_ops.silu_mul(gate.contiguous(), up.contiguous()), down_weight, down_format)


def _register() -> torch.library.Library:
    lib = torch.library.Library("my_ops", "FRAGMENT")
    arguments = ("Tensor hidden, Tensor input_norm, Tensor qkv_weight, str qkv_format, Tensor cos, Tensor sin, "
                 "Tensor(a!) key_cache, Tensor(b!) value_cache, SymInt start_pos, float? scale, Tensor o_weight, "
                 "str o_format, Tensor post_norm, Tensor gate_up_weight, str gate_up_format, Tensor down_weight, "
                 "str down_format, float eps, Tensor? v_weight=None, str? v_format=None")
    lib.define(f"decoder_layer({arguments}) -> Tensor")
    lib.define(f"decoder_layer.out({arguments}, *, Tensor(c!) out) -> Tensor(c!)")
    functional, out_variant = OP, OP + ".out"

    def compute(*args, **v):
        _check(functional, *args, **v)
        return _layer(functional, *args, **v)

    def compute_out(*args, out, **v):
        _check(out_variant, *args, **v, out=out)
        result = _layer(out_variant, *args, **v)
        return out.resize_(result.shape).copy_(result)

    def fake(*args, **v):
        _check(functional, *args, **v)
        return args[0].new_empty(args[0].shape)

    def fake_out(*args, out, **v):
        _check(out_variant, *args, **v, out=out)
        return out.resize_(args[0].shape)

    torch.library.impl(functional, "CompositeExplicitAutograd", lib=lib)(compute)
    torch.library.impl(out_variant, "CompositeExplicitAutograd", lib=lib)(compute_out)
    torch.library.register_fake(functional, fake, lib=lib)
    torch.library.impl(out_variant, "Meta", lib=lib)(fake_out)
    return lib


MODEL, HEADS, KV_HEADS, HEAD_DIM, MLP, MAX_SEQ = 64, 4, 2, 16, 96, 16


class LayerExample(torch.nn.Module):
    """One layer over its own caches, a row format per projection (F32, F16, BF16: the block formats' kernels are
    linear_blocks' own example's; tests/test_fused_ops.py runs the layer in each)."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(21)

        def weight(outputs, inputs, dtype):
            return (torch.randn(outputs, inputs, generator=generator) * inputs ** -0.5).to(dtype)

        self.register_buffer("input_norm", 1 + 0.1 * torch.randn(MODEL, generator=generator))
        self.register_buffer("qkv", weight((HEADS + 2 * KV_HEADS) * HEAD_DIM, MODEL, torch.float32))
        self.register_buffer("o", weight(MODEL, HEADS * HEAD_DIM, torch.float16))
        self.register_buffer("post_norm", 1 + 0.1 * torch.randn(MODEL, generator=generator))
        self.register_buffer("gate_up", weight(2 * MLP, MODEL, torch.bfloat16))
        self.register_buffer("down", weight(MODEL, MLP, torch.float32))
        self.register_buffer("k_cache", torch.zeros(1, MAX_SEQ, KV_HEADS, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(1, MAX_SEQ, KV_HEADS, HEAD_DIM))

    def forward(self, hidden, cos, sin, position):
        start = start_of(position, hidden.shape[1], MAX_SEQ)
        return torch.ops.my_ops.decoder_layer(hidden, self.input_norm, self.qkv, "F32", cos, sin, self.k_cache,
                                              self.v_cache, start, None, self.o, "F16", self.post_norm, self.gate_up,
                                              "BF16", self.down, "F32", 1e-5)


def example():
    """(model, runs): three steps of two new positions each (0-1, 2-3, 4-5), each attending over what the previous
    wrote, at Llama's angles."""
    generator = torch.Generator().manual_seed(22)
    runs = []
    for step in range(3):
        runs.append((torch.randn(1, 2, MODEL, generator=generator), *llama_rotation(2 * step, 2, HEAD_DIM),
                     torch.tensor([2 * step])))
    return LayerExample(), runs


# Once per process: a copy of this module registered first (e.g. the my_ops wheel's) leaves the op defined.
_lib = None if hasattr(torch.ops.my_ops, "decoder_layer") else _register()
