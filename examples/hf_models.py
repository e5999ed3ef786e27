"""Tiny Hugging Face checkpoints for `test_custom_ops.sh hf`: architectures this project did not write (Llama, Qwen3),
each a small config with seeded random weights made here and saved with save_pretrained, so the flow loads them back
with from_pretrained from a directory, the path a downloaded checkpoint takes. Nothing is downloaded.

Both use grouped-query attention (4 query heads over 2 kv heads), so a kv head mapped wrongly changes the tokens.
"""

from __future__ import annotations

import math
import os

import torch

VOCAB = 256
MAX_POSITIONS = 256
PROMPT = (1, 17, 42, 99, 7, 3, 250, 64)  # token ids
NEW_TOKENS = 200

_COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
               bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no end token: every run decodes NEW_TOKENS


def configs() -> dict:
    """name -> a transformers config of a tiny decoder."""
    from transformers import LlamaConfig, Qwen3Config

    return {
        "llama": LlamaConfig(**_COMMON, rms_norm_eps=1e-5, tie_word_embeddings=False),
        # Qwen3 adds RMSNorms on each head's queries and keys (q_norm, k_norm) and ties the embeddings.
        "qwen3": Qwen3Config(**_COMMON, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True),
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
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("norm.weight"):
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:  # wider than transformers' init (std 0.02): logits far enough apart that greedy decoding does not
                # hinge on the last bit of a float
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    return directory


def load(directory: str):
    """The checkpoint as a user loads it: from_pretrained, float32, in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
