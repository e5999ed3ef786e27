"""An op's kind: what the generic machinery (declarations -> codegen -> build -> register -> export -> run) does
differently for it, read from its declaration and its registered schema. The tests that take every op through a
whole build configuration of its own (selective build alone, the verifier's per-op flow builds, the Buck2 graph's
per-op targets, torch.compile) take one op of each kind there (`representatives`), while every op still goes through
the fast paths: its reference, dtypes and refusals, both runtimes, the combined and sanitized builds, ARM64.

    python -m flow.op_kinds      each op's traits and the representatives

Sound only while every trait an op can have is one the machinery is known to take a path on: `uncovered` names any
other (a new declaration field or value), and tests/test_op_kinds.py fails on it until the trait is listed here;
listed, an op with it becomes a representative by itself.
"""

from __future__ import annotations

import dataclasses
import sys

from flow.declarations import DeclaredOp
from flow.schema_types import ARGUMENT_TYPES, base_type, schema_arguments

# Each trait and the path the machinery takes for it. Argument types add "argument <type>" for every type of
# flow/schema_types.py's table (codegen's C++ type, the runner's argument checks, export).
PATHS = {
    # PyTorch's side and the runtime's together: selective build, the AOT library and codegen depend on both.
    "registered from python, in the runtime by codegen": "the op's module calls torch.library; custom_ops.yaml binds "
                                                         "the out variant, codegen registers it when it is selected",
    "registered from python, in the runtime by executorch_library": "the op's module calls torch.library; its kernel "
                                                                    "source registers itself wherever it is linked",
    "registered from cpp, in the runtime by codegen": "TORCH_LIBRARY_FRAGMENT in the AOT library, which the build "
                                                      "makes and export loads; codegen registers the kernel",
    "registered from aten, in the runtime by codegen": "PyTorch ships the op (nothing registered ahead of time); "
                                                       "custom_ops.yaml binds ATen's out variant by name (`op:`), "
                                                       "codegen registers it; export lets the non-core op through",
    "a kernel in place of ExecuTorch's": "kept out of the global registry (a second kernel of a name stops "
                                         "ExecuTorch); the runner hands it to load_method as a method-scoped kernel, "
                                         "the Python loader registers it under its calls' kernel keys",
    "an op another library defines": "the library's module (defined_by) imported before the op's, which adds the "
                                      "out variant to its namespace: registration, export, the verifier, the wheel",
    "a C++ registration without Python": "libcustom_ops_without_python.so, for AOTInductor's runner",
    "CUDA kernels": "built only with a CUDA torch (test_aot_build.py compiles them with nvcc)",
    "example from inputs": "the flow exports one call of the op on the declared inputs",
    "example from a model": "the flow exports the declared module and verifies its runs in order",
    "an input written in place": "a mutable buffer in the program, kept across executions",
    "several outputs": "an out variant with several out arguments (codegen's tuple, the verifier's outputs)",
    "elementwise": "the batched vmap rule registered for a C++ op",
    "compared bit for bit": "the verifier and the profile mode compare its outputs' bits",
    "kernel sources shared with another op": "a build compiles a source two selected ops list once",
    **{f"argument {t}": "codegen's C++ type for it, the runner's check of the value's kind" for t in ARGUMENT_TYPES},
}

# Declaration fields that are no path of a build configuration, and where each is checked for every op instead.
NOT_A_PATH = {
    "name": "the op's identity",
    "kernel_sources": "compiled in every build that selects the op (the combined, sanitized, fuzz and ARM64 builds "
                      "hold every op); shared sources are a trait",
    "example_program": "the program's file name",
    "reference": "every op against it in test_references.py, test_runtime.py and the verifier on the combined build",
    "dtypes": "every op in each of them in test_references.py (both kernels) and the sanitized runner",
    "python_module": "its registration path is the 'registered from python' trait; test_imports.py checks every one",
    "aot_sources": "its registration path is the 'registered from cpp' trait",
    "source_patterns": "the patterns of its source lists, which are expanded in them: CMake re-checks them for added "
                       "files",
    "out_overload": "the out variant's name (every place reads DeclaredOp.out_name); the 'registered from aten' "
                    "trait covers the ops whose out variant is not '.out'",
}
# The fields a trait is read from (traits() below).
TRAIT_FIELDS = {"registered_from", "runtime_registration", "without_python_sources", "cuda_sources", "example_inputs",
                "example_model", "elementwise", "bit_exact", "defined_by", "replaces_executorch"}


def schema_of(op: DeclaredOp) -> str:
    """The out variant's schema as registered (the op must be registered with PyTorch)."""
    return str(op.out_variant()._schema)


def registered_schemas(declared: dict[str, DeclaredOp]) -> dict[str, str]:
    """schema_of() for every op of `declared`, by name: what traits() and representatives() read."""
    return {name: schema_of(op) for name, op in declared.items()}


def traits(op: DeclaredOp, schema: str, declared: dict[str, DeclaredOp]) -> set[str]:
    """What the machinery does for `op` (its out variant's `schema`), among the ops of `declared`."""
    found = {f"registered from {op.registered_from}, in the runtime by {op.runtime_registration}",
             "example from a model" if op.example_model else "example from inputs"}
    for field, trait in (("without_python_sources", "a C++ registration without Python"),
                         ("defined_by", "an op another library defines"),
                         ("replaces_executorch", "a kernel in place of ExecuTorch's"),
                         ("cuda_sources", "CUDA kernels"), ("elementwise", "elementwise"),
                         ("bit_exact", "compared bit for bit")):
        if getattr(op, field):
            found.add(trait)
    import torch

    inputs, outputs = [], []  # the schema's types: its arguments, and the out arguments written after its "*"
    for (type_, _), argument in zip(schema_arguments(schema), torch._C.parse_schema(schema).arguments):
        (outputs if argument.kwarg_only and "!" in type_ else inputs).append(type_)
    found |= {f"argument {base_type(t)}" for t in inputs}
    if any("!" in t for t in inputs):
        found.add("an input written in place")
    if len(outputs) > 1:
        found.add("several outputs")
    others = {s for other in declared.values() if other.name != op.name for s in other.kernel_sources}
    if others & set(op.kernel_sources):
        found.add("kernel sources shared with another op")
    return found


def uncovered(op: DeclaredOp, schema: str, declared: dict[str, DeclaredOp]) -> list[str]:
    """The ways `op` leaves the kinds the reduced checks know: a trait no path is listed for, a declaration field
    neither read for a trait nor listed as no path. Empty when its kind is covered."""
    problems = [f"{op.name}: trait {t!r} is on no path flow/op_kinds.py knows; list it in PATHS (then an op with it "
                "is a representative and the per-configuration checks run it)"
                for t in sorted(traits(op, schema, declared) - PATHS.keys())]
    for field in sorted({f.name for f in dataclasses.fields(op)} - TRAIT_FIELDS - NOT_A_PATH.keys()):
        problems.append(f"{op.name}: declaration field {field!r} is neither a trait nor listed as no path in "
                        "flow/op_kinds.py; say which, so the per-configuration checks cover what it changes")
    return problems


def representatives(declared: dict[str, DeclaredOp], schemas: dict[str, str]) -> list[DeclaredOp]:
    """Few ops that together have every trait of every declared op: the op with the most traits no chosen op has yet,
    the first declared among equals, until none is left; in declaration order."""
    remaining = {name: traits(op, schemas[name], declared) for name, op in declared.items()}
    wanted = set().union(*remaining.values()) if remaining else set()
    chosen: list[str] = []
    while wanted:
        best = max(remaining, key=lambda name: len(remaining[name] & wanted))  # max keeps the first of equals
        chosen.append(best)
        wanted -= remaining.pop(best)
    return [op for name, op in declared.items() if name in chosen]


def main() -> int:
    import argparse
    import os

    from flow import declarations, registration

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build_dir", default=os.path.join(declarations.BUILD_ROOT, "all_ops"),
                        help="a build with every op (its AOT library registers the C++ ops)")
    args = parser.parse_args()
    declared = declarations.load()
    registration.register_with_pytorch(list(declared.values()),
                                       aot_library=os.path.join(args.build_dir, "libcustom_ops_aot_lib.so"))
    schemas = registered_schemas(declared)
    for name, op in declared.items():
        print(f"{name}: {', '.join(sorted(traits(op, schemas[name], declared)))}")
    print("representatives:", ", ".join(op.name for op in representatives(declared, schemas)))
    problems = [p for name, op in declared.items() for p in uncovered(op, schemas[name], declared)]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
