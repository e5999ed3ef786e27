"""The Buck2 build, checked without buck2 (which no registry here provides). Four stages, each needing the last:

  evaluate  TARGETS, the .bzl files it loads and toolchains/BUCK, run by starlark-rust (the starlark-pyo3 wheel, the
            interpreter buck2 embeds) in buck2's dialects: build files without `def` or top-level `if`/`for`, .bzl
            files with them. The prelude's rules are stand-ins that record each target and reject any attribute the
            prelude does not declare settable (tests/buck2/prelude-rule-attrs.json); `native`, `read_config` (from
            .buckconfig and .buckconfig.local) and `glob` behave as in buck2.
  check     .buckconfig and the toolchains are the offline set; every file and label the graph names exists; each
            example's op selection, kernel sources and AOT sources are the ones CMake's plan picks for it.
  build     the recorded graph executed the way buck2 would: genrules under `bash -e` in a symlinked $SRCDIR with
            $OUT, $SRCS and $(location ...)/$(exe ...) expanded; cxx_library/cxx_binary compiled and linked from
            their recorded srcs, headers, flags and deps (static archives, link_whole, shared libraries) with the
            toolchain's compiler and flags. Outputs go to buck-out/graph/.
  run       every declared op's example exported (its AOT library from this build for C++ ops), run in the runner
            built here, and verified against its declared reference (flow/verify.py); the all-ops runner runs them
            all. With --ops, the build and run stages take those ops' own targets only.

    python tests/buck2_graph.py [--repo DIR] [--stage evaluate|check|build|run] [--ops mul4,rms_norm]
Exit 0 when every stage up to --stage passed; 1 otherwise, with one `error:` line per problem on stderr.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import configparser
import dataclasses
import fnmatch
import glob as globlib
import hashlib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ATTRIBUTES = os.path.join(HERE, "buck2", "prelude-rule-attrs.json")
TOOLCHAIN_RULES = {  # load("@prelude//toolchains:<file>.bzl", ...) -> the stand-ins each file provides
    "@prelude//toolchains:cxx.bzl": ["system_cxx_toolchain"],
    "@prelude//toolchains:genrule.bzl": ["system_genrule_toolchain"],
    "@prelude//toolchains:python.bzl": ["system_python_bootstrap_toolchain"],
}
BUILD_RULES = ["genrule", "cxx_library", "cxx_binary", "prebuilt_cxx_library", "export_file", "filegroup"]


class GraphError(Exception):
    """A problem with the Buck2 graph; the message names the file, target or attribute."""


@dataclasses.dataclass
class Target:
    kind: str
    name: str
    cell: str
    attrs: dict

    @property
    def label(self) -> str:
        return f"{self.cell}//:{self.name}"


# ---- evaluate ------------------------------------------------------------------------------------------------------
def read_buckconfig(repo: str) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    for name in (".buckconfig", ".buckconfig.local"):
        path = os.path.join(repo, name)
        if os.path.isfile(path):
            with open(path) as f:
                parser.read_string("\n".join(line.strip() for line in f), source=path)
    return {section: dict(parser[section]) for section in parser.sections()}


class Evaluator:
    def __init__(self, repo: str, config: dict):
        import starlark

        self.sl = starlark
        self.repo = repo
        self.config = config
        self.targets: dict[str, Target] = {}
        with open(ATTRIBUTES) as f:
            self.attributes = json.load(f)
        self.globals = starlark.Globals.extended_by([starlark.LibraryExtension.StructType,
                                                     starlark.LibraryExtension.Json])
        self.frozen: dict[str, object] = {}

    def _dialect(self, build_file: bool):
        d = self.sl.Dialect.extended()
        d.enable_def = not build_file
        d.enable_top_level_stmt = not build_file  # build files: no top-level if/for either
        d.enable_keyword_only_arguments = not build_file
        d.enable_load_reexport = False
        d.enable_f_strings = True
        return d

    def _rule(self, kind: str, cell: str):
        settable = set(self.attributes[kind]["settable"])
        default_only = set(self.attributes[kind]["default_only"])

        def record(*args, **kwargs):
            if args:
                raise GraphError(f"{kind}() takes keyword arguments only, got {len(args)} positional")
            name = kwargs.get("name")
            if not isinstance(name, str) or not name:
                raise GraphError(f"{kind}() needs name")
            for key in kwargs:
                if key in default_only:
                    raise GraphError(f"{kind}(name = {name!r}): attribute {key!r} is default_only in the prelude and "
                                     "cannot be set")
                if key not in settable:
                    raise GraphError(f"{kind}(name = {name!r}): {key!r} is not an attribute of {kind} in the prelude")
            if kind == "export_file":
                kwargs.setdefault("src", name)  # the prelude's native.export_file stub: src defaults to name
            target = Target(kind, name, cell, kwargs)
            if target.label in self.targets:
                raise GraphError(f"target {target.label} is defined twice")
            self.targets[target.label] = target

        return record

    def _read_config(self, section, key, default=None):
        return self.config.get(section, {}).get(key, default)

    def _glob(self, include, exclude=()):
        found = set()
        for pattern in include:
            for path in globlib.glob(os.path.join(self.repo, pattern), recursive=True):
                if os.path.isfile(path):
                    found.add(os.path.relpath(path, self.repo))
        return sorted(p for p in found if not any(fnmatch.fnmatch(p, e) for e in exclude))

    def _builtins(self, cell: str, rules: list[str]):
        """A frozen module holding what buck2 makes global: native (a struct), read_config, and the rules."""
        key = f"__builtins__{cell}"
        if key not in self.frozen:
            m = self.sl.Module()
            for rule in rules:
                m.add_callable(f"__rule_{rule}", self._rule(rule, cell))
            m.add_callable("read_config", self._read_config)
            m.add_callable("glob", self._glob)
            m.add_callable("package_name", lambda: "")
            members = "".join(f"{r} = __rule_{r}, " for r in rules)
            src = f"native = struct({members}read_config = read_config, glob = glob, package_name = package_name)\n"
            src += "".join(f"{r} = __rule_{r}\n" for r in rules)
            self.sl.eval(m, self.sl.parse("<builtins>", src, self.sl.Dialect.extended()), self.globals)
            self.frozen[key] = m.freeze()
        return self.frozen[key]

    def eval_file(self, cell: str, relative: str, build_file: bool):
        path = os.path.join(self.repo, relative)
        with open(path) as f:
            source = f.read()
        rules = BUILD_RULES if cell == "root" else []
        exported = ["read_config"] + (rules + ["glob", "package_name"] if build_file else ["native"])
        # buck2 provides these as globals; a load on line 1 (joined with `;`) keeps the file's line numbers.
        names = ", ".join(f'"{n}"' for n in exported)
        source = f'load("@__builtins__{cell}", {names}); ' + source
        module = self.sl.Module()
        try:
            ast = self.sl.parse(relative, source, self._dialect(build_file))
            self.sl.eval(module, ast, self.globals, self.sl.FileLoader(lambda label: self._load(cell, label)))
        except self.sl.StarlarkError as err:
            raise GraphError(f"{relative}: {err}") from None
        return module.freeze()

    def _load(self, cell: str, label: str):
        if label.startswith("@__builtins__"):
            return self._builtins(label[len("@__builtins__"):], BUILD_RULES if cell == "root" else [])
        if label in TOOLCHAIN_RULES:
            m = self.sl.Module()
            for rule in TOOLCHAIN_RULES[label]:
                m.add_callable(rule, self._rule(rule, cell))
            return m.freeze()
        if label.startswith("@prelude//") or label.startswith("prelude//"):
            raise GraphError(f"loads {label}, which the graph check has no stand-in for")
        if label.startswith("//"):
            relative = label[2:].replace(":", "/").lstrip("/")  # //codegen:codegen.bzl -> codegen/codegen.bzl
        elif label.startswith(":"):
            relative = label[1:]  # a file of the root package
        else:
            raise GraphError(f"load({label!r}): only root-cell labels and the prelude's toolchains are supported")
        if not os.path.isfile(os.path.join(self.repo, relative)):
            raise GraphError(f"load({label!r}): {relative} does not exist")
        if relative not in self.frozen:
            self.frozen[relative] = self.eval_file(cell, relative, build_file=False)
        return self.frozen[relative]


def evaluate(repo: str) -> tuple[dict[str, Target], dict]:
    config = read_buckconfig(repo)
    evaluator = Evaluator(repo, config)
    name = config.get("buildfile", {}).get("name")
    if name != "TARGETS":
        raise GraphError(f".buckconfig: [buildfile] name must be TARGETS (the project's build file), got {name!r}")
    evaluator.eval_file("root", "TARGETS", build_file=True)
    evaluator.eval_file("toolchains", "toolchains/BUCK", build_file=True)
    return evaluator.targets, config


# ---- check ---------------------------------------------------------------------------------------------------------
LABEL = re.compile(r"^(?:(\w+)?//)?:([\w.+-]+)(?:\[([^\]]+)\])?$")
MACRO = re.compile(r"(?<!\\)\$\((location|exe) ([^)\s]+)\)")


def parse_label(value: str, cell: str = "root"):
    m = LABEL.match(value)
    if not m:
        return None
    return f"{m.group(1) or cell}//:{m.group(2)}", m.group(3)


def sources_of(target: Target) -> list[str]:
    """Every source attribute value (files and labels) of a target."""
    values = []
    for key in ("srcs", "headers", "exported_headers"):
        value = target.attrs.get(key, [])
        values += list(value.values()) if isinstance(value, dict) else list(value)
    if target.kind == "export_file":
        values.append(target.attrs["src"])
    return values


def deps_of(target: Target) -> list[str]:
    return [*target.attrs.get("deps", []), *target.attrs.get("exported_deps", [])]


def check(repo: str, targets: dict[str, Target], config: dict) -> list[str]:
    problems = []
    cells = config.get("cells", {})
    if cells.get("root") != "." or cells.get("toolchains") != "toolchains" or "prelude" not in cells:
        problems.append(".buckconfig: [cells] needs root = ., prelude and toolchains = toolchains")
    if config.get("external_cells", {}).get("prelude") != "bundled":
        problems.append(".buckconfig: [external_cells] prelude must be bundled (no prelude checkout needed)")
    if "target_platform_detector_spec" not in config.get("parser", {}):
        problems.append(".buckconfig: [parser] target_platform_detector_spec is missing")
    for name in ("cxx", "genrule", "python_bootstrap"):
        if f"toolchains//:{name}" not in targets:
            problems.append(f"toolchains/BUCK defines no {name} toolchain, which the prelude looks up")
    for target in targets.values():
        where = f"{target.label} ({target.kind})"
        for value in sources_of(target):
            label = parse_label(value, target.cell)
            if label is None:
                if not os.path.isfile(os.path.join(repo, value)):
                    problems.append(f"{where}: source {value} does not exist")
                continue
            problems += _check_label(targets, where, *label)
        for dep in deps_of(target):
            label = parse_label(dep, target.cell)
            if label is None:
                problems.append(f"{where}: dep {dep!r} is not a label")
            else:
                problems += _check_label(targets, where, *label)
                if label[0] in targets and targets[label[0]].kind not in ("cxx_library", "prebuilt_cxx_library"):
                    problems.append(f"{where}: dep {dep} is a {targets[label[0]].kind}, not a C++ library")
        for key in ("cmd", "bash"):
            for _, value in MACRO.findall(target.attrs.get(key) or ""):
                problems += _check_label(targets, f"{where} {key}", *(parse_label(value, target.cell) or (value, None)))
        if target.kind == "genrule" and not (target.attrs.get("cmd") or target.attrs.get("bash")):
            problems.append(f"{where}: a genrule needs cmd")
        if target.kind == "genrule" and ("out" in target.attrs) == ("outs" in target.attrs):
            problems.append(f"{where}: a genrule needs exactly one of out and outs")
    return problems


def _check_label(targets, where, label, sub):
    if label not in targets:
        return [f"{where}: label {label} names no target"]
    target = targets[label]
    if sub is not None and sub not in (target.attrs.get("outs") or {}) and sub not in ("shared",):
        return [f"{where}: {label} has no named output [{sub}]"]
    return []


# ---- build ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Built:
    default: list[str] = dataclasses.field(default_factory=list)  # default outputs, absolute paths
    named: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    # C++: what dependents compile with and link against
    exported_preprocessor_flags: list[str] = dataclasses.field(default_factory=list)
    exported_header_dirs: list[str] = dataclasses.field(default_factory=list)
    exported_linker_flags: list[str] = dataclasses.field(default_factory=list)
    archive: str | None = None
    link_whole: bool = False
    shared_library: str | None = None


class Executor:
    ENV_DROPPED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_LIBRARY_PATH", "LD_PRELOAD")  # as buck2 does

    def __init__(self, repo: str, targets: dict[str, Target], log=print):
        self.repo = repo
        self.targets = targets
        self.out = os.path.join(repo, "buck-out", "graph")
        self.cache = os.environ.get("BUCK2_GRAPH_CACHE", os.path.join(self.out, "cache"))
        os.makedirs(self.cache, exist_ok=True)
        self.built: dict[str, Built] = {}
        self._keys: dict[str, str] = {}  # _content_key by path
        self._names: dict[str, str] = {}  # _names_key by header tree
        self._manifest_lock = threading.Lock()
        self.log = log
        cxx = targets["toolchains//:cxx"].attrs
        self.cxx = shutil.which(cxx.get("cxx_compiler") or "clang++")
        self.linker = shutil.which(cxx.get("linker") or "clang++")
        self.archiver = shutil.which(cxx.get("archiver") or "ar")
        if not (self.cxx and self.linker and self.archiver):
            raise GraphError("toolchains//:cxx names a compiler, linker or archiver that is not on PATH")
        self.cxx_flags = list(cxx.get("cxx_flags", []))
        self.link_flags = list(cxx.get("link_flags", []))

    def target_dir(self, target: Target) -> str:
        path = os.path.join(self.out, target.cell, target.name)
        os.makedirs(path, exist_ok=True)
        return path

    def source(self, value: str, cell: str = "root") -> str:
        """The absolute path of a source attribute value: a file of the repository, or a target's output."""
        label = parse_label(value, cell)
        if label is None:
            return os.path.join(self.repo, value)
        built = self.build(label[0])
        outputs = built.named[label[1]] if label[1] else built.default
        if len(outputs) != 1:
            raise GraphError(f"{value} has {len(outputs)} outputs; a source needs one")
        return outputs[0]

    def build(self, label: str) -> Built:
        if label not in self.built:
            target = self.targets[label]
            method = getattr(self, f"_build_{target.kind}", None)
            if method is None:
                raise GraphError(f"{label}: the graph check cannot execute a {target.kind}")
            self.built[label] = method(target)
        return self.built[label]

    # -- rules --
    def _build_export_file(self, target):
        return Built(default=[os.path.join(self.repo, target.attrs["src"])])

    def _expand_macros(self, text: str, target: Target, relative_to: str, inputs: list[str] | None = None) -> str:
        """`text` with $(location x) and $(exe x) replaced by the path of x's output (appended to `inputs`)."""
        def expand(m):
            path = self.source(m.group(2), target.cell)
            if inputs is not None:
                inputs.append(path)
            return os.path.relpath(path, relative_to)

        return MACRO.sub(expand, text).replace("\\$(", "$(")

    def _build_genrule(self, target):
        attrs = target.attrs
        base = self.target_dir(target)
        srcs_dir, out_dir = os.path.join(base, "srcs"), os.path.join(base, "out")
        for d in (srcs_dir, out_dir):
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(srcs_dir)
        short_paths = []
        for value in attrs.get("srcs", []):
            label = parse_label(value, target.cell)
            short = value if label is None else os.path.basename(self.source(value, target.cell))
            link = os.path.join(srcs_dir, short)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(self.source(value, target.cell), link)
            short_paths.append(short)
        if "out" in attrs:
            out_env = os.path.join(out_dir, attrs["out"])
            prepare = os.path.dirname(out_env)
            default, named = [out_env], {}
        else:
            out_env = prepare = out_dir
            named = {name: [os.path.join(out_dir, p) for p in paths] for name, paths in attrs["outs"].items()}
            default = [os.path.join(out_dir, p) for p in attrs.get("default_outs", [])] or [out_dir]
        rel = lambda p: os.path.relpath(p, srcs_dir)  # noqa: E731  (buck2 relativizes every path to $SRCDIR)
        macro_inputs: list[str] = []
        cmd = self._expand_macros(attrs.get("bash") or attrs["cmd"], target, srcs_dir, macro_inputs)
        script_text = f"mkdir -p {shlex.quote(rel(prepare))} || exit 99\nexport TMP=${{TMPDIR:-/tmp}}\n{cmd}\n"
        script = os.path.join(base, "genrule.sh")
        with open(script, "w") as f:
            f.write(script_text)
        rule_env = dict(OUT=rel(out_env), SRCDIR="./.", SRCS=" ".join(f"./{p}" for p in short_paths),
                        GEN_DIR="GEN_DIR_DEPRECATED", **{k: str(v) for k, v in (attrs.get("env") or {}).items()})
        # The action cache, as buck2's: the command, its environment and every input by content (the srcs, and what
        # its macros name), so a copy of the repository reruns only the genrules its change reaches.
        key = hashlib.sha256("\0".join(
            [script_text, repr(sorted(rule_env.items())), os.path.relpath(out_dir, base)]
            + [f"{p}={self._content_key(os.path.join(srcs_dir, p))}" for p in short_paths]
            + [self._content_key(p) for p in macro_inputs]).encode()).hexdigest()
        cached = os.path.join(self.cache, f"genrule-{key}")
        if os.path.isdir(cached):
            shutil.copytree(cached, out_dir, symlinks=True)  # out_dir was removed above
        else:
            env = {k: v for k, v in os.environ.items() if k not in self.ENV_DROPPED}
            env.update(rule_env)
            self.log(f"genrule {target.label}")
            proc = subprocess.run(["/usr/bin/env", "bash", "-e", script], cwd=srcs_dir, env=env, capture_output=True,
                                  text=True)
            if proc.returncode != 0:
                raise GraphError(f"{target.label}: the genrule's cmd failed (exit {proc.returncode}): "
                                 f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
            staged = f"{cached}.{os.getpid()}.tmp"  # whole or absent: another graph check may share the cache
            shutil.copytree(out_dir, staged, symlinks=True)
            try:
                os.rename(staged, cached)
            except OSError:  # another one stored it first
                shutil.rmtree(staged)
        for path in default + [p for paths in named.values() for p in paths]:
            if not os.path.exists(path):
                raise GraphError(f"{target.label}: the genrule's cmd did not write its output {rel(path)}")
        return Built(default=default, named=named)

    def _build_prebuilt_cxx_library(self, target):
        attrs = target.attrs
        built = Built(exported_preprocessor_flags=self._flags(attrs.get("exported_preprocessor_flags", []), target),
                      exported_linker_flags=self._flags(attrs.get("exported_linker_flags", []), target))
        self._inherit_exported(built, attrs.get("exported_deps", []), target)
        return built

    def _flags(self, flags, target):
        return [self._expand_macros(flag, target, self.repo) for flag in flags]

    def _inherit_exported(self, built: Built, deps, target):
        """Exported preprocessor flags and headers pass on through exported_deps, as in buck2."""
        for dep in deps:
            d = self.build(parse_label(dep, target.cell)[0])
            built.exported_preprocessor_flags = built.exported_preprocessor_flags + d.exported_preprocessor_flags
            built.exported_header_dirs = built.exported_header_dirs + d.exported_header_dirs

    def _header_tree(self, target, attr: str) -> str | None:
        headers = target.attrs.get(attr)
        if not headers:
            return None
        tree = os.path.join(self.target_dir(target), attr)
        shutil.rmtree(tree, ignore_errors=True)
        namespace = target.attrs.get("header_namespace", "")  # the package path: "" for the root package
        items = headers.items() if isinstance(headers, dict) else ((h, h) for h in headers)
        for name, value in items:
            link = os.path.join(tree, namespace, name)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(self.source(value, target.cell), link)
        return tree

    def _compile(self, target, deps) -> list[str]:
        attrs = target.attrs
        flags = list(self.cxx_flags)
        own_exported = self._flags(attrs.get("exported_preprocessor_flags", []), target)
        flags += self._flags(attrs.get("preprocessor_flags", []), target) + own_exported
        for tree in (self._header_tree(target, "headers"), self._header_tree(target, "exported_headers")):
            if tree:
                flags += ["-I", tree]
        for dep in deps:
            d = self.build(dep)
            flags += d.exported_preprocessor_flags + [f for tree in d.exported_header_dirs for f in ("-I", tree)]
        flags += self._flags(attrs.get("compiler_flags", []), target) + ["-fPIC"]
        sources = [self.source(value, target.cell) for value in attrs.get("srcs", [])]
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            compiles = [pool.submit(self._compile_one, target, src, flags) for src in sources]
            try:
                return [c.result() for c in compiles]
            except GraphError:
                pool.shutdown(cancel_futures=True)  # as a failed build stops: the compiles not yet started never do
                raise

    def _content_key(self, path: str) -> str:
        """A header tree or output directory by the content of its files, any other path by the content of the file.
        Read once per run: a source, a header tree or a built output does not change after it is first keyed."""
        if path not in self._keys:
            self._keys[path] = self._read_content_key(path)
        return self._keys[path]

    @staticmethod
    def _files_under(directory: str) -> list[str]:
        return sorted(os.path.relpath(os.path.join(r, f), directory) for r, _, fs in os.walk(directory) for f in fs)

    def _read_content_key(self, path: str) -> str:
        digest = hashlib.sha256()
        for name in self._files_under(path) if os.path.isdir(path) else [""]:
            digest.update(name.encode())
            with open(os.path.join(path, name) if name else path, "rb") as f:
                digest.update(f.read())
        return digest.hexdigest()

    def _names_key(self, tree: str) -> str:
        """A header tree by the names it offers (what an #include can find there), not their contents."""
        if tree not in self._names:
            self._names[tree] = hashlib.sha256("\n".join(self._files_under(tree)).encode()).hexdigest()
        return self._names[tree]

    def _compile_one(self, target, src, flags) -> str:
        """One compile, cached like buck2's action cache by the command and its inputs: the source and every header
        it read, by content (from the compiler's dependency list, as ccache's direct mode does). Header trees enter the
        command by the names they hold, not their paths, so one source compiled by two targets whose trees offer the
        same headers compiles once, even where the trees differ in headers it does not include."""
        trees = [f for f in flags if f.startswith(self.out) and os.path.isdir(f)]
        command = [f"tree:{self._names_key(f)}" if f in trees else self._content_key(f) if f.startswith(self.out)
                   else f for f in flags]
        command_key = hashlib.sha256(" ".join([self.cxx, *command, self._content_key(src)]).encode()).hexdigest()
        manifest = os.path.join(self.cache, command_key + ".deps.json")
        for deps in self._manifest_entries(manifest):
            obj = self._object_path(command_key, deps, trees)
            if obj and os.path.isfile(obj):
                return obj
        self.log(f"compile {target.label}: {os.path.relpath(src, self.repo)}")
        with tempfile.TemporaryDirectory(dir=self.cache) as scratch:
            depfile, tmp_obj = os.path.join(scratch, "deps.d"), os.path.join(scratch, "out.o")
            proc = subprocess.run([self.cxx, *flags, "-MD", "-MF", depfile, "-c", src, "-o", tmp_obj], cwd=self.repo,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise GraphError(f"{target.label}: compiling {os.path.relpath(src, self.repo)} failed: "
                                 f"{proc.stderr.strip()[-3000:]}")
            deps = self._portable_deps(depfile, src, trees)
            obj = self._object_path(command_key, deps, trees)
            os.replace(tmp_obj, obj)
        with self._manifest_lock:
            entries = self._manifest_entries(manifest)
            if deps not in entries:
                with open(manifest + ".tmp", "w") as f:
                    json.dump(entries + [deps], f)
                os.replace(manifest + ".tmp", manifest)
        return obj

    @staticmethod
    def _manifest_entries(manifest: str) -> list:
        try:
            with open(manifest) as f:
                return json.load(f)
        except FileNotFoundError:
            return []

    def _portable_deps(self, depfile: str, src: str, trees: list[str]) -> list:
        """The headers a compile read, each as [tree index, path in that tree], ["repo", path in the repository] (a
        copy of the repository reads the same) or [None, absolute path]."""
        with open(depfile) as f:
            paths = shlex.split(f.read().replace("\\\n", " ").split(":", 1)[1])
        deps = []
        for path in (os.path.normpath(os.path.join(self.repo, p)) for p in paths):
            if path == os.path.normpath(src):
                continue
            tree = next((i for i, t in enumerate(trees) if path.startswith(t + os.sep)), None)
            if tree is None and path.startswith(self.repo + os.sep):
                tree = "repo"
            deps.append([tree, path if tree is None else os.path.relpath(path, self._root(tree, trees))])
        return deps

    def _object_path(self, command_key: str, deps: list, trees: list[str]) -> str | None:
        """Where the object of this command over these headers' contents lives; None if one no longer exists."""
        digest = hashlib.sha256(command_key.encode())
        for tree, path in deps:
            digest.update(f"{tree}:{path}".encode())
            path = os.path.join(self._root(tree, trees), path) if tree is not None else path
            if not os.path.isfile(path):
                return None
            digest.update(self._content_key(path).encode())
        return os.path.join(self.cache, digest.hexdigest() + ".o")

    def _root(self, tree, trees: list[str]) -> str:
        return self.repo if tree == "repo" else trees[tree]

    def _dep_labels(self, target):
        return [parse_label(d, target.cell)[0] for d in deps_of(target)]

    def _link_inputs(self, target) -> tuple[list[str], list[str]]:
        """(library arguments, linker flags) of every transitive dep, dependents before their dependencies."""
        order, seen = [], set()

        def visit(label):
            if label in seen:
                return
            seen.add(label)
            for dep in self._dep_labels(self.targets[label]):
                visit(dep)
            order.insert(0, label)

        for dep in self._dep_labels(target):
            visit(dep)
        libraries, flags = [], []
        for label in order:
            d = self.build(label)
            if d.shared_library:
                libraries += [d.shared_library, f"-Wl,-rpath,{os.path.dirname(d.shared_library)}"]
            elif d.archive and d.link_whole:
                libraries += ["-Wl,--whole-archive", d.archive, "-Wl,--no-whole-archive"]
            elif d.archive:
                libraries.append(d.archive)
            flags += d.exported_linker_flags
        return libraries, flags

    def _build_cxx_library(self, target):
        attrs = target.attrs
        objects = self._compile(target, self._dep_labels(target))
        built = Built(exported_preprocessor_flags=self._flags(attrs.get("exported_preprocessor_flags", []), target),
                      exported_linker_flags=self._flags(attrs.get("exported_linker_flags", []), target),
                      link_whole=bool(attrs.get("link_whole")))
        tree = self._header_tree(target, "exported_headers")
        built.exported_header_dirs = [tree] if tree else []
        self._inherit_exported(built, attrs.get("exported_deps", []), target)
        base = self.target_dir(target)
        if attrs.get("preferred_linkage") == "shared":
            soname = attrs.get("soname") or f"lib{target.name}.so"
            path = os.path.join(base, soname)
            libraries, flags = self._link_inputs(target)
            whole = ["-Wl,--whole-archive", *objects, "-Wl,--no-whole-archive"] if built.link_whole else objects
            self._link(target, [*self.link_flags, "-shared", f"-Wl,-soname,{soname}", *whole, *libraries, *flags,
                                *self._flags(attrs.get("linker_flags", []), target)], path)
            built.shared_library = path
            built.default = built.named["shared"] = [path]
        else:
            built.archive = os.path.join(base, f"lib{target.name}.a")
            if os.path.exists(built.archive):
                os.remove(built.archive)
            subprocess.run([self.archiver, "rcs", built.archive, *objects], check=True)
            built.default = [built.archive]
        return built

    def _build_cxx_binary(self, target):
        attrs = target.attrs
        objects = self._compile(target, self._dep_labels(target))
        libraries, flags = self._link_inputs(target)
        path = os.path.join(self.target_dir(target), target.name)
        self._link(target, [*self.link_flags, *self._flags(attrs.get("linker_flags", []), target), *objects,
                            *libraries, *flags, *self._flags(attrs.get("post_linker_flags", []), target)], path)
        return Built(default=[path])

    def _link(self, target, args, output):
        self.log(f"link {target.label}")
        proc = subprocess.run([self.linker, *args, "-o", output], cwd=self.repo, capture_output=True, text=True)
        if proc.returncode != 0:
            raise GraphError(f"{target.label}: linking failed: {proc.stderr.strip()[-3000:]}")


# ---- the examples: selection against CMake's, then run and verify --------------------------------------------------
PER_OP_TARGETS = ("select", "custom_ops_kernels", "custom_ops_lib", "custom_ops_executor_runner", "custom_ops_aot_lib")


def examples(repo: str, only: set[str] | None = None):
    """(suffix, [declared ops]) per example: each op alone, then all together, as targets.bzl defines them; with
    `only` (short names), those ops alone."""
    sys.path.insert(0, repo)
    from flow import declarations

    ops = list(declarations.load(os.path.join(repo, "custom_ops.bzl")).values())
    if only is not None:
        return [(f"_{op.short_name}", [op]) for op in ops if op.short_name in only]
    return [(f"_{op.short_name}", [op]) for op in ops] + [("", ops)]


def left_out(repo: str, only: set[str] | None) -> set[str]:
    """The labels `only` leaves out of the build: the per-op targets of the other ops, and the all-ops targets (whose
    sources and selection the check stage compares with CMake's plan all the same)."""
    if only is None:
        return set()
    _, everything = examples(repo)[-1]
    if unknown := only - {op.short_name for op in everything}:
        raise GraphError(f"--ops names {', '.join(sorted(unknown))}, which custom_ops.bzl does not declare")
    others = [f"_{op.short_name}" for op in everything if op.short_name not in only]
    return {f"root//:{base}{suffix}{combined}" for suffix in others + [""] for base in PER_OP_TARGETS
            for combined in ("", "_combined")}


def cmake_plan(repo: str, ops) -> tuple[set[str], list[str], list[str]]:
    """What CMake selects and compiles for `ops`: (selected operators, kernel sources, AOT sources), from the plan
    CMake's configure step writes (codegen/run_codegen.py plan; called here, in this process, once per example)."""
    if os.path.join(repo, "codegen") not in sys.path:
        sys.path.insert(0, os.path.join(repo, "codegen"))
    import run_codegen

    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_codegen.plan(tmp, root_ops=[op.out_name for op in ops])
        except Exception as err:  # noqa: BLE001  (whatever codegen refuses is the check's finding)
            raise GraphError(f"codegen/run_codegen.py plan for {', '.join(op.name for op in ops)} failed: "
                             f"{type(err).__name__}: {err}") from None
        with open(os.path.join(tmp, "custom_ops_plan.cmake")) as f:
            plan = dict(re.findall(r'set\((\w+) "([^"]*)"\)', f.read()))
        import yaml

        with open(os.path.join(tmp, "selected_operators.yaml")) as f:
            selected = set(yaml.safe_load(f)["operators"] or ())
    sources = lambda var: sorted(os.path.relpath(p, repo) for p in plan[var].split(";") if p)  # noqa: E731
    return selected, sources("CUSTOM_OPS_KERNEL_SOURCES"), sources("CUSTOM_OPS_AOT_SOURCES")


def check_against_cmake(repo: str, targets, executor: Executor) -> list[str]:
    import yaml

    problems = []
    for suffix, ops in examples(repo):
        selected, kernel_sources, aot_sources = cmake_plan(repo, ops)
        label = f"root//:select{suffix}"
        if label in targets:
            with open(executor.build(label).default[0]) as f:
                buck_selected = set(yaml.safe_load(f)["operators"] or ())
        elif selected:
            problems.append(f"no selection target {label} for {', '.join(op.name for op in ops)}")
            continue
        else:  # every op registers itself (EXECUTORCH_LIBRARY): nothing for codegen to select
            buck_selected = set()
        if buck_selected != selected:
            problems.append(f"{label} selects {sorted(buck_selected)}, CMake selects {sorted(selected)}")
        buck_kernels = sorted(targets.get(f"root//:custom_ops_kernels{suffix}", Target("", "", "", {})).attrs
                              .get("srcs", []))
        if buck_kernels != kernel_sources:
            problems.append(f"root//:custom_ops_kernels{suffix} compiles {buck_kernels}, CMake {kernel_sources}")
        aot = targets.get(f"root//:custom_ops_aot_lib{suffix}")
        buck_aot = sorted(s for s in (aot.attrs.get("srcs", []) if aot else []) if not s.startswith(":"))
        if buck_aot != aot_sources:
            problems.append(f"root//:custom_ops_aot_lib{suffix} compiles {buck_aot}, CMake {aot_sources}")
    return problems


def build_and_run(repo: str, executor: Executor, log=print, fail_fast: bool = False,
                  only: set[str] | None = None) -> list[str]:
    """Each op's example exported (with its own AOT library for a C++ op) and verified in its own runner, then (without
    `only`) every example in the all-ops runner. One process per AOT library (PyTorch takes one per process), not two per example:
    the Python ops' examples and the all-ops runner's share one."""
    programs = os.path.join(executor.out, "programs")
    os.makedirs(programs, exist_ok=True)
    groups: dict[str | None, list[dict]] = {}
    combined = []
    for suffix, ops in examples(repo, only):
        runner = executor.build(f"root//:custom_ops_executor_runner{suffix}").default[0]
        aot_label = f"root//:custom_ops_aot_lib{suffix}"
        aot = executor.build(aot_label).shared_library if aot_label in executor.targets else None
        if suffix == "":
            combined = [dict(op=op.name, runner=runner, aot=aot, export=False) for op in ops]
        else:
            groups.setdefault(aot, []).append(dict(op=ops[0].name, runner=runner, aot=aot, export=True))
    # The C++ ops' groups first: the all-ops runner's verification reads every example they export.
    order = [aot for aot in groups if aot is not None] + [None]
    problems = []
    for aot in order:
        jobs = groups.get(aot, []) + (combined if aot is None else [])
        problems += _export_and_verify(repo, programs, jobs, log)
        if fail_fast and problems:
            break
    return problems


def _export_and_verify(repo, programs, jobs, log) -> list[str]:
    spec = json.dumps(dict(repo=repo, programs=programs, jobs=jobs))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--examples", spec], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=repo), cwd=repo)
    verdicts = [json.loads(line[2:]) for line in proc.stdout.splitlines() if line.startswith("@@")]
    problems = []
    for job, verdict in itertools.zip_longest(jobs, verdicts):
        runner = os.path.relpath(job["runner"], repo)
        program = f"{job['op']}'s example"
        if verdict is None:
            problems.append(f"{runner} on {program}: not run; the process ended with {proc.returncode}: "
                            f"{proc.stderr[-2000:]}")
            log(f"verify {runner} on {program}: FAILED")
            continue
        log(f"verify {runner} on {verdict['program']}: {'FAILED' if verdict['problems'] else 'match'}")
        problems += [f"{runner} on {verdict['program']}: {p}" for p in verdict["problems"]]
    return problems


def export_and_verify_here(spec: dict) -> int:
    """The child of _export_and_verify(): for each job, in order, exports the op's example (when asked) and verifies
    it in the job's runner, printing one `@@{json}` verdict per job."""
    sys.path.insert(0, spec["repo"])
    from flow import declarations, registration
    from flow.export import export_example
    from flow.verify import verify

    declared = declarations.load(os.path.join(spec["repo"], "custom_ops.bzl"))
    for job in spec["jobs"]:
        op = declared[job["op"]]
        pte = os.path.join(spec["programs"], f"{op.example_program}.pte")
        try:
            if job["export"]:
                registration.register_with_pytorch([op], aot_library=job["aot"])
                export_example(op, spec["programs"])
            problems = verify(pte, runner=job["runner"], aot_library=job["aot"], report=lambda *_: None)
        except Exception as err:  # noqa: BLE001  (whatever fails is this example's finding)
            problems = [f"{type(err).__name__}: {err}"]
        print("@@" + json.dumps(dict(program=os.path.basename(pte), problems=problems)), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=os.path.dirname(HERE))
    parser.add_argument("--stage", choices=("evaluate", "check", "build", "run"), default="run")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--fail_fast", action="store_true", help="stop running examples at the first failure")
    parser.add_argument("--ops", default=None,
                        help="build and run the per-op targets of these ops only (short names, comma-separated), "
                             "not the all-ops ones; every target is still evaluated and checked against CMake's plan. "
                             "The test suite passes one op of each kind (flow/op_kinds.py)")
    parser.add_argument("--examples", help=argparse.SUPPRESS)  # the run stage's child: a JSON spec of its jobs
    args = parser.parse_args()
    if args.examples:
        return export_and_verify_here(json.loads(args.examples))
    repo = os.path.abspath(args.repo)
    log = (lambda *a: None) if args.quiet else (lambda message: print(f"[buck2 graph] {message}", flush=True))
    stages = ["evaluate", "check", "build", "run"][: ["evaluate", "check", "build", "run"].index(args.stage) + 1]
    try:
        targets, config = evaluate(repo)
        log(f"evaluated TARGETS and toolchains/BUCK: {len(targets)} targets, every attribute known to the prelude")
        problems = check(repo, targets, config) if "check" in stages else []
        if not problems and "check" in stages:
            executor = Executor(repo, targets, log)
            problems = check_against_cmake(repo, targets, executor)
            if not problems:
                log("every file and label resolves; each example selects and compiles what CMake does")
            if not problems and "build" in stages:
                only = set(args.ops.split(",")) if args.ops else None
                skipped = left_out(repo, only)
                for label, target in targets.items():
                    if (target.cell == "root" and target.kind in ("cxx_binary", "cxx_library", "genrule")
                            and label not in skipped):
                        executor.build(label)
                log("built every target" if only is None else
                    "built every target but the all-ops ones and the per-op ones of the ops --ops leaves out")
                if "run" in stages:
                    problems = build_and_run(repo, executor, log, fail_fast=args.fail_fast, only=only)
    except GraphError as err:
        problems = [str(err)]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        log(f"passed: {', '.join(stages)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
