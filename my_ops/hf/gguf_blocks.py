"""Reading a llama.cpp GGUF file's own quantized blocks (Q8_0, Q4_0, Q4_1) as the packer of quantize.py takes them, and
attaching them to transformers' model of the file (attach_blocks), so export packs them as they are (quantize="gguf").
The reading imports only numpy and the gguf package; my_ops.gguf is the entry point.

llama.cpp's blocks (ggml-common.h), 32 weights each, little-endian:
    Q8_0  fp16 d, int8 qs[32]                     w[j] = d * qs[j]
    Q4_0  fp16 d, uint8 qs[16]                    w[j] = d * ((qs[j] & 15) - 8), w[j + 16] = d * ((qs[j] >> 4) - 8)
    Q4_1  fp16 d, fp16 m, uint8 qs[16]            w[j] = d * (qs[j] & 15) + m,   w[j + 16] = d * (qs[j] >> 4) + m
"""

from __future__ import annotations

import numpy as np

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
FORMATS = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}  # GGUF type -> my_ops' format


class UnsupportedTensorError(ValueError):
    pass


def codes_and_records(raw: np.ndarray, type_name: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """A tensor's rows of blocks (uint8 [n, blocks * block bytes], as gguf.GGUFReader gives them) as my_ops' packer
    takes them: codes uint8 [n, blocks * 32] (Q8_0: q + 128; Q4: q, 0 to 15) and the records, fp16 [n, blocks] each
    (d, then m for Q4_1)."""
    if type_name not in BLOCK_BYTES:
        raise UnsupportedTensorError(f"GGUF tensor type {type_name} is not one my_ops reads; it takes "
                                     f"{', '.join(BLOCK_BYTES)}")
    if raw.ndim != 2 or raw.dtype != np.uint8 or raw.shape[1] % BLOCK_BYTES[type_name]:
        raise UnsupportedTensorError(f"a {type_name} tensor's rows are whole blocks of {BLOCK_BYTES[type_name]} bytes; "
                                     f"this one is {raw.dtype} {list(raw.shape)} ({raw.shape[-1]} bytes a row): the "
                                     "file is damaged or not llama.cpp's layout")
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, BLOCK_BYTES[type_name])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if type_name == "Q8_0":
        q = blocks[..., 2:34].copy().view(np.int8).astype(np.int16) + 128
        return q.astype(np.uint8).reshape(n, -1), [d]
    first = 4 if type_name == "Q4_1" else 2
    qs = blocks[..., first:first + 16]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)
    records = [d, blocks[..., 2:4].copy().view(np.float16)[..., 0]] if type_name == "Q4_1" else [d]
    return codes, records


def dequantize(codes: np.ndarray, records: list[np.ndarray], type_name: str) -> np.ndarray:
    """float32 [n, k] of codes_and_records' output, as llama.cpp's dequantizers compute it."""
    n = codes.shape[0]
    q = codes.reshape(n, -1, BLOCK).astype(np.float32)
    d = records[0].astype(np.float32)[..., None]
    if type_name == "Q8_0":
        return ((q - 128) * d).reshape(n, -1)
    if type_name == "Q4_0":
        return ((q - 8) * d).reshape(n, -1)
    return (q * d + records[1].astype(np.float32)[..., None]).reshape(n, -1)


def rope_row_order(rows: int, heads: int) -> np.ndarray:
    """The rows of a Q or K weight as transformers orders them, indices into the GGUF tensor's rows: llama.cpp's
    converter interleaved each head's two rotary halves; whole rows move, so the blocks stay intact."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).swapaxes(1, 2).reshape(rows)


def attach_blocks(model, path: str) -> dict[str, str]:
    """Every torch.nn.Linear and the token embedding of `model` (transformers' model of the GGUF file at `path`) whose
    weight is a quantized tensor of the file gets `gguf_blocks = (codes, records, format)` in transformers' row order,
    for my_ops.hf.quantize to pack instead of quantizing. Returns {GGUF tensor: its type} of what was attached. Raises
    UnsupportedTensorError naming every quantized tensor of a type the ops do not take, before anything is attached."""
    import gguf
    import torch
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    config = model.config.get_text_config(decoder=True)
    names = get_gguf_hf_weights_map(model)  # GGUF tensor -> transformers parameter
    reader = gguf.GGUFReader(path)
    float_types = {"F32", "F16", "BF16"}
    refused = [f"{t.name} ({t.tensor_type.name})" for t in reader.tensors
               if t.tensor_type.name not in float_types | set(BLOCK_BYTES)]
    if refused:
        raise UnsupportedTensorError(f"{path}: {len(refused)} tensors of types my_ops does not read: "
                                     f"{', '.join(refused[:6])}{' ...' if len(refused) > 6 else ''}; it takes "
                                     f"{', '.join(BLOCK_BYTES)} (and float tensors); requantize the file with "
                                     "llama-quantize to one of them, or export with --quantize 8da4w")
    modules = dict(model.named_modules())
    attached = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in BLOCK_BYTES or tensor.name not in names:
            continue
        module = modules[names[tensor.name].rsplit(".", 1)[0]]
        codes, records = codes_and_records(np.asarray(tensor.data), kind)
        if ".attn_q." in tensor.name or ".attn_k." in tensor.name:
            heads = config.num_attention_heads if ".attn_q." in tensor.name else config.num_key_value_heads
            order = rope_row_order(codes.shape[0], heads)
            codes, records = codes[order], [r[order] for r in records]
        module.gguf_blocks = (torch.from_numpy(np.ascontiguousarray(codes)),
                              [torch.from_numpy(np.ascontiguousarray(r)) for r in records], FORMATS[kind])
        attached[tensor.name] = kind
    return attached
