"""The vector code the kernels run on this CPU, by their rule (kernel_helpers/vector.h: a variant runs where
the CPU has every feature it is compiled for, never above CUSTOM_OPS_ISA's cap; the block formats' AVX-512 tiles also
need VNNI, ops/blocks/block_ops.h), for the benchmarks to say what each side ran and the tests what to expect."""

from __future__ import annotations

import os

ISA_ORDER = ["baseline", "avx2", "avx512"]


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith(("flags", "Features"))), "").split())
    except OSError:
        return set()


def hardware_isa() -> str:
    """The best loop this CPU can run."""
    flags = cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags:
        return "baseline"
    return "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags else "avx2"


def kernel_isa(cap: str | None = None) -> str:
    """The loop the kernels run in a process started with CUSTOM_OPS_ISA=cap, or (None) with this process's own."""
    cap = os.environ.get("CUSTOM_OPS_ISA") if cap is None else cap
    best = hardware_isa()
    return best if cap not in ISA_ORDER else ISA_ORDER[min(ISA_ORDER.index(best), ISA_ORDER.index(cap))]


def describe() -> str:
    """One line: what the block formats and the other kernels run here, and what the CPU has."""
    isa = kernel_isa()
    flags = cpu_flags()
    vnni = "avx512_vnni" in flags
    blocks = "avx2" if isa == "avx512" and not vnni else isa
    cap = os.environ.get("CUSTOM_OPS_ISA")
    if "asimddp" in flags and cap != "baseline":  # ARM64 with the dot-product instructions
        blocks = "dot product"
    return (f"my_ops kernels: {isa} (block formats: {blocks}{', VNNI' if blocks == 'avx512' else ''})"
            f"{f', capped by CUSTOM_OPS_ISA={cap}' if cap else ''}; this CPU: {hardware_isa()}"
            f"{' with VNNI' if vnni else ''}")
