"""From a transformers model to an ExecuTorch program on the project's ops: swap.py puts its norms, cache and
attention on my_ops, quantize.py its linear layers and embedding, then one torch.export, fuse.py's pass (the rotary
embedding, the MLP's activation and each residual add with its norm onto fused ops) and EXIR lowering. Every
computation that reads weights runs on the project's kernels, so the program needs no delegate: what is left (the
splits of the fused projections, views, the rotary table) runs on ExecuTorch's own kernels.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import torch

from .fuse import FUSIONS, fuse
from .quantize import FORMATS, ops_in, ops_of, packed_buffers, put_linears_on_ops
from .swap import OPS, ExportableDecoder, UnsupportedModelError, swap_ops

# None is float32; "gguf": a GGUF file's own blocks (my_ops.gguf attaches them; export_checkpoint does it for you)
QUANTIZE_MODES = (*(p for p in FORMATS if p), "gguf")


def program_ops(quantize: str | None) -> tuple[str, ...]:
    """The custom ops a program of this precision calls (each must reach the program's own kernels)."""
    return (*OPS, *ops_of(quantize))


def prepare(model: torch.nn.Module, *, max_seq_len: int = 256, quantize: str | None = None,
            keep_unknown_norms: bool = False) -> ExportableDecoder:
    """`model` with the project's ops swapped in (in place) and its linear layers packed, inside the module a program
    is exported from: forward(tokens int64 [1, T], input_pos int64 [1]) -> logits [1, vocab] of the last position. It
    runs in eager too (the ops' PyTorch kernels)."""
    if quantize not in FORMATS and quantize != "gguf":
        raise UnsupportedModelError(f"quantize={quantize!r}: choose None (float32) or one of {QUANTIZE_MODES}")
    if quantize == "gguf" and not any(hasattr(m, "gguf_blocks") for m in model.modules()):
        raise UnsupportedModelError("quantize='gguf' runs a GGUF file's own blocks, and this model carries none: load "
                                    "a .gguf file and use my_ops.gguf.export_program(path) (or export_checkpoint)")
    if max_seq_len < 1:
        raise UnsupportedModelError(f"max_seq_len={max_seq_len}: give the positions the program holds, 1 or more")
    limit = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    if limit is not None and max_seq_len > limit:
        raise UnsupportedModelError(f"max_seq_len={max_seq_len} passes the model's max_position_embeddings ({limit})")
    model = swap_ops(model.eval(), keep_unknown_norms=keep_unknown_norms).requires_grad_(False)
    put_linears_on_ops(model, quantize)
    # The program's inputs follow the modules' buffer order, which transformers sometimes takes from a set (Gemma 3's
    # rotary tables) and so from Python's hash seed: in name order, each export of a model writes the same bytes.
    for module in model.modules():
        module._buffers = dict(sorted(module._buffers.items()))
    # A model built without weights (my_ops.hf.checkpoint.load(dequantize=False)) has each now on the ops, or none
    if empty := [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]:
        raise UnsupportedModelError(f"{', '.join(empty[:4])}{' ...' if len(empty) > 4 else ''} have no values: the "
                                    "model was built without weights and these were given none")
    return ExportableDecoder(model, max_seq_len).eval()


def export_program(model: torch.nn.Module, *, max_seq_len: int = 256, quantize: str | None = None,
                   keep_unknown_norms: bool = False, fusions=None, weights_dir: str | None = None,
                   data_file: str | None = None):
    """Swaps the project's ops into `model` (in place), exports it and returns the ExecuTorch program (an
    ExecutorchProgramManager: .buffer, .write_to_file). quantize: None (float32), "8da8w", "8da4w" or "gguf" (the
    blocks my_ops.gguf.attach_blocks put on the model). fusions: the export pass's fused ops (fuse.py's FUSIONS:
    "rope", "swiglu", "geglu", "add_norm", ...); None puts in each one whose pattern the model computes and warns naming
    the others, a list requires each (refused by name where the model lacks it), () puts in none. Checks that every custom op of the
    precision reached the program's own kernels. weights_dir: the packed weights wait in files there while the program
    is emitted, and the program takes them from there when it is written (my_ops/hf/disk_weights.py: the export holds
    them once, not twice); the folder must outlive the writing, and the model is left with placeholders, for this
    export only. data_file: the weights (every constant) go into ExecuTorch's named data file <data_file>.ptd instead
    of the program, which then names each by its key; write both with write_program, load the program with it
    (the runner's --data_path, Runtime.load_program(data_path=...))."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    if data_file is not None and (not data_file or os.path.basename(data_file) != data_file
                                  or data_file.endswith(".ptd")):
        raise UnsupportedModelError(f"data_file={data_file!r}: give the data file's name without folder or .ptd "
                                    "(\"model\" writes model.ptd beside the program)")
    decoder = prepare(model, max_seq_len=max_seq_len, quantize=quantize, keep_unknown_norms=keep_unknown_norms)
    disk = None
    if weights_dir is not None:
        from .disk_weights import DiskWeights

        disk = DiskWeights(weights_dir)
        disk.hold_buffers(packed_buffers(decoder))
    inputs, dynamic_shapes = decoder.example_inputs(), decoder.dynamic_shapes()
    # Not strict: strict mode's tracer keeps a real copy of every tensor attribute it meets, which for a model is a
    # second copy of its weights in memory while it traces (the placeholders disk_weights leaves too).
    exported = torch.export.export(decoder, inputs, dynamic_shapes=dynamic_shapes, strict=False)
    fused = fuse(exported, fusions)
    if fusions is None and (missing := fused.missing(FUSIONS)):
        warnings.warn(f"my_ops.hf: this model computes no {', '.join(missing)} pattern; those parts stay the ops "
                      "they were (my_ops/hf/fuse.py lists what each pattern is)")
    # The methods ExecuTorch's LLM runner (extension/llm/runner, TextLLMRunner) reads before it decodes: with them the
    # program also runs there, as optimum-executorch's do (get_max_seq_len is required; the others have defaults that
    # would prefill token by token).
    text_config = decoder.model.config.get_text_config(decoder=True)
    metadata = {"get_max_seq_len": max_seq_len, "get_max_context_len": max_seq_len, "enable_dynamic_shape": True,
                "use_kv_cache": True, "get_vocab_size": text_config.vocab_size}
    # Nothing is delegated, so plain to_edge (to_edge_transform_and_lower decomposes twice, for partitioners: 31 s
    # instead of 15 for SmolLM2's 30 layers). The IR check re-verifies every node against the edge dialect, a minute
    # more; the program's ops are checked below and by the runtime's loader.
    edge = to_edge(exported, constant_methods=metadata, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    # A GGUF file decides each layer's format: its ops are those of the layers the swap made
    # (less the ops whose every call the pass put into a fused op).
    swapped = program_ops(quantize) if quantize != "gguf" else (*OPS, *ops_in(decoder))
    expected = (*(op for op in swapped if op not in fused.gone), *fused.ops())
    if missing := [op for op in expected if op not in _ops_outside_delegates(edge.exported_program().graph)]:
        raise UnsupportedModelError(f"{', '.join(missing)} did not reach the program's own kernels (decomposed or "
                                    "delegated): the swap did not take")
    # The caches start uninitialized (their zeros are not stored in the program): every position attention reads was
    # written by this generation first, since my_ops::sdpa_with_cache reads only positions before start + T.
    # Planned tensors (the caches, the activations) and the constants (the weights) on cache lines: a kernel's 64-byte
    # loads then touch one line each where the runtime puts the plan and the program's data on one (the project's
    # runner and Python loader do; ExecuTorch's default aligns both to 16 bytes).
    config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alignment=64),
                                     constant_tensor_alignment=64,
                                     external_constants=(lambda node: data_file) if data_file else False)
    with warnings.catch_warnings(), disk.emitting() if disk is not None else contextlib.nullcontext():
        warnings.filterwarnings("ignore", message="Mutation on a buffer in the model is detected")
        program = edge.to_executorch(config)
    return program if disk is None else disk.fill(program)


def write_program(program, pte: str, data_file: str | None = None) -> list[str]:
    """Writes `program` to `pte` and, when it was exported with data_file, <data_file>.ptd beside it (the data file
    holds the weights the program names); returns the paths written, the program first."""
    with open(pte, "wb") as f:
        program.write_to_file(f)
    if data_file is None:
        return [pte]
    folder = os.path.dirname(os.path.abspath(pte))
    program.write_tensor_data_to_file(folder)
    return [pte, os.path.join(folder, f"{data_file}.ptd")]


def export_checkpoint(checkpoint, *, max_seq_len: int = 256, quantize: str | None = None,
                      weights_dir: str | None = None, data_file: str | None = None):
    """export_program of a loaded checkpoint (my_ops.hf.checkpoint.load); quantize="gguf" first attaches the blocks of
    the GGUF file it was loaded from (a model folder has none: refused), unless it was loaded on them
    (dequantize=False), which takes quantize="gguf" alone. weights_dir, data_file: as export_program's."""
    if not checkpoint.dequantized:
        if quantize != "gguf":
            raise UnsupportedModelError(f"quantize={quantize!r} quantizes the float32 model, and this checkpoint holds "
                                        "the GGUF file's own tensors only (load(dequantize=False)): load it with "
                                        "dequantize=True, or export quantize='gguf'")
    elif quantize == "gguf":
        from .gguf_blocks import attach_blocks
        from .checkpoint import gguf_file

        if (path := gguf_file(checkpoint.path)) is None:
            raise UnsupportedModelError(f"{checkpoint.path}: --quantize gguf runs a GGUF file's own blocks; give a "
                                        ".gguf file, or choose none, 8da8w or 8da4w for a model folder")
        attach_blocks(checkpoint.model, path)
    return export_program(checkpoint.model, max_seq_len=max_seq_len, quantize=quantize,
                          weights_dir=weights_dir or checkpoint.weights_dir, data_file=data_file)


def _ops_outside_delegates(graph) -> set[str]:
    """The operators the edge graph calls itself (not through a delegate), e.g. "my_ops::rms_norm"; an op mutating its
    argument is wrapped in auto_functionalized until to_executorch."""
    names = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.args[0] if "auto_functionalized" in str(node.target) else node.target
        if hasattr(target, "name"):
            names.add(target.name().split(".")[0])  # "my_ops::rms_norm.default" -> "my_ops::rms_norm"
    return names
