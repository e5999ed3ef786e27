"""The reference a program's results are checked against: the exported model (the .pt2 saved beside the .pte, or the
ETRecord's edge graph) run in eager PyTorch with every declared custom op replaced by its declared reference, a
composite of ATen ops. So an expected value never comes from the kernels under test: not from the runtime kernel, and
not from a C++ op's PyTorch kernel either, which shares the runtime kernel's code (mul4's CPU kernel calls the same
functor and loop)."""

from __future__ import annotations

import os

import torch


def op_overload(target) -> torch._ops.OpOverload | None:
    """A graph node's target as an OpOverload: itself, or the one EXIR's EdgeOpOverload wraps; None otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    wrapped = getattr(target, "_op", None)  # (an OpOverload's own _op is its C++ callable: checked above)
    return wrapped if isinstance(wrapped, torch._ops.OpOverload) else None


def custom_op_name(target) -> str | None:
    """'my_ops::mul4' for a graph node's target that is an op overload (ATen's, or EXIR's edge wrapper of one)."""
    op = op_overload(target)
    return None if op is None else op._schema.name


def references(declared_ops) -> dict[str, tuple[str, object]]:
    """Each declared op's reference function, by the op's name, with the functional overload it stands in for:
    {"my_ops::mul3": ("default", f), "aten::bucketize": ("Tensor", g)}."""
    return {op.name: (op.functional_overload, op.reference_function()) for op in declared_ops}


def reference_for(functions: dict[str, tuple[str, object]], name: str, overload: str):
    """The reference standing in for op `name`'s `overload`, None for an op without one; another overload of a
    declared op (its out variant, say) is NotImplementedError: the reference computes the functional op only.
    One lookup: ReferenceMode asks for every op a model dispatches."""
    entry = functions.get(name)
    if entry is None:
        return None
    stands_in, function = entry
    if overload != stands_in:
        raise NotImplementedError(f"{name}.{overload} is in the graph; the reference stands in for {name}.{stands_in} "
                                  f"only (export the model calling {name}.{stands_in})")
    return function


class ReferenceInterpreter(torch.fx.Interpreter):
    """Runs a graph in eager PyTorch, calling each declared op's reference instead of the op."""

    def __init__(self, module: torch.fx.GraphModule, reference_functions: dict[str, object]):
        super().__init__(module)
        self.reference_functions = reference_functions

    def call_function(self, target, args, kwargs):
        op = op_overload(target)
        function = None if op is None else reference_for(self.reference_functions, op._schema.name, op._overloadname)
        if function is not None:
            return function(*args, **kwargs)
        return super().call_function(target, args, kwargs)


def reference_outputs(pt2_path: str, inputs, declared_ops) -> list:
    """The exported program at `pt2_path` run on `inputs` with the references of `declared_ops` (the ops must be
    registered, to deserialize the program); its outputs, flattened."""
    return reference_runs(pt2_path, [inputs], declared_ops)[0]


def reference_runs(pt2_path: str, runs, declared_ops) -> list[list]:
    """Like reference_outputs, for several executions in order on one instance of the model: state it keeps (a
    mutated buffer) carries from one to the next, as in the runtime. The outputs of each, flattened and cloned."""
    if not os.path.isfile(pt2_path):
        raise FileNotFoundError(pt2_path)
    return program_reference_runs(torch.export.load(pt2_path), runs, declared_ops)


def program_reference_runs(exported: torch.export.ExportedProgram, runs, declared_ops) -> list[list]:
    """reference_runs of an ExportedProgram in memory."""
    interpreter = ReferenceInterpreter(exported.module(), references(declared_ops))
    results = []
    with torch.no_grad():
        for inputs in runs:
            outputs = interpreter.run(*inputs)
            results.append([t.clone() for t in torch.utils._pytree.tree_leaves(outputs)])
    return results


class ReferenceMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Eager PyTorch with every declared custom op computed by its reference: a model that calls the ops (a swapped
    Hugging Face model, say) runs under `with ReferenceMode(references(declared_ops)):` on ATen ops alone, no kernel
    under test involved. Only the functional overloads are stood in for (eager code calls those)."""

    def __init__(self, reference_functions: dict[str, object]):
        super().__init__()
        self.reference_functions = reference_functions

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        function = reference_for(self.reference_functions, func._schema.name, func._overloadname)
        if function is not None:
            return function(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class RememberedDequantization:
    """While active, the block ops' reference (ops/blocks/blocks.py) dequantizes each weight once: a reference decode
    of dozens of steps over a model's layers would otherwise spend minutes dequantizing the same constants. The results
    are kept by tensor (data pointer, shape) and format, valid while the weights are unchanged."""

    MODULE = "ops.blocks.blocks"

    def __enter__(self):
        from flow.declarations import import_repository_module

        self.module = import_repository_module(self.MODULE)
        self.original, memo = self.module.dequantize, {}

        def remembered(weight, fmt, original=self.original):
            key = (weight.data_ptr(), tuple(weight.shape), fmt)
            if key not in memo:
                memo[key] = original(weight, fmt)
            return memo[key]

        self.module.dequantize = remembered
        return self

    def __exit__(self, *exc):
        self.module.dequantize = self.original
