"""This project's ops in a Hugging Face transformers decoder you did not write, and the model as text in, text out:

    model = AutoModelForCausalLM.from_pretrained(path)
    program = my_ops.hf.export_program(model, max_seq_len=256, quantize="8da4w")   # None: float32; or "8da8w"
    program.write_to_file(open("model.pte", "wb"))

    python -m my_ops.hf generate --model PATH --prompt "The capital of France is" [--chat] [--quantize 8da4w]
    python -m my_ops.hf export --model PATH [--quantize ...] --output DIR [--ptd]   # --ptd: weights in model.ptd

The program's method is forward(tokens int64 [1, T], input_pos int64 [1]) -> logits float32 [1, vocab] of the last
position: the project's runner decodes it (`--prompt`), and so do the Python runtime and ExecuTorch's LLM runner. Its
norms, KV cache and attention are my_ops::rms_norm, update_cache and sdpa_with_cache (swap.py); its linear layers and
embedding my_ops' block-format ops (quantize.py); a PATH is a model folder or a llama.cpp GGUF file (checkpoint.py).

    checkpoint      a model folder or a GGUF file loaded by transformers, its config read once from the file; or
                    a GGUF file's model built on the file's own tensors, no float32 copy (dequantize=False); a
                    file's rope factors (Llama 3's scaling) applied, which transformers' loader drops
    gguf_file       a GGUF file's header, checked whole before anything is read from it, and its metadata as
                    transformers reads it
    gguf_blocks     a GGUF file's tensors in their own block formats, attached to the model's layers (or given to
                    a model built without weights), read by a map of the file a tensor at a time
    gguf_tokenizer  a GGUF file's tokenizer, as llama.cpp splits text
    swap            the norms, KV cache and attention put on my_ops (and what is refused, by name)
    quantize        the linear layers and embedding on the block-format ops (8da8w, 8da4w, a file's own blocks)
    fuse            the export pass that puts the fused ops (rope, silu_mul, gelu_mul, add_rms_norm, the attention and
                    the whole decoder layer) where a model computes their patterns
    to_program      torch.export, the pass and EXIR lowering: the ExecuTorch program (its weights in it, or in a
                    named data file beside it: write_program)
    disk_weights    a file's packed tensors kept on disk while their program is emitted (the export holds them once)
    session         what a process needs: the ops for PyTorch, their kernels for ExecuTorch, the program cache
    text            sampling, generation and perplexity (llama-perplexity's protocol), the libraries kept quiet
    __main__        python -m my_ops.hf generate | export | perplexity
"""

from .to_program import QUANTIZE_MODES, export_program, prepare, program_ops, write_program
from .quantize import Embedding, Linear, put_linears_on_ops
from .swap import (ATTENTION_NAME, ATTENTIONS, MLPS, NORMS, OPS, MLP, Attention, ExportableDecoder, RMSNorm,
                   UnsupportedModelError, problems, sdpa_with_cache_attention, swap_ops)

__all__ = ["ATTENTIONS", "ATTENTION_NAME", "MLPS", "NORMS", "OPS", "QUANTIZE_MODES", "Attention", "Embedding",
           "ExportableDecoder", "Linear", "MLP", "RMSNorm", "UnsupportedModelError", "export_program", "prepare",
           "problems", "program_ops", "put_linears_on_ops", "sdpa_with_cache_attention", "swap_ops", "write_program"]
