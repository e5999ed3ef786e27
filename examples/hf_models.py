"""Tiny Hugging Face checkpoints for `test_custom_ops.sh hf`: architectures this project did not write (Llama, Qwen3,
Gemma 3), each a small config with seeded random weights made here and saved with save_pretrained, so the flow loads
them back with from_pretrained from a directory, the path a downloaded checkpoint takes. Nothing is downloaded.

Each uses grouped-query attention (4 query heads over 2 kv heads), so a kv head mapped wrongly changes the tokens.
"""

from __future__ import annotations

import math
import os

import torch

VOCAB = 256
MAX_POSITIONS = 256
PROMPT = (1, 17, 42, 99, 7, 3, 250, 64)  # token ids
NEW_TOKENS = 200
SLIDING_WINDOW = 16  # Gemma 3's local layers: slides from the 9th new token, far before a decode ends

_COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
               bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no end token: every run decodes NEW_TOKENS


def configs() -> dict:
    """name -> a transformers config of a tiny decoder."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config

    return {
        "llama": LlamaConfig(**_COMMON, rms_norm_eps=1e-5, tie_word_embeddings=False),
        # Mistral: Llama's layers, every one attending within a sliding window (its config's, not its modules').
        "mistral": MistralConfig(**_COMMON, rms_norm_eps=1e-5, tie_word_embeddings=False, head_dim=32,
                                 sliding_window=SLIDING_WINDOW),
        # Qwen3 adds RMSNorms on each head's queries and keys (q_norm, k_norm) and ties the embeddings.
        "qwen3": Qwen3Config(**_COMMON, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True),
        # Gemma 3: norms that scale by (1 + weight), four a layer, and on each head's queries and keys; GELU-tanh in the
        # MLP; the embedding scaled by sqrt(hidden size); a local layer (its own rotary base and a window of
        # SLIDING_WINDOW positions) and a global one.
        "gemma3": Gemma3TextConfig(**_COMMON, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                   query_pre_attn_scalar=32, sliding_window=SLIDING_WINDOW,
                                   layer_types=["sliding_attention", "full_attention"],
                                   rope_parameters={
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                       "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
    }


def make_checkpoint(name: str, directory: str, seed: int = 0, **overrides) -> str:
    """Writes checkpoint `name` (its config's fields changed by `overrides`) to `directory` (config.json,
    model.safetensors, generation_config.json); returns it."""
    from transformers import AutoModelForCausalLM

    config = configs()[name]
    for field, value in overrides.items():
        setattr(config, field, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    generator = torch.Generator().manual_seed(seed)
    # Norm scales near 1: Gemma's norms scale by (1 + weight), so its weights are near 0.
    norm_offset = 0.0 if config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("norm.weight"):
                parameter.copy_(norm_offset + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:  # wider than transformers' init (std 0.02): logits far enough apart that greedy decoding does not
                # hinge on the last bit of a float
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))
        # Gemma scales its embedding by sqrt(hidden size): without this, the (tied) token's own row would outweigh
        # every layer's output and the model would repeat its last token.
        embedding = model.get_input_embeddings()
        embedding.weight /= float(getattr(embedding, "embed_scale", 1.0))
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    return directory


def load(directory: str):
    """The checkpoint as a user loads it: from_pretrained, float32, in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
