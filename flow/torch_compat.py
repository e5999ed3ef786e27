"""Workarounds for two bugs in the pinned torch (2.13.0) that these ops would otherwise hit, narrowed to this project's
op namespaces. flow.registration and the my_ops package call apply("my_ops") once the ops are registered; importing
this module costs nothing, and it imports only the standard library and torch (the my_ops wheel carries a copy).

Both bugs are in Inductor's lowering of a functional custom op with one output to its `Tag.out` overload:
  1. it calls the out overload with `out=buf`, whatever the schema names the out argument (ours: `output`, the
     upstream example's schema), so `torch.compile` of mul3/mul4 fails with "missing value for argument 'output'"
     (pytorch/pytorch#175117 fixes it upstream);
  2. with dynamic shapes it builds the output buffers' layouts from the fake outputs' SymInt sizes, which its layout
     refuses (an AssertionError in FixedLayout; pytorch/pytorch#185503), so torch.compile(dynamic=True) and
     AOTInductor fail on our ops in a model with a dynamic dimension (rms_norm over a dynamic sequence), with one output or
     several (ExternKernelMultiOut: quantize_rows).

The workaround: for ops in the namespaces given to apply() that one of the bugs would hit, Inductor is told there is
no out variant, so it calls the functional op as a plain fallback kernel: correct, only without output-buffer reuse.
Other libraries' ops are untouched. Whether each bug is present is decided by behaviour: the first time Inductor asks
about one of our ops, a subprocess compiles probe ops (about 6 s, once per torch build: the verdicts are kept in
Inductor's cache folder). On a torch without `torch._library._out_variant` there is nothing to patch and apply() does
nothing. One patch per process, whichever copy of this module applies it first: the namespaces live on the patched
function itself.

Inductor caches compiled graphs, and the workaround changes what a graph compiles to, so it must change the cache key:
a graph compiled in a process without it (importing an op module alone is allowed) would otherwise be replayed, broken,
after it. apply() therefore adds a no-op post-grad pass whose uuid() names the workaround and its namespaces; Inductor
hashes custom passes' uuids into every FX-graph key. Importing Inductor's config takes seconds, so the pass is added
when Inductor's config is first imported (or at once, if it already was).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.util
import json
import logging
import os
import subprocess
import sys

log = logging.getLogger(__name__)

_PROBE = r"""
import torch
lib = torch.library.Library("_torch_compat_probe", "DEF")
for name, out in (("scale", "result"), ("twice", "out")):
    lib.define(f"{name}(Tensor x) -> Tensor")
    lib.define(f"{name}.out(Tensor x, *, Tensor(a!) {out}) -> Tensor(a!)", tags=(torch.Tag.out,))
    torch.library.impl(lib, name, "CompositeExplicitAutograd")(lambda x: x * 2)
    torch.library.impl(lib, f"{name}.out", "CompositeExplicitAutograd")(
        lambda x, **out: torch.mul(x, 2, out=next(iter(out.values()))))
    torch.library.register_fake(f"_torch_compat_probe::{name}", lib=lib)(torch.empty_like)
torch._inductor.config.force_disable_caches = True  # a cached graph from another torch would hide the answer
ops = torch.ops._torch_compat_probe
probes = {  # bug name: (function, inputs, the error message that means the bug)
    "out_kwarg": (lambda x: ops.scale.default(x), [torch.ones(3)], "missing value for argument 'result'"),
    "dynamic_shapes": (lambda x: ops.twice.default(x + 1), [torch.ones(3), torch.ones(5)], "FixedLayout"),
}
for bug, (fn, inputs, signature) in probes.items():
    try:
        compiled = torch.compile(fn, fullgraph=True, dynamic=bug == "dynamic_shapes")
        ok = all(compiled(x).tolist() == fn(x).tolist() for x in inputs)
        print(f"PROBE:{bug}:" + ("works" if ok else "wrong result"))
    except Exception as err:
        import traceback
        print(f"PROBE:{bug}:" + ("bug" if signature in traceback.format_exc() else f"error {err!r}"))
"""
BUGS = ("out_kwarg", "dynamic_shapes")
CACHE_KEY_VERSION = 2  # bump when the workaround's effect on compiled graphs changes


def _verdicts_path() -> str:
    """Where this torch's verdicts are kept: Inductor's cache folder, named by the probe and the torch build."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    build = f"{_PROBE}\0{torch.__version__}\0{torch.version.git_version}\0{torch.__file__}"
    return os.path.join(cache_dir(), f"my_ops_torch_compat-{hashlib.sha256(build.encode()).hexdigest()[:32]}.json")


@functools.cache
def _probe() -> dict[str, bool]:
    """Which of BUGS this torch's Inductor has: probed once per torch build, then read from Inductor's cache folder."""
    path = _verdicts_path()
    try:
        with open(path) as f:
            kept = json.load(f)
        if isinstance(kept, dict) and sorted(kept) == sorted(BUGS) and all(isinstance(v, bool) for v in kept.values()):
            return kept
    except (OSError, ValueError):  # not probed yet, or damaged: probed again
        pass
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600)
        verdicts = dict(line[len("PROBE:"):].split(":", 1) for line in proc.stdout.splitlines()
                        if line.startswith("PROBE:"))
    except (OSError, subprocess.SubprocessError) as err:
        verdicts = {bug: f"probe did not run: {err}" for bug in BUGS}
    found = {}
    for bug in BUGS:
        verdict = verdicts.get(bug, "no answer")
        if verdict not in ("works", "bug"):
            # The fallback kernel is always correct, so an inconclusive probe keeps the workaround on.
            log.warning("torch_compat: Inductor probe %s inconclusive (%s); keeping the workaround", bug, verdict)
        found[bug] = verdict != "works"
    if all(verdicts.get(bug) in ("works", "bug") for bug in BUGS):  # an inconclusive probe is asked again next time
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(f"{path}.{os.getpid()}.tmp", "w") as f:
                json.dump(found, f)
            os.replace(f"{path}.{os.getpid()}.tmp", path)  # whole or absent for a concurrent reader
        except OSError as err:  # a folder it cannot write: probed again by the next process
            log.info("torch_compat: could not keep the probe's verdicts in %s: %s", path, err)
    return found


def inductor_hardcodes_out_kwarg() -> bool:
    """True when this torch's Inductor calls out variants with `out=` regardless of the argument's name (bug 1)."""
    return _probe()["out_kwarg"]


def inductor_fails_dynamic_out_lowering() -> bool:
    """True when this torch's Inductor cannot lower a custom op to its out variant under dynamic shapes (bug 2)."""
    return _probe()["dynamic_shapes"]


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
            and (((names := out_variant.get_out_arg_names(candidate)) != ["out"] and len(names) == 1
                  and inductor_hardcodes_out_kwarg()) or inductor_fails_dynamic_out_lowering())
        ):
            return None
        return candidate

    to_out_variant.custom_ops_namespaces = {namespace}
    out_variant.to_out_variant = to_out_variant
    _key_inductor_cache(to_out_variant.custom_ops_namespaces)


def _key_inductor_cache(namespaces: set[str]) -> None:
    """Adds the cache-keying pass to Inductor's config now if it is imported, else as soon as it is."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        _add_keying_pass(config, namespaces)
        return
    sys.meta_path.insert(0, _OnImport("torch._inductor.config", lambda module: _add_keying_pass(module, namespaces)))


def _add_keying_pass(config, namespaces: set[str]) -> None:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class WorkaroundKey(CustomGraphPass):
        """Changes nothing in the graph; its uuid() makes Inductor's cache key tell graphs compiled with the
        workaround from graphs compiled without it. The set is read when the key is made: later namespaces count."""

        def __call__(self, graph) -> None:
            pass

        def uuid(self):
            return f"custom_ops.torch_compat:v{CACHE_KEY_VERSION}:{','.join(sorted(namespaces))}"

    passes = config.post_grad_custom_post_pass
    passes = [] if passes is None else list(passes) if isinstance(passes, (list, tuple)) else [passes]
    if not any(type(p).__name__ == "WorkaroundKey" for p in passes):
        config.post_grad_custom_post_pass = [*passes, WorkaroundKey()]


class _OnImport:
    """A one-shot import hook: runs `then(module)` right after module `name` is first executed."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                then(module)

        spec.loader = Loader()
        return spec


def applied_namespaces() -> set[str]:
    """The namespaces the workaround covers in this process (empty when it is not installed)."""
    try:
        import torch._library._out_variant as out_variant
    except ImportError:
        return set()
    return set(getattr(getattr(out_variant, "to_out_variant", None), "custom_ops_namespaces", ()))
