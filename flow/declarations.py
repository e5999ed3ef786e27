"""The op declarations (custom_ops.bzl) for Python: which ops exist, how PyTorch learns each one, their kernel sources,
reference and example programs. The codegen entry point, the flow script, the exporter, the verifier and the tests all
ask here, so adding an op means adding it to custom_ops.bzl, not to any of them.

    python -m flow.declarations list     one tab-separated line per op: short name, name, example program,
                                         registered_from, the module or sources that register it,
                                         runtime_registration (codegen or executorch_library) and
                                         the out variant

It imports only the standard library (torch lazily, to check dtype names): the my_ops package of an editable install
loads this file by path.
"""

from __future__ import annotations

import ast
import glob
import importlib
import os
import sys
from dataclasses import dataclass

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECLARATIONS = os.path.join(REPO_ROOT, "custom_ops.bzl")
BUILD_ROOT = os.path.join(REPO_ROOT, "cmake-out")  # test_custom_ops.sh builds each example in BUILD_ROOT/<program>


class DeclarationError(ValueError):
    """custom_ops.bzl is malformed, or names an op it does not declare."""


@dataclass(frozen=True)
class DeclaredOp:
    name: str  # "my_ops::mul3"
    registered_from: str  # "python", "cpp", or "aten" (PyTorch ships the op; the project adds its runtime kernel)
    kernel_sources: tuple[str, ...]
    example_program: str
    reference: str  # "module.function": the op in ATen ops, never calling its own kernels
    dtypes: tuple[str, ...]  # what its kernels accept for the first tensor input, by torch name
    example_inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()
    example_model: str | None = None  # "module.function" returning (model, runs)
    runtime_registration: str = "codegen"  # or "executorch_library": EXECUTORCH_LIBRARY_CHECKED in its kernel source
    python_module: str | None = None
    aot_sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    without_python_sources: tuple[str, ...] = ()  # "python" ops: C++ schema + CPU kernel for processes without Python
    elementwise: bool = False
    bit_exact: bool = False
    out_overload: str = "out"  # its out variant's overload; ATen names some otherwise (bucketize.Tensor_out)
    defined_by: str | None = None  # "python" ops another library defines: its module, imported before python_module
    replaces_executorch: bool = False  # "aten" ops ExecuTorch has too: this kernel runs in place of theirs
    # Not a field of the declaration: the patterns its source lists hold (expanded in the lists above), which a build
    # re-checks for added files.
    source_patterns: tuple[str, ...] = ()

    @property
    def namespace(self) -> str:
        return self.name.split("::")[0]

    @property
    def short_name(self) -> str:
        return self.name.split("::")[1]

    @property
    def out_name(self) -> str:
        """The out variant EXIR emits and custom_ops.yaml binds, e.g. "my_ops::mul3.out", "aten::bucketize.Tensor_out"."""
        return f"{self.name}.{self.out_overload}"

    @property
    def functional_overload(self) -> str:
        """The overload the out variant is the out form of: "default" for ".out", "Tensor" for ".Tensor_out"."""
        return "default" if self.out_overload == "out" else self.out_overload.removesuffix("_out")

    @property
    def from_cpp(self) -> bool:
        return self.registered_from == "cpp"

    @property
    def from_python(self) -> bool:
        return self.registered_from == "python"

    @property
    def from_aten(self) -> bool:
        """PyTorch ships the op (an ATen op ExecuTorch's kernels lack): nothing registers it ahead of time."""
        return self.registered_from == "aten"

    @property
    def by_codegen(self) -> bool:
        """Its runtime kernel is registered by codegen from custom_ops.yaml (else by its source, EXECUTORCH_LIBRARY)."""
        return self.runtime_registration == "codegen"

    @property
    def python_file(self) -> str | None:
        """"python" ops: the module's file, relative to the repository ("ops/update_cache/update_cache.py")."""
        return self.python_module.replace(".", "/") + ".py" if self.python_module else None

    @property
    def wheel_module(self) -> str | None:
        """"python" ops: the module's name inside the my_ops package, which carries the file flat (my_ops.update_cache)."""
        return self.python_module.rpartition(".")[2] if self.python_module else None

    def packet(self):
        """torch.ops.<namespace>.<name> (the op must be registered)."""
        import torch

        return getattr(getattr(torch.ops, self.namespace), self.short_name)

    def as_manifest(self) -> dict:
        """What the my_ops package needs of each op (setup.py writes it into the wheel as _declared.py): at import
        time, and the out variant's name for the checked loader's missing-operator message."""
        return {"name": self.name, "registered_from": self.registered_from, "python_file": self.python_file,
                "wheel_module": self.wheel_module, "elementwise": self.elementwise, "defined_by": self.defined_by,
                "out_name": self.out_name}

    @property
    def build_dir(self) -> str:
        """Where `bash test_custom_ops.sh cmake <short name>` builds this op alone."""
        return os.path.join(BUILD_ROOT, self.example_program)

    def reference_function(self):
        """The declared reference, imported: computes the op with ATen ops, for the verifier, profile and tests."""
        module, _, function = self.reference.rpartition(".")
        try:
            return getattr(import_repository_module(module), function)
        except (ImportError, AttributeError) as err:
            raise DeclarationError(f"{self.name}: its reference {self.reference!r} cannot be imported ({err}); "
                                   "declare a function computing the op with ATen ops, as 'module.function'") from None

    def mutates_an_argument(self) -> bool:
        """Whether the op writes an argument in place (a cache: `Tensor(a!) cache` in its schema; the op must be
        registered). EXIR turns such a call back into an in-place one without its debug handle."""
        schema = self.functional()._schema
        return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)

    def functional(self):
        """The functional overload a model calls (torch.ops.my_ops.mul3.default, torch.ops.aten.bucketize.Tensor)."""
        return getattr(self.packet(), self.functional_overload)

    def out_variant(self):
        """The out variant's overload (torch.ops.my_ops.mul3.out)."""
        return getattr(self.packet(), self.out_overload)

    def is_registered(self) -> bool:
        import torch

        return hasattr(getattr(torch.ops, self.namespace), self.short_name)

    def make_example_inputs(self, seed: int = 0):
        """Random example inputs of the declared dtypes and shapes (a private generator: the global RNG is untouched)."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        inputs = []
        for dtype_name, shape in self.example_inputs:
            dtype = getattr(torch, dtype_name)  # checked to be a torch dtype by load()
            if dtype.is_floating_point:
                inputs.append(torch.randn(shape, generator=generator).to(dtype))
            else:
                inputs.append(torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=generator, dtype=dtype))
        return tuple(inputs)


_FIELDS = {f.name for f in DeclaredOp.__dataclass_fields__.values()} - {  # type: ignore[attr-defined]
    "name", "source_patterns"}
SOURCE_FIELDS = ("kernel_sources", "aot_sources", "cuda_sources", "without_python_sources")
_REQUIRED = {"registered_from", "kernel_sources", "example_program", "reference", "dtypes"}
RUNTIME_REGISTRATIONS = ("codegen", "executorch_library")
REGISTERED_FROM = ("python", "cpp", "aten")


def import_repository_module(name: str):
    """Imports a module the declarations name (python_module, reference): the repository's own, or any installed one
    (a reference may be e.g. torch.nn.functional.relu6)."""
    if REPO_ROOT not in sys.path:
        sys.path.append(REPO_ROOT)  # after the installed packages: a repository file never shadows one
    return importlib.import_module(name)


# torch's dtype names (str(dtype) without "torch.") of every scalar type a program may hold (flow/dtypes.py's table,
# which tests/test_selective_build.py checks this against). Spelled out so reading the declarations does not import torch:
# codegen's configure step reads them for every build tree.
DTYPE_NAMES = frozenset({
    "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32", "complex64",
    "complex128", "bool", "qint8", "quint8", "qint32", "bfloat16", "quint4x2", "quint2x4", "bits16", "float8_e5m2",
    "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "uint16", "uint32", "uint64",
})


def _is_dtype_name(name: object) -> bool:
    return isinstance(name, str) and name in DTYPE_NAMES


def _literal(node: ast.AST, names: dict[str, object]):
    """A literal, where a name bound earlier in the file to a literal may stand for its value and lists may be
    added: what Starlark evaluates alike (custom_ops.bzl's BLOCK_FORMAT_SOURCES)."""
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, names), _literal(node.right, names)
        if isinstance(left, list) and isinstance(right, list):
            return left + right
        raise ValueError("only lists may be added")
    if isinstance(node, ast.Dict):
        return {_literal(k, names): _literal(v, names) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(e, names) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    return ast.literal_eval(node)


def _parse(path: str) -> dict:
    with open(path) as f:
        source = f.read()
    try:
        module = ast.parse(source, path)
    except SyntaxError as err:
        raise DeclarationError(f"{path}:{err.lineno}:{err.offset}: syntax error: {err.msg}") from None
    names: dict[str, object] = {}
    for node in module.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        try:
            value = _literal(node.value, names)
        except ValueError:
            raise DeclarationError(f"{path}:{node.lineno}: {node.targets[0].id} must be a literal (no calls or "
                                   "expressions but names of earlier literals and lists added): Buck2 and Python "
                                   "both read it") from None
        if node.targets[0].id == "CUSTOM_OPS":
            return value
        names[node.targets[0].id] = value
    raise DeclarationError(f"{path}: no `CUSTOM_OPS = {{...}}` assignment")


def _check(name: str, entry: object, path: str) -> DeclaredOp:
    where = f"{path}: {name}"
    if not isinstance(name, str) or name.count("::") != 1 or "." in name:
        raise DeclarationError(f"{path}: op key {name!r} must be 'namespace::name' (no overload)")
    if not isinstance(entry, dict):
        raise DeclarationError(f"{where}: the declaration must be a dict of fields")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise DeclarationError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
    missing = _REQUIRED - set(entry)
    if missing:
        raise DeclarationError(f"{where}: missing field(s) {sorted(missing)}")
    origin = entry["registered_from"]
    if origin == "python" and not entry.get("python_module"):
        raise DeclarationError(f"{where}: registered_from 'python' needs python_module (the module that registers it)")
    if origin == "cpp" and not entry.get("aot_sources"):
        raise DeclarationError(f"{where}: registered_from 'cpp' needs aot_sources (its TORCH_LIBRARY_FRAGMENT sources)")
    if entry.get("without_python_sources") and origin != "python":
        raise DeclarationError(f"{where}: without_python_sources is for ops registered from Python; an op registered "
                               "from C++ has its aot_sources in every process")
    if origin not in REGISTERED_FROM:
        raise DeclarationError(f"{where}: registered_from must be 'python', 'cpp' or 'aten', got {origin!r}")
    if (origin == "aten") != name.startswith("aten::"):
        raise DeclarationError(f"{where}: registered_from 'aten' is for ATen's ops (aten::<name>), which PyTorch ships "
                               "and this project gives a runtime kernel; an op of your own namespace is registered "
                               "from 'python' or 'cpp'")
    if origin == "aten":
        extra = sorted(k for k in ("python_module", "aot_sources", "cuda_sources", "without_python_sources",
                                   "elementwise") if entry.get(k))
        if extra:
            raise DeclarationError(f"{where}: {', '.join(extra)} register(s) an op with PyTorch, which ships ATen's "
                                   "ops already; remove them (give its kernel_sources only)")
        if entry.get("runtime_registration", "codegen") != "codegen":
            raise DeclarationError(f"{where}: an ATen op's kernel is bound in custom_ops.yaml (`- op: "
                                   f"{name}.{entry.get('out_overload', 'out')}`) and registered by codegen; remove "
                                   "runtime_registration")
    if "replaces_executorch" in entry and not (origin == "aten" and entry["replaces_executorch"] is True):
        raise DeclarationError(f"{where}: replaces_executorch is True or absent, for an ATen op (registered_from "
                               "'aten') whose ExecuTorch kernel this one replaces; got "
                               f"{entry['replaces_executorch']!r} for an op registered from {origin!r}")
    if "defined_by" in entry and not (origin == "python" and isinstance(entry["defined_by"], str)
                                      and all(part.isidentifier() for part in entry["defined_by"].split("."))):
        raise DeclarationError(f"{where}: defined_by names the module of the library that defines the op (a Python "
                               "module name, imported before python_module, which adds the out variant), for an op "
                               f"registered_from 'python'; got {entry['defined_by']!r}")
    overload = entry.get("out_overload", "out")
    if not (isinstance(overload, str) and overload.isidentifier() and (overload == "out" or overload.endswith("_out"))):
        raise DeclarationError(f"{where}: out_overload must name the out variant's overload, 'out' or '<overload>_out' "
                               f"(aten::bucketize.Tensor_out: 'Tensor_out'); got {overload!r}")
    if ("example_inputs" in entry) == ("example_model" in entry):
        raise DeclarationError(f"{where}: give example_inputs (one call of the op on tensors) or example_model "
                               "('module.function' returning (model, runs)), exactly one")
    if "example_model" in entry and not (isinstance(entry["example_model"], str) and "." in entry["example_model"]):
        raise DeclarationError(f"{where}: example_model must be 'module.function'; got {entry['example_model']!r}")
    if entry.get("runtime_registration", "codegen") not in RUNTIME_REGISTRATIONS:
        raise DeclarationError(f"{where}: runtime_registration must be one of {', '.join(RUNTIME_REGISTRATIONS)}; "
                               f"got {entry['runtime_registration']!r}")
    if entry.get("runtime_registration") == "executorch_library" and origin == "cpp":
        # PyTorch learns a C++ op's out variant from codegen's ATen-mode registration, which needs the yaml entry.
        raise DeclarationError(f"{where}: runtime_registration 'executorch_library' is for ops registered from "
                               "Python; an op registered from C++ gets its out variant into PyTorch through "
                               "custom_ops.yaml and codegen (keep 'codegen')")
    inputs = []
    for item in entry.get("example_inputs", ()):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and _is_dtype_name(item[0])
                and all(isinstance(d, int) and d >= 0 for d in item[1])):
            raise DeclarationError(f"{where}: example_inputs entries are (dtype, shape) with a torch dtype name, e.g. "
                                   f"('float32', [2, 3]); got {item!r}")
        inputs.append((item[0], tuple(item[1])))
    dtypes = entry["dtypes"]
    if not (isinstance(dtypes, (list, tuple)) and dtypes and all(_is_dtype_name(d) for d in dtypes)
            and len(set(dtypes)) == len(dtypes)):
        raise DeclarationError(f"{where}: dtypes must list the dtypes its kernels accept, each once, by torch name, "
                               f"e.g. ['float32', 'bfloat16']; got {dtypes!r}")
    if not (isinstance(entry["reference"], str) and "." in entry["reference"]):
        raise DeclarationError(f"{where}: reference must be 'module.function', a function computing the op with ATen "
                               f"ops; got {entry['reference']!r}")
    values = {**entry, "example_inputs": tuple(inputs), "dtypes": tuple(dtypes)}
    root = os.path.dirname(os.path.abspath(path))
    for key in SOURCE_FIELDS:
        values[key] = _sources(entry.get(key, ()), root)
    patterns = {item for key in SOURCE_FIELDS for item in entry.get(key, ()) if "*" in item}
    return DeclaredOp(name=name, **values, source_patterns=tuple(sorted(patterns)))


def _sources(items, root: str) -> tuple[str, ...]:
    """A source list with each pattern (a `*` in a path, matching within one folder) replaced by the files it matches
    under `root`, sorted, as buck2's glob() lists them; each file once. A pattern that matches nothing stays as it is:
    a step that reads the declarations without the sources (Buck2's genrules) has no use for them; a build refuses it
    (codegen/run_codegen.py checked_declarations)."""
    listed = []
    for item in items:
        found = sorted(os.path.relpath(f, root).replace(os.sep, "/") for f in glob.glob(os.path.join(root, item))
                       if os.path.isfile(f)) if "*" in item else []
        listed += found or [item]
    return tuple(dict.fromkeys(listed))


# The modules the my_ops wheel carries flat beside the ops' own (setup.py copies each to my_ops/<file name>): the ops'
# shared Python side, the block formats' layouts, the file cache, and the checked loading of untrusted programs
# (flow/runtime.py and the modules it imports, each other relatively: my_ops.hf loads programs through my_ops.runtime).
# Each imports only the standard library, torch and the others at load time; executorch when used.
WHEEL_SHARED_MODULES = (
    "flow/file_cache.py", "flow/torch_compat.py", "flow/vmap_rules.py", "ops/blocks/block_layouts.py",
    "ops/rope_sdpa_with_cache/cache_positions.py",
    "flow/runtime.py", "flow/program.py", "flow/data_file.py", "flow/xnnpack_payload.py", "flow/xnnpack_layout.py",
    "flow/lazy_exir.py", "flow/dtypes.py", "flow/argument_kinds.py", "flow/runtime_kernels.py",
)


def load(path: str = DECLARATIONS) -> dict[str, DeclaredOp]:
    """All declared ops by name, in declaration order; DeclarationError names the file, op and field at fault."""
    ops = _parse(path)
    if not isinstance(ops, dict):
        raise DeclarationError(f"{path}: CUSTOM_OPS must be a dict of op name -> declaration")
    declared = {name: _check(name, entry, path) for name, entry in ops.items()}
    programs = [op.example_program for op in declared.values()]
    if len(set(programs)) != len(programs):
        raise DeclarationError(f"{path}: two ops share an example_program; each needs its own")
    modules = {os.path.basename(shared)[:-3]: shared for shared in WHEEL_SHARED_MODULES}
    for op in declared.values():
        if op.python_module and (other := modules.setdefault(op.wheel_module, op.python_module)) != op.python_module:
            fix = "rename the op's module" if other in WHEEL_SHARED_MODULES else "rename one file"
            raise DeclarationError(f"{path}: {op.name}: python_module {op.python_module!r} and {other!r} end in the "
                                   f"same name, and the my_ops wheel carries both as my_ops.{op.wheel_module}; {fix}")
    return declared


def with_example_program(program: str, declared: dict[str, DeclaredOp] | None = None) -> list[DeclaredOp]:
    """The ops whose example program is `program` (custom_ops_2 -> [my_ops::mul4]): what an example module exports."""
    declared = load() if declared is None else declared
    ops = [op for op in declared.values() if op.example_program == program]
    if not ops:
        raise DeclarationError(f"no op in custom_ops.bzl has example_program {program!r}")
    return ops


def find(name: str, declared: dict[str, DeclaredOp] | None = None) -> DeclaredOp:
    """The op called `name`: "mul3", "my_ops::mul3" or its out variant "my_ops::mul3.out"."""
    declared = load() if declared is None else declared
    base = name.split(".")[0]
    for op in declared.values():
        if base in (op.name, op.short_name):
            return op
    raise DeclarationError(f"no op {name!r} is declared in custom_ops.bzl; declared: {', '.join(declared)}")


def main() -> int:
    if sys.argv[1:] != ["list"]:
        print("usage: python -m flow.declarations list", file=sys.stderr)
        return 2
    try:
        for op in load().values():
            where = " ".join(op.aot_sources) if op.from_cpp else op.python_file or "PyTorch itself"
            print("\t".join((op.short_name, op.name, op.example_program, op.registered_from, where,
                             op.runtime_registration, op.out_name)))
    except DeclarationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
