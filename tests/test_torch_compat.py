"""torch_compat's workarounds for torch 2.13's Inductor (which calls every out variant with `out=`, and cannot lower a
custom op to its out variant under dynamic shapes): they reach only this project's namespaces, are decided by a
behavioural probe, and do nothing where they cannot apply."""

import os
import subprocess
import textwrap
from types import SimpleNamespace

import torch

from flow import declarations, registration, torch_compat
from helpers import run_in_fresh_python

registration.register_with_pytorch([declarations.find("mul3")])  # registers mul3, applies the workaround to my_ops


def test_the_probe_finds_both_bugs_in_the_pinned_torch():
    assert torch.__version__.startswith("2.13.0")
    assert torch_compat.inductor_hardcodes_out_kwarg() is True
    assert torch_compat.inductor_fails_dynamic_out_lowering() is True


def test_the_verdicts_are_probed_once_per_torch_build_and_kept_in_inductors_cache(tmp_path, monkeypatch):
    probes = []

    def probe(command, **kwargs):  # a torch with bug 1 only
        probes.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=answer, stderr="")

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch_compat, "subprocess",
                        SimpleNamespace(run=probe, SubprocessError=subprocess.SubprocessError))
    answer = "PROBE:out_kwarg:bug\nPROBE:dynamic_shapes:works\n"

    def verdicts():
        torch_compat._probe.cache_clear()
        return torch_compat._probe()

    try:
        path = torch_compat._verdicts_path()
        assert os.path.dirname(path) == str(tmp_path)
        assert verdicts() == verdicts() == {"out_kwarg": True, "dynamic_shapes": False} and len(probes) == 1
        with open(path, "w") as f:
            f.write("{")  # damaged
        assert verdicts() == {"out_kwarg": True, "dynamic_shapes": False} and len(probes) == 2
        assert verdicts() and len(probes) == 2  # kept again
        monkeypatch.setattr(torch.version, "git_version", "another build")
        assert torch_compat._verdicts_path() != path
        answer = "PROBE:out_kwarg:error RuntimeError()\n"  # inconclusive: the workaround stays on, nothing kept
        assert verdicts() == verdicts() == {"out_kwarg": True, "dynamic_shapes": True} and len(probes) == 4
        assert not os.path.exists(torch_compat._verdicts_path())
    finally:
        torch_compat._probe.cache_clear()


def test_our_ops_report_no_out_variant_only_while_the_bug_is_present(monkeypatch):
    from torch._library._out_variant import to_out_variant

    # The probes of the copy of torch_compat that installed the patch (my_ops loads its own copy of the module, and
    # whichever copy a process imports first installs it).
    installed = to_out_variant.__globals__
    assert to_out_variant(torch.ops.my_ops.mul3.default) is None
    monkeypatch.setitem(installed, "inductor_hardcodes_out_kwarg", lambda: False)  # a torch with fix 1 only
    assert to_out_variant(torch.ops.my_ops.mul3.default) is None
    monkeypatch.setitem(installed, "inductor_fails_dynamic_out_lowering", lambda: False)  # and fix 2
    assert to_out_variant(torch.ops.my_ops.mul3.default) is torch.ops.my_ops.mul3.out


def test_our_single_output_ops_compile_with_dynamic_shapes(combined_build):
    """Bug 2 on a real op of ours: rms_norm under torch.compile(dynamic=True), two sequence lengths."""
    result = run_in_fresh_python(f"""
        import torch
        from flow import declarations, registration
        registration.register_with_pytorch([declarations.find("rms_norm")], aot_library={combined_build.aot_lib!r})
        from ops.rms_norm.rms_norm import rms_norm_reference
        weight = torch.rand(8)
        f = torch.compile(lambda x: torch.ops.my_ops.rms_norm(x + 1, weight, 1e-6), fullgraph=True, dynamic=True)
        result = [torch.allclose(f(x), rms_norm_reference(x + 1, weight, 1e-6)) for x in (torch.randn(3, 8),
                                                                                           torch.randn(5, 8))]
    """, timeout=600)
    assert result == [True, True]


OTHER_LIBRARY = textwrap.dedent("""
    import torch
    lib = torch.library.Library("other_lib", "DEF")
    lib.define("scale(Tensor x) -> Tensor")
    lib.define("scale.out(Tensor x, *, Tensor(a!) result) -> Tensor(a!)", tags=(torch.Tag.out,))
    lib.define("halves(Tensor x) -> (Tensor, Tensor)")
    lib.define("halves.out(Tensor x, *, Tensor(a!) out1, Tensor(b!) out2) -> (Tensor(a!), Tensor(b!))",
               tags=(torch.Tag.out,))
    torch.library.impl(lib, "scale", "CompositeExplicitAutograd")(lambda x: x * 2)
    torch.library.impl(lib, "scale.out", "CompositeExplicitAutograd")(
        lambda x, *, result: torch.mul(x, 2, out=result))
    torch.library.register_fake("other_lib::scale", lib=lib)(torch.empty_like)
    torch.library.impl(lib, "halves", "CompositeExplicitAutograd")(lambda x: (x / 2, x / 2))
    def halves_out(x, *, out1, out2):
        torch.div(x, 2, out=out1)
        torch.div(x, 2, out=out2)
        return out1, out2
    torch.library.impl(lib, "halves.out", "CompositeExplicitAutograd")(halves_out)
    torch.library.register_fake("other_lib::halves", lib=lib)(lambda x: (torch.empty_like(x), torch.empty_like(x)))
    # The same multi-output op in our own namespace: its lowering names its out arguments, so it is left alone too.
    mine = torch.library.Library("my_ops", "FRAGMENT")
    mine.define("halves(Tensor x) -> (Tensor, Tensor)")
    mine.define("halves.out(Tensor x, *, Tensor(a!) out1, Tensor(b!) out2) -> (Tensor(a!), Tensor(b!))",
                tags=(torch.Tag.out,))
    torch.library.impl(mine, "halves", "CompositeExplicitAutograd")(lambda x: (x / 2, x / 2))
    torch.library.impl(mine, "halves.out", "CompositeExplicitAutograd")(halves_out)
    torch.library.register_fake("my_ops::halves", lib=mine)(lambda x: (torch.empty_like(x), torch.empty_like(x)))
""")


def test_other_libraries_keep_their_out_variant_lowering_and_ours_with_several_outputs_fall_back():
    # Several outputs take the dynamic-shape bug's path too (ExternKernelMultiOut): with the bug present, our
    # multi-output op is a plain fallback kernel like our single-output ones; another library's keeps its out variant.
    result = run_in_fresh_python(OTHER_LIBRARY + textwrap.dedent("""
        from flow import declarations, registration
        registration.register_with_pytorch([declarations.find("mul3")])  # applies the workaround to my_ops
        from torch._library._out_variant import to_out_variant
        from torch._inductor.utils import run_and_get_code
        result = {"scale": str(to_out_variant(torch.ops.other_lib.scale.default))}
        for ns in ("other_lib", "my_ops"):
            op = getattr(torch.ops, ns).halves.default
            y, (code,) = run_and_get_code(torch.compile(op, fullgraph=True), torch.ones(4))
            result[ns] = [str(to_out_variant(op)), f"{ns}.halves.out" in code, [t.tolist() for t in y]]
    """), timeout=600)
    halves = [[0.5] * 4, [0.5] * 4]
    assert result == {"scale": "other_lib.scale.out",
                      "other_lib": ["other_lib.halves.out", True, halves],
                      "my_ops": ["None" if torch_compat.inductor_fails_dynamic_out_lowering() else "my_ops.halves.out",
                                 not torch_compat.inductor_fails_dynamic_out_lowering(), halves]}


def test_nothing_happens_on_a_torch_without_the_patched_module():
    result = run_in_fresh_python("""
        import sys
        sys.modules["torch._library._out_variant"] = None  # as on a torch that never had it
        from flow import torch_compat
        torch_compat.apply("my_ops")
        result = sorted(torch_compat.applied_namespaces())
    """, fresh_imports=True)
    assert result == []


def test_one_patch_per_process_whichever_copy_applies_it(tmp_path):
    # The my_ops wheel carries a copy of torch_compat; both copies in one process share one patch and its namespaces.
    copy = tmp_path / "torch_compat_copy.py"
    copy.write_text(open(torch_compat.__file__).read())
    result = run_in_fresh_python(f"""
        import importlib.util, torch
        from flow import torch_compat
        spec = importlib.util.spec_from_file_location("torch_compat_copy", {str(copy)!r})
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        torch_compat.apply("my_ops")
        import torch._library._out_variant as out_variant
        patched = out_variant.to_out_variant
        other.apply("other_ns")
        result = [out_variant.to_out_variant is patched, sorted(torch_compat.applied_namespaces()),
                  sorted(other.applied_namespaces())]
    """)
    assert result == [True, ["my_ops", "other_ns"], ["my_ops", "other_ns"]]
