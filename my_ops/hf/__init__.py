"""This project's ops in a Hugging Face transformers decoder you did not write, and the model as text in, text out:

    model = AutoModelForCausalLM.from_pretrained(path)
    program = my_ops.hf.export_program(model, max_seq_len=256, quantize="8da4w")   # None: float32; or "8da8w"
    program.write_to_file(open("model.pte", "wb"))

    python -m my_ops.hf generate --model PATH --prompt "The capital of France is" [--chat] [--quantize 8da4w]
    python -m my_ops.hf export --model PATH [--quantize ...] --output DIR

The program's method is forward(tokens int64 [1, T], input_pos int64 [1]) -> logits float32 [1, vocab] of the last
position: the project's runner decodes it (`--prompt`), and so do the Python runtime and ExecuTorch's LLM runner. Its
norms, KV cache and attention are my_ops::rms_norm, update_cache and sdpa_with_cache (swap.py); its linear layers and
embedding my_ops' block-format ops (quantize.py); a PATH is a model folder or a llama.cpp GGUF file (checkpoint.py).
"""

from .to_program import QUANTIZE_MODES, export_program, prepare, program_ops
from .quantize import Embedding, Linear, put_linears_on_ops
from .swap import (ATTENTION_NAME, ATTENTIONS, MLPS, NORMS, OPS, MLP, Attention, ExportableDecoder, RMSNorm,
                   UnsupportedModelError, problems, sdpa_with_cache_attention, swap_ops)

__all__ = ["ATTENTIONS", "ATTENTION_NAME", "MLPS", "NORMS", "OPS", "QUANTIZE_MODES", "Attention", "Embedding",
           "ExportableDecoder", "Linear", "MLP", "RMSNorm", "UnsupportedModelError", "export_program", "prepare",
           "problems", "program_ops", "put_linears_on_ops", "sdpa_with_cache_attention", "swap_ops"]
