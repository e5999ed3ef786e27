# Buck2 macros for selective build and kernel-binding codegen, named like upstream ExecuTorch's
# (shim_et/xplat/executorch/codegen/codegen.bzl) but calling this project's one codegen entry point,
# codegen/run_codegen.py, with the Python from .buckconfig.local, so Buck2 and CMake generate the same code.

# What the codegen genrules need of the repository: the entry point and what it imports, the declarations and the
# templates. Buck2 symlinks them into the genrule's $SRCDIR with their paths, so the entry point finds them there.
def _codegen_srcs(custom_ops_yaml_target):
    return [
        "codegen/run_codegen.py",
        "flow/__init__.py",
        "flow/argument_kinds.py",
        "flow/declarations.py",
        "flow/dtypes.py",
        "flow/lazy_exir.py",
        "flow/program.py",
        "flow/runtime_kernels.py",
        "flow/schema_types.py",
        "flow/xnnpack_layout.py",
        "custom_ops.bzl",
        custom_ops_yaml_target,
    ] + native.glob(["codegen/templates/*"])

def codegen_python():
    """The interpreter that has executorch, torch and torchgen (read from .buckconfig.local)."""
    python = read_config("custom_ops", "python")
    if python == None:
        fail("[custom_ops] python is not set: run `bash test_custom_ops.sh buck2`, which writes .buckconfig.local")
    return python

def et_operator_library(name, ops, custom_ops_yaml_target = ":custom_ops.yaml", visibility = ["PUBLIC"]):
    """selected_operators.yaml for `ops` (out variants such as my_ops::mul3.out), through executorch's gen_oplist.
    A root op that custom_ops.yaml does not bind fails the genrule with run_codegen.py's one-line error."""
    native.genrule(
        name = name,
        srcs = _codegen_srcs(custom_ops_yaml_target),
        out = "selected_operators.yaml",
        cmd = "{} $SRCDIR/codegen/run_codegen.py select --root_ops {} --output $OUT".format(
            codegen_python(),
            ",".join(ops),
        ),
        labels = ["et_operator_library"],
        visibility = visibility,
    )

_EXECUTORCH_OUTPUTS = ["RegisterCodegenUnboxedKernelsEverything.cpp", "NativeFunctions.h", "Functions.h", "RegisterKernels.h",
                       "RegistrationTables.h"]
_ATEN_OUTPUTS = ["RegisterSchema.cpp", "CustomOpsNativeFunctions.h"]  # the schemas and their CPU registration, one file

def executorch_generated_lib(
        name,
        operator_library,
        custom_ops_yaml_target = ":custom_ops.yaml",
        aten_mode = False,
        srcs = [],
        headers = [],
        kernel_deps = [],
        deps = [],
        compiler_flags = [],
        preprocessor_flags = [],
        visibility = ["PUBLIC"],
        **kwargs):
    """The registration of the ops `operator_library` selects, compiled with `srcs` into one library.

    ExecuTorch mode: the kernels (in `kernel_deps` or `srcs`) boxed and registered into the runtime's registry from a
    static initializer, so the library is linked whole. aten_mode: the schemas and CPU registration of the ops for
    PyTorch, for an AOT library (pass its sources in `srcs`, and e.g. preferred_linkage = "shared").
    """
    outputs = _ATEN_OUTPUTS if aten_mode else _EXECUTORCH_OUTPUTS
    native.genrule(
        name = name + "_combined",
        srcs = _codegen_srcs(custom_ops_yaml_target),
        outs = {output: [output] for output in outputs},
        default_outs = ["."],
        cmd = "{} $SRCDIR/codegen/run_codegen.py generate --selection $(location {}) --output_dir $OUT{}".format(
            codegen_python(),
            operator_library,
            " --aten" if aten_mode else "",
        ),
    )
    generated = ":{}_combined[{{}}]".format(name)

    # A dict of include path -> source: the generated headers are included by their bare names.
    all_headers = dict(headers) if type(headers) == type({}) else {header: header for header in headers}
    all_headers.update({f: generated.format(f) for f in outputs if f.endswith(".h")})
    native.cxx_library(
        name = name,
        srcs = srcs + [generated.format(f) for f in outputs if f.endswith(".cpp")],
        headers = all_headers,
        compiler_flags = compiler_flags,
        preprocessor_flags = preprocessor_flags,
        link_whole = True,
        deps = kernel_deps + deps,
        visibility = visibility,
        **kwargs
    )

def argument_kinds_header(name, custom_ops_yaml_target = ":custom_ops.yaml", visibility = ["PUBLIC"]):
    """argument_kinds.h: the value kinds ExecuTorch's own kernels unbox, from PyTorch's schemas
    (flow/argument_kinds.py), for the runner's check of a program's kernel calls (runner/kernel_calls.cpp)."""
    native.genrule(
        name = name,
        srcs = _codegen_srcs(custom_ops_yaml_target),
        out = "argument_kinds.h",
        cmd = "{} $SRCDIR/codegen/run_codegen.py argument_kinds --output $OUT".format(codegen_python()),
        visibility = visibility,
    )

def declared_dtypes_path(op_name):
    """Where op_name's dtype set is written: declared_dtypes/<namespace>/<name>.h (codegen/declared_dtypes.py)."""
    return "declared_dtypes/" + op_name.replace("::", "/") + ".h"

def declared_dtypes_headers(
        name,
        ops,
        python_modules,
        custom_ops_yaml_target = ":custom_ops.yaml",
        visibility = ["PUBLIC"]):
    """One header per declared op (`ops`), its dtypes as the contract::DtypeSet its kernels take, each a named output
    (`:<name>[declared_dtypes/<namespace>/<op>.h]`), after checking that each Python-registered op's module
    (`python_modules`, read as text) states the same DTYPES."""
    native.genrule(
        name = name,
        srcs = _codegen_srcs(custom_ops_yaml_target) + ["codegen/declared_dtypes.py"] + python_modules,
        outs = {declared_dtypes_path(op): [declared_dtypes_path(op)] for op in ops},
        default_outs = ["."],
        cmd = "{} $SRCDIR/codegen/run_codegen.py declared_dtypes --output_dir $OUT".format(codegen_python()),
        visibility = visibility,
    )

def block_layouts_header(name, visibility = ["PUBLIC"]):
    """ops/blocks/block_layouts.h: the block formats' list and layouts as ops/blocks/block_layouts.py states them,
    which each format's traits are checked against when it compiles (ops/blocks/formats.h)."""
    native.genrule(
        name = name,
        srcs = ["ops/blocks/block_layouts.py"] + native.glob(["ops/blocks/formats/*.cpp"]),
        out = "block_layouts.h",
        cmd = "{} $SRCDIR/ops/blocks/block_layouts.py $OUT".format(codegen_python()),
        visibility = visibility,
    )
