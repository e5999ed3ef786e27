"""Reading a llama.cpp GGUF file's own tensors as my_ops' block ops take them, and attaching them to transformers' model
of the file (attach_blocks), so export packs them as they are (quantize="gguf"): nothing requantized, nothing
dequantized into the program. The reading imports only numpy, the gguf package and the formats' layouts
(my_ops.block_layouts); my_ops.gguf is the entry point.

llama.cpp's blocks (ggml-common.h; dequantized as ggml-quants.c does), little-endian. The ops take each block's weights
as unsigned codes in weight order and its other bytes (the "record": scales, minimums, packed sub-block scales) as the
file stores them:
    Q8_0  d, qs[32]                                   code = q + 128
    Q4_0  d, qs[16]                                   nibbles: weight j low, j + 16 high
    Q4_1  d, m, qs[16]
    Q5_0  d, qh[4], qs[16]                            as Q4 plus bit j of qh as the code's fifth bit
    Q5_1  d, m, qh[4], qs[16]
    Q2_K  scales[16], qs[64], d, dmin                 256 weights: 2 bits, weight 128h + 32j + 16u + l in bits 2j of
                                                      qs[32h + 16u + l]
    Q3_K  hmask[32], qs[64], scales[12], d            Q2_K's low bits, the third in bit 4h + j of hmask[16u + l]
    Q4_K  d, dmin, scales[12], qs[128]                weight 64j + 32u + l: nibble u of qs[32j + l]
    Q5_K  d, dmin, scales[12], qh[32], qs[128]        Q4_K's nibbles, the fifth bit in bit 2j + u of qh[l]
    Q6_K  ql[128], qh[64], scales[16], d              weight 128h + 32v + l (v < 4): nibble v // 2 of
                                                      ql[64h + 32 (v % 2) + l], top bits 2v of qh[32h + l]
"""

from __future__ import annotations

import numpy as np

from ..block_layouts import FORMATS, LAYOUTS, ROW_DTYPES as FLOAT_TYPES  # ops/blocks/block_layouts.py

# Where each format's record (the fields of its packed layout, in order) lies in the file's block: byte ranges.
RECORDS = {"Q8_0": ((0, 2),), "Q4_0": ((0, 2),), "Q4_1": ((0, 4),), "Q5_0": ((0, 2),), "Q5_1": ((0, 4),),
           "Q2_K": ((0, 16), (80, 84)), "Q3_K": ((96, 110),), "Q4_K": ((0, 16),), "Q5_K": ((0, 16),),
           "Q6_K": ((192, 210),)}


class UnsupportedTensorError(ValueError):
    pass


def block_bytes(type_name: str) -> int:
    """Bytes of one block of the type: its codes and its record."""
    return LAYOUTS[type_name].bytes


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_0 / Q4_1's 16 bytes as 32 codes: byte j's low nibble is weight j, its high nibble weight j + 16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(qh: np.ndarray) -> np.ndarray:
    """A little-endian 32-bit field as 32 bits, bit j first."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _codes(blocks: np.ndarray, kind: str) -> np.ndarray:
    """The codes [n, blocks, weights] of rows of blocks [n, blocks, block bytes]."""
    n, count = blocks.shape[:2]
    if kind == "Q8_0":
        return (blocks[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    if kind in ("Q4_0", "Q4_1"):
        return _nibbles(blocks[..., -16:])
    if kind in ("Q5_0", "Q5_1"):
        first = 2 if kind == "Q5_0" else 4
        return _nibbles(blocks[..., -16:]) | (_bits(blocks[..., first:first + 4]) << 4)
    shifts = np.arange(0, 8, 2, dtype=np.uint8)
    if kind in ("Q2_K", "Q3_K"):
        qs = blocks[..., 16:80] if kind == "Q2_K" else blocks[..., 32:96]
        # [h, u, l] bytes -> [h, j, u, l] weights
        low = (qs.reshape(n, count, 2, 1, 2, 16) >> shifts.reshape(4, 1, 1)) & 3
        if kind == "Q2_K":
            return low.reshape(n, count, 256)
        hmask = blocks[..., 0:32].reshape(n, count, 1, 1, 2, 16)
        high = (hmask >> np.arange(8, dtype=np.uint8).reshape(2, 4, 1, 1)) & 1  # bit 4h + j
        return (low | (high << 2)).reshape(n, count, 256)
    if kind in ("Q4_K", "Q5_K"):
        qs = blocks[..., -128:].reshape(n, count, 4, 1, 32)
        low = (qs >> np.array([0, 4], np.uint8).reshape(2, 1)) & 0x0F  # [j, u, l]
        if kind == "Q4_K":
            return low.reshape(n, count, 256)
        qh = blocks[..., 16:48].reshape(n, count, 1, 1, 32)
        high = (qh >> np.arange(8, dtype=np.uint8).reshape(4, 2, 1)) & 1  # bit 2j + u
        return (low | (high << 4)).reshape(n, count, 256)
    if kind == "Q6_K":
        ql = blocks[..., 0:128].reshape(n, count, 2, 1, 2, 32)  # [h, half of 64, l]
        qh = blocks[..., 128:192].reshape(n, count, 2, 1, 32)  # [h, l]
        low = (ql >> np.array([0, 4], np.uint8).reshape(2, 1, 1)) & 0x0F  # [h, nibble, half, l]: v = 2 nibble + half
        high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(4, 1)) & 3  # [h, v, l]
        return (low.reshape(n, count, 2, 4, 32) | (high << 4)).reshape(n, count, 256)
    raise AssertionError(kind)


def codes_and_records(raw: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray]:
    """A tensor's rows of blocks (uint8 [n, blocks * block bytes], as gguf.GGUFReader gives them) as my_ops' packer
    takes them: codes uint8 [n, k] (each weight's unsigned code, in weight order) and records uint8 [n, blocks, record
    bytes] (the block's scales and minimums, in the file's order)."""
    if type_name not in LAYOUTS:
        raise UnsupportedTensorError(f"GGUF tensor type {type_name} is not one my_ops reads as blocks; it takes "
                                     f"{', '.join(LAYOUTS)}")
    size = block_bytes(type_name)
    if raw.ndim != 2 or raw.dtype != np.uint8 or raw.shape[1] % size:
        raise UnsupportedTensorError(f"a {type_name} tensor's rows are whole blocks of {size} bytes; this one is "
                                     f"{raw.dtype} {list(raw.shape)} ({raw.shape[-1]} bytes a row): the file is damaged "
                                     "or not llama.cpp's layout")
    n = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(n, -1, size)
    records = np.concatenate([blocks[..., a:b] for a, b in RECORDS[type_name]], axis=-1)
    return _codes(blocks, type_name).reshape(n, -1), np.ascontiguousarray(records)


def rope_row_order(rows: int, heads: int) -> np.ndarray:
    """The rows of a Q or K weight as transformers orders them, indices into the GGUF tensor's rows: llama.cpp's
    converter interleaved each head's two rotary halves; whole rows move, so the blocks stay intact."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).swapaxes(1, 2).reshape(rows)


def attach_blocks(model, path: str) -> dict[str, str]:
    """Every torch.nn.Linear and the token embedding of `model` (transformers' model of the GGUF file at `path`) whose
    weight the file stores quantized, or at 16 bits, gets `gguf_blocks = (codes, records, format)` in transformers'
    row order (16 bits: `(the rows at their dtype, None, "F16" or "BF16")`), for my_ops.hf.quantize to pack instead of
    quantizing. Returns {GGUF tensor: its type} of what was attached. Raises UnsupportedTensorError naming every tensor
    of a type the ops do not take, before anything is attached."""
    import gguf
    import torch
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, LlamaTensorProcessor, TensorProcessor,
                                                          get_gguf_hf_weights_map)

    from .gguf_file import check

    config = model.config.get_text_config(decoder=True)
    names = get_gguf_hf_weights_map(model)  # GGUF tensor -> transformers parameter
    architecture = check(path).metadata.get("general.architecture")  # whole and well-formed before gguf reads it
    # llama.cpp's converter interleaves Q and K rows for the llama architecture only (not Gemma's, for one), and
    # transformers puts them back for those: the blocks follow the rows exactly where its float weights do.
    interleaved = issubclass(TENSOR_PROCESSORS.get(architecture, TensorProcessor), LlamaTensorProcessor)
    reader = gguf.GGUFReader(path)
    refused = [f"{t.name} ({t.tensor_type.name})" for t in reader.tensors if t.tensor_type.name not in FORMATS]
    if refused:
        raise UnsupportedTensorError(f"{path}: {len(refused)} tensors of types my_ops does not read: "
                                     f"{', '.join(refused[:6])}{' ...' if len(refused) > 6 else ''}; it takes "
                                     f"{', '.join(FORMATS)}; requantize the file with llama-quantize to one of them, "
                                     "or export with --quantize 8da4w")
    modules = dict(model.named_modules())
    attached = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind == "F32" or tensor.name not in names or len(tensor.shape) != 2:
            continue
        module = modules[names[tensor.name].rsplit(".", 1)[0]]
        if kind in FLOAT_TYPES:  # the file's 16-bit rows as they are (BF16 comes as raw bytes)
            rows = np.asarray(tensor.data)
            codes, records = torch.from_numpy(np.ascontiguousarray(rows).view(np.int16)).view(
                getattr(torch, FLOAT_TYPES[kind])), None
        else:
            codes, records = (torch.from_numpy(np.ascontiguousarray(a))
                              for a in codes_and_records(np.asarray(tensor.data), kind))
        if interleaved and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
            heads = config.num_attention_heads if ".attn_q." in tensor.name else config.num_key_value_heads
            order = torch.from_numpy(rope_row_order(codes.shape[0], heads))
            codes, records = codes[order], None if records is None else records[order]
        module.gguf_blocks = (codes.contiguous(), None if records is None else records.contiguous(), kind)
        attached[tensor.name] = kind
    return attached
