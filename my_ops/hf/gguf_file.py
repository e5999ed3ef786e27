"""A GGUF file checked whole before anything reads it: downloads get cut short and disks flip bits, and the readers
downstream (the gguf package, transformers) answer a damaged file with a numpy error or a traceback. check(path)
walks the header as llama.cpp writes it (gguf.cpp: magic, version, counts, key-value pairs, tensor infos, aligned
data) with every read bounded by the file's size, and raises DamagedFileError naming the file, what is wrong and the
way out; it returns what it read, for the caller to use.

    GGUF v2/v3, little-endian: b"GGUF", u32 version, u64 tensors, u64 key-value pairs; each pair a string key (u64
    length, bytes), a u32 value type and the value (an array: u32 element type, u64 count, elements); each tensor a
    string name, u32 dimensions, u64 sizes, u32 type, u64 offset into the data, which starts at the next multiple of
    general.alignment (32 by default) after the infos.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
# value type -> struct format of a scalar (strings and arrays apart)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
SMALLEST_TENSOR_INFO = 8 + 4 + 8 + 4 + 8  # an empty name, one dimension, type, offset
SMALLEST_PAIR = 8 + 4 + 1  # an empty key, a value type, a one-byte value


class DamagedFileError(ValueError):
    """The file is not a whole, well-formed GGUF file; the message names the file, the problem and the way out."""


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # as GGUF stores it: the row length first
    type_id: int
    offset: int  # from the start of the data
    nbytes: int = 0


@dataclass
class GGUFFile:
    path: str
    size: int
    version: int
    metadata: dict[str, object] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0


def _type_sizes() -> dict[int, tuple[str, int, int]]:
    """GGUF tensor type id -> (name, weights per block, bytes per block), from the gguf package's table."""
    import gguf

    return {int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType if t in gguf.GGML_QUANT_SIZES}


class _Cursor:
    def __init__(self, path: str, data):  # bytes or a map of the file
        self.path, self.data, self.at = path, data, 0

    def cut(self, what: str, need: int) -> DamagedFileError:
        return DamagedFileError(f"{self.path}: the file ends at byte {len(self.data)}, inside {what} (which needs "
                                f"{need} more bytes from byte {self.at}): it is cut short; download it again")

    def take(self, count: int, what: str) -> bytes:
        if count > len(self.data) - self.at:
            raise self.cut(what, count)
        chunk = self.data[self.at:self.at + count]
        self.at += count
        return chunk

    def scalar(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("Q", what)
        if length > len(self.data) - self.at:
            raise self.cut(what, length)
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DamagedFileError(f"{self.path}: {what} at byte {self.at - length} is not UTF-8 text: the metadata "
                                   "is damaged; download the file again") from None


def _value(cursor: _Cursor, kind: int, what: str, depth: int = 0):
    if kind in SCALARS:
        return cursor.scalar(SCALARS[kind], what)
    if kind == STRING:
        return cursor.string(what)
    if kind == ARRAY and depth == 0:
        element, count = cursor.scalar("I", what), cursor.scalar("Q", what)
        if element not in SCALARS and element != STRING:
            raise DamagedFileError(f"{cursor.path}: {what} is an array of value type {element}, which GGUF arrays do "
                                   "not hold: the metadata is damaged; download the file again")
        smallest = 8 if element == STRING else struct.calcsize(SCALARS[element])
        if count * smallest > len(cursor.data) - cursor.at:
            raise DamagedFileError(f"{cursor.path}: {what} claims {count} elements, more than the file's remaining "
                                   f"{len(cursor.data) - cursor.at} bytes can hold: the file is cut short or damaged; "
                                   "download it again")
        if element in SCALARS:  # one read for the whole array
            fmt = SCALARS[element]
            return list(struct.unpack(f"<{count}{fmt}", cursor.take(count * struct.calcsize(fmt), what)))
        return [cursor.string(what) for _ in range(count)]
    raise DamagedFileError(f"{cursor.path}: {what} has value type {kind}, which GGUF does not define (0-12): the "
                           "metadata is damaged; download the file again")


def check(path: str) -> GGUFFile:
    """The GGUF file at `path`, its header read and every tensor's bytes found inside the file; DamagedFileError
    otherwise (never another exception for any content of the file)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(min(size, 24))
        if head[:4] != MAGIC:
            raise DamagedFileError(f"{path} is not a GGUF file: it starts with {head[:4]!r}, not {MAGIC!r} (a "
                                   "download's error page, or another format); download the .gguf file again")
        # The header through a map of the file: only the pages it spans are read (the tensors, gigabytes of a large
        # model, are located here, never read).
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _walk(path, size, data)
    finally:
        data.close()


def _walk(path: str, size: int, data) -> GGUFFile:
    cursor = _Cursor(path, data)
    cursor.take(4, "the magic")
    version = cursor.scalar("I", "the version")
    if version not in VERSIONS:
        raise DamagedFileError(f"{path}: GGUF version {version}; this reader takes versions {VERSIONS[0]} and "
                               f"{VERSIONS[1]} (llama.cpp's since 2023): the file is damaged or from another "
                               "writer; convert it again with llama.cpp")
    tensors, pairs = cursor.scalar("Q", "the tensor count"), cursor.scalar("Q", "the key-value count")
    if tensors * SMALLEST_TENSOR_INFO + pairs * SMALLEST_PAIR > size - cursor.at:
        raise DamagedFileError(f"{path}: the header claims {tensors} tensors and {pairs} key-value pairs, more than "
                               f"the file's {size} bytes can hold: the file is cut short or its header damaged; "
                               "download it again")
    found = GGUFFile(path, size, version)
    for index in range(pairs):
        key = cursor.string(f"the key of key-value pair {index} of {pairs}")
        kind = cursor.scalar("I", f"the value type of '{key}'")
        found.metadata[key] = _value(cursor, kind, f"the value of '{key}'")
    types = _type_sizes()
    for index in range(tensors):
        name = cursor.string(f"the name of tensor {index} of {tensors}")
        dims = cursor.scalar("I", f"the dimensions of tensor '{name}'")
        if not 1 <= dims <= MAX_DIMS:
            raise DamagedFileError(f"{path}: tensor '{name}' claims {dims} dimensions (GGUF has 1 to {MAX_DIMS}): the "
                                   "tensor infos are damaged; download the file again")
        shape = tuple(cursor.scalar("Q", f"the sizes of tensor '{name}'") for _ in range(dims))
        type_id = cursor.scalar("I", f"the type of tensor '{name}'")
        offset = cursor.scalar("Q", f"the data offset of tensor '{name}'")
        if type_id not in types:
            raise DamagedFileError(f"{path}: tensor '{name}' has type {type_id}, which the gguf package does not know: "
                                   "the tensor infos are damaged (or the file is newer than the installed gguf "
                                   "package: upgrade it)")
        type_name, block, block_bytes = types[type_id]
        elements = 1
        for n in shape:
            elements *= n
        if shape[0] % block or elements >= 1 << 62:
            raise DamagedFileError(f"{path}: tensor '{name}' is {type_name} of shape {list(shape)}, whose rows are not "
                                   f"whole blocks of {block} weights: the tensor infos are damaged; download the file "
                                   "again")
        found.tensors.append(TensorInfo(name, shape, type_id, offset, elements // block * block_bytes))
    alignment = found.metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise DamagedFileError(f"{path}: general.alignment is {alignment!r}, not a power of two: the metadata is "
                               "damaged; download the file again")
    found.data_start = (cursor.at + alignment - 1) // alignment * alignment
    for tensor in found.tensors:
        start = found.data_start + tensor.offset
        if tensor.offset % alignment or start + tensor.nbytes > size:
            type_name = types[tensor.type_id][0]
            problem = (f"is not aligned to {alignment} bytes: the tensor infos are damaged" if tensor.offset % alignment
                       else f"needs bytes {start} to {start + tensor.nbytes} of the file, which has {size}: the file "
                            "is cut short (a download that stopped early)")
            raise DamagedFileError(f"{path}: tensor '{tensor.name}' ({type_name} {list(tensor.shape)}, "
                                   f"{tensor.nbytes} bytes) {problem}; download it again")
    return found


def check_and_parse(path: str, header: GGUFFile | None = None) -> tuple[str, GGUFFile, dict]:
    """(the absolute path, check(path) or the `header` it gave already, transformers' reading of the file without its
    tensors): the file is checked whole first, so a damaged one is one sentence, not a numpy error or a traceback from
    transformers' reader."""
    path = os.path.abspath(path)
    header = header or check(path)
    return path, header, transformers_reading(header)


# Architectures whose reading transformers' load_gguf_checkpoint changes in ways transformers_reading does not follow
# (their tensors decide config values, or their keys are reshaped): read by transformers itself.
READ_BY_TRANSFORMERS = ("t5", "t5encoder", "stablelm", "lfm2")


def transformers_reading(header: GGUFFile) -> dict:
    """What transformers' load_gguf_checkpoint(path, return_tensors=False) returns ({"config", "tokenizer",
    "tokenizer_config", "ignore"}: its renaming of the file's keys by its own tables), made from the header check()
    read. transformers' reader parses the metadata again through the gguf package's reader, every string of the
    vocabulary an array of its own: Gemma 3's 262,144 tokens take it 9 s and 0.7 GiB, this 0.1 s and nothing
    beyond the header. tests/test_gguf.py holds the two equal on every file it reads."""
    from transformers.modeling_gguf_pytorch_utils import (GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_SUPPORTED_ARCHITECTURES,
                                                          GGUF_TO_TRANSFORMERS_MAPPING, load_gguf_checkpoint)

    architecture = header.metadata.get("general.architecture")
    if not isinstance(architecture, str) or any(a in architecture for a in READ_BY_TRANSFORMERS):
        return load_gguf_checkpoint(header.path, return_tensors=False)
    renamed = architecture
    if "llama" in architecture and header.metadata.get("general.name") == "mistral":
        renamed = "mistral"  # llama.cpp calls Mistral's architecture llama
    elif "qwen2moe" in architecture:
        renamed = "qwen2_moe"
    elif "qwen3moe" in architecture:
        renamed = "qwen3_moe"
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES and renamed not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF model with architecture {architecture} is not supported yet.")
    parsed = {group: {} for group in GGUF_TO_TRANSFORMERS_MAPPING}
    # no separate output projection in the file: the embedding's table is it (falcon and bloom tie theirs always)
    parsed["config"]["tie_word_embeddings"] = (all(t.name != "output.weight" for t in header.tensors)
                                               or architecture in ("falcon", "bloom"))
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(renamed, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or
                                                       {}).items():
        parsed["config"].setdefault(key, value)
    pairs = {"GGUF.version": header.version, "GGUF.tensor_count": len(header.tensors),
             "GGUF.kv_count": len(header.metadata), **header.metadata}
    for key, value in pairs.items():
        prefix, _, name = key.replace(architecture, renamed).partition(".")
        if isinstance(value, list) and len(value) == 1:  # transformers reads a one-element array as its element
            value = value[0]
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, renamed)
        for group, renames in GGUF_TO_TRANSFORMERS_MAPPING.items():
            if prefix in renames and name in renames[prefix] and renames[prefix][name] not in (-1, None):
                parsed[group][renames[prefix][name]] = value
    if parsed["config"].get("model_type") == "gemma3":
        parsed["config"]["model_type"] = "gemma3_text"  # a Gemma 3 file holds its text model alone
    if "vocab_size" not in parsed["config"] and "tokens" in parsed["tokenizer"]:
        parsed["config"]["vocab_size"] = len(parsed["tokenizer"]["tokens"])
    return parsed
