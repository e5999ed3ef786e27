"""torch.compile with every declared op of this project's (an ATen op's kernel here is the runtime's; torch.compile runs
PyTorch's own): each op's example compiled with static and with dynamic shapes (several outputs included) equals the
op's declared reference, every execution in order; and the torch 2.13 workaround (flow/torch_compat.py) keys
Inductor's cache, so a graph compiled before the workaround was applied is not replayed after. Each mode compiles
every op in one fresh process with the graph caches off (every graph traced, lowered and generated anew; only
Inductor's C++ objects, named by their generated source, are reused from cmake-out/); the workaround's sequence has a
private Inductor cache (TORCHINDUCTOR_CACHE_DIR) seeded with those objects alone, so no other test's graphs are read."""

import os
import shutil

import pytest

from helpers import run_in_fresh_python

# Inductor's graph caches (FX graph, AOTAutograd) replay a compiled graph without lowering it, so the examples turn
# them off (in code: their environment variables are read when torch imports, which a forked child has done). Its code
# cache (the session's, tests/conftest.py) keys a kernel's compiled object by the generated C++ and the compile command,
# so reusing it skips only g++.
GRAPH_CACHES = ("fxgraph", "aotautograd")

COMPILE_EXAMPLES = """
import torch
import torch._functorch.config, torch._inductor.config
torch._inductor.config.fx_graph_cache = torch._functorch.config.enable_autograd_cache = False
from flow import compare, declarations, registration
from flow.export import example_of
from flow.reference import program_reference_runs

# An ATen op's kernel here is the runtime's: torch.compile runs PyTorch's own op, nothing of this project.
ops = {{name: op for name, op in declarations.load().items() if not op.from_aten}}
registration.register_with_pytorch(list(ops.values()), aot_library={aot!r})
result = {{}}
for op in ops.values():
    model, runs = example_of(op)
    expected = program_reference_runs(torch.export.export(model, runs[0], strict=True), runs, [op])
    model, runs = example_of(op)  # a fresh model: a stateful example starts from its initial state again
    compiled = torch.compile(model, fullgraph=True, dynamic={dynamic})
    result[op.name] = []
    with torch.no_grad():
        for step, inputs in enumerate(runs):
            outputs = torch.utils._pytree.tree_leaves(compiled(*inputs))
            result[op.name] += [f"execution {{step}}: {{p}}"
                                for p in compare.mismatches(outputs, expected[step], exact=op.bit_exact)]
from torch._dynamo.utils import counters
result = dict(ops=result, replayed=counters["inductor"]["fxgraph_cache_hit"]
              + counters["aot_autograd"]["autograd_cache_hit"], compiled=counters["aot_autograd"]["ok"])
"""


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_every_declared_op_compiles_and_equals_its_reference(dynamic, declared, aot_ops):
    # One process for every op (Inductor's start-up and its compiled header once, not once per op).
    result = run_in_fresh_python(COMPILE_EXAMPLES.format(aot=aot_ops, dynamic=dynamic), timeout=900)
    problems = result["ops"]
    ours = [name for name, op in declared.items() if not op.from_aten]
    assert list(problems) == ours
    assert {name: p for name, p in problems.items() if p} == {}
    assert result["replayed"] == 0 and result["compiled"] >= len(ours), result


COMPILE_MUL3 = """
import torch
import custom_ops_1  # registers my_ops::mul3 and nothing else: the workaround is not applied
if {apply}:
    from flow import torch_compat
    torch_compat.apply("my_ops")
x = torch.randn(4, 5)
try:
    y = torch.compile(lambda t: torch.ops.my_ops.mul3(t) + 1, fullgraph=True)(x)
    result = "ok" if torch.equal(y, custom_ops_1.mul3_reference(x) + 1) else "wrong result"
except Exception as err:
    result = f"{{type(err).__name__}}: {{str(err).splitlines()[0]}}"
"""


def code_cache_without_graphs(private):
    """A copy of the session's Inductor cache without its graph caches: its compiled code and ISA checks, none of
    another test's graphs. Whatever another process is writing meanwhile may be missed (it would only be compiled)."""
    shared = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")

    def skipped(folder, names):
        return [n for n in names if n in (*GRAPH_CACHES, "locks") or n.startswith("tmp")] if folder == shared else []

    try:
        shutil.copytree(shared, private, ignore=skipped)
    except (FileNotFoundError, shutil.Error):
        os.makedirs(private, exist_ok=True)
    return private


def test_a_graph_compiled_before_the_workaround_is_not_replayed_after_it(tmp_path):
    """The issue's sequence: compile without the workaround (importing the op module alone, as documented), then
    apply it and compile the same function again in a new process, with the same cache. Before the workaround keyed
    the cache, the second process replayed the first's broken code ("missing value for argument 'output'")."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(code_cache_without_graphs(tmp_path / "inductor"))}
    first = run_in_fresh_python(COMPILE_MUL3.format(apply=False), env=env)
    second = run_in_fresh_python(COMPILE_MUL3.format(apply=True), env=env)
    assert second == "ok", f"after the workaround: {second} (before it: {first})"
    third = run_in_fresh_python(COMPILE_MUL3.format(apply=True), env=env)  # a cache hit of a right graph works too
    assert third == "ok"
