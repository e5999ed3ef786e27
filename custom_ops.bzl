# The project's ops, declared once. CMake (through codegen/run_codegen.py), test_custom_ops.sh, the verifier
# (flow/verify.py), the tests and Buck2 (TARGETS loads this file) all read it; custom_ops.yaml binds each op's out
# variant to its kernel function. Plain literals only: Starlark loads it and Python parses it (flow/declarations.py).
#
# Each key is an op, "namespace::name"; its out variant "namespace::name.out" (or .<out_overload>) must be in
# custom_ops.yaml.
#   registered_from  how PyTorch learns the op: "python" (a module calling torch.library), "cpp"
#                    (TORCH_LIBRARY_FRAGMENT in sources built into libcustom_ops_aot_lib.so), or "aten": an ATen op
#                    PyTorch ships and ExecuTorch's kernels lack, given a runtime kernel here (key "aten::<name>")
#   replaces_executorch  "aten" ops, optional: True when ExecuTorch's kernels have the op too and this kernel is to
#                    run in its place. It stays out of the global registry (a second kernel of a name stops
#                    ExecuTorch at load) and the runner hands it to each method it loads, which looks there first;
#                    ExecuTorch's Python runtime, which cannot, runs ExecuTorch's (docs/adding-an-op.md)
#   out_overload     optional: its out variant's overload, when not "out" (aten::bucketize's is "Tensor_out")
#   defined_by       "python" ops another library defines without an out variant: that library's module, imported
#                    before python_module, which adds the out variant (docs/adding-an-op.md)
#   python_module    "python" ops: the module that registers it (importing it must register it and do nothing else)
#   aot_sources      "cpp" ops: the C++ sources of its PyTorch registration
#   cuda_sources     "cpp" ops, optional: CUDA kernels, built only with a CUDA build of torch
#   without_python_sources  "python" ops, optional: the op's CPU kernels registered from C++, for a process without
#                    Python (AOTInductor's C++ runner; its schemas are written from its module at build time, by
#                    codegen/python_op_schemas.py); built with its kernel_sources in ATen mode into
#                    libcustom_ops_without_python.so (-DCUSTOM_OPS_BUILD_AOTI=ON), never loaded beside its module
#   kernel_sources   its out variant's kernel: compiled for the ExecuTorch runtime and, for "cpp" ops, in ATen mode
#                    into the AOT library too. In any list of sources a path with `*` (within one folder) stands for
#                    the files it matches, sorted, as Buck2's glob() finds them; CMake reconfigures when one is added
#   dtypes           the dtypes its kernels accept for the first tensor input, by torch name ("float32", ...), stated
#                    here alone: the build writes them into declared_dtypes/<namespace>/<name>.h, the set its
#                    kernels take (declared_dtypes::<namespace>::<name>), and stops when a "python" op's module states
#                    other DTYPES; the tests compute the op in each against its reference, and expect every other real
#                    dtype refused
#   elementwise      True: one input, output shaped and laid out like it (gives "cpp" ops the batched vmap rule)
#   bit_exact        True: results equal the reference bit for bit (flow/compare.py; the verifier then compares so)
#   reference        "module.function": the op computed with ATen ops, independent of its kernels. The verifier, the
#                    profiler and the tests compare every kernel of the op (runtime, and PyTorch's) with it
#   example_program  the program the flow exports: <example_program>.pte (and .pt2), built in cmake-out/<it>/
#   example_inputs   its inputs, as (dtype, shape): the example is one call of the op on them. Or, for ops with
#                    scalars, several tensors or state:
#   example_model    "module.function" returning (model, runs): a torch.nn.Module calling the op, and the inputs of
#                    each execution in order (the first is what export traces with; several when the program keeps
#                    state across executions, e.g. a cache). The exporter saves the runs beside the .pte for the verifier
#   runtime_registration  "codegen" (default): custom_ops.yaml binds the out variant, codegen registers it, selective
#                    build decides; or "executorch_library" (ops registered from Python): the kernel source registers
#                    it with EXECUTORCH_LIBRARY_CHECKED, no yaml entry, registered wherever its source is linked
# The formats of my_ops::linear_blocks and embedding_blocks: each block format's traits in formats/<its GGUF type in
# lower case>.cpp, the row formats' in formats/float_rows.cpp; their list and layouts are ops/blocks/block_layouts.py's,
# whose build step stops when a stated format has no source here or a source here no stated format. Both ops run
# every format, so both list them (each build compiles a shared source once).
BLOCK_FORMAT_SOURCES = ["ops/blocks/formats/*.cpp"]

CUSTOM_OPS = {
    "my_ops::mul3": {
        "registered_from": "python",
        "python_module": "custom_ops_1",
        "kernel_sources": ["custom_ops_1_out.cpp"],
        "without_python_sources": ["ops/mul3/custom_ops_1_without_python.cpp"],
        "elementwise": True,
        "bit_exact": True,
        "reference": "custom_ops_1.mul3_reference",
        "dtypes": ["float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64"],
        "example_program": "custom_ops_1",
        "example_inputs": [("float32", [2, 3])],
    },
    "my_ops::mul4": {
        "registered_from": "cpp",
        "aot_sources": ["custom_ops_2.cpp"],
        "cuda_sources": ["ops/mul4/custom_ops_2_cuda.cu"],
        "kernel_sources": ["custom_ops_2_out.cpp"],
        "elementwise": True,
        "bit_exact": True,
        "reference": "custom_ops_2.mul4_reference",
        "dtypes": ["float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64"],
        "example_program": "custom_ops_2",
        "example_inputs": [("float32", [2, 3])],
    },
    "my_ops::rms_norm": {
        "registered_from": "cpp",
        "aot_sources": ["ops/rms_norm/rms_norm.cpp"],
        "kernel_sources": ["ops/rms_norm/rms_norm_out.cpp"],
        "reference": "ops.rms_norm.rms_norm.rms_norm_reference",
        "dtypes": ["float32", "float16", "bfloat16"],
        "example_program": "rms_norm",
        "example_model": "ops.rms_norm.rms_norm.example",
    },
    "my_ops::update_cache": {
        "registered_from": "python",
        "python_module": "ops.update_cache.update_cache",
        "kernel_sources": ["ops/update_cache/update_cache_out.cpp"],
        "without_python_sources": ["ops/update_cache/update_cache_without_python.cpp"],
        "runtime_registration": "executorch_library",
        "bit_exact": True,
        "reference": "ops.update_cache.update_cache.update_cache_reference",
        "dtypes": ["float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64"],
        "example_program": "update_cache",
        "example_model": "ops.update_cache.update_cache.example",
    },
    "my_ops::quantize_rows": {
        "registered_from": "python",
        "python_module": "ops.quantize_rows.quantize_rows",
        "kernel_sources": ["ops/quantize_rows/quantize_rows_out.cpp"],
        "without_python_sources": ["ops/quantize_rows/quantize_rows_without_python.cpp"],
        "bit_exact": True,
        "reference": "ops.quantize_rows.quantize_rows.quantize_rows_reference",
        "dtypes": ["float32", "float16", "bfloat16"],
        "example_program": "quantize_rows",
        "example_model": "ops.quantize_rows.quantize_rows.example",
    },
    "my_ops::sdpa_with_cache": {
        "registered_from": "cpp",
        "aot_sources": ["ops/sdpa_with_cache/sdpa_with_cache.cpp"],
        "kernel_sources": ["ops/sdpa_with_cache/sdpa_with_cache_out.cpp"],
        "reference": "ops.sdpa_with_cache.sdpa_with_cache.sdpa_with_cache_reference",
        "dtypes": ["float32", "bfloat16"],
        "example_program": "sdpa_with_cache",
        "example_model": "ops.sdpa_with_cache.sdpa_with_cache.example",
    },
    "my_ops::linear_blocks": {
        "registered_from": "cpp",
        "aot_sources": ["ops/blocks/linear_blocks.cpp"],
        "kernel_sources": ["ops/blocks/linear_blocks_out.cpp"] + BLOCK_FORMAT_SOURCES,
        "reference": "ops.blocks.blocks.linear_blocks_reference",
        "dtypes": ["float32"],
        "example_program": "linear_blocks",
        "example_model": "ops.blocks.blocks.linear_example",
    },
    "my_ops::embedding_blocks": {
        "registered_from": "cpp",
        "aot_sources": ["ops/blocks/embedding_blocks.cpp"],
        "kernel_sources": ["ops/blocks/embedding_blocks_out.cpp"] + BLOCK_FORMAT_SOURCES,
        "bit_exact": True,
        "reference": "ops.blocks.blocks.embedding_blocks_reference",
        "dtypes": ["uint8"],
        "example_program": "embedding_blocks",
        "example_model": "ops.blocks.blocks.embedding_example",
    },
    "my_ops::rope": {
        "registered_from": "python",
        "python_module": "ops.rope.rope",
        "kernel_sources": ["ops/rope/rope_out.cpp"],
        "without_python_sources": ["ops/rope/rope_without_python.cpp"],
        "bit_exact": True,
        "reference": "ops.rope.rope.rope_reference",
        "dtypes": ["float32", "float16", "bfloat16"],
        "example_program": "rope",
        "example_model": "ops.rope.rope.example",
    },
    "my_ops::silu_mul": {
        "registered_from": "python",
        "python_module": "ops.gated.gated",
        "kernel_sources": ["ops/gated/silu_mul_out.cpp"],
        "without_python_sources": ["ops/gated/silu_mul_without_python.cpp"],
        "reference": "ops.gated.gated.silu_mul_reference",
        "dtypes": ["float32", "float16", "bfloat16"],
        "example_program": "silu_mul",
        "example_model": "ops.gated.gated.silu_mul_example",
    },
    "my_ops::gelu_mul": {
        "registered_from": "python",
        "python_module": "ops.gated.gated",
        "kernel_sources": ["ops/gated/gelu_mul_out.cpp"],
        "without_python_sources": ["ops/gated/gelu_mul_without_python.cpp"],
        "reference": "ops.gated.gated.gelu_mul_reference",
        "dtypes": ["float32", "float16", "bfloat16"],
        "example_program": "gelu_mul",
        "example_model": "ops.gated.gated.gelu_mul_example",
    },
    "my_ops::add_rms_norm": {
        "registered_from": "python",
        "python_module": "ops.add_rms_norm.add_rms_norm",
        "kernel_sources": ["ops/add_rms_norm/add_rms_norm_out.cpp"],
        "without_python_sources": ["ops/add_rms_norm/add_rms_norm_without_python.cpp"],
        "reference": "ops.add_rms_norm.add_rms_norm.add_rms_norm_reference",
        "dtypes": ["float32", "float16", "bfloat16"],
        "example_program": "add_rms_norm",
        "example_model": "ops.add_rms_norm.add_rms_norm.example",
    },
    "my_ops::rope_sdpa_with_cache": {
        "registered_from": "python",
        "python_module": "ops.rope_sdpa_with_cache.rope_sdpa_with_cache",
        # sdpa_with_cache's source holds the attention both ops run (ops/sdpa_with_cache/attention.h).
        "kernel_sources": ["ops/rope_sdpa_with_cache/rope_sdpa_with_cache_out.cpp",
                           "ops/sdpa_with_cache/sdpa_with_cache_out.cpp"],
        "without_python_sources": ["ops/rope_sdpa_with_cache/rope_sdpa_with_cache_without_python.cpp"],
        "runtime_registration": "executorch_library",
        "reference": "ops.rope_sdpa_with_cache.rope_sdpa_with_cache.rope_sdpa_with_cache_reference",
        "dtypes": ["float32", "bfloat16"],
        "example_program": "rope_sdpa_with_cache",
        "example_model": "ops.rope_sdpa_with_cache.rope_sdpa_with_cache.example",
    },
    "my_ops::decoder_layer": {
        "registered_from": "python",
        "python_module": "ops.decoder_layer.decoder_layer",
        # The layer runs the row code of the ops it replaces: their formats' sources and the attention's.
        "kernel_sources": ["ops/decoder_layer/decoder_layer_out.cpp",
                           "ops/sdpa_with_cache/sdpa_with_cache_out.cpp"] + BLOCK_FORMAT_SOURCES,
        "without_python_sources": ["ops/decoder_layer/decoder_layer_without_python.cpp"],
        "runtime_registration": "executorch_library",
        "reference": "ops.decoder_layer.decoder_layer.decoder_layer_reference",
        "dtypes": ["float32"],
        "example_program": "decoder_layer",
        "example_model": "ops.decoder_layer.decoder_layer.example",
    },
    # Kernels for ATen ops that ExecuTorch's kernel libraries lack: PyTorch ships the op (registered_from "aten"), the
    # project adds its runtime kernel, bound in custom_ops.yaml by `- op: aten::<name>.<out_overload>`.
    "aten::bucketize": {
        "registered_from": "aten",
        "out_overload": "Tensor_out",
        "kernel_sources": ["ops/bucketize/bucketize_out.cpp"],
        "bit_exact": True,
        "reference": "ops.bucketize.bucketize.bucketize_reference",
        "dtypes": ["float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64"],
        "example_program": "bucketize",
        "example_model": "ops.bucketize.bucketize.example",
    },
    "aten::cumprod": {
        "registered_from": "aten",
        "kernel_sources": ["ops/cumprod/cumprod_out.cpp"],
        "bit_exact": True,
        "reference": "ops.cumprod.cumprod.cumprod_reference",
        "dtypes": ["float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64"],
        "example_program": "cumprod",
        "example_model": "ops.cumprod.cumprod.example",
    },
    # A kernel for an ATen op ExecuTorch's kernels have too, which the runner uses in place of theirs.
    "aten::cumsum": {
        "registered_from": "aten",
        "replaces_executorch": True,
        "kernel_sources": ["ops/cumsum/cumsum_out.cpp"],
        "bit_exact": True,
        "reference": "ops.cumsum.cumsum.cumsum_reference",
        "dtypes": ["float32", "float64", "float16", "bfloat16", "uint8", "int8", "int16", "int32", "int64"],
        "example_program": "cumsum",
        "example_model": "ops.cumsum.cumsum.example",
    },
    # Add new ops above this line.
}
