"""The one codegen entry point: operator selection (executorch's gen_oplist) and registration code (executorch's
codegen with this project's templates), behind checks that turn selection mistakes into one-line errors that name
the fix. CMake's configure step and custom commands, the JIT build (custom_ops_2.py) and Buck2's genrules call it.

  run_codegen.py plan     --build_dir DIR [--root_ops a.out,b.out | --model_file x.pte[,y.pte] | --example N]
      checks the selection against custom_ops.yaml and custom_ops.bzl, writes DIR/selected_operators.yaml (and
      DIR/aot_selected_operators.yaml when a selected op is registered from C++) and DIR/custom_ops_plan.cmake (the
      selected ops and their sources, for CMakeLists.txt). No selection: every declared op.
  run_codegen.py select   --output FILE (--root_ops a.out,b.out | --model_file x.pte) [--registered_from cpp]
      just the selection yaml (Buck2's et_operator_library); --registered_from keeps the ops registered that way.
      Ops registered by EXECUTORCH_LIBRARY in their source (runtime_registration) are left to it in both commands.
  run_codegen.py generate --selection FILE --output_dir DIR [--aten | --manual_registration]
      the registration sources: ExecuTorch mode (registered from a static initializer, or with --manual_registration
      by a register_all_kernels() the application calls, RegisterKernels.h), or --aten for the PyTorch AOT library
      (schemas + CPU kernels, one file).
  run_codegen.py argument_kinds --output FILE
      the runner's table of the value kinds ExecuTorch's own kernels unbox (flow/argument_kinds.py).
  run_codegen.py python_schemas --ops a,b --output FILE
      the C++ definitions of the schemas the named ops' Python modules define, for a process without Python, each
      op's out schema checked against custom_ops.yaml's (codegen/python_op_schemas.py).
  run_codegen.py declared_dtypes --output_dir DIR
      DIR/declared_dtypes/<namespace>/<name>.h: each declared op's dtype set for its kernels, after checking each
      Python-registered op's module states the same dtypes (codegen/declared_dtypes.py); prints the files it read.

Errors go to stderr as one `error:` line and exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys

CODEGEN_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(CODEGEN_DIR)
CUSTOM_OPS_YAML = os.path.join(REPO_ROOT, "custom_ops.yaml")
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from flow import declarations, schema_types  # noqa: E402


class SelectionError(Exception):
    """A selection or declaration mistake; the message names it and the fix."""


# ---- Inputs: custom_ops.yaml, custom_ops.bzl, a model file ---------------------------------------------------------
def yaml_ops(path: str = CUSTOM_OPS_YAML) -> list[str]:
    """The out-variant names custom_ops.yaml binds, e.g. ["my_ops::mul3.out", "aten::bucketize.Tensor_out", ...]."""
    return [entry_name(e) for e in yaml_entries(path)]


def entry_name(entry: dict) -> str:
    """The out variant a custom_ops.yaml entry binds: its `func:` schema's name, or the ATen op its `op:` names."""
    return entry["func"].split("(")[0].strip() if "func" in entry else entry["op"]


def yaml_schemas(path: str = CUSTOM_OPS_YAML) -> dict[str, str]:
    """Each out variant custom_ops.yaml binds, with its schema: {"my_ops::mul3.out": "my_ops::mul3.out(...) -> ..."};
    an ATen op's (`op:`) is PyTorch's, from the native_functions.yaml codegen reads."""
    return schemas_of(yaml_entries(path))


def schemas_of(entries: list[dict]) -> dict[str, str]:
    """yaml_schemas() of these custom_ops.yaml entries."""
    aten = aten_schemas({e["op"] for e in entries if "op" in e})
    return {entry_name(e): e["func"] if "func" in e else aten[e["op"]] for e in entries}


def native_yaml_dir() -> str:
    """torchgen's packaged ATen/native directory (tags.yaml, native_functions.yaml), found without importing torch."""
    import importlib.util

    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        raise SelectionError("torchgen (part of torch) is not installed in this Python; codegen needs it")
    return os.path.join(list(spec.submodule_search_locations)[0], "packaged", "ATen", "native")


def aten_schemas(names) -> dict[str, str]:
    """PyTorch's schema of each ATen out variant in `names` ("aten::bucketize.Tensor_out"); one that PyTorch does not
    have is a SelectionError naming it."""
    if not names:
        return {}
    wanted = {name.split("::", 1)[1]: name for name in names}
    found = {}
    with open(os.path.join(native_yaml_dir(), "native_functions.yaml")) as f:
        for line in f:  # `- func: bucketize.Tensor_out(Tensor self, ...) -> Tensor(a!)`, one line each
            if line.startswith("- func: ") and line[8:].split("(")[0] in wanted:
                schema = line[8:].strip()
                found[wanted[schema.split("(")[0]]] = "aten::" + schema
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise SelectionError(f"custom_ops.yaml binds {', '.join(unknown)}, which PyTorch does not have: an `op:` entry "
                             "names an ATen out variant as native_functions.yaml spells it (aten::bucketize.Tensor_out); "
                             "an op of your own is a `func:` entry with its schema")
    return found


def yaml_entries(path: str = CUSTOM_OPS_YAML) -> list[dict]:
    """custom_ops.yaml's entries, each checked to have `func: <schema>` (an op of this project's) or `op: aten::...`
    (ATen's op, its schema PyTorch's); a mistake is a SelectionError naming it."""
    import yaml

    try:
        with open(path) as f:
            entries = yaml.safe_load(f) or []
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        raise SelectionError(f"{path}:{mark.line + 1}:{mark.column + 1}: YAML syntax error: {err.problem}") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and (isinstance(e.get("func"), str)) !=
                                                (isinstance(e.get("op"), str)) for e in entries):
        raise SelectionError(f"{path}: expected a list of entries, each with `func: <schema>` (or, for an ATen op, "
                             "`op: aten::<name>.<overload>`) and `kernels:`")
    for e in entries:
        if "op" in e and not e["op"].startswith("aten::"):
            raise SelectionError(f"{path}: `op: {e['op']}` names an ATen op by its out variant, aten::<name>.<overload> "
                                 "(aten::bucketize.Tensor_out); an op of another namespace is a `func:` entry with its "
                                 "schema")
    return entries


def checked_declarations(check_sources: bool = True) -> dict[str, declarations.DeclaredOp]:
    """The declared ops, checked against custom_ops.yaml (and, with check_sources, their files; a Buck2 genrule has
    only the declarations and the yaml in its $SRCDIR)."""
    try:
        ops = declarations.load()
    except declarations.DeclarationError as err:
        raise SelectionError(str(err)) from None
    bound = yaml_schemas()
    for name, schema in bound.items():
        unsupported = schema_types.unsupported_arguments(schema)
        if unsupported:
            raise SelectionError(f"custom_ops.yaml: {name} has argument(s) of a type this flow cannot pass to a kernel: "
                                 f"{', '.join(unsupported)}; supported: {', '.join(schema_types.ARGUMENT_TYPES)}")
    for op in ops.values():
        if op.by_codegen and op.out_name not in bound:
            raise SelectionError(f"custom_ops.bzl declares {op.name} but custom_ops.yaml binds no {op.out_name}; add "
                                 f"`- func: {op.out_name}(Tensor input, *, Tensor(a!) output) -> Tensor(a!)` with its "
                                 "kernel_name")
        if not op.by_codegen and op.out_name in bound:
            raise SelectionError(f"custom_ops.yaml binds {op.out_name}, which custom_ops.bzl registers with "
                                 "EXECUTORCH_LIBRARY (runtime_registration 'executorch_library'): it would be "
                                 "registered twice; remove the yaml entry, or the runtime_registration field")
        sources = (*op.kernel_sources, *op.aot_sources, *op.cuda_sources, *op.without_python_sources)
        for source in sources if check_sources else ():
            if "*" in source:  # a pattern is replaced by the files it matches: this one matched none
                raise SelectionError(f"custom_ops.bzl: {op.name} names {source}, which matches no file")
            if not os.path.isfile(os.path.join(REPO_ROOT, source)):
                raise SelectionError(f"custom_ops.bzl: {op.name} names {source}, which does not exist")
        if check_sources:
            check_library_registration(op)
    for name in bound:
        if name.split(".")[0] not in ops:
            raise SelectionError(f"custom_ops.yaml binds {name} but custom_ops.bzl does not declare "
                                 f"{name.split('.')[0]}; declare it (its kernel sources and how PyTorch learns it)")
    return ops


def check_library_registration(op: declarations.DeclaredOp) -> None:
    """An op is registered by codegen or by EXECUTORCH_LIBRARY in its kernel source, as declared, never both or
    neither (a second registration fails at load, a missing one only when a program calls the op)."""
    import re

    registers = re.compile(r'EXECUTORCH_LIBRARY\w*\(\s*' + re.escape(op.namespace) + r'\s*,\s*"'
                           + re.escape(op.short_name) + r'\.out"')
    registering = []
    for source in op.kernel_sources:
        with open(os.path.join(REPO_ROOT, source)) as f:
            if registers.search(f.read()):
                registering.append(source)
    if op.by_codegen and registering:
        raise SelectionError(f"{registering[0]} registers {op.out_name} with EXECUTORCH_LIBRARY, and custom_ops.yaml "
                             "binds it for codegen: it would be registered twice; declare runtime_registration "
                             "'executorch_library' (and remove the yaml entry), or remove the macro")
    if not op.by_codegen and not registering:
        raise SelectionError(f"custom_ops.bzl declares {op.name} with runtime_registration 'executorch_library', but "
                             f"none of its kernel_sources registers it: add EXECUTORCH_LIBRARY_CHECKED({op.namespace}, "
                             f'"{op.short_name}.out", <kernel function>) (kernel_helpers/checked_unboxing.h)')


def codegen_names(selected: list[str], ops: dict[str, declarations.DeclaredOp]) -> list[str]:
    """The selected operators codegen registers: all but the ops whose source registers them (EXECUTORCH_LIBRARY)."""
    by_library = {op.out_name for op in ops.values() if not op.by_codegen}
    return [name for name in selected if name not in by_library]


def namespaces(bound: list[str]) -> set[str]:
    """The namespaces of the ops custom_ops.yaml binds that are this project's alone: ExecuTorch's own kernels serve
    the others (aten, quantized_decomposed, ...), where the yaml may add a kernel for an op they lack."""
    from flow.runtime_kernels import RUNTIME_NAMESPACES

    return {name.split("::")[0] for name in bound} - set(RUNTIME_NAMESPACES)


def check_root_ops(root_ops: list[str], bound: list[str], self_registered: list[str] = ()) -> None:
    """Each root op is an out variant custom_ops.yaml binds or a declared op's source registers (self_registered)."""
    known = [*bound, *self_registered]
    for name in root_ops:
        overloads = [k for k in known if k.split(".")[0] == name.split(".")[0]]
        if name not in known and overloads and name.split("::")[0] not in namespaces(known):
            raise SelectionError(f"root op {name!r} is not the out variant custom_ops.yaml binds; did you mean "
                                 f"{' or '.join(overloads)}?")
        if name in known or name.split("::")[0] not in namespaces(known):
            continue
        if f"{name}.out" in known:
            raise SelectionError(f"root op {name!r} names no overload; did you mean {name}.out? (EXIR calls the out "
                                 "variant, which the runtime registers)")
        also = f"; registered by their sources: {', '.join(self_registered)}" if self_registered else ""
        raise SelectionError(f"root op {name!r} is not in custom_ops.yaml, which binds: {', '.join(bound)}{also}")


def program_operators(model_file: str) -> list[str]:
    """The operators a .pte calls, after checking it is one (gen_oplist crashes on other files)."""
    if not os.path.isfile(model_file):
        raise SelectionError(f"model file {model_file} does not exist; export it first (e.g. python custom_ops_1.py)")
    from flow import program

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return program.read(model_file).operators
    except program.ProgramError as err:
        raise SelectionError(f"model file {model_file} is {err}; pass a program written by to_executorch()") from None


# ---- Selection and generation --------------------------------------------------------------------------------------
def replace_if_changed(fresh: str, path: str) -> None:
    """Moves the file `fresh` to `path`, or drops it when `path` already holds the same text: a configure rewriting the
    same selection would otherwise regenerate and relink its build's libraries, under a test or user running them
    from another process."""
    try:
        with open(fresh) as new, open(path) as old:
            if new.read() == old.read():
                os.remove(fresh)
                return
    except FileNotFoundError:
        pass
    os.replace(fresh, path)


def write_if_changed(path: str, text: str) -> None:
    """`text` into `path` through replace_if_changed: the file keeps its time when it already holds that text."""
    with open(path + ".new", "w") as f:
        f.write(text)
    replace_if_changed(path + ".new", path)


def write_selection(output: str, root_ops: list[str]) -> None:
    """selected_operators.yaml for `root_ops`, through executorch's gen_oplist."""
    from executorch.codegen.tools.gen_oplist import gen_oplist

    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):  # gen_oplist prints its inputs
        gen_oplist(output_path=output + ".new", root_ops=",".join(root_ops) if root_ops else None)
    replace_if_changed(output + ".new", output)


def selected_root_ops(ops, *, root_ops=None, model_file=None, example=None) -> list[str]:
    bound = yaml_ops()
    if model_file:  # one program, or several comma-separated: the ops any of them calls
        return list(dict.fromkeys(op for path in model_file.split(",") for op in program_operators(path)))
    if root_ops:
        check_root_ops(root_ops, bound, [op.out_name for op in ops.values() if not op.by_codegen])
        return list(root_ops)
    if example:
        # The upstream example's switch: 1 = custom_ops_1's op, 2 = custom_ops_2's, 3 = both (not the other examples)
        programs = {"custom_ops_1", "custom_ops_2"} if example == "3" else {f"custom_ops_{example}"}
        chosen = [op.out_name for op in ops.values() if op.example_program in programs]
        if not chosen:
            raise SelectionError(f"no declared op has example program custom_ops_{example}; use 1, 2 or 3 (both)")
        return chosen
    return [op.out_name for op in ops.values()]


def _key(*texts: str, files: list[str]) -> str:
    """A digest of `texts` (versions, switches) and of the contents of `files`."""
    import hashlib

    digest = hashlib.sha256(";".join(texts).encode())
    for path in files:
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def _versions() -> list[str]:
    from importlib import metadata

    return [f"executorch={metadata.version('executorch')}", f"torch={metadata.version('torch')}"]


def selected_bindings(selection: str) -> str:
    """custom_ops.yaml cut to the entries `selection` selects (all of it when it selects every operator), as yaml text.
    Codegen reads this instead of the whole file, so an op declared beside the selected ones changes neither the code
    generated for them nor its cache key: build trees of other selections do not regenerate, recompile or relink."""
    import yaml

    with open(selection) as f:
        selected = yaml.safe_load(f) or {}
    if selected.get("include_all_operators"):
        with open(CUSTOM_OPS_YAML) as f:
            return f.read()
    operators = set(selected.get("operators") or {})
    entries = [e for e in yaml_entries() if entry_name(e) in operators]
    return yaml.safe_dump(entries, sort_keys=False)


def declared_replacing() -> list[str]:
    """Every declared out variant whose kernel replaces ExecuTorch's (replaces_executorch), selected or not."""
    return [op.out_name for op in declarations.load().values() if op.replaces_executorch]


def bound_among(bindings: str, names: list[str]) -> list[str]:
    """The out variants of `names` that `bindings` (a selection's custom_ops.yaml entries) binds."""
    import yaml

    return [entry_name(e) for e in yaml.safe_load(bindings) or [] if entry_name(e) in names]


def argument_list(schema: str) -> list[str]:
    """A schema's arguments as checked_unboxing::Argument initializers: the name, the value tags a call may pass (every
    tag for a type without a known one: not checked), the type for the message."""
    from torchgen.model import FunctionSchema

    rows = []
    for argument in FunctionSchema.parse(schema.split("::", 1)[1]).arguments.flat_all:
        tags = _accepted_tags(argument.type)
        mask = " | ".join(f"bit(Tag::{t})" for t in tags) if tags else "0xffffffffu"
        rows.append(f'{{"{argument.name}", {mask}, "{argument.type}"}}')
    return rows


def registration_tables_header(bindings: str, replacing: list[str]) -> str:
    """RegistrationTables.h, which the registration templates include for register_table
    (kernel_helpers/registration_prelude.h): each bound kernel's argument list, from its schema, that a call is checked
    against before the generated kernel unboxes any value; the selected kernels that replace ExecuTorch's own, which
    stay out of the global registry for the runner to hand to each method it loads; and every declared one, so a
    runner can say when ExecuTorch's kernel runs for an op the library was built without."""
    import yaml

    arguments, lists = [], []
    for i, (op, schema) in enumerate(schemas_of(yaml.safe_load(bindings) or []).items()):
        rows = argument_list(schema)
        arguments.append(f"inline constexpr Argument kArguments{i}[] = {{{', '.join(rows)}}};\n")
        lists.append(f'{{"{op}", argument_lists::kArguments{i}, {len(rows)}}}, ')

    def names(ops):
        return "".join(f'"{op}", ' for op in ops)

    return ("// Written by codegen/run_codegen.py from custom_ops.yaml and custom_ops.bzl for one selection.\n"
            '#pragma once\n\n#include "kernel_helpers/registration_prelude.h"\n\nnamespace custom_ops {\n'
            "namespace argument_lists {\n"
            "using checked_unboxing::Argument;\nusing checked_unboxing::bit;\nusing checked_unboxing::Tag;\n"
            f"{''.join(arguments)}}}  // namespace argument_lists\n"
            f"inline constexpr ArgumentList kArgumentLists[] = {{{''.join(lists)}{{nullptr, nullptr, 0}}}};\n"
            f"inline constexpr const char* kReplacingExecuTorch[] = {{{names(bound_among(bindings, replacing))}"
            "nullptr};\n"
            f"inline constexpr const char* kDeclaredReplacing[] = {{{names(replacing)}nullptr}};\n"
            "}  // namespace custom_ops\n")


def _generation_key(selection: str, bindings: str, aten: bool, native: str, manual: bool, replacing: list[str]) -> str:
    """What codegen's output depends on: the selection, its bindings, the declared ops whose kernels replace
    ExecuTorch's, the templates, this file (the tables it writes), ATen's yaml files and the executorch and torch
    versions."""
    templates = os.path.join(CODEGEN_DIR, "templates")
    return _key(f"aten={aten}", f"manual={manual}", *_versions(), bindings, "replacing:", *replacing, files=[
        selection, os.path.abspath(__file__), os.path.join(native, "tags.yaml"),
        os.path.join(native, "native_functions.yaml"),
        *sorted(os.path.join(templates, name) for name in os.listdir(templates))])


def _cached(key: str, output_dir: str, make) -> None:
    """Fills output_dir with what make(directory) writes into an empty directory. With $CUSTOM_OPS_CODEGEN_CACHE set
    (test_custom_ops.sh sets it, and the copies of the repository the tests build inherit it), output already made
    from the same inputs (`key`) is copied from there instead: each build tree and copy would otherwise make it again."""
    import shutil

    cache = os.environ.get("CUSTOM_OPS_CODEGEN_CACHE")
    entry = os.path.join(cache, key) if cache else None
    os.makedirs(output_dir, exist_ok=True)
    if cache:
        os.makedirs(cache, exist_ok=True)
    source = entry
    if not (entry and os.path.isdir(entry)):
        # Made aside, so a cache entry holds exactly this run's files, and renamed into place, so a concurrent build
        # sees a whole entry or none.
        source = f"{entry or os.path.join(output_dir, 'codegen')}.{os.getpid()}.tmp"
        shutil.rmtree(source, ignore_errors=True)
        os.makedirs(source)
        make(source)
    for name in os.listdir(source):
        # Unchanged files keep their time stamps, so the build recompiles nothing for them (Ninja's restat).
        fresh = os.path.join(output_dir, name + ".new")
        shutil.copyfile(os.path.join(source, name), fresh)
        replace_if_changed(fresh, os.path.join(output_dir, name))
    if source != entry:
        if entry:
            with contextlib.suppress(OSError):  # another build may have stored the entry first
                os.rename(source, entry)
        shutil.rmtree(source, ignore_errors=True)  # gone once renamed


def generate(selection: str, output_dir: str, aten: bool, manual: bool = False) -> list[str]:
    """Runs executorch.codegen.gen (through the cache, see _cached); returns the generated sources. `manual`: codegen's
    --manual_registration, a register_all_kernels() the application calls instead of a static initializer."""
    native = native_yaml_dir()
    names = (["RegisterSchema.cpp"] if aten else ["RegisterKernelsEverything.cpp"] if manual
             else ["RegisterCodegenUnboxedKernelsEverything.cpp"])

    bindings = selected_bindings(selection)
    replacing = declared_replacing()

    def make(directory):
        import tempfile

        import yaml

        # Codegen reads this project's ops (`func:`, with their schemas) as custom ops, and ATen's (`op:`) as it reads
        # ExecuTorch's own functions.yaml, their schemas from native_functions.yaml.
        entries = yaml.safe_load(bindings) or []
        with tempfile.TemporaryDirectory() as scratch:
            paths = [os.path.join(scratch, name) for name in ("custom_ops.yaml", "functions.yaml")]
            for path, key in zip(paths, ("func", "op")):
                with open(path, "w") as f:
                    f.write(yaml.safe_dump([e for e in entries if key in e], sort_keys=False))
            _run_codegen(selection, *paths, directory, aten, native, manual)
        if aten:
            merge_aten_registrations(directory)
        else:
            with open(os.path.join(directory, "RegistrationTables.h"), "w") as f:
                f.write(registration_tables_header(bindings, replacing))

    _cached(_generation_key(selection, bindings, aten, native, manual, replacing), output_dir, make)
    return [os.path.join(output_dir, name) for name in names]


def merge_aten_registrations(directory: str) -> None:
    """Appends the CPU registrations (RegisterCPUCustomOps.cpp) to the schemas (RegisterSchema.cpp): one translation
    unit parses torch/library.h once, 4.6 s of compiler where the two files took 9.3, in every AOT build tree."""
    schemas, kernels = (os.path.join(directory, name) for name in ("RegisterSchema.cpp", "RegisterCPUCustomOps.cpp"))
    with open(kernels) as f:
        text = f.read()
    with open(schemas, "a") as f:
        f.write("\n" + text)
    os.remove(kernels)


def defining_file(op) -> str | None:
    """The repository file of the module that defines a "python" op another library owns (defined_by), if any."""
    if not op.defined_by:
        return None
    path = op.defined_by.replace(".", "/") + ".py"
    return path if os.path.isfile(os.path.join(REPO_ROOT, path)) else None


def python_schemas(names: list[str], output: str) -> None:
    """The C++ definitions of the schemas these "python" ops' modules define (codegen/python_op_schemas.py)."""
    from codegen import python_op_schemas

    ops = checked_declarations(check_sources=False)
    unknown = [name for name in names if name not in ops or ops[name].registered_from != "python"]
    if unknown:
        raise SelectionError(f"python_schemas: {', '.join(unknown)} is not an op custom_ops.bzl declares registered "
                             "from Python")
    try:
        text = python_op_schemas.source([ops[name] for name in names], yaml_schemas())
    except python_op_schemas.SchemaMismatch as err:
        raise SelectionError(str(err)) from None
    write_if_changed(output, text)


def declared_dtypes(output_dir: str) -> list[str]:
    """Each op's dtypes as its kernels' C++ set, one header per op under output_dir (a file rewritten only when its
    op's set changed, one of an op no longer declared removed), each Python module checked against the same
    declaration; returns the modules read (a build reruns this when one changes)."""
    from codegen import declared_dtypes as dtypes

    ops = checked_declarations(check_sources=False).values()
    try:
        read = dtypes.check_python_modules(ops, REPO_ROOT)
        written = dtypes.headers(ops)
    except dtypes.DtypeMismatch as err:
        raise SelectionError(str(err)) from None
    for relative, text in written.items():
        path = os.path.join(output_dir, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_if_changed(path, text)
    root = os.path.join(output_dir, dtypes.HEADER_DIR)
    for directory, _, files in os.walk(root):
        for name in files:
            if os.path.relpath(os.path.join(directory, name), output_dir) not in written:
                os.remove(os.path.join(directory, name))
    return read


def argument_kinds(output: str) -> None:
    """The runner's table of the value kinds ExecuTorch's own kernels unbox (flow/argument_kinds.py), through the
    cache: reading PyTorch's and ExecuTorch's schemas takes seconds."""
    import tempfile

    from flow import argument_kinds as kinds

    files = [os.path.join(REPO_ROOT, "flow", name) for name in ("argument_kinds.py", "xnnpack_layout.py",
                                                                 "runtime_kernels.py")]
    with tempfile.TemporaryDirectory() as tmp:
        _cached("argument_kinds-" + _key(*_versions(), files=files), tmp,
                lambda directory: kinds.main(["--output", os.path.join(directory, "argument_kinds.h")]))
        with open(os.path.join(tmp, "argument_kinds.h")) as f:
            text = f.read()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        f.write(text)


def _run_codegen(selection: str, bindings_yaml: str, functions_yaml: str, output_dir: str, aten: bool, native: str,
                 manual: bool) -> None:
    cmd = [sys.executable, "-m", "executorch.codegen.gen", "--source-path", CODEGEN_DIR, "--install-dir", output_dir,
           "--custom-ops-yaml-path", bindings_yaml, "--functions-yaml-path", functions_yaml,
           "--op-selection-yaml-path", selection,
           "--tags-path", os.path.join(native, "tags.yaml"),
           "--aten-yaml-path", os.path.join(native, "native_functions.yaml")]
    if aten:
        cmd.append("--use-aten-lib")
    if manual:
        cmd.append("--manual_registration")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SelectionError(f"executorch.codegen.gen failed:\n{proc.stderr[-4000:]}")


# The EValue tags each schema type accepts, for the checked unboxing (see templates/RegisterCodegenUnboxedKernels.cpp).
_TAGS = {"Tensor": ["Tensor"], "int": ["Int"], "SymInt": ["Int"], "float": ["Double"], "bool": ["Bool"],
         "Scalar": ["Int", "Double", "Bool"], "str": ["String"], "ScalarType": ["Int"], "Layout": ["Int"],
         "MemoryFormat": ["Int"], "Tensor[]": ["ListTensor"], "Tensor?[]": ["ListOptionalTensor"],
         "int[]": ["ListInt"], "SymInt[]": ["ListInt"], "float[]": ["ListDouble"], "bool[]": ["ListBool"],
         "Scalar[]": ["ListScalar"]}


def _accepted_tags(type_) -> list[str] | None:
    text = str(type_)
    optional = text.endswith("?")
    base = text[:-1] if optional else text
    base = "int[]" if base.startswith("int[") else base  # int[2] etc.
    tags = _TAGS.get(base)
    return None if tags is None else tags + (["None"] if optional else [])


def check_runtime_kernels(selected: list[str], chosen, ops, model_file: str | None) -> None:
    """A program's operators, each registered by exactly one kernel library the runner links: ExecuTorch's (the
    wheel's, linked whole: one shared object registering all of its ops at load) or this project's selected ones. An
    op in both would stop ExecuTorch at load (register_kernels refuses a name registered twice with a failed
    ET_CHECK) unless its declaration says it replaces ExecuTorch's (then it is not registered but handed to each
    method); an op in neither would fail the program's load ("Missing operator")."""
    from flow import runtime_kernels
    from flow.runtime_kernels import RUNTIME_NAMESPACES

    if not (model_file or any(op.namespace in RUNTIME_NAMESPACES for op in chosen)):
        return  # only this project's namespaces: nothing ExecuTorch registers, no need to read its registry
    chosen_by_name = {op.name: op for op in chosen}
    twice = runtime_kernels.twice_registered(chosen_by_name)
    if twice:
        raise SelectionError(f"{', '.join(twice)}: ExecuTorch's kernels ({runtime_kernels.EXECUTORCH_LIBRARIES}, which "
                             "the runner and the Python runtime link) register it already, and a second registration "
                             "stops ExecuTorch at load. To run yours in its place, declare it with "
                             "\"replaces_executorch\": True in custom_ops.bzl (the runner hands it to each method it "
                             "loads, which looks there before the global registry); to keep ExecuTorch's, remove the "
                             "declaration from custom_ops.bzl and custom_ops.yaml")
    nothing = runtime_kernels.replacing_nothing(chosen_by_name)
    if nothing:
        raise SelectionError(f"{', '.join(nothing)}: declared replaces_executorch, but ExecuTorch's kernels have no "
                             "kernel of that name to replace; remove the field (the kernel is then registered like "
                             "any other)")
    if model_file:
        missing = runtime_kernels.without_kernel(selected, ops)
        if missing:
            raise SelectionError(runtime_kernels.missing_kernel_message(missing, model_file))


def cmake_list(paths) -> str:
    """Each path once (ops may share sources: the block formats' serve both of their ops), absolute."""
    return ";".join(os.path.join(REPO_ROOT, p).replace("\\", "/") for p in dict.fromkeys(paths))


def plan(build_dir: str, *, root_ops=None, model_file=None, example=None) -> None:
    ops = checked_declarations()
    selected = selected_root_ops(ops, root_ops=root_ops, model_file=model_file, example=example)
    by_out_name = {op.out_name: op for op in ops.values()}
    chosen = [by_out_name[name] for name in selected if name in by_out_name]
    ours = namespaces(yaml_ops())
    unbound = [name for name in selected if name not in by_out_name and name.split("::")[0] in ours]
    if unbound:
        raise SelectionError(f"the program calls {', '.join(unbound)}, which custom_ops.yaml does not bind; bind and "
                             "declare them, or export the program without them")
    check_runtime_kernels(selected, chosen, ops, model_file)
    if not chosen:
        raise SelectionError("the selection contains no op of custom_ops.yaml; nothing to build")
    by_codegen = codegen_names(selected, ops)
    write_selection(os.path.join(build_dir, "selected_operators.yaml"), by_codegen)
    cpp = [op for op in chosen if op.from_cpp]
    if cpp:
        write_selection(os.path.join(build_dir, "aot_selected_operators.yaml"), [op.out_name for op in cpp])
    # The C++ registration of the selected Python-registered ops and their kernels (ATen mode), for processes without
    # Python (AOTInductor's runner).
    without_python_ops = [op for op in chosen if op.without_python_sources]
    without_python = [s for op in without_python_ops for s in (*op.without_python_sources, *op.kernel_sources)]
    lines = [
        "# Written by codegen/run_codegen.py plan: the selected ops and what to build for them.",
        f'set(CUSTOM_OPS_SELECTED "{";".join(op.name for op in chosen)}")',
        f'set(CUSTOM_OPS_BY_CODEGEN "{";".join(op.name for op in chosen if op.by_codegen)}")',
        f'set(CUSTOM_OPS_KERNEL_SOURCES "{cmake_list(s for op in chosen for s in op.kernel_sources)}")',
        f'set(CUSTOM_OPS_AOT_SOURCES "{cmake_list(s for op in cpp for s in (*op.aot_sources, *op.kernel_sources))}")',
        f'set(CUSTOM_OPS_CUDA_SOURCES "{cmake_list(s for op in cpp for s in op.cuda_sources)}")',
        f'set(CUSTOM_OPS_WITHOUT_PYTHON_SOURCES "{cmake_list(without_python)}")',
        f'set(CUSTOM_OPS_WITHOUT_PYTHON_OPS "{";".join(op.name for op in without_python_ops)}")',
        # their modules, whose schemas python_schemas writes into C++ (again when one changes)
        f'set(CUSTOM_OPS_WITHOUT_PYTHON_MODULES '
        f'"{cmake_list(f for op in without_python_ops for f in (op.python_file, defining_file(op)) if f)}")',
    ]
    # A file added where a source pattern of a selected op matches reconfigures the tree (which lists it then).
    for pattern in sorted({p for op in chosen for p in op.source_patterns}):
        where = os.path.join(REPO_ROOT, pattern).replace("\\", "/")
        lines.append(f'file(GLOB CUSTOM_OPS_GLOBBED CONFIGURE_DEPENDS "{where}")')
    plan_file = os.path.join(build_dir, "custom_ops_plan.cmake")
    write_if_changed(plan_file, "\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--build_dir", required=True)
    s = sub.add_parser("select")
    s.add_argument("--output", required=True)
    s.add_argument("--registered_from", choices=("python", "cpp"))
    for command in (p, s):
        which = command.add_mutually_exclusive_group()
        which.add_argument("--root_ops", help="comma-separated out variants, e.g. my_ops::mul3.out")
        which.add_argument("--model_file", help="select every op this .pte program calls (a,b.pte: any of them)")
        if command is p:
            which.add_argument("--example", help="1, 2 or 3 (both): the upstream example's REGISTER_EXAMPLE_CUSTOM_OP")
    g = sub.add_parser("generate")
    g.add_argument("--selection", required=True)
    g.add_argument("--output_dir", required=True)
    g.add_argument("--aten", action="store_true")
    g.add_argument("--manual_registration", action="store_true",
                   help="a register_all_kernels() the application calls, no static initializer")
    k = sub.add_parser("argument_kinds")
    k.add_argument("--output", required=True)
    w = sub.add_parser("python_schemas")
    w.add_argument("--ops", required=True, help="comma-separated ops registered from Python, e.g. my_ops::mul3")
    w.add_argument("--output", required=True)
    d = sub.add_parser("declared_dtypes")
    d.add_argument("--output_dir", required=True, help="the include directory: declared_dtypes/<namespace>/<name>.h")
    args = parser.parse_args()

    root_ops = [op.strip() for op in args.root_ops.split(",") if op.strip()] if getattr(args, "root_ops", None) else None
    try:
        if args.command == "plan":
            plan(args.build_dir, root_ops=root_ops, model_file=args.model_file, example=args.example)
        elif args.command == "select":
            ops = checked_declarations(check_sources=False)
            selected = codegen_names(selected_root_ops(ops, root_ops=root_ops, model_file=args.model_file), ops)
            if args.registered_from:
                keep = {op.out_name for op in ops.values() if op.registered_from == args.registered_from}
                selected = [name for name in selected if name in keep]
            write_selection(args.output, selected)
        elif args.command == "argument_kinds":
            argument_kinds(args.output)
        elif args.command == "declared_dtypes":
            print("\n".join(declared_dtypes(args.output_dir)))
        elif args.command == "python_schemas":
            python_schemas([name.strip() for name in args.ops.split(",") if name.strip()], args.output)
        else:
            generate(args.selection, args.output_dir, args.aten, args.manual_registration)
    except SelectionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
