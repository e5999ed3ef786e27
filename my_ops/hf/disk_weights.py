"""A GGUF file's packed tensors kept on disk while their program is exported, so the export holds the weights once.
ExecuTorch's emitter copies every constant into the program as bytes (exir/emit/_emitter.py); a model holding its
weights in memory then peaks at twice their size (8B parameters in Q4_K_M: 2 x 4.9 GB). Here each packed tensor is
written to a file of its own as it is packed, and the model holds a placeholder of its shape instead: memory never
written (the kernel maps zero pages, which cost nothing), but for a tag in its first bytes that makes each placeholder
distinct (the emitter merges equal constants). The written program then takes each file's bytes where its
placeholder's bytes stand: the serialized program (a Cord, exir/_serialize/_cord.py) holds the emitter's bytes of each
constant as one piece, which becomes the file (ExecuTorch's FileBackedData, streamed when the program is written).
While the program is emitted (DiskWeights.emitting), each placeholder's copy becomes its file as soon as the emitter
stores it, so the emitter holds one weight's bytes at a time, not every weight's until the program is written.

A GGUF file's tensors can go to disk as they are packed (my_ops.hf.checkpoint.load(weights_dir=...)): the model then
never holds them, and parts the swap joins (q, k and v; gate and up) are joined on disk too. A placeholder that does
not reach the program as itself (an export pass computing a new constant from it) is found missing and refused: the
program would hold the placeholder's bytes. The model is for exporting only: its matrices' values are on disk.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import shutil
import weakref

import torch

TAG = b"\x00my_ops placeholder\x00"  # then the weight's number in this process, 8 bytes
TAGGED = len(TAG) + 8
SMALLEST = 4096  # bytes: smaller tensors stay in memory (a page: a tag needs room, a smaller one saves nothing)
_FILES: dict[bytes, str] = {}  # each live placeholder's tag -> the file holding its weight's bytes
_NUMBERS = itertools.count()


def tag_of(tensor: torch.Tensor) -> bytes | None:
    """The tag of a placeholder this module made, None for any other tensor."""
    if not tensor.is_contiguous() or tensor.numel() * tensor.element_size() < TAGGED:
        return None
    tag = bytes(tensor.view(-1).view(torch.uint8)[:TAGGED].tolist())
    return tag if tag in _FILES else None


def _placeholder(shape, dtype: torch.dtype, path: str) -> torch.Tensor:
    nbytes = os.path.getsize(path)
    tag = TAG + next(_NUMBERS).to_bytes(8, "little")
    # private and anonymous: a page is the kernel's zero page until written (a shared one would be allocated on its
    # first read, as shared memory)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory[:TAGGED] = tag
    _FILES[tag] = path
    # The memory lives as long as a tensor over it does; then its tag is forgotten (a long process exports many models).
    weakref.finalize(memory, _FILES.pop, tag, None)
    return torch.frombuffer(memory, dtype=torch.uint8).view(dtype).reshape(shape)


def join(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """torch.cat(parts) of placeholders, made on disk: a placeholder whose file is their files one after another; None
    unless every part is a placeholder."""
    tags = [tag_of(p) for p in parts]
    if any(t is None for t in tags):
        return None
    path = f"{_FILES[tags[0]]}.joined{next(_NUMBERS)}"
    with open(path, "wb") as out:
        for tag in tags:
            with open(_FILES[tag], "rb") as part:
                shutil.copyfileobj(part, out, 1 << 23)
    return _placeholder((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), parts[0].dtype, path)


def join_rows(weights: list[torch.Tensor], fmt: str) -> torch.Tensor | None:
    """Packed weights of one format, stacked by rows, as the one packed weight of all their rows (joined on disk where
    they are placeholders); None where the layout cannot be joined: a part but the last whose rows are not whole
    groups of the kernels' 16 (a group's rows lie together)."""
    from ..block_layouts import GROUP, ROW_DTYPES

    if fmt not in ROW_DTYPES and any(w.shape[0] % GROUP for w in weights[:-1]):
        return None
    on_disk = join(weights)
    return on_disk if on_disk is not None else torch.cat(weights)


class DiskWeights:
    """Packed tensors written into `directory` (which must outlive the program's writing), placeholders given out."""

    def __init__(self, directory: str):
        self.directory = directory
        self.expected: set[bytes] = set()  # the placeholders the model held when it was exported

    def hold(self, tensor: torch.Tensor) -> torch.Tensor:
        """A placeholder of `tensor`'s shape and dtype, `tensor` itself written to a file (a small one, or a
        placeholder already: itself)."""
        if tensor.numel() * tensor.element_size() < SMALLEST or tag_of(tensor) is not None:
            return tensor
        path = os.path.join(self.directory, f"weight{next(_NUMBERS)}.bin")
        tensor.detach().contiguous().view(torch.uint8).numpy().tofile(path)
        return _placeholder(tensor.shape, tensor.dtype, path)

    def hold_buffers(self, buffers: list[tuple[torch.nn.Module, str]]) -> None:
        """Each (module, buffer name)'s tensor replaced by its placeholder, a tensor several share (a tied table) by
        one; what the program must then hold (fill's check)."""
        held: dict[int, torch.Tensor] = {}
        for module, name in buffers:
            tensor = module._buffers[name]
            if id(tensor) not in held:
                held[id(tensor)] = self.hold(tensor)
            module._buffers[name] = held[id(tensor)]
        self.expected = {t for t in map(tag_of, held.values()) if t is not None}

    @contextlib.contextmanager
    def emitting(self):
        """Around to_executorch: ExecuTorch's emitter copies each constant's bytes out of its tensor and keeps every
        copy until the program is serialized; a placeholder's copy (a whole weight's bytes, its pages written) is
        replaced by the placeholder's file as soon as the emitter stores it, in the program's constants or in those
        of a named data file (.ptd). A copy of another size or tag is left for fill to refuse."""
        from executorch.exir._serialize._cord import FileBackedData
        from executorch.exir.emit._emitter import _Emitter
        from executorch.exir.schema import Buffer

        store = _Emitter._save_new_const_tensor

        def stored(emitter, spec, buffer_data, *args, **kwargs):
            index = store(emitter, spec, buffer_data, *args, **kwargs)
            tag = bytes(buffer_data[:TAGGED])
            if tag not in self.expected or os.path.getsize(_FILES[tag]) != len(buffer_data):
                return index
            state = emitter.program_state
            if index < len(state.constant_buffer) and state.constant_buffer[index].storage is buffer_data:
                state.constant_buffer[index] = Buffer(storage=FileBackedData(_FILES[tag]))
            elif index < len(state.external_constant_buffer) and state.external_constant_buffer[index] is buffer_data:
                state.external_constant_buffer[index] = FileBackedData(_FILES[tag])
            return index

        _Emitter._save_new_const_tensor = stored
        try:
            yield
        finally:
            _Emitter._save_new_const_tensor = store

    def fill(self, program):
        """`program` (an ExecutorchProgramManager exported from the model hold_buffers made placeholders in) with each
        placeholder's bytes taken from its file when it is written; returns it. Raises RuntimeError when a
        placeholder is not in the program as itself."""
        from executorch.exir._serialize._cord import FileBackedData

        # the serialized program and its named data files (.ptd), each a Cord, piece by piece
        cords = [program._pte_data, *(program._tensor_data or {}).values()]
        found = set()
        emitted = {_FILES[tag]: tag for tag in self.expected if tag in _FILES}  # the files `emitting` put in
        for pieces in (cord._buffers for cord in cords):
            for index, piece in enumerate(pieces):
                if isinstance(piece, FileBackedData) and (tag := emitted.get(piece._path)) is not None:
                    if tag in found:
                        raise RuntimeError(f"the program holds the weight of placeholder {tag!r} twice")
                    found.add(tag)
                elif isinstance(piece, bytes) and len(piece) >= TAGGED and piece.startswith(TAG):
                    tag = piece[:TAGGED]
                    if tag not in self.expected or tag in found or os.path.getsize(_FILES[tag]) != len(piece):
                        raise RuntimeError(f"the program holds a weight placeholder {tag!r} it should not: an export "
                                           "pass copied or changed a weight; export with the weights in memory")
                    pieces[index] = FileBackedData(_FILES[tag])
                    found.add(tag)
        if missing := len(self.expected - found):
            raise RuntimeError(f"{missing} of {len(self.expected)} weights did not reach the program as they were (an "
                               "export pass computed new constants from them); export with the weights in memory")
        program._buffer = None  # the program's bytes, if asked for, are made again from the pieces
        return program
