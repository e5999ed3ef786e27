"""A llama.cpp GGUF file as an ExecuTorch program on its own quantized blocks (Q8_0, Q4_0, Q4_1), nothing dequantized
into the program and nothing requantized: its linear layers and embedding on my_ops' block ops, the rest as my_ops.hf
does it (`python -m my_ops.hf generate|export --model FILE.gguf --quantize gguf` is the same from the command line).

    program = my_ops.gguf.export_program("SmolLM2-135M-Instruct.Q4_1.gguf", max_seq_len=512)
    program.write_to_file(open("model.pte", "wb"))

The reading and the row order are my_ops/hf/gguf_blocks.py's (re-exported here).
"""

from __future__ import annotations

from .hf.gguf_blocks import (BLOCK, BLOCK_BYTES, FORMATS, UnsupportedTensorError, attach_blocks, codes_and_records,
                             dequantize, rope_row_order)

__all__ = ["BLOCK", "BLOCK_BYTES", "FORMATS", "UnsupportedTensorError", "attach_blocks", "codes_and_records",
           "dequantize", "export_program", "rope_row_order"]


def export_program(path: str, *, max_seq_len: int = 256):
    """The GGUF file at `path` as an ExecuTorch program whose linear layers and embedding run the file's own blocks on
    my_ops' block ops (nothing dequantized into the program, nothing requantized); the rest as my_ops.hf does it."""
    from .hf.checkpoint import load
    from .hf.export import export_checkpoint

    return export_checkpoint(load(path), max_seq_len=max_seq_len, quantize="gguf")
