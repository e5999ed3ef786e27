"""Reading a llama.cpp GGUF file's own tensors as my_ops' block ops take them, and attaching them to transformers' model
of the file, so export puts them on the ops as they are (quantize="gguf"): nothing requantized, nothing dequantized
into the program. attach_blocks gives them to a model loaded in float32; load_file_weights gives a model built without
weights everything it needs from the file, so no float32 copy of the matrices is ever made (the memory of an export
follows the file's size). The reading of blocks imports only numpy, the gguf package and the formats' layouts
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

import mmap

import numpy as np

from ..block_layouts import FORMATS, LAYOUTS, ROW_DTYPES as FLOAT_TYPES  # ops/blocks/block_layouts.py

# Where each format's record (the fields of its packed layout, in order) lies in the file's block: byte ranges.
RECORDS = {"Q8_0": ((0, 2),), "Q4_0": ((0, 2),), "Q4_1": ((0, 4),), "Q5_0": ((0, 2),), "Q5_1": ((0, 4),),
           "Q2_K": ((0, 16), (80, 84)), "Q3_K": ((96, 110),), "Q4_K": ((0, 16),), "Q5_K": ((0, 16),),
           "Q6_K": ((192, 210),)}


# Rows of a tensor unpacked and packed at a time (whole groups of 16 rows): the work memory of the largest tensor (a
# vocabulary's embedding) stays a few hundred MiB beside it.
ROWS_AT_ONCE = 4096


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


class _FileBytes:
    """A GGUF file's tensors through a read-only map of our own: each tensor's pages are handed back once it is read
    (MADV_DONTNEED; a read-only file map's pages are the page cache's), so the process holds what it made of the
    tensors, not the file as well."""

    def __init__(self, header):
        with open(header.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._start = header.data_start

    def rows(self, tensor) -> np.ndarray:
        """The tensor's bytes as uint8 [rows, row bytes] (GGUF's shape: the row length first; a vector is one row)."""
        rows = int(np.prod(tensor.shape[1:], dtype=np.int64))
        return np.frombuffer(self._map, np.uint8, tensor.nbytes, self._start + tensor.offset).reshape(rows, -1)

    def release(self, tensor) -> None:
        first = (self._start + tensor.offset) // mmap.PAGESIZE * mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, first, self._start + tensor.offset + tensor.nbytes - first)


def _type_name(tensor) -> str:
    import gguf

    return gguf.GGMLQuantizationType(tensor.type_id).name


def packed_rows(raw: np.ndarray, kind: str, order: np.ndarray | None = None):
    """A tensor's rows of blocks (uint8 [n, row bytes], as the file stores them; `order`: the file's rows to take, in
    order) as my_ops' block ops read them, a torch tensor of the same shape; a 16-bit tensor's rows at their dtype.
    ROWS_AT_ONCE rows are unpacked and packed at a time, so the work memory stays small beside the tensor."""
    import torch

    from .quantize import interleave

    if kind in FLOAT_TYPES:
        rows = raw if order is None else raw[order]
        return torch.from_numpy(np.array(rows).view(np.int16)).view(getattr(torch, FLOAT_TYPES[kind]))
    packed = torch.empty(raw.shape, dtype=torch.uint8)
    for first in range(0, raw.shape[0], ROWS_AT_ONCE):  # whole groups of rows: each part lands where the whole would
        end = min(first + ROWS_AT_ONCE, raw.shape[0])
        codes, records = codes_and_records(raw[first:end] if order is None else raw[order[first:end]], kind)
        packed[first:end] = interleave(torch.from_numpy(codes), torch.from_numpy(records), kind)
    return packed


class _Plan:
    """Where a GGUF file's tensors go in transformers' model of it: {GGUF tensor: parameter}, the architecture's tensor
    processor, and whether Q and K rows are interleaved; every tensor of a type the ops do not take refused by name
    first, and the file checked whole before anything is read."""

    def __init__(self, model, path: str):
        import torch
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, LlamaTensorProcessor,
                                                              TensorProcessor, get_gguf_hf_weights_map)

        from .gguf_file import check

        self.header = check(path)
        self.config = model.config.get_text_config(decoder=True)
        self.names = get_gguf_hf_weights_map(model)  # GGUF tensor -> transformers parameter
        architecture = self.header.metadata.get("general.architecture")
        self.processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
        # llama.cpp's converter interleaves Q and K rows for the llama architecture only (not Gemma's, for one), and
        # transformers puts them back for those: the blocks follow the rows exactly where its float weights do.
        self.interleaved = issubclass(self.processor, LlamaTensorProcessor)
        refused = [f"{t.name} ({_type_name(t)})" for t in self.header.tensors if _type_name(t) not in FORMATS]
        if refused:
            raise UnsupportedTensorError(f"{path}: {len(refused)} tensors of types my_ops does not read: "
                                         f"{', '.join(refused[:6])}{' ...' if len(refused) > 6 else ''}; it takes "
                                         f"{', '.join(FORMATS)}; requantize the file with llama-quantize to one of "
                                         "them, or export with --quantize 8da4w")
        modules = dict(model.named_modules())
        self.tensors = [t for t in self.header.tensors if t.name in self.names]
        owners = {t.name: modules.get(self.names[t.name].rsplit(".", 1)[0]) for t in self.tensors}
        # The matrices of linear layers and embeddings the file keeps in blocks or at 16 bits: their module.
        self.blocks = {t.name: owners[t.name] for t in self.tensors if _type_name(t) != "F32" and len(t.shape) == 2
                       and isinstance(owners[t.name], (torch.nn.Linear, torch.nn.Embedding))}

    def row_order(self, tensor) -> np.ndarray | None:
        if self.interleaved and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
            heads = self.config.num_attention_heads if ".attn_q." in tensor.name else self.config.num_key_value_heads
            return rope_row_order(int(np.prod(tensor.shape[1:])), heads)
        return None

    def attach(self, file: _FileBytes, hold=None) -> dict[str, str]:
        attached = {}
        for tensor in self.tensors:
            if (module := self.blocks.get(tensor.name)) is not None:
                kind = _type_name(tensor)
                packed = packed_rows(file.rows(tensor), kind, self.row_order(tensor))
                module.gguf_blocks = (packed if hold is None else hold(packed), kind)
                file.release(tensor)
                attached[tensor.name] = kind
        return attached


def attach_blocks(model, path: str) -> dict[str, str]:
    """Every torch.nn.Linear and the token embedding of `model` (transformers' model of the GGUF file at `path`) whose
    weight the file stores quantized, or at 16 bits, gets `gguf_blocks = (weight, format)`: the file's tensor in
    transformers' row order, packed as my_ops' block ops read it (16 bits: the rows at their dtype), for
    my_ops.hf.quantize to put on the ops instead of quantizing. Returns {GGUF tensor: its type} of what was attached.
    Raises UnsupportedTensorError naming every tensor of a type the ops do not take, before anything is attached."""
    plan = _Plan(model, path)
    return plan.attach(_FileBytes(plan.header))


def load_file_weights(model, path: str, disk=None) -> dict[str, str]:
    """A model built without its weights (its parameters on the meta device: my_ops.hf.checkpoint.load(path,
    dequantize=False)) given the GGUF file's tensors: the block and 16-bit matrices attached as attach_blocks does,
    their float32 parameters left unallocated; every other tensor (the norms, what the file keeps in float32)
    as transformers' loader makes it, float32. The file is read by a map, a tensor at a time: the process holds the
    packed tensors, never a float32 copy of them; with `disk` (my_ops.hf.disk_weights.DiskWeights), not even those:
    each goes to a file as it is packed, the model holding a placeholder. Returns what attach_blocks returns; raises
    UnsupportedTensorError for a parameter the file has no tensor for."""
    import gguf
    import torch

    plan = _Plan(model, path)
    file = _FileBytes(plan.header)
    attached = plan.attach(file, None if disk is None else disk.hold)
    processor = plan.processor(config=plan.config.to_dict())
    given = {}  # the placeholder (meta) tensor -> the file's values
    state = model.state_dict(keep_vars=True)
    for tensor in plan.tensors:
        if tensor.name in attached:
            continue
        values = gguf.quants.dequantize(file.rows(tensor), gguf.GGMLQuantizationType(tensor.type_id))
        result = processor.process(weights=values.reshape(tuple(reversed(tensor.shape))), name=tensor.name,
                                   tensor_key_mapping=plan.names, parsed_parameters={"tensors": {}})
        if result.name not in plan.names:
            continue
        placeholder = state[plan.names[result.name]]
        if tuple(result.weights.shape) != tuple(placeholder.shape):
            raise UnsupportedTensorError(f"{path}: tensor {tensor.name} is {list(result.weights.shape)}, the model's "
                                         f"{plan.names[result.name]} {list(placeholder.shape)}: the file's metadata "
                                         "does not describe its tensors")
        given[id(placeholder)] = torch.from_numpy(np.array(result.weights)).to(placeholder.dtype)
        file.release(tensor)
    for module in model.modules():  # by identity: a tied parameter is given once for every module that holds it
        for name, placeholder in module._parameters.items():
            if placeholder is not None and id(placeholder) in given:
                module._parameters[name] = torch.nn.Parameter(given[id(placeholder)], requires_grad=False)
        for name, placeholder in module._buffers.items():
            if placeholder is not None and id(placeholder) in given:
                module._buffers[name] = given[id(placeholder)]
    held_as_blocks = {id(m.weight) for m in plan.blocks.values()}
    missing = [name for name, value in model.state_dict(keep_vars=True).items()
               if value.is_meta and id(value) not in held_as_blocks]
    if missing:
        listed = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        raise UnsupportedTensorError(f"{path}: no tensor for {listed}: the file is not a whole model of the "
                                     "architecture its metadata names")
    return attached
