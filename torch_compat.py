"""Workarounds for bugs in the pinned torch (2.13.0) that these example ops would otherwise hit. Each is narrow,
checks that the bug is present before acting, and names the upstream fix.

custom_ops_1.py (on import) and custom_ops_2.py (when it loads the AOT library) call apply().
"""

from __future__ import annotations

import importlib.util

_applied = False


def _inductor_hardcodes_out_kwarg() -> bool:
    # pytorch/pytorch#175117 moved the lowering into torch/_inductor/custom_op_out_lowering.py and made it use the
    # schema's real out-argument name; before it, Inductor always writes `out=`.
    return importlib.util.find_spec("torch._inductor.custom_op_out_lowering") is None


def apply() -> None:
    """Inductor lowers a functional custom op to its `Tag.out` overload and calls it with `out=buf`, whatever the
    schema names the out argument (ours: `output`, as custom_ops.yaml declares), so `torch.compile` of mul3/mul4
    fails with "missing value for argument 'output'". For such ops, report no out variant: Inductor then calls the
    functional op as a plain fallback kernel, which is correct and only forgoes reusing the output buffer."""
    global _applied
    if _applied or not _inductor_hardcodes_out_kwarg():
        return
    import torch._library._out_variant as out_variant

    find_out_variant = out_variant.to_out_variant

    def to_out_variant_named_out(op):
        candidate = find_out_variant(op)
        if candidate is not None and out_variant.get_out_arg_names(candidate) != ["out"]:
            return None
        return candidate

    out_variant.to_out_variant = to_out_variant_named_out
    _applied = True
