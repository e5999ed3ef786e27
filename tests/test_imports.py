"""The repository's import graph, read statically (every import, at any depth): the machinery never imports an example
module (it reaches an op's modules only through the declarations), the layers import only downward (the op machinery,
then the model layer, then the benchmarks) and no two modules of different folders share a name, the graph has no
cycle, the example modules import only torch at load time, and the modules the wheel carries copies of import only the
standard library and torch."""

import ast
import glob
import os
import sys

import pytest

from flow import declarations
from helpers import REPO_ROOT

MACHINERY = ["flow/*.py", "codegen/*.py", "my_ops/*.py", "my_ops/hf/*.py", "models/*.py", "setup.py", "benchmark/*.py",
             "tools/*.py"]
# The layers, lowest first: a module may import from its own layer and the ones below it. The benchmarks run as
# scripts with benchmark/ on their path, so they import each other by bare names.
LAYERS = [("the op machinery", ["flow/*.py", "codegen/*.py", "tools/*.py"]),
          ("the wheel", ["my_ops/*.py", "my_ops/hf/*.py"]),
          ("the model layer", ["models/*.py"]),
          ("the benchmarks", ["benchmark/*.py"])]
OP_MODULES = ["custom_ops_1.py", "custom_ops_2.py", "ops/*/*.py"]  # copied into users' projects and the wheel
EXAMPLES = [*OP_MODULES, "examples/*.py"]


def paths(patterns: list[str]) -> list[str]:
    """The files the patterns match, less an op's own tests (ops/<name>/test_*.py: tests, which import what tests do;
    neither copied into users' projects nor into the wheel)."""
    found = (glob.glob(os.path.join(REPO_ROOT, pattern)) for pattern in patterns)
    return sorted(os.path.relpath(p, REPO_ROOT) for matches in found for p in matches
                  if not os.path.basename(p).startswith("test_"))


def test_an_ops_own_tests_are_not_op_modules(tmp_path, monkeypatch):
    # docs/adding-an-op.md puts an op's tests at ops/<name>/test_<name>.py; they import pytest and the machinery, which
    # an op module may not.
    for name in ("ops/mine/mine.py", "ops/mine/test_mine.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("import pytest\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", str(tmp_path))
    assert paths(OP_MODULES) == ["ops/mine/mine.py"]


def module_name(path: str) -> str:
    relative = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".")
    return relative.removesuffix(".__init__")


def at_load(body: list[ast.stmt]):
    """The statements a module runs when it is imported: its body, into module-level if, try and with blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            continue  # run as a script, not on import
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                          *(handler.body for handler in getattr(node, "handlers", []))):
                yield from at_load(block)


def imports(path: str, top_level_only: bool = False) -> set[str]:
    """The modules `path` imports (absolute names; relative imports resolved against its package); top_level_only:
    those it imports when it is loaded."""
    tree = ast.parse(open(path).read(), path)
    package = module_name(path).rpartition(".")[0] if not path.endswith("__init__.py") else module_name(path)
    nodes = at_load(tree.body) if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(filter(None, [package.rsplit(".", node.level - 1)[0] if node.level > 1 else package,
                                              node.module]))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def repository_modules() -> dict[str, str]:
    return {module_name(p): os.path.join(REPO_ROOT, p) for p in paths([*MACHINERY, *EXAMPLES])}


def test_the_machinery_imports_no_example_module():
    examples = {op.python_module for op in declarations.load().values() if op.python_module}
    examples |= {op.reference.rpartition(".")[0] for op in declarations.load().values()}
    examples |= {module_name(os.path.join(REPO_ROOT, p)) for p in paths(EXAMPLES)}
    offenders = {module: sorted(imports(path) & examples) for module, path in repository_modules().items()
                 if module not in examples and imports(path) & examples}
    assert offenders == {}


def layer_of(module: str) -> int | None:
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(module_name(os.path.join(REPO_ROOT, p)) == module for p in paths(patterns)):
            return rank
    return None


def resolved(importer: str, imported: str, modules: dict[str, str]) -> str | None:
    """The repository module an import names: a benchmark's bare name is its sibling in benchmark/."""
    if imported in modules:
        return imported
    sibling = f"{importer.rpartition('.')[0]}.{imported}"
    return sibling if importer.startswith("benchmark.") and sibling in modules else None


def test_the_layers_import_only_downward():
    modules = repository_modules()
    upward = []
    for module, path in modules.items():
        if (rank := layer_of(module)) is None:
            continue
        for imported in imports(path):
            target = resolved(module, imported, modules)
            if target is not None and (other := layer_of(target)) is not None and other > rank:
                upward.append(f"{module} ({LAYERS[rank][0]}) imports {target} ({LAYERS[other][0]})")
    assert upward == []


def test_no_two_folders_hold_a_module_of_the_same_name():
    # ops/<name>/ folders are the ops' own (an op may name its module after itself); every other folder's modules, and
    # the ops' modules against them, have names of their own.
    by_name: dict[str, set[str]] = {}
    for path in paths([*MACHINERY, *EXAMPLES]):
        name = os.path.splitext(os.path.basename(path))[0]
        if name != "__init__":
            by_name.setdefault(name, set()).add(os.path.dirname(path) or ".")
    shared = {name: sorted(folders) for name, folders in by_name.items()
              if len({"ops" if f.startswith("ops/") else f for f in folders}) > 1}
    assert shared == {}


def test_the_import_graph_has_no_cycle():
    modules = repository_modules()
    graph = {m: {t for i in imports(p) if (t := resolved(m, i, modules)) is not None and t != m}
             for m, p in modules.items()}
    visiting, done, cycles = [], set(), []

    def visit(module):
        if module in visiting:
            cycles.append(visiting[visiting.index(module):] + [module])
            return
        if module in done:
            return
        visiting.append(module)
        for dependency in sorted(graph[module]):
            visit(dependency)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert cycles == []


STANDARD_LIBRARY = set(sys.stdlib_module_names)


def shipped_modules() -> list[str]:
    """The modules the wheel carries beside the ops' own (setup.py copies flow.declarations.WHEEL_SHARED_MODULES)."""
    return list(declarations.WHEEL_SHARED_MODULES)


def sibling_imports(path: str) -> set[str]:
    """The modules of its own folder `path` imports relatively at load time (`from .x import y`, `from . import x`):
    they travel with it."""
    tree = ast.parse(open(path).read(), path)
    folder = os.path.dirname(path)
    names = [name for node in tree.body if isinstance(node, ast.ImportFrom) and node.level == 1
             for name in ([node.module] if node.module else [alias.name for alias in node.names])]
    return {os.path.join(folder, f"{name}.py") for name in names if os.path.isfile(os.path.join(folder, f"{name}.py"))}


@pytest.mark.parametrize("path", sorted({*paths(OP_MODULES), *(op.python_file for op in declarations.load().values()
                                                                   if op.python_file), *shipped_modules()}))
def test_what_ships_or_gets_copied_imports_only_torch(path):
    # The example modules are copied into users' projects (an op's folder whole, so a module may import its folder's
    # other modules), the op modules and the shared ones into the wheel, flat: a module the wheel carries imports only
    # others it carries, and the shared modules (declarations.WHEEL_SHARED_MODULES) from where they are in either
    # place. At load time they may need nothing but torch.
    full = os.path.join(REPO_ROOT, path)
    siblings = sibling_imports(full)
    package = module_name(full).rpartition(".")[0]
    # A shared module the wheel carries, by its place in the repository or beside the module in the wheel.
    shared = {f"{name}{suffix}" for p in shipped_modules() for suffix in ("", ".*")
              for name in (module_name(os.path.join(REPO_ROOT, p)), f"{package}.{os.path.basename(p)[:-3]}")}
    loaded = {name.split(".")[0] for name in imports(full, top_level_only=True)
              if name != package and not any(name.startswith(module_name(s)) for s in siblings)
              and not any(name == s or (s.endswith(".*") and name.startswith(s[:-1])) for s in shared)}
    assert loaded - STANDARD_LIBRARY - {"torch", "__future__"} == set()
    in_the_wheel = {os.path.join(REPO_ROOT, p) for p in [*shipped_modules(), *(op.python_file for op in
                                                                                declarations.load().values()
                                                                                if op.from_python)]}
    if full in in_the_wheel:
        assert siblings - in_the_wheel == set()


def test_an_op_module_named_as_a_module_the_wheel_carries_is_refused_by_name(tmp_path):
    # The wheel carries both flat in my_ops/: the op's module would replace the checked loader's my_ops.runtime.
    text = open(os.path.join(REPO_ROOT, "custom_ops.bzl")).read()
    bzl = tmp_path / "custom_ops.bzl"
    bzl.write_text(text.replace('"python_module": "custom_ops_1"', '"python_module": "ops.mine.runtime"'))
    with pytest.raises(declarations.DeclarationError) as error:
        declarations.load(str(bzl))
    assert str(error.value) == (f"{bzl}: my_ops::mul3: python_module 'ops.mine.runtime' and 'flow/runtime.py' end in "
                                "the same name, and the my_ops wheel carries both as my_ops.runtime; rename the op's "
                                "module")
