"""Which kernels a program's runtime will have, so a program that would be dead on arrival is refused when it is made
(export) or built for (selective build), naming each operator, instead of failing to load on the device.

ExecuTorch's kernels are the wheel's libexecutorch_kernels_optimized.so (ATen's ops and the prims; ExecuTorch's Python
runtime links the same library) and libexecutorch_kernels_quantized.so, both linked into this project's runner; this
project's are the declared ops' out variants. ExecuTorch's set is read from its own registry, in a fresh interpreter
(one that loaded a kernel library of this project's would count its kernels as ExecuTorch's), and kept as JSON by the
torch and executorch versions: $CUSTOM_OPS_CODEGEN_CACHE, else ~/.cache/my_ops.

    python -m flow.runtime_kernels      ExecuTorch's kernels, one a line (what a program calls that no kernel has:
                                        codegen/run_codegen.py plan --model_file x.pte --build_dir DIR)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata

# Run in a fresh interpreter, which imports lazy_exir from its file beside this one: in the checkout's flow/, or in the
# my_ops wheel, whose package registers the ops when imported.
_READ_REGISTRY = """
import ctypes, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("lazy_exir", sys.argv[1])
lazy_exir = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lazy_exir)
lazy_exir.defer_exir_package()
import executorch
ctypes.CDLL(os.path.join(executorch.__path__[0], "lib", "libexecutorch_kernels_quantized.so"), mode=ctypes.RTLD_GLOBAL)
from executorch.runtime import Runtime
sys.stdout.write("\\n@@NAMES@@" + json.dumps(sorted(Runtime.get().operator_registry.operator_names)))
"""

# The namespaces of ExecuTorch's own ops, whose kernels a runner links besides this project's: its aten kernels, its
# prim ops, its quantized kernels, its dim-order and its device-copy ops. (The project may add a kernel for an ATen op
# they lack; an op of any other namespace is the project's own.)
RUNTIME_NAMESPACES = ("aten", "executorch_prim", "quantized_decomposed", "dim_order_ops", "et_copy")

# Where each of ExecuTorch's kernels comes from, for the messages.
EXECUTORCH_LIBRARIES = ("libexecutorch_kernels_optimized.so (ATen ops, prims) and libexecutorch_kernels_quantized.so "
                        "(quantized_decomposed::*)")


def cache_dir() -> str:
    """Where the tables read from ExecuTorch and PyTorch are kept, by their versions."""
    return os.environ.get("CUSTOM_OPS_CODEGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "my_ops")


@functools.cache
def executorch_kernels() -> frozenset[str]:
    """The operators ExecuTorch's kernel libraries register, by the name a program gives them ("aten::add.out")."""
    with open(__file__, "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(f"torch={metadata.version('torch')};executorch={metadata.version('executorch')}".encode())
    path = os.path.join(cache_dir(), f"executorch_kernels-{digest.hexdigest()[:32]}.json")
    try:
        with open(path) as f:
            return frozenset(json.load(f))
    except (OSError, ValueError):  # not made yet, or damaged: made again
        pass
    lazy_exir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lazy_exir.py")
    proc = subprocess.run([sys.executable, "-c", _READ_REGISTRY, lazy_exir], capture_output=True, text=True)
    if proc.returncode != 0 or "@@NAMES@@" not in proc.stdout:
        raise RuntimeError(f"could not read ExecuTorch's kernel registry (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    names = json.loads(proc.stdout.split("@@NAMES@@")[-1])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.{os.getpid()}.tmp", "w") as f:
        json.dump(names, f)
    os.replace(f"{path}.{os.getpid()}.tmp", path)  # whole or absent for a concurrent reader
    return frozenset(names)


def declared_kernels(declared=None) -> dict[str, object]:
    """The out variants this project's declared ops give kernels for, by name."""
    from . import declarations

    declared = declarations.load() if declared is None else declared
    return {op.out_name: op for op in declared.values()}


def declared_out_names(declared=None) -> set[str]:
    """The declared ops' out variants: from custom_ops.bzl in a checkout; in the my_ops wheel, which carries this
    module without the declarations, from the op list it was built with (its _declared.py)."""
    if declared is None:
        try:
            from . import declarations  # noqa: F401  (declared_kernels reads it)
        except ImportError:
            from ._declared import OPS

            return {op["out_name"] for op in OPS}
    return set(declared_kernels(declared))


def twice_registered(declared=None) -> list[str]:
    """Declared ops whose out variant ExecuTorch's kernels register too, and which do not say they replace theirs:
    ExecuTorch stops the process when a second library registers a name (an ET_CHECK in register_kernels)."""
    return [name for name, op in declared_kernels(declared).items()
            if name in executorch_kernels() and not op.replaces_executorch]


def replacing_nothing(declared=None) -> list[str]:
    """Declared ops that say they replace ExecuTorch's kernel where ExecuTorch's kernels have none."""
    return [name for name, op in declared_kernels(declared).items()
            if op.replaces_executorch and name not in executorch_kernels()]


def without_kernel(operators, declared=None) -> list[str]:
    """The operators of `operators` that neither ExecuTorch's kernels nor a declared op serve, in order, once each."""
    ours = declared_kernels(declared)
    return [name for name in dict.fromkeys(operators) if name not in ours and name not in executorch_kernels()]


def missing_kernel_message(names, where: str) -> str:
    """Why a program calling `names` (no kernel for them) is refused, and the two ways out."""
    aten = [name for name in names if name.startswith("aten::")]
    fixes = ["declare a kernel for it in custom_ops.bzl and custom_ops.yaml (docs/adding-an-op.md, \"A kernel for an "
             "ATen op ExecuTorch lacks\")"]
    if aten:
        fixes.append("keep it out of the program: replace the call in the model, or give export a decomposition of "
                     "it into ops ExecuTorch has (docs/adding-an-op.md shows one)")
    return (f"{where} calls {', '.join(names)}, which no kernel the runtime links has (ExecuTorch's: "
            f"{EXECUTORCH_LIBRARIES}; this project's: the ops custom_ops.bzl declares): the program would fail to load "
            f"with \"Missing operator\". Either {'; or '.join(fixes)}")


def missing_operator_advice(names, declared=None) -> str:
    """What to do about operators no kernel library loaded into a runtime registers, by kind, as the runner words it
    (runner/program_runner.cpp): an op of this project's namespaces, one ExecuTorch's kernels have, one nobody ships."""
    ours = declared_out_names(declared)
    kinds: dict[str, list[str]] = {"project": [], "executorch": [], "nobody": []}
    for name in names:
        kind = ("executorch" if name in executorch_kernels() else
                "nobody" if name.split("::")[0] in RUNTIME_NAMESPACES and name not in ours else "project")
        kinds[kind].append(name)
    what = {
        "project": "an op custom_ops.bzl declares: load a kernel library built with it "  # flow. or the wheel's my_ops.
                   f"({__package__}.runtime.load_kernel_library(<build>/libcustom_ops_lib.so), built with "
                   "-DCUSTOM_OPS_ROOT_OPS or -DCUSTOM_OPS_MODEL_FILE selecting it)",
        "executorch": "ExecuTorch's kernels have it: load the library that does before the program (quantized_decomposed"
                      "::*: executorch/lib/libexecutorch_kernels_quantized.so, ctypes.CDLL(path, mode=RTLD_GLOBAL))",
        "nobody": "no kernel library ExecuTorch ships has it: write one (docs/adding-an-op.md, \"A kernel for an ATen op "
                  "ExecuTorch lacks\"), or keep it out of the program with a decomposition at export",
    }
    return "; ".join(f"{', '.join(found)}: {what[kind]}" for kind, found in kinds.items() if found)


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("\n".join(sorted(executorch_kernels())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
