"""The swap: a Hugging Face transformers decoder's RMSNorm modules become my_ops::rms_norm, its KV cache a static cache
written with my_ops::update_cache, its attention my_ops::sdpa_with_cache (quantize.py puts its linear layers and
embedding on the block-format ops; export.py exports the result); a sliding window (Mistral's, Gemma 3's local layers)
is the op's `window`. What cannot be put on the project's ops is refused by name before anything is traced: an unknown
norm, chunked or cross attention, logit soft-capping, a missing op library. Another architecture's norm is one entry
of NORMS (docs/hf.md).
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch

ATTENTION_NAME = "my_ops_sdpa_with_cache"  # the name under transformers' AttentionInterface
OPS = ("my_ops::rms_norm", "my_ops::update_cache", "my_ops::sdpa_with_cache")  # what every program calls


class UnsupportedModelError(ValueError):
    """A model, config or environment the swap cannot honour; the message names what and the way out."""


# Norm classes whose forward is weight * (x / sqrt(mean(x^2, -1) + eps)) computed in float: my_ops::rms_norm's math.
# Each maps a module to (weight, eps).
def _weight_and_variance_epsilon(module: torch.nn.Module) -> tuple[torch.nn.Parameter, float]:
    return module.weight, float(module.variance_epsilon)


def _one_plus_weight_and_eps(module: torch.nn.Module) -> tuple[torch.nn.Parameter, float]:
    """Gemma's norm scales by (1 + weight), added in float32: the same float32 scale, stored."""
    with torch.no_grad():
        scale = 1.0 + module.weight.float()
    return torch.nn.Parameter(scale, requires_grad=False), float(module.eps)


NORMS: dict[str, Callable[[torch.nn.Module], tuple[torch.nn.Parameter, float]]] = {
    **{name: _weight_and_variance_epsilon
       for name in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")},
    "Gemma3RMSNorm": _one_plus_weight_and_eps,
}


class RMSNorm(torch.nn.Module):
    """my_ops::rms_norm in place of a transformers RMSNorm; shares the original's weight."""

    def __init__(self, weight: torch.nn.Parameter, eps: float, replaces: str):
        super().__init__()
        self.weight = weight
        self.eps = eps
        self.replaces = replaces

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.my_ops.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, replaces={self.replaces}"


def _start_of(positions: torch.Tensor, length: int, capacity: int) -> int:
    """The first position of this step, checked against the cache's capacity (export keeps the checks)."""
    start = positions.reshape(-1)[0].item()
    torch._check(start >= 0)
    torch._check(start + length <= capacity)
    return start


def sdpa_with_cache_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Registered as transformers' attention implementation (config._attn_implementation) so that the model builds no
    attention mask (it has no mask function for this name); the swapped Attention modules attend themselves, so
    reaching this means an attention module was not swapped."""
    raise UnsupportedModelError(f"{type(module).__name__} was not swapped for my_ops.hf.Attention; add its class to "
                                "my_ops.hf.ATTENTIONS if it computes Llama's attention")


def _fused_linear(*linears: torch.nn.Linear) -> torch.nn.Linear:
    """One linear layer computing `linears` side by side (their weights, and biases, concatenated). A model loaded
    without float32 weights (my_ops.hf.checkpoint.load(dequantize=False)) keeps them unallocated here too."""
    empty = any(m.weight.is_meta for m in linears)
    fused = torch.nn.Linear(linears[0].in_features, sum(m.out_features for m in linears),
                            bias=linears[0].bias is not None, dtype=linears[0].weight.dtype,
                            device="meta" if empty else None)
    with torch.no_grad():
        if not empty:
            fused.weight.copy_(torch.cat([m.weight for m in linears]))
            if fused.bias is not None:
                fused.bias.copy_(torch.cat([m.bias for m in linears]))
        elif fused.bias is not None:
            fused.bias = torch.nn.Parameter(torch.cat([m.bias for m in linears]))
    # A GGUF file's own tensors (my_ops.gguf.attach_blocks) follow the rows: joined when every part has one format
    # (and the packed layout allows it), else kept as parts (my_ops.hf.quantize.Linears computes each in its own), the
    # neighbours of one format joined: q and k beside a v of more bits (llama-quantize's Q4_K_M), which
    # my_ops::decoder_layer takes as two projections.
    blocks = [getattr(m, "gguf_blocks", None) for m in linears]
    if any(b is not None for b in blocks):
        parts = [((m.weight.detach(), "F32") if b is None else b, m.out_features) for b, m in zip(blocks, linears)]
        parts = _join_neighbours_of_one_format(parts)
        if len(parts) == 1:
            fused.gguf_blocks = parts[0][0]
        else:
            fused.gguf_parts = parts
    return fused


def _join_neighbours_of_one_format(parts: list) -> list:
    """[((weight, format), rows)] with each run of neighbours in one format joined into one part where the packed
    layout allows it (my_ops.hf.disk_weights.join_rows), each run in one join."""
    from .disk_weights import join_rows

    joined = []
    for fmt, run in itertools.groupby(parts, key=lambda part: part[0][1]):
        run = list(run)
        together = join_rows([weight for (weight, _), _ in run], fmt) if len(run) > 1 else None
        if together is None:
            joined += run
        else:
            joined.append(((together, fmt), sum(rows for _, rows in run)))
    return joined


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of transformers' Llama family, x [B, T, heads, D] with cos and sin [B, T, D]."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


# Attention modules that compute Llama's attention: q, k and v projections, the rotary embedding from the decoder's
# position_embeddings, grouped-query heads (Qwen3 and Gemma 3 add per-head RMSNorms on q and k; Gemma 3's layers take
# the local or the global rotary embedding, as its decoder hands them, and its local ones a sliding window).
ATTENTIONS = ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention", "Gemma3Attention")
MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Gemma3MLP")  # down(act(gate(x)) * up(x)); Gemma: GELU-tanh


class Attention(torch.nn.Module):
    """my_ops' attention in place of a Llama-family attention module: q, k and v from one projection (their weights
    side by side), the heads kept as [B, T, heads, head_dim] throughout (the layout my_ops::update_cache and
    my_ops::sdpa_with_cache take, so nothing is transposed), the rotary embedding applied in that layout, then the
    layer's cache written at the step's position and attended over."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.qkv_proj = _fused_linear(original.q_proj, original.k_proj, original.v_proj)
        self.o_proj = original.o_proj
        self.q_norm, self.k_norm = getattr(original, "q_norm", None), getattr(original, "k_norm", None)
        config = original.config
        self.head_dim = original.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, _kv_heads(config)
        self.scaling, self.layer_idx = float(original.scaling), original.layer_idx
        self.window = _window(original)
        self.replaces = type(original).__name__

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                cache_position=None, **kwargs):
        batch, length, _ = hidden_states.shape
        q, k, v = self.qkv_proj(hidden_states).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        q = q.view(batch, length, self.heads, self.head_dim)
        k = k.view(batch, length, self.kv_heads, self.head_dim)
        v = v.view(batch, length, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = position_embeddings
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        keys, values, start = past_key_values.write(self.layer_idx, k, v, cache_position)
        out = torch.ops.my_ops.sdpa_with_cache(q, keys, values, start, self.scaling, self.window)
        return self.o_proj(out.reshape(batch, length, self.heads * self.head_dim)), None

    def extra_repr(self) -> str:
        window = f", window={self.window}" if self.window else ""
        return (f"heads={self.heads}, kv_heads={self.kv_heads}, head_dim={self.head_dim}{window}, "
                f"replaces={self.replaces}")


def _window(attention: torch.nn.Module) -> int:
    """The layer's sliding window in positions, 0 for none: the module's own (per layer: Gemma 3, Qwen2/3) or, where
    the module keeps none, its config's for every layer (Mistral)."""
    if hasattr(attention, "sliding_window"):
        window = attention.sliding_window
    else:
        window = getattr(attention.config, "sliding_window", None)
    return int(window or 0)


class MLP(torch.nn.Module):
    """A gated MLP, down(act(gate(x)) * up(x)), with gate and up from one projection (their weights side by side)."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.gate_up_proj = _fused_linear(original.gate_proj, original.up_proj)
        self.down_proj, self.act_fn = original.down_proj, original.act_fn
        self.intermediate = original.gate_proj.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def _cache_class():
    from transformers import StaticCache

    class MyOpsCache(StaticCache):
        """transformers' static cache with every layer's keys and values as [B, S, H_kv, D] tensors (the layout
        my_ops::sdpa_with_cache reads), written with my_ops::update_cache at the step's position."""

        def __init__(self, config, max_cache_len: int, dtype: torch.dtype):
            super().__init__(config=config, max_cache_len=max_cache_len)
            text = config.get_text_config(decoder=True)
            shape = (1, max_cache_len, _kv_heads(text), _head_dim(text))
            self.key_tensors = [torch.zeros(shape, dtype=dtype) for _ in range(text.num_hidden_layers)]
            self.value_tensors = [torch.zeros(shape, dtype=dtype) for _ in range(text.num_hidden_layers)]

        start = None  # the step's first position, read once a step by ExportableDecoder (one op, not one a layer)

        def write(self, layer_idx: int, key_states, value_states, cache_position):
            """Writes [B, T, H_kv, D] keys and values at the step's first position; returns the layer's caches and that
            position."""
            keys, values = self.key_tensors[layer_idx], self.value_tensors[layer_idx]
            start = self.start
            if start is None:
                start = _start_of(cache_position, key_states.shape[1], keys.shape[1])
            torch.ops.my_ops.update_cache(key_states, keys, start)
            torch.ops.my_ops.update_cache(value_states, values, start)
            return keys, values, start

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return int(self.key_tensors[layer_idx][0, :, 0].any(dim=-1).sum())

        def reset(self):
            for tensor in (*self.key_tensors, *self.value_tensors):
                tensor.zero_()

    return MyOpsCache


def _head_dim(text_config) -> int:
    return getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads


def _kv_heads(text_config) -> int:
    return getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads


def problems(model: torch.nn.Module, *, keep_unknown_norms: bool = False) -> list[str]:
    """Why `model` cannot be put on the project's ops, one line each (empty when it can)."""
    found = []
    missing = [op for op in OPS if not hasattr(getattr(torch.ops, op.split("::")[0]), op.split("::")[1])]
    if missing:
        found.append(f"{', '.join(missing)} not registered with PyTorch: `import my_ops` (the wheel), or load the "
                     "build's libcustom_ops_aot_lib.so and import ops/update_cache/update_cache.py")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return found + [f"{type(model).__name__} is not a transformers model (no config); load it with "
                        "AutoModelForCausalLM.from_pretrained"]
    text = config.get_text_config(decoder=True)
    if getattr(config, "is_encoder_decoder", False):
        found.append(f"{type(model).__name__} is an encoder-decoder (cross attention): only decoder-only models are "
                     "supported")
    kinds = set(getattr(text, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if kinds:
        found.append(f"layer types {sorted(kinds)}: only full and sliding-window attention are supported "
                     "(my_ops::sdpa_with_cache attends to every earlier position or to a window of them)")
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls in NORMS or isinstance(module, RMSNorm):
            continue
        if cls.endswith("Norm") and not keep_unknown_norms:
            found.append(f"{name} ({cls}): no my_ops mapping; add one to my_ops.hf.NORMS if it computes "
                         "weight * x / rms(x), or pass keep_unknown_norms=True to leave it as ATen ops")
        if hasattr(module, "is_causal") and hasattr(module, "layer_idx") and not isinstance(module, Attention):
            if not module.is_causal:  # a decoder layer's attention
                found.append(f"{name} ({cls}): non-causal attention is not supported")
            elif cls not in ATTENTIONS:
                found.append(f"{name} ({cls}): no my_ops attention for this class; add it to my_ops.hf.ATTENTIONS if it "
                             "computes Llama's attention (q, k, v and o projections, rotary embedding)")
    if getattr(text, "attn_logit_softcapping", None) is not None:
        found.append("attn_logit_softcapping: soft-capped attention logits are not supported")
    return found


def swap_ops(model: torch.nn.Module, *, keep_unknown_norms: bool = False) -> torch.nn.Module:
    """Puts the project's ops into `model`, in place: every known RMSNorm becomes RMSNorm (my_ops::rms_norm, the same
    weight and epsilon), every attention module Attention (my_ops::update_cache and my_ops::sdpa_with_cache over
    ExportableDecoder's cache), every gated MLP an MLP with one projection for gate and up. Raises
    UnsupportedModelError naming every problem first."""
    from transformers import AttentionInterface

    if found := problems(model, keep_unknown_norms=keep_unknown_norms):
        raise UnsupportedModelError("cannot put this model on my_ops:\n  " + "\n  ".join(found))
    AttentionInterface.register(ATTENTION_NAME, sdpa_with_cache_attention)
    for name, module in list(model.named_modules()):
        cls = type(module).__name__
        parent, _, child = name.rpartition(".")
        if (mapping := NORMS.get(cls)) is not None:
            weight, eps = mapping(module)
            setattr(model.get_submodule(parent), child, RMSNorm(weight, eps, cls))
    for name, module in list(model.named_modules()):  # after the norms: Qwen3's per-head ones move with its attention
        cls = type(module).__name__
        parent, _, child = name.rpartition(".")
        if cls in ATTENTIONS:
            setattr(model.get_submodule(parent), child, Attention(module))
        elif cls in MLPS:
            setattr(model.get_submodule(parent), child, MLP(module))
    for config in {id(c): c for c in (model.config, model.config.get_text_config(decoder=True))}.values():
        config._attn_implementation = ATTENTION_NAME
    return model


class ExportableDecoder(torch.nn.Module):
    """A swapped model with its cache, as one module: forward(tokens int64 [1, T], input_pos int64 [1]) -> logits
    [1, vocab] of the last position. The caches are its buffers (state the program keeps between executions)."""

    def __init__(self, model: torch.nn.Module, max_seq_len: int):
        super().__init__()
        dtype = next(model.parameters()).dtype
        self.model = model
        self.max_seq_len = max_seq_len
        self.cache = _cache_class()(model.config, max_seq_len, dtype)
        for i, (keys, values) in enumerate(zip(self.cache.key_tensors, self.cache.value_tensors)):
            self.register_buffer(f"key_cache_{i}", keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", values, persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        # The layers reach the caches through the cache object, so it is handed this module's buffers each step: an
        # export that is not strict puts its own tensors in their place, and attention must write those.
        layers = range(len(self.cache.key_tensors))
        self.cache.key_tensors = [getattr(self, f"key_cache_{i}") for i in layers]
        self.cache.value_tensors = [getattr(self, f"value_cache_{i}") for i in layers]
        positions = input_pos + torch.arange(tokens.shape[1], dtype=input_pos.dtype)
        self.cache.start = _start_of(input_pos, tokens.shape[1], self.max_seq_len)
        try:
            out = self.model(input_ids=tokens, cache_position=positions, position_ids=positions.unsqueeze(0),
                             past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        finally:
            self.cache.start = None
        return out.logits[:, -1, :]

    def example_inputs(self, length: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, length, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)

    def dynamic_shapes(self):
        return ({1: torch.export.Dim("length", min=1, max=self.max_seq_len)}, None)
