"""This project's ops in a Hugging Face transformers decoder you did not write: its RMSNorm modules become
my_ops::rms_norm, its KV cache a static cache written with my_ops::update_cache, its attention my_ops::sdpa_with_cache;
then one call exports it to an ExecuTorch program (linear layers on XNNPACK, float32 or 8-bit dynamically quantized,
the custom ops on this project's kernels) that the project's runner decodes:

    model = AutoModelForCausalLM.from_pretrained(path)
    program = my_ops.hf.export_program(model, max_seq_len=256, quantize="8da8w")   # or None for float32
    program.write_to_file(open("model.pte", "wb"))

The program's method is forward(tokens int64 [1, T], input_pos int64 [1]) -> logits float32 [1, vocab] of the last
position (the runner's `--prompt` decoding). What this module cannot put on the project's ops is refused by name before
anything is traced: an unknown norm, sliding-window, chunked or cross attention, logit soft-capping, a missing op
library. Another architecture's norm is one entry of NORMS (docs/hf.md).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

ATTENTION_NAME = "my_ops_sdpa_with_cache"  # the name under transformers' AttentionInterface
QUANTIZE_MODES = ("8da8w",)  # 8-bit weights per channel, 8-bit activations quantized per token at run time (XNNPACK)
OPS = ("my_ops::rms_norm", "my_ops::update_cache", "my_ops::sdpa_with_cache")


class UnsupportedModelError(ValueError):
    """A model, config or environment the swap cannot honour; the message names what and the way out."""


# Norm classes whose forward is weight * (x / sqrt(mean(x^2, -1) + eps)) computed in float: my_ops::rms_norm's math.
# Each maps a module to (weight, eps). Gemma's norm scales by (1 + weight): it would need its own entry, not this one.
def _weight_and_variance_epsilon(module: torch.nn.Module) -> tuple[torch.nn.Parameter, float]:
    return module.weight, float(module.variance_epsilon)


NORMS: dict[str, Callable[[torch.nn.Module], tuple[torch.nn.Parameter, float]]] = {
    name: _weight_and_variance_epsilon
    for name in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
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
    """transformers' attention interface over the caches MyOpsCache returns: query [B, H, T, D] from the model,
    key and value the whole caches [B, S, H_kv, D]; attends causally to positions 0 .. start + t. Returns
    ([B, T, H, D], None) as transformers' own attention functions do."""
    length, capacity = query.shape[2], key.shape[1]
    start = _start_of(kwargs["position_ids"], length, capacity)
    out = torch.ops.my_ops.sdpa_with_cache(query.transpose(1, 2), key, value, start, scaling)
    return out, None


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

        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            keys, values = self.key_tensors[layer_idx], self.value_tensors[layer_idx]
            start = _start_of(cache_kwargs["cache_position"], key_states.shape[2], keys.shape[1])
            torch.ops.my_ops.update_cache(key_states.transpose(1, 2), keys, start)
            torch.ops.my_ops.update_cache(value_states.transpose(1, 2), values, start)
            return keys, values

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


def problems(model: torch.nn.Module, *, keep_unknown_norms: bool = False, max_seq_len: int | None = None) -> list[str]:
    """Why `model` cannot be put on the project's ops, one line each (empty when it can). A sliding window at least
    max_seq_len long never slides, so it is accepted then."""
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
    window = getattr(text, "sliding_window", None)
    slides = window is not None and (max_seq_len is None or window < max_seq_len)
    if slides and getattr(text, "use_sliding_window", True):
        found.append(f"sliding-window attention (window {window}) is not supported: my_ops::sdpa_with_cache attends to "
                     f"every earlier position; export with max_seq_len <= {window}, where the window never slides")
    kinds = set(getattr(text, "layer_types", None) or ())
    if kinds - {"full_attention"}:
        found.append(f"layer types {sorted(kinds - {'full_attention'})}: sliding-window and chunked attention are not "
                     "supported (my_ops::sdpa_with_cache attends to every earlier position)")
    for name, module in model.named_modules():
        cls = type(module).__name__
        if cls in NORMS or isinstance(module, RMSNorm):
            continue
        if cls.endswith("Norm") and not keep_unknown_norms:
            found.append(f"{name} ({cls}): no my_ops mapping; add one to my_ops.hf.NORMS if it computes "
                         "weight * x / rms(x), or pass keep_unknown_norms=True to leave it as ATen ops")
        if hasattr(module, "is_causal") and hasattr(module, "layer_idx"):  # a decoder layer's attention
            if not module.is_causal:
                found.append(f"{name} ({cls}): non-causal attention is not supported")
    if getattr(text, "attn_logit_softcapping", None) is not None:
        found.append("attn_logit_softcapping: soft-capped attention logits are not supported")
    return found


def swap_ops(model: torch.nn.Module, *, keep_unknown_norms: bool = False,
             max_seq_len: int | None = None) -> torch.nn.Module:
    """Puts the project's ops into `model`, in place: every known RMSNorm becomes RMSNorm (my_ops::rms_norm, the same
    weight and epsilon) and attention goes through my_ops::sdpa_with_cache (config._attn_implementation). The cache
    is ExportableDecoder's. Raises UnsupportedModelError naming every problem first."""
    from transformers import AttentionInterface

    if found := problems(model, keep_unknown_norms=keep_unknown_norms, max_seq_len=max_seq_len):
        raise UnsupportedModelError("cannot put this model on my_ops:\n  " + "\n  ".join(found))
    AttentionInterface.register(ATTENTION_NAME, sdpa_with_cache_attention)
    for name, module in list(model.named_modules()):
        if (mapping := NORMS.get(type(module).__name__)) is not None:
            weight, eps = mapping(module)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, RMSNorm(weight, eps, type(module).__name__))
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
        positions = input_pos + torch.arange(tokens.shape[1], dtype=input_pos.dtype)
        out = self.model(input_ids=tokens, cache_position=positions, position_ids=positions.unsqueeze(0),
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    def example_inputs(self, length: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, length, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)

    def dynamic_shapes(self):
        return ({1: torch.export.Dim("length", min=1, max=self.max_seq_len)}, None)


def quantize_8da8w(module: torch.nn.Module, inputs, dynamic_shapes) -> torch.nn.Module:
    """XNNPACK's 8-bit dynamic quantization of the linear layers (int8 weights per channel, activations per token),
    calibrated on `inputs`; returns the converted graph, which also runs in eager (the quantized model's reference)."""
    from executorch.backends.transforms.duplicate_dynamic_quant_chain import DuplicateDynamicQuantChainPass
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    graph = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes, strict=True).module()
    prepared = prepare_pt2e(graph, quantizer)
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    # One activation-quantizing chain per linear layer: q, k and v share their input, and one chain feeding three
    # partitions on either side of the custom ops makes XNNPACK's partitions depend on each other in a cycle.
    DuplicateDynamicQuantChainPass()(converted)
    return converted


def export_program(model: torch.nn.Module, *, max_seq_len: int = 256, quantize: str | None = None,
                   keep_unknown_norms: bool = False):
    """Swaps the project's ops into `model` (in place), exports it with its linear layers on XNNPACK, and returns the
    ExecuTorch program (an ExecutorchProgramManager: .buffer, .write_to_file). Checks that every custom op stayed
    outside the delegate."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    if quantize not in (None, *QUANTIZE_MODES):
        raise UnsupportedModelError(f"quantize={quantize!r}: choose None (float32) or one of {QUANTIZE_MODES}")
    if max_seq_len < 1:
        raise UnsupportedModelError(f"max_seq_len={max_seq_len}: give the positions the program holds, 1 or more")
    text_config = model.config.get_text_config(decoder=True)
    limit = getattr(text_config, "max_position_embeddings", None)
    if limit is not None and max_seq_len > limit:
        raise UnsupportedModelError(f"max_seq_len={max_seq_len} passes the model's max_position_embeddings ({limit})")
    model = swap_ops(model.eval(), keep_unknown_norms=keep_unknown_norms, max_seq_len=max_seq_len).requires_grad_(False)
    decoder = ExportableDecoder(model, max_seq_len).eval()
    inputs, dynamic_shapes = decoder.example_inputs(), decoder.dynamic_shapes()
    module = quantize_8da8w(decoder, inputs, dynamic_shapes) if quantize else decoder
    exported = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes, strict=True)
    # The methods ExecuTorch's LLM runner (extension/llm/runner, TextLLMRunner) reads before it decodes: with them the
    # program also runs there, as optimum-executorch's do (get_max_seq_len is required; the others have defaults that
    # would prefill token by token).
    metadata = {"get_max_seq_len": max_seq_len, "get_max_context_len": max_seq_len, "enable_dynamic_shape": True,
                "use_kv_cache": True, "get_vocab_size": text_config.vocab_size}
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()], constant_methods=metadata)
    if missing := [op for op in OPS if op not in _ops_outside_delegates(edge.exported_program().graph)]:
        raise UnsupportedModelError(f"{', '.join(missing)} did not reach the program's own kernels (decomposed or "
                                    "delegated): the swap did not take")
    # The caches start uninitialized (their zeros are not stored in the program): every position attention reads was
    # written by this generation first, since my_ops::sdpa_with_cache reads only positions before start + T.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Mutation on a buffer in the model is detected")
        return edge.to_executorch()


def _ops_outside_delegates(graph) -> set[str]:
    """The operators the edge graph calls itself (not through a delegate), e.g. "my_ops::rms_norm"; an op mutating its
    argument is wrapped in auto_functionalized until to_executorch."""
    names = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.args[0] if "auto_functionalized" in str(node.target) else node.target
        if hasattr(target, "name"):
            names.add(target.name().split(".")[0])  # "my_ops::rms_norm.default" -> "my_ops::rms_norm"
    return names
