"""A workaround for a bug in the pinned torch (2.13.0) that these ops would otherwise hit, narrowed to this project's
op namespaces. flow.registration and the my_ops package call apply("my_ops") once the ops are registered; importing
this module costs nothing, and it imports only the standard library and torch (the my_ops wheel carries a copy).

The bug: Inductor lowers a functional custom op to its `Tag.out` overload and calls it with `out=buf`, whatever the
schema names the out argument (ours: `output`, the upstream example's schema), so `torch.compile` of mul3/mul4 fails
with "missing value for argument 'output'". pytorch/pytorch#175117 fixes it upstream.

The workaround: for ops in the namespaces given to apply() whose single out argument is not named `out`, Inductor is
told there is no out variant, so it calls the functional op as a plain fallback kernel: correct, only without
output-buffer reuse. Other libraries' ops, and multi-output out variants (whose lowering names its arguments), are
untouched. Whether the bug is present is decided by behaviour: the first time Inductor asks about one of our ops, a
subprocess compiles a probe op with an out argument named `result` (about 5 s, once per process). On a torch without
`torch._library._out_variant` there is nothing to patch and apply() does nothing. One patch per process, whichever
copy of this module applies it first: the namespaces live on the patched function itself.
"""

from __future__ import annotations

import functools
import logging
import subprocess
import sys

log = logging.getLogger(__name__)

_PROBE = r"""
import torch
lib = torch.library.Library("_torch_compat_probe", "DEF")
lib.define("scale(Tensor x) -> Tensor")
lib.define("scale.out(Tensor x, *, Tensor(a!) result) -> Tensor(a!)", tags=(torch.Tag.out,))
torch.library.impl(lib, "scale", "CompositeExplicitAutograd")(lambda x: x * 2)
torch.library.impl(lib, "scale.out", "CompositeExplicitAutograd")(lambda x, *, result: torch.mul(x, 2, out=result))
torch.library.register_fake("_torch_compat_probe::scale", lib=lib)(torch.empty_like)
torch._inductor.config.force_disable_caches = True  # a cached graph from another torch would hide the answer
try:
    y = torch.compile(torch.ops._torch_compat_probe.scale.default, fullgraph=True)(torch.ones(3))
    print("PROBE:" + ("works" if y.tolist() == [2.0, 2.0, 2.0] else "wrong result"))
except Exception as err:
    print("PROBE:" + ("bug" if "missing value for argument 'result'" in str(err) else f"error {err!r}"))
"""


@functools.cache
def inductor_hardcodes_out_kwarg() -> bool:
    """True when this torch's Inductor calls out variants with `out=` regardless of the argument's name."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600)
        verdict = next((line[len("PROBE:"):] for line in proc.stdout.splitlines() if line.startswith("PROBE:")), None)
    except (OSError, subprocess.SubprocessError) as err:
        verdict = f"probe did not run: {err}"
    if verdict not in ("works", "bug"):
        # The fallback kernel is always correct, so an inconclusive probe keeps the workaround on.
        log.warning("torch_compat: Inductor out-variant probe inconclusive (%s); keeping the workaround", verdict)
        return True
    return verdict == "bug"


def apply(namespace: str) -> None:
    """Applies the workaround to the ops of `namespace` (e.g. "my_ops"); idempotent."""
    try:
        import torch._library._out_variant as out_variant
    except ImportError:
        return  # a torch without this lowering: nothing to work around
    find_out_variant = getattr(out_variant, "to_out_variant", None)
    if find_out_variant is None:
        return
    namespaces = getattr(find_out_variant, "custom_ops_namespaces", None)
    if namespaces is not None:  # installed already, by this copy of the module or another
        namespaces.add(namespace)
        return

    @functools.wraps(find_out_variant)
    def to_out_variant(op):
        candidate = find_out_variant(op)
        if (
            candidate is not None
            and op.namespace in to_out_variant.custom_ops_namespaces
            and len(names := out_variant.get_out_arg_names(candidate)) == 1
            and names != ["out"]
            and inductor_hardcodes_out_kwarg()
        ):
            return None
        return candidate

    to_out_variant.custom_ops_namespaces = {namespace}
    out_variant.to_out_variant = to_out_variant


def applied_namespaces() -> set[str]:
    """The namespaces the workaround covers in this process (empty when it is not installed)."""
    try:
        import torch._library._out_variant as out_variant
    except ImportError:
        return set()
    return set(getattr(getattr(out_variant, "to_out_variant", None), "custom_ops_namespaces", ()))
