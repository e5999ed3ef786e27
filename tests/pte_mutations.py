"""Seeded mutations of a valid .pte, for testing that untrusted programs never crash the runtime: byte flips,
truncations, inserted or deleted byte runs, and structured edits made through executorch's own serializer (sizes,
dim orders, dtypes, buffer offsets and sizes, value and operator indices), which reach past the flatbuffer's
structure into what the runtime does with it; for a delegated program, also byte flips inside each delegate's payload
(what the backend parses).

    mutations(data, seed, count) -> [(kind, description, bytes)]
    python tests/pte_mutations.py PROGRAM.pte OUT_DIR [--count N] [--seed S]   (writes the mutants as files)
"""

from __future__ import annotations

import argparse
import copy
import os
import random

KINDS = ("flip", "truncate", "splice", "structured")
HUGE = [2**31 - 1, 2**31, 2**32 + 2, 2**40, 2**62, -1, -(2**31)]


def flip(data: bytes, rng: random.Random, within: tuple[int, int] | None = None) -> tuple[str, bytes]:
    """Flips bytes anywhere, or in the range `within` (start, end)."""
    out = bytearray(data)
    start, end = within or (0, len(out))
    positions = [rng.randrange(start, end) for _ in range(rng.choice((1, 1, 2, 4, 16)))]
    for p in positions:
        out[p] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    return f"flip {len(positions)} byte(s) at {positions[:4]}", bytes(out)


def truncate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    keep = rng.randrange(len(data))
    return f"truncate to {keep} of {len(data)} bytes", data[:keep]


def splice(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    at = rng.randrange(len(data))
    if rng.random() < 0.5:
        n = rng.randrange(1, 64)
        return f"delete {n} bytes at {at}", data[:at] + data[at + n:]
    run = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    return f"insert {len(run)} bytes at {at}", data[:at] + run + data[at:]


def structured(program, rng: random.Random) -> tuple[str, object]:
    """One semantic edit of a deserialized program (a PTEFile or Program from executorch.exir._serialize)."""
    from executorch.exir.schema import ScalarType

    p = copy.deepcopy(program)
    prog = getattr(p, "program", p)
    plan = prog.execution_plan[0]
    tensors = [v.val for v in plan.values if type(v.val).__name__ == "Tensor"]
    t = rng.choice(tensors) if tensors else None
    choice = rng.randrange(13)
    if choice == 0 and t is not None:
        t.sizes = [rng.choice(HUGE + [0, 1, 7]) for _ in t.sizes] or [rng.choice(HUGE)]
        what = f"tensor sizes -> {t.sizes}"
    elif choice == 1 and t is not None:
        t.dim_order = [rng.randrange(-2, 6) for _ in range(max(1, len(t.dim_order) + rng.choice((-1, 0, 1))))]
        what = f"tensor dim_order -> {t.dim_order}"
    elif choice == 2 and t is not None:
        t.scalar_type = rng.choice(list(ScalarType))
        what = f"tensor scalar_type -> {t.scalar_type}"
    elif choice == 3 and t is not None and t.allocation_info is not None:
        t.allocation_info.memory_offset_low = rng.choice([1, 2, 3, 33, 63, 2**31 - 1, 2**32 - 1])
        what = f"tensor memory offset -> {t.allocation_info.memory_offset_low}"
    elif choice == 4 and t is not None and t.allocation_info is not None:
        t.allocation_info.memory_id = rng.choice([0, 2, 7, 2**31 - 1])
        what = f"tensor memory_id -> {t.allocation_info.memory_id}"
    elif choice == 5:
        plan.non_const_buffer_sizes = [rng.choice(HUGE + [0, 3]) for _ in plan.non_const_buffer_sizes]
        what = f"planned buffer sizes -> {plan.non_const_buffer_sizes}"
    elif choice == 6:
        plan.outputs = [rng.choice([len(plan.values), len(plan.values) + 5, 2**31 - 1, -1, 0])]
        what = f"output value indices -> {plan.outputs}"
    elif choice == 7:
        plan.inputs = [rng.choice([len(plan.values), 2**31 - 1, -1, 1])]
        what = f"input value indices -> {plan.inputs}"
    elif choice == 8 and plan.operators:
        plan.operators[0].name = rng.choice(["my_ops::nope", "", "aten::mul", "my_ops::mul3" * 40])
        what = f"operator name -> {plan.operators[0].name[:30]!r}"
    elif choice == 9:
        for chain in plan.chains:
            for instruction in chain.instructions:
                args = getattr(instruction.instr_args, "args", None)
                if args:
                    args[rng.randrange(len(args))] = rng.choice([len(plan.values), 2**31 - 1, -1, 0])
        what = "an instruction argument index out of range"
    elif choice == 10:
        for chain in plan.chains:
            for instruction in chain.instructions:
                if hasattr(instruction.instr_args, "op_index"):
                    instruction.instr_args.op_index = rng.choice([len(plan.operators), 2**31 - 1, -1])
        what = "an operator index out of range"
    elif choice == 11:
        from executorch.exir.schema import EValue, Int

        plan.values.append(EValue(Int(rng.choice([0, 7, -1]))))
        for chain in plan.chains:
            for instruction in chain.instructions:
                args = getattr(instruction.instr_args, "args", None)
                if args:
                    args[rng.randrange(len(args))] = len(plan.values) - 1
        what = "a kernel argument becomes an Int"
    else:
        if t is not None:
            t.sizes = list(reversed(t.sizes)) + [rng.randrange(1, 4)]
            t.dim_order = list(range(len(t.sizes)))
        what = "a tensor gains a dimension"
    return what, p


def delegate_payloads(data: bytes, program) -> list[tuple[int, int]]:
    """The byte ranges (start, end) in `data` of the delegates' payloads stored inline (e.g. XNNPACK's compiled graph
    and weights), found by their bytes; `program` is `data` deserialized."""
    from executorch.exir.schema import DataLocation

    program = getattr(program, "program", program)
    ranges = []
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            if delegate.processed.location == DataLocation.INLINE:
                payload = bytes(program.backend_delegate_data[delegate.processed.index].data)
                start = data.find(payload)
                if payload and start >= 0:
                    ranges.append((start, start + len(payload)))
    return ranges


def mutations(data: bytes, seed: int, count: int) -> list[tuple[str, str, bytes]]:
    """`count` mutants of `data`, the kinds in rotation, reproducible from `seed`."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    rng = random.Random(seed)
    program = deserialize_pte_binary(data)
    payloads = delegate_payloads(data, program)
    kinds = KINDS + ("payload",) if payloads else KINDS  # a delegated program: flips inside its payloads too
    out = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        if kind == "payload":
            what, mutant = flip(data, rng, within=rng.choice(payloads))
            out.append((kind, f"{what} (in a delegate payload)", mutant))
            continue
        if kind == "structured":
            for _ in range(20):  # some edits do not serialize (e.g. a negative index in an unsigned field)
                try:
                    what, mutant = structured(program, rng)
                    out.append((kind, what, bytes(serialize_pte_binary(mutant))))
                    break
                except Exception:  # noqa: BLE001
                    continue
            continue
        what, mutant = {"flip": flip, "truncate": truncate, "splice": splice}[kind](data, rng)
        out.append((kind, what, mutant))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program")
    parser.add_argument("out_dir")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(args.program, "rb") as f:
        data = f.read()
    for i, (kind, what, mutant) in enumerate(mutations(data, args.seed, args.count)):
        with open(os.path.join(args.out_dir, f"{i:05d}_{kind}.pte"), "wb") as f:
            f.write(mutant)


if __name__ == "__main__":
    main()
