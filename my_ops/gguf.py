"""A llama.cpp GGUF file as an ExecuTorch program on its own tensors, nothing dequantized into the program and nothing
requantized: every format llama-quantize's presets write (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K;
F16 and BF16 kept at 16 bits) on my_ops::linear_blocks and embedding_blocks, the rest as my_ops.hf does it
(`python -m my_ops.hf generate|export|perplexity --model FILE.gguf --quantize gguf` is the same from the command line).

    program = my_ops.gguf.export_program("SmolLM2-135M-Instruct.Q4_K_M.gguf", max_seq_len=512)
    program.write_to_file(open("model.pte", "wb"))

The reading and the row order are my_ops/hf/gguf_blocks.py's (re-exported here).
"""

from __future__ import annotations

from .hf.gguf_blocks import (FLOAT_TYPES, FORMATS, LAYOUTS, UnsupportedTensorError, attach_blocks, block_bytes,
                             codes_and_records, load_file_weights, packed_rows, rope_row_order)

__all__ = ["FLOAT_TYPES", "FORMATS", "LAYOUTS", "UnsupportedTensorError", "attach_blocks", "block_bytes",
           "codes_and_records", "export_program", "load_file_weights", "packed_rows", "rope_row_order"]


def export_program(path: str, *, max_seq_len: int = 256):
    """The GGUF file at `path` as an ExecuTorch program whose linear layers and embedding run the file's own tensors
    on my_ops' block ops (nothing dequantized into the program, nothing requantized); the rest as my_ops.hf does it.
    The model is built on the file's tensors alone (no float32 copy of its matrices: the export's memory follows the
    file's size)."""
    from .hf.checkpoint import load
    from .hf.to_program import export_checkpoint

    return export_checkpoint(load(path, dequantize=False), max_seq_len=max_seq_len, quantize="gguf")
