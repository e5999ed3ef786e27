"""One set of argument checks per kernel: every bad-argument case of every op (dtype, shape, aliasing, an
out-of-range position, a wrong `bits`) is refused by PyTorch's CPU kernel and by the ExecuTorch kernel with the same
reason. The ExecuTorch side is the op's example program with the call's arguments rewritten (tests/pte_surgery.py),
run in the runner; the PyTorch side calls the op's out variant. The reasons are compared with their numbers masked
(the two calls need not have the same shapes)."""

import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from flow.export import export_example
from helpers import run_runner
from pte_surgery import edit_plan


@dataclass
class Case:
    op: str  # "mul3"
    what: str
    eager: Callable[[], object]  # calls the PyTorch CPU kernel with the bad arguments
    edit: Callable  # edit(plan, args): rewrites the example program's call (args: its value indices, schema order)
    words: str  # what both reasons say


def set_dtype(argument: int, dtype: str):
    from executorch.exir.schema import ScalarType

    def edit(plan, args):
        plan.values[args[argument]].val.scalar_type = ScalarType[dtype]
    return edit


def set_sizes(argument: int, change):
    def edit(plan, args):
        tensor = plan.values[args[argument]].val
        tensor.sizes = change(list(tensor.sizes))
    return edit


def set_int(argument: int, value: int):
    from executorch.exir.schema import EValue, Int

    def edit(plan, args):
        plan.values.append(EValue(Int(value)))
        args[argument] = len(plan.values) - 1
    return edit


def overlap(output: int, other: int, by_bytes: int = 4):
    """Places argument `output` `by_bytes` past argument `other` in the same planned buffer (grown to hold it)."""
    def edit(plan, args):
        out, src = plan.values[args[output]].val, plan.values[args[other]].val
        out.allocation_info.memory_id = src.allocation_info.memory_id
        out.allocation_info.memory_offset_low = src.allocation_info.memory_offset_low + by_bytes
        buffer = src.allocation_info.memory_id
        needed = out.allocation_info.memory_offset_low + 8 * max(1, *out.sizes)
        plan.non_const_buffer_sizes[buffer] = max(plan.non_const_buffer_sizes[buffer], needed * len(out.sizes or [1]))
    return edit


def out_variant(op: str):
    """The op's out variant, looked up when called (the ops are registered by fixtures, after collection)."""
    return lambda *args, **kwargs: getattr(torch.ops.my_ops, op).out(*args, **kwargs)


def elementwise_cases(op: str) -> list[Case]:
    out = out_variant(op)
    buffer = torch.arange(1.0, 9.0)
    return [
        Case(op, "input dtype", lambda: out(torch.ones(2, 3, dtype=torch.bool), output=torch.empty(2, 3, dtype=torch.bool)),
             lambda plan, args: (set_dtype(0, "BOOL")(plan, args), set_dtype(1, "BOOL")(plan, args)),
             "input has unsupported dtype bool; supported: float32, float64, float16, bfloat16, uint8, int8, int16, "
             "int32, int64"),
        Case(op, "output dtype", lambda: out(torch.ones(2, 3), output=torch.empty(2, 3, dtype=torch.int32)),
             set_dtype(1, "INT"), "output has dtype int32 but input has float32; they must match"),
        Case(op, "output overlapping input", lambda: out(buffer[:-1], output=buffer[1:]), overlap(1, 0),
             "output overlaps input without being it; pass separate tensors"),
    ]


def rms_norm_cases() -> list[Case]:
    out = out_variant("rms_norm")
    buffer = torch.randn(9)
    return [
        Case("rms_norm", "weight dtype",
             lambda: out(torch.randn(2, 4), torch.ones(4, dtype=torch.float16), 1e-6, out=torch.empty(2, 4)),
             set_dtype(1, "HALF"), "weight has dtype float16 but input has float32; they must match"),
        Case("rms_norm", "input dtype",
             lambda: out(torch.ones(2, 4, dtype=torch.int32), torch.ones(4, dtype=torch.int32), 1e-6,
                         out=torch.empty(2, 4, dtype=torch.int32)),
             lambda plan, args: [set_dtype(k, "INT")(plan, args) for k in (0, 1, 3)],
             "input has unsupported dtype int32; supported: float32, float16, bfloat16"),
        Case("rms_norm", "weight shape", lambda: out(torch.randn(2, 4), torch.ones(3), 1e-6, out=torch.empty(2, 4)),
             set_sizes(1, lambda s: [s[-1] - 1]), "does not scale the last dimension of input"),
        Case("rms_norm", "out overlapping input",
             lambda: out(buffer[:8].view(2, 4), torch.ones(4), 1e-6, out=buffer[1:9].view(2, 4)), overlap(3, 0),
             "out overlaps input without being it; pass separate tensors"),
    ]


def quantize_rows_cases() -> list[Case]:
    out = out_variant("quantize_rows")

    def call(input=None, bits=8, values=None, scales=None):
        input = torch.randn(2, 4) if input is None else input
        return out(input, bits, values=torch.empty(0, dtype=torch.int8) if values is None else values,
                   scales=torch.empty(0) if scales is None else scales)
    return [
        Case("quantize_rows", "bits too large", lambda: call(bits=9), set_int(1, 9), "bits must be 2 to 8, got 9"),
        Case("quantize_rows", "bits too small", lambda: call(bits=1), set_int(1, 1), "bits must be 2 to 8, got 1"),
        Case("quantize_rows", "input dtype", lambda: call(input=torch.ones(2, 4, dtype=torch.int32)), set_dtype(0, "INT"),
             "input has unsupported dtype int32; supported: float32, float16, bfloat16"),
        Case("quantize_rows", "values dtype", lambda: call(values=torch.empty(0, dtype=torch.uint8)), set_dtype(2, "BYTE"),
             "values has unsupported dtype uint8; supported: int8"),
        Case("quantize_rows", "scales dtype", lambda: call(scales=torch.empty(0, dtype=torch.float16)),
             set_dtype(3, "HALF"), "scales has unsupported dtype float16; supported: float32"),
        Case("quantize_rows", "an empty last dimension", lambda: call(input=torch.randn(2, 0)),
             set_sizes(0, lambda s: s[:-1] + [0]), "input needs a non-empty last dimension (the rows quantized)"),
    ]


def update_cache_cases() -> list[Case]:
    out = out_variant("update_cache")

    def call(value=None, cache=None, start=0):
        value = torch.ones(1, 2, 2, 4) if value is None else value
        cache = torch.zeros(1, 8, 2, 4) if cache is None else cache
        return out(value, cache, start, out=torch.empty(1, dtype=torch.int64))
    return [
        # The example writes one row into 8: start 8 is one past the last that fits; eager writes two, so 7 is.
        Case("update_cache", "start_pos past the end", lambda: call(start=7), set_int(2, 8),
             "passes the end of the cache (8 rows)"),
        Case("update_cache", "start_pos negative", lambda: call(start=-1), set_int(2, -1), "start_pos -1 is negative"),
        Case("update_cache", "cache dtype", lambda: call(cache=torch.zeros(1, 8, 2, 4, dtype=torch.float16)),
             set_dtype(1, "HALF"), "cache has dtype float16 but value has float32; they must match"),
        Case("update_cache", "value dtype", lambda: call(value=torch.ones(1, 2, 2, 4, dtype=torch.bool),
                                                         cache=torch.zeros(1, 8, 2, 4, dtype=torch.bool)),
             lambda plan, args: [set_dtype(k, "BOOL")(plan, args) for k in (0, 1)],
             "value has unsupported dtype bool"),
        Case("update_cache", "value shape", lambda: call(value=torch.ones(1, 2, 1, 4)),
             set_sizes(0, lambda s: s[:2] + [1] + s[3:]), "must match in every dimension but 1 (the sequence)"),
    ]


def block_format_cases() -> list[Case]:
    # The weights are packed blocks (uint8), built by the op's Python side as its example is. The example's first
    # call (the one a case edits) is its first block format, Q8_0.
    from ops.blocks import blocks

    generator = torch.Generator().manual_seed(0)
    q8, q4 = blocks.random_weight("Q8_0", 8, 96, generator), blocks.random_weight("Q4_0", 8, 96, generator)
    linear, embedding = out_variant("linear_blocks"), out_variant("embedding_blocks")
    return [
        Case("linear_blocks", "input width",
             lambda: linear(torch.randn(1, 2, 64), q8, "Q8_0", out=torch.empty(0)),
             set_sizes(0, lambda s: s[:-1] + [s[-1] - 32]), "must end in the layer's"),
        Case("linear_blocks", "weight rows not whole blocks",
             lambda: linear(torch.randn(2, 96), q8[:, :-1], "Q8_0", out=torch.empty(0)),
             set_sizes(1, lambda s: [s[0], s[1] - 1]), "bytes are not whole Q8_0 blocks"),
        Case("linear_blocks", "input dtype",
             lambda: linear(torch.ones(2, 96, dtype=torch.int32), q8, "Q8_0", out=torch.empty(0)),
             set_dtype(0, "INT"), "input has unsupported dtype int32; supported: float32"),
        Case("embedding_blocks", "indices dtype",
             lambda: embedding(q4, torch.zeros(3, dtype=torch.int32), "Q4_0", out=torch.empty(0)),
             set_dtype(1, "INT"), "indices have dtype int32; they must be int64"),
    ]


CASES = [*elementwise_cases("mul3"), *elementwise_cases("mul4"), *rms_norm_cases(), *quantize_rows_cases(),
         *update_cache_cases(), *block_format_cases()]


def reason(text: str, op: str) -> str:
    """The message after the op's name, numbers masked; the first one in `text`."""
    found = re.search(rf"my_ops::{op}(?:\.out)?: ([^\n]*)", text)
    assert found, f"no message from my_ops::{op} in:\n{text[-2000:]}"
    return re.sub(r"\d+", "N", found.group(1).rstrip("."))


@pytest.fixture(scope="module")
def examples(declared, python_ops, aot_ops, tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("examples")
    return {name: export_example(declared[f"my_ops::{name}"], directory) for name in
            ("mul3", "mul4", "rms_norm", "quantize_rows", "update_cache", "linear_blocks", "embedding_blocks")}


def rewritten(src: str, dst: str, op: str, edit) -> str:
    def change(plan):
        names = [f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators]
        call = next(i.instr_args for chain in plan.chains for i in chain.instructions
                    if getattr(i.instr_args, "op_index", None) is not None
                    and names[i.instr_args.op_index] == f"my_ops::{op}.out")
        edit(plan, call.args)
    return edit_plan(src, dst, change)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.op}: {c.what}" for c in CASES])
def test_both_kernels_refuse_a_bad_argument_for_the_same_reason(case, examples, combined_build, tmp_path):
    with pytest.raises(RuntimeError) as refused:
        case.eager()
    eager = reason(str(refused.value), case.op)
    bad = rewritten(examples[case.op], str(tmp_path / "bad.pte"), case.op, case.edit)
    proc = run_runner(combined_build.runner, f"--model_path={bad}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    runtime = reason(proc.stderr, case.op)
    assert case.words in str(refused.value) and case.words in proc.stderr, (str(refused.value), proc.stderr[-1500:])
    assert eager == runtime
