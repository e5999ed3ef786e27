"""The one reader of .pte files in the machinery: which operators a program calls, what each method takes and returns,
how much planned memory it asks for, and the checks an untrusted program must pass before the ExecuTorch runtime is
handed it. check() makes the same checks, in the same order, as the C++ runner's pre-flight (runner/program_runner.cpp)
on the same fields (the runner reads them through MethodMeta, this through executorch's own flatbuffer reader):

  1. the file is an ExecuTorch program, and the method exists;
  2. every memory-planned buffer has a size >= 0, and together they fit the memory budget;
  3. every input refers to a value of the method; a tensor input has valid metadata (sizes >= 0, a dim order that is
     a permutation of its dimensions, a known dtype), and planned buffers plus inputs fit the budget;
  4. every output refers to a value of the method (ExecuTorch aborts in Method::get_outputs otherwise), and a tensor
     output has valid metadata;
  5. every operator name fits ExecuTorch's 100-byte buffer (the runner: no error logged while the method loads);
  6. every kernel call names an operator of the method and passes the kinds of values its operator's schema declares
     (flow/argument_kinds.py; the runner: runner/kernel_calls.cpp over the table generated from it): ExecuTorch's own
     kernels unbox unchecked and would abort the process;
  7. every delegate entry has its backend id, data and compile specs (ExecuTorch's BackendDelegate::Init reads them
     unchecked), and every XNNPACK payload is one XNNPACK can read safely (flow/xnnpack_payload.py; the runner:
     runner/xnnpack_payload.cpp, both reading flow/xnnpack_layout.py): its header's regions, and every field
     XNNPACK's compiler trusts (dims against the bytes stored, num_dims, datatypes, constant and scale indices,
     per-channel scale counts, external ids against the delegate call's arguments); docs/untrusted-programs.md lists
     them. A wrong flatbuffer identifier is refused too: the backend logs it verbatim, and the Python runtime's log,
     decoding those bytes as UTF-8, ends the interpreter; the runner's log hook makes them printable instead;
  8. every item of a list value (IntList, TensorList, OptionalTensorList: indices of other values) names a value of
     the list's kind: ExecuTorch reads each with an ET_CHECK when a kernel unboxes the list;
  9. no input tensor is data the program holds (a constant buffer, external named data): set_input would copy the
     caller's values over the program's bytes, read-only where the program is mapped from a file (the runner:
     runner/kernel_calls.cpp).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from . import xnnpack_payload
from .lazy_exir import defer_exir_package
from .xnnpack_layout import TENSOR_DATA_EXTERNAL

DEFAULT_MAX_MEMORY = 1 << 30  # as the runner's --max_memory default
OPERATOR_NAME_LIMIT = 100  # ExecuTorch's buffer for "name.overload", terminator included (method.cpp)


class ProgramError(ValueError):
    """The file is not a program the runtime can be handed safely; the message names the problem."""


@dataclass(frozen=True)
class TensorSpec:
    scalar_type: str  # ExecuTorch's name, e.g. "FLOAT"
    sizes: tuple[int, ...]  # the upper bound, for dynamic dimensions
    dim_order: tuple[int, ...]
    data_buffer: int = 0  # > 0: the program's constant buffer holding its bytes
    external: bool = False  # its bytes are named data outside the program

    @property
    def dtype(self):
        from .dtypes import from_scalar_type

        return from_scalar_type(self.scalar_type)

    def problem(self) -> str | None:
        """What is wrong with this metadata, or None."""
        if any(s < 0 for s in self.sizes):
            return f"negative size in {list(self.sizes)}"
        if len(self.dim_order) != len(self.sizes) or sorted(self.dim_order) != list(range(len(self.sizes))):
            return f"dim order {list(self.dim_order)} is not a permutation of its {len(self.sizes)} dimension(s)"
        if self.dtype is None:
            return f"unknown dtype {self.scalar_type}"
        return None

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * self.dtype.itemsize


@dataclass(frozen=True)
class ValueSpec:
    """An input or output of a method: a tensor, or another kind of value (Int, Double, Bool, Null, ...)."""

    index: int  # into the method's values
    kind: str  # the schema's class name: "Tensor", "Int", ...; "missing" when the index is out of range
    tensor: TensorSpec | None = None
    scalar: object = None  # the value an Int/Double/Bool/String carries in the program


@dataclass(frozen=True)
class MethodSpec:
    name: str
    num_values: int
    inputs: tuple[ValueSpec, ...]
    outputs: tuple[ValueSpec, ...]
    planned_buffer_sizes: tuple[int, ...]  # ExecuTorch's non_const_buffer_sizes: entry 0 is reserved (0)
    operators: tuple[str, ...]
    kernel_calls: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (operator index, each argument value's kind)
    kernel_keys: tuple[tuple[int, str], ...] = ()  # (operator index, the kernel key its call resolves with)
    backends: tuple[str, ...] = ()  # the delegates' backend ids, e.g. ("XnnpackBackend",)
    delegate_problems: tuple[str, ...] = ()  # what is wrong with the delegates' entries or payloads (check 7)
    list_problem: str | None = None  # a list value whose item is of another kind (check 8)
    external_tensors: int = 0  # tensors whose bytes are in a named data file (.ptd) the runtime must be given


@dataclass(frozen=True)
class ProgramSpec:
    methods: dict[str, MethodSpec]

    @property
    def operators(self) -> list[str]:
        """Every operator any method calls, e.g. ["my_ops::mul3.out"], sorted."""
        return sorted({op for method in self.methods.values() for op in method.operators})

    @property
    def backends(self) -> list[str]:
        """Every backend a delegate of any method names, e.g. ["XnnpackBackend"], sorted."""
        return sorted({backend for method in self.methods.values() for backend in method.backends})

    def method(self, name: str = "forward") -> MethodSpec:
        if name not in self.methods:
            raise ProgramError(f"the program has no method {name!r}; it has: {', '.join(self.methods)}")
        return self.methods[name]


def _value_spec(values, index: int) -> ValueSpec:
    if not 0 <= index < len(values):
        return ValueSpec(index, "missing")
    value = values[index].val
    kind = type(value).__name__
    if kind == "Tensor":
        extra = value.extra_tensor_info
        tensor = TensorSpec(value.scalar_type.name, tuple(value.sizes), tuple(value.dim_order),
                            data_buffer=value.data_buffer_idx,
                            external=extra is not None and int(extra.location) == TENSOR_DATA_EXTERNAL)
        return ValueSpec(index, kind, tensor=tensor)
    scalar = next((getattr(value, f) for f in ("int_val", "double_val", "bool_val", "string_val") if hasattr(value, f)),
                  None)
    return ValueSpec(index, kind, scalar=scalar)


def read(source: str | os.PathLike | bytes) -> ProgramSpec:
    """Parses a .pte (a path, or its bytes); ProgramError when it is not a readable ExecuTorch program."""
    defer_exir_package()
    from executorch.exir._serialize._program import deserialize_pte_binary

    if isinstance(source, (bytes, bytearray, memoryview)):
        data = memoryview(source).cast("B")
    else:
        with open(source, "rb") as f:
            data = memoryview(f.read())
    # A view, not bytes: the deserializer slices out every segment and constant, and slices of a view copy nothing
    # (an 8B program's 4.6 GB took 45 s to copy twice).
    if len(data) < 8 or data[4:6] != b"ET":  # the flatbuffer file identifier, e.g. "ET12"
        raise ProgramError("not an ExecuTorch program (.pte): its header has no ET file identifier")
    try:
        try:
            pte = deserialize_pte_binary(data)
        except TypeError:  # named data (XNNPACK's constants) it takes as bytes only; the rest reads from the view
            pte = deserialize_pte_binary(bytes(data))
    except Exception as err:  # noqa: BLE001  (any parse failure means a corrupt program)
        raise ProgramError(f"not a readable ExecuTorch program: {type(err).__name__}: {err}") from None
    program = getattr(pte, "program", pte)  # newer versions wrap the Program with its data segments
    segment_base = int.from_bytes(data[24:32], "little") if data[8:12] == b"eh00" else None  # extended header
    try:
        return _read_methods(program, data, segment_base, _named_data_sizes(pte))
    except (TypeError, AttributeError) as err:  # a field the schema makes optional is absent
        raise ProgramError(f"not a readable ExecuTorch program: a required field is missing ({err})") from None


def _named_data_sizes(pte) -> dict[bytes, int]:
    """Bytes the program holds under each named-data key (where XNNPACK's constants live)."""
    store = getattr(pte, "named_data", None)
    if store is None:
        return {}
    return {key.encode(): len(store.buffers[entry.buffer_index]) if 0 <= entry.buffer_index < len(store.buffers) else 0
            for key, entry in store.pte_data.items()}


def _delegate_args(plan) -> dict[int, int]:
    """The fewest arguments each delegate is called with: XNNPACK's executor indexes them by external id unchecked."""
    fewest: dict[int, int] = {}
    for chain in plan.chains:
        for instruction in chain.instructions:
            if type(call := instruction.instr_args).__name__ == "DelegateCall":
                fewest[call.delegate_index] = min(fewest.get(call.delegate_index, len(call.args)), len(call.args))
    return fewest


# The kind each list's items must have: a list holds indices of other values, and ExecuTorch's BoxedEvalueList reads
# each as its element type with an ET_CHECK (libFuzzer: an IntList item naming a Tensor aborted in et_view).
LIST_ITEM_KINDS = {"IntList": ("Int",), "TensorList": ("Tensor",), "OptionalTensorList": ("Tensor", "Null")}


def list_problem(kinds: list[str], items_of) -> str | None:
    """Check 8: every item of every list value names a value of the list's kind. kinds: each value's kind;
    items_of(i): the item indices of list value i. The runner words it the same (xnnpack_payload.cpp)."""
    for i, kind in enumerate(kinds):
        allowed = LIST_ITEM_KINDS.get(kind)
        for j, item in enumerate(items_of(i) if allowed else ()):
            found = kinds[item] if 0 <= item < len(kinds) else None
            if found not in allowed:
                what = f"whose kind is {found}" if found else f"outside the method's {len(kinds)} values"
                return (f"value {i} ({kind}) lists value {item} as its item {j}, {what}, not "
                        f"{' or '.join(allowed)}; the program is corrupt")
    return None


def _kernel_key(values, args) -> str:
    """The kernel key ExecuTorch's Method builds when it resolves a call: each tensor argument's dtype number and dim
    order, in argument order ("v1/6;0,1|6;0,1"); a specialized kernel registered under it is preferred to a fallback."""
    tensors = [values[i].val for i in args if 0 <= i < len(values) and type(values[i].val).__name__ == "Tensor"]
    return "v1/" + "|".join(f"{int(t.scalar_type)};{','.join(str(d) for d in t.dim_order)}" for t in tensors)


def _read_methods(program, data: bytes, segment_base: int | None, named_data: dict[bytes, int]) -> ProgramSpec:
    methods = {}
    for plan in program.execution_plan:
        delegate_args = _delegate_args(plan)
        operators = tuple(f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators)
        kernel_args = [args for chain in plan.chains for instruction in chain.instructions
                       if type(args := instruction.instr_args).__name__ == "KernelCall"]
        calls = tuple((args.op_index, tuple(_value_spec(plan.values, i).kind for i in args.args))
                      for args in kernel_args)
        methods[plan.name] = MethodSpec(
            name=plan.name, num_values=len(plan.values),
            inputs=tuple(_value_spec(plan.values, i) for i in plan.inputs),
            outputs=tuple(_value_spec(plan.values, i) for i in plan.outputs),
            planned_buffer_sizes=tuple(plan.non_const_buffer_sizes), operators=operators, kernel_calls=calls,
            kernel_keys=tuple((args.op_index, _kernel_key(plan.values, args.args)) for args in kernel_args),
            backends=tuple(delegate.id for delegate in plan.delegates),
            external_tensors=sum(type(v.val).__name__ == "Tensor" and v.val.extra_tensor_info is not None and
                                 int(v.val.extra_tensor_info.location) == TENSOR_DATA_EXTERNAL for v in plan.values),
            list_problem=list_problem([type(v.val).__name__ for v in plan.values],
                                      lambda i: plan.values[i].val.items),
            delegate_problems=tuple(problem for i, delegate in enumerate(plan.delegates)
                                   if (problem := _delegate_problem(i, delegate, program, data, segment_base,
                                                                    named_data, delegate_args.get(i)))))
    return ProgramSpec(methods)


def _delegate_problem(index: int, delegate, program, data: bytes, segment_base: int | None,
                      named_data: dict[bytes, int], delegate_args: int | None) -> str | None:
    """Check 7 on one delegate: an entry ExecuTorch can read (its BackendDelegate::Init dereferences these fields
    unchecked), and an XNNPACK payload, inline or in a segment the extended header places, that XNNPACK can."""
    from executorch.exir.schema import DataLocation

    if delegate.id is None or delegate.processed is None or delegate.compile_specs is None or any(
            spec.key is None or spec.value is None for spec in delegate.compile_specs):
        return (f"delegate {index} lacks its backend id, its data or its compile specs (or a spec's key or value); "
                "the program is corrupt")
    if delegate.id != "XnnpackBackend":
        return None
    where = delegate.processed
    if where.location == DataLocation.INLINE:
        entries = program.backend_delegate_data
        payload = bytes(entries[where.index].data) if 0 <= where.index < len(entries) else b""
    elif segment_base is not None and 0 <= where.index < len(program.segments):
        segment = program.segments[where.index]
        payload = data[segment_base + segment.offset:segment_base + segment.offset + segment.size]
    else:
        return None  # the runtime finds no payload either, and says so
    if (problem := xnnpack_payload.problem(payload, named_data, delegate_args)) is not None:
        return f"delegate {index} (XnnpackBackend): {problem}; the payload is corrupt"
    return None


def kernel_call_problem(spec: MethodSpec) -> str | None:
    """Check 6: a kernel call naming an operator the method lacks, or passing values of kinds its operator's schema
    (as PyTorch knows it) does not take, or None. ExecuTorch's own kernels unbox their arguments unchecked
    (EValue::toTensor() aborts on an Int). The table and the words are flow/argument_kinds.py's, as the runner's."""
    from . import argument_kinds

    runtime_ops = argument_kinds.runtime_arguments()
    for op_index, kinds in spec.kernel_calls:
        if not 0 <= op_index < len(spec.operators):
            return f"a kernel call names operator {op_index}, but the method has {len(spec.operators)}"
        name = spec.operators[op_index]
        runtime_op = name.split("::")[0] in argument_kinds.RUNTIME_NAMESPACES  # the runner's table, as the runner
        arguments = runtime_ops.get(name) if runtime_op else argument_kinds.arguments_of_operator(name)
        if arguments is not None and not runtime_op:
            arguments = argument_kinds.as_an_older_schema_passes(name, arguments, len(kinds))
        if arguments is not None and (problem := argument_kinds.call_problem(name, arguments, kinds)):
            return problem
    return None


def operators_in_program(path: str | os.PathLike) -> list[str]:
    """Names of the operators a .pte program calls, e.g. ["my_ops::mul3.out"]."""
    return read(path).operators


def registered_in(runner: str | os.PathLike) -> set[str]:
    """What a runner binary links in: {"operator my_ops::mul3.out", "backend XnnpackBackend", ...}, and "replacing
    aten::cumsum.out" for an operator whose kernel there runs in place of ExecuTorch's (replaces_executorch)."""
    import subprocess

    listed = subprocess.run([os.fspath(runner), "--list_registered"], capture_output=True, text=True)
    if listed.returncode != 0:
        raise RuntimeError(f"{runner} --list_registered failed: {listed.stderr.strip()}")
    return set(listed.stdout.splitlines())


def missing_from(source: str | os.PathLike | bytes | ProgramSpec, registered: set[str]) -> list[str]:
    """What the program needs that `registered` (registered_in() of a runner) lacks: "operator NAME" for an operator
    it calls outside its delegates, "backend NAME" for a delegate's backend; sorted, empty when it would run. The
    exporter's check before a .pte ships: the runner would refuse it at load with the same names."""
    spec = source if isinstance(source, ProgramSpec) else read(source)
    needed = [f"operator {op}" for op in spec.operators] + [f"backend {backend}" for backend in spec.backends]
    return sorted(set(needed) - registered)


def input_data_problem(input: int, buffer: int) -> str:
    """An input whose tensor is the program's own data: ExecuTorch's set_input would copy the caller's values over it
    (read-only where the program is mapped from a file: the process dies). The runner words it the same
    (runner/kernel_calls.cpp)."""
    where = f"constant buffer {buffer}" if buffer else "external data"
    return (f"input {input} is data the program holds ({where}), not planned memory or the caller's: setting it "
            "would write over the program's own bytes")


def _budget(needed: int, max_memory: int) -> str:
    return f"{needed} bytes, more than max_memory={max_memory}; raise max_memory if you trust this program"


def check(source: str | os.PathLike | bytes | ProgramSpec, method: str = "forward",
          max_memory: int = DEFAULT_MAX_MEMORY) -> MethodSpec:
    """The runner's pre-flight on `method` (see the module's docstring); returns the method, or raises ProgramError
    naming the first problem."""
    spec = (source if isinstance(source, ProgramSpec) else read(source)).method(method)
    total = 0
    for i, size in enumerate(spec.planned_buffer_sizes[1:]):
        if size < 0:
            raise ProgramError(f"memory-planned buffer {i} has no valid size ({size})")
        total += size
        if total > max_memory:
            raise ProgramError(f"the method's memory-planned buffers need at least {_budget(total, max_memory)}")
    for name in spec.operators:
        # ExecuTorch resolves names in a 100-byte buffer and, for a longer one, can still report the method loaded
        # (the runner catches that from the runtime's log; the Python runtime has no log to read).
        if len(name.encode()) >= OPERATOR_NAME_LIMIT:
            raise ProgramError(f"operator name {name[:60]!r}... is {len(name.encode())} bytes; ExecuTorch resolves at "
                               f"most {OPERATOR_NAME_LIMIT - 1}")
    if (problem := kernel_call_problem(spec)) is not None:
        raise ProgramError(problem)
    if spec.list_problem is not None:
        raise ProgramError(spec.list_problem)
    if spec.delegate_problems:
        raise ProgramError(spec.delegate_problems[0])
    for kind, values in (("input", spec.inputs), ("output", spec.outputs)):
        for i, value in enumerate(values):
            if value.kind == "missing":
                raise ProgramError(f"{kind} {i} refers to value {value.index}, but the method has {spec.num_values} "
                                   "values")
            if value.tensor is None:
                continue
            if (problem := value.tensor.problem()) is not None:
                raise ProgramError(f"{kind} {i} has invalid tensor metadata: {problem}")
            if kind == "input" and (value.tensor.data_buffer or value.tensor.external):
                raise ProgramError(input_data_problem(i, value.tensor.data_buffer))
            if kind == "input":
                total += value.tensor.nbytes
                if total > max_memory:
                    raise ProgramError(f"the method's buffers and inputs need at least {_budget(total, max_memory)}")
    return spec
