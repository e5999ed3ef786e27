# The Buck2 graph, built from the op declarations (custom_ops.bzl) like CMakeLists.txt builds it. TARGETS calls
# define_common_targets(); a build file cannot loop, so the per-op targets are made here. For each declared op
# (suffix _<short name>, e.g. _mul3) and for all ops together (no suffix):
#   select<sfx>                       et_operator_library: the op selection (selected_operators.yaml)
#   custom_ops_kernels<sfx>           the selected ops' runtime kernels
#   custom_ops_lib<sfx>               their generated registration, linked whole with the kernels (none for ops
#                                     whose source registers them: runtime_registration "executorch_library")
#   custom_ops_executor_runner<sfx>   the runner: custom ops + ExecuTorch's optimized aten kernels, the XNNPACK
#                                     delegate and the quantized kernels (as CMake's default)
#   argument_kinds                    (once) the value kinds ExecuTorch's own kernels unbox, for the runners' check
#   block_layouts                     (once) the block formats' list and layouts from ops/blocks/block_layouts.py,
#                                     which each format's traits are checked against as it compiles
#   declared_dtypes                   (once) each op's dtypes from custom_ops.bzl as the set its kernels take,
#                                     its Python module's DTYPES checked against them
#   custom_ops_aot_lib<sfx>           ops registered from C++: their PyTorch registration, kernels in ATen mode and
#                                     codegen's schemas (build its [shared] sub-target: libcustom_ops_aot_lib.so)
load(":custom_ops.bzl", "CUSTOM_OPS")
load(
    "//codegen:codegen.bzl",
    "argument_kinds_header",
    "block_layouts_header",
    "declared_dtypes_headers",
    "declared_dtypes_path",
    "et_operator_library",
    "executorch_generated_lib",
)

_RUNNER_HEADERS = [
    "runner/command_line.h",
    "runner/data_file.h",
    "runner/file_segment_loader.h",
    "runner/flat_reader.h",
    "runner/greedy_decoding.h",
    "runner/kernel_calls.h",
    "runner/program_runner.h",
    "runner/xnnpack_layout.h",
    "runner/xnnpack_payload.h",
]

def _wheel_dir(key):
    value = read_config("custom_ops", key)
    if value == None:
        fail("[custom_ops] {} is not set: run `bash test_custom_ops.sh buck2`, which writes .buckconfig.local".format(key))
    return value

def _wheel_library(name, libraries, exported_deps = [], preprocessor_flags = []):
    """A library of the executorch wheel, by flags: its .so files stay where pip put them (absolute rpath)."""
    lib = _wheel_dir("executorch_dir") + "/lib"
    native.prebuilt_cxx_library(
        name = name,
        exported_preprocessor_flags = preprocessor_flags,
        # no-as-needed: kernel libraries only register from static initializers; nothing references their symbols.
        exported_linker_flags = ["-L" + lib, "-Wl,--push-state,--no-as-needed"] +
                                ["-l" + library for library in libraries] + ["-Wl,--pop-state", "-Wl,-rpath," + lib],
        exported_deps = exported_deps,
        visibility = ["PUBLIC"],
    )

def wheel_libraries():
    et = _wheel_dir("executorch_dir")
    _wheel_library(
        name = "executorch",
        libraries = ["executorch"],
        # The definitions the wheel's own libraries were built with: a mismatch silently changes class layouts.
        preprocessor_flags = [
            "-isystem",
            et + "/include",
            "-isystem",
            et + "/include/executorch/runtime/core/portable_type/c10",
            "-DC10_USING_CUSTOM_GENERATED_MACROS",
            "-DET_EVENT_TRACER_ENABLED",
        ],
    )
    _wheel_library(
        name = "executorch_threadpool",
        libraries = ["executorch_threadpool"],
        preprocessor_flags = ["-DET_USE_THREADPOOL"],
        exported_deps = [":executorch"],
    )
    _wheel_library(
        name = "executorch_kernels_optimized",
        libraries = ["executorch_kernels_optimized"],
        exported_deps = [":executorch"],
    )
    _wheel_library(
        name = "executorch_backend_xnnpack",
        libraries = ["executorch_backend_xnnpack"],
        exported_deps = [":executorch"],
    )
    _wheel_library(
        name = "executorch_kernels_quantized",
        libraries = ["executorch_kernels_quantized"],
        exported_deps = [":executorch"],
    )
    _wheel_library(
        name = "executorch_etdump",
        libraries = ["executorch_etdump"],
        exported_deps = [":executorch"],
    )
    torch = _wheel_dir("torch_dir")
    native.prebuilt_cxx_library(
        name = "torch",
        exported_preprocessor_flags = [
            "-isystem",
            torch + "/include",
            "-isystem",
            torch + "/include/torch/csrc/api/include",
            "-D_GLIBCXX_USE_CXX11_ABI=" + _wheel_dir("torch_cxx11_abi"),
            # Each ATen op's declarations only where included (as cmake/TorchFromWheel.cmake).
            "-DAT_PER_OPERATOR_HEADERS",
        ],
        exported_linker_flags = ["-L" + torch + "/lib", "-ltorch", "-ltorch_cpu", "-lc10", "-Wl,-rpath," + torch + "/lib"],
        visibility = ["PUBLIC"],
    )

# The headers kernels include: the kernel helpers and any header in an op's folder.
# Every compiled target: optimized, and no floating-point contraction (kernels equal ATen bit for bit, which rounds
# a*b + c twice; GCC fuses it into an FMA by default on ARM64). The same flags as flow/compiler_flags.py.
_COMPILER_FLAGS = ["-O3", "-ffp-contract=off"]

def _unique(items):
    """Each item once, in order: ops may share sources (the block formats' serve both of their ops)."""
    return list({item: None for item in items}.keys())

def _sources(name, keys):
    """An op's sources of the given declaration fields, a pattern (`*`) as the files glob() finds for it."""
    found = []
    for key in keys:
        for src in CUSTOM_OPS[name].get(key, []):
            found += native.glob([src]) if "*" in src else [src]
    return found

def _out_variant(name):
    """The out variant a program calls and custom_ops.yaml binds: my_ops::mul3.out, aten::bucketize.Tensor_out."""
    return name + "." + CUSTOM_OPS[name].get("out_overload", "out")

def _kernel_headers():
    # A dict of include path -> source: the block formats' statement is generated from ops/blocks/block_layouts.py,
    # the ops' dtype sets from custom_ops.bzl.
    headers = {h: h for h in native.glob(["kernel_helpers/*.h", "ops/**/*.h"])}
    headers["ops/blocks/block_layouts.h"] = ":block_layouts"
    for name in CUSTOM_OPS:
        headers[declared_dtypes_path(name)] = ":declared_dtypes[{}]".format(declared_dtypes_path(name))
    return headers

def _define_example(suffix, ops):
    select = "select" + suffix
    by_codegen = [name for name in ops if CUSTOM_OPS[name].get("runtime_registration", "codegen") == "codegen"]
    native.cxx_library(
        name = "custom_ops_kernels" + suffix,
        srcs = _unique([src for name in ops for src in _sources(name, ["kernel_sources"])]),
        headers = _kernel_headers(),
        compiler_flags = _COMPILER_FLAGS,
        deps = [":executorch_threadpool"],
        # A kernel registered by its own source (EXECUTORCH_LIBRARY) is referenced by nothing: link it whole.
        link_whole = len(by_codegen) < len(ops),
        visibility = ["PUBLIC"],
    )
    registration = ":custom_ops_kernels" + suffix
    if by_codegen:
        et_operator_library(name = select, ops = [_out_variant(name) for name in by_codegen])
        executorch_generated_lib(
            name = "custom_ops_lib" + suffix,
            operator_library = ":" + select,
            headers = _kernel_headers(),
            compiler_flags = _COMPILER_FLAGS,
            kernel_deps = [":custom_ops_kernels" + suffix],
            deps = [":executorch"],
        )
        registration = ":custom_ops_lib" + suffix
    # A dict of include path -> source: the generated table is included by its bare name.
    runner_headers = {h: h for h in _RUNNER_HEADERS}
    runner_headers["argument_kinds.h"] = ":argument_kinds"
    native.cxx_binary(
        name = "custom_ops_executor_runner" + suffix,
        srcs = [
            "runner/custom_ops_executor_runner.cpp",
            "runner/command_line.cpp",
            "runner/data_file.cpp",
            "runner/kernel_calls.cpp",
            "runner/program_runner.cpp",
            "runner/xnnpack_payload.cpp",
        ],
        headers = runner_headers,
        compiler_flags = _COMPILER_FLAGS,
        link_style = "static",
        deps = [
            registration,
            ":executorch_kernels_optimized",
            ":executorch_backend_xnnpack",
            ":executorch_kernels_quantized",
            ":executorch_etdump",
        ],
        visibility = ["PUBLIC"],
    )
    cpp_ops = [name for name in ops if CUSTOM_OPS[name]["registered_from"] == "cpp"]
    if cpp_ops:
        et_operator_library(name = "select_aot" + suffix, ops = [_out_variant(name) for name in cpp_ops])
        executorch_generated_lib(
            name = "custom_ops_aot_lib" + suffix,
            operator_library = ":select_aot" + suffix,
            aten_mode = True,
            srcs = _unique([src for name in cpp_ops for src in _sources(name, ["aot_sources", "kernel_sources"])]),
            headers = _kernel_headers(),
            # C++20 like torch's cpp_extension; USE_ATEN_LIB compiles the kernels against at::Tensor.
            compiler_flags = ["-std=c++20"] + _COMPILER_FLAGS,
            preprocessor_flags = ["-DUSE_ATEN_LIB"],
            deps = [":torch"],
            preferred_linkage = "shared",
            soname = "libcustom_ops_aot_lib.so",
        )

def define_common_targets():
    wheel_libraries()
    native.export_file(name = "custom_ops.yaml", visibility = ["PUBLIC"])
    argument_kinds_header(name = "argument_kinds")
    block_layouts_header(name = "block_layouts")
    declared_dtypes_headers(
        name = "declared_dtypes",
        ops = list(CUSTOM_OPS),
        python_modules = _unique([
            CUSTOM_OPS[name]["python_module"].replace(".", "/") + ".py"
            for name in CUSTOM_OPS
            if "python_module" in CUSTOM_OPS[name]
        ]),
    )
    for name in CUSTOM_OPS:
        _define_example("_" + name.split("::")[1], [name])
    _define_example("", list(CUSTOM_OPS))
