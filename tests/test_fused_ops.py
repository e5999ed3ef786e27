"""The fused ops of a decoder layer and the export pass that puts them into models nobody wrote for them
(my_ops/hf/fuse.py): my_ops::rope equal to its ATen reference bit for bit, my_ops::silu_mul within 3 ulp of
silu(gate) * up computed in float64 and my_ops::add_rms_norm giving the bits of an add and my_ops::rms_norm, in each
dtype, my_ops::rope_sdpa_with_cache giving the bits of the four ops it replaces, in the runtime, each program executed
twice; a fused program giving the unfused one's bits; the pass on the tiny Llama and Qwen3 checkpoints (every layer's rotary embedding and activation replaced, the graph computing the same bits,
a layer's ops in the program counted), transformers' own apply_rotary_pos_emb and both operand orders, near misses left
as ATen ops, and a fusion that finds nothing refused or reported by name."""

import math
import os

import pytest
import torch

from flow.compare import bit_difference
from flow.export import export_to_pte

pytestmark = pytest.mark.usefixtures("aot_ops", "python_ops")

FLOATING = [torch.float32, torch.float16, torch.bfloat16]


class CallRope(torch.nn.Module):
    def forward(self, x, cos, sin):
        return torch.ops.my_ops.rope(x, cos, sin)


class CallSiluMul(torch.nn.Module):
    def forward(self, gate, up):
        return torch.ops.my_ops.silu_mul(gate, up)


def angles(shape) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of Llama's rotation angles, shaped `shape`: its last dimension the width, the others positions."""
    width = shape[-1]
    position = torch.arange(math.prod(shape) // width, dtype=torch.float32)[:, None]
    half = position * 10000.0 ** (-torch.arange(0, width // 2, dtype=torch.float32) / (width // 2))
    full = torch.cat((half, half), dim=-1).reshape(shape)
    return full.cos(), full.sin()


def run_twice(load_method, pte: str, inputs: list) -> torch.Tensor:
    method = load_method(pte)
    first = method.execute(inputs)[0]
    second = method.execute(inputs)[0]
    assert bit_difference(first, second) is None  # the same program gives the same bits every time
    return second


# (x's shape, cos and sin's shape): the two head layouts, cos without its leading dimensions, a head size of 2.
ROPE_SHAPES = {"[B, T, H, D], cos [B, T, 1, D]": ((1, 5, 3, 64), (1, 5, 1, 64)),
               "[B, H, T, D], cos [B, 1, T, D]": ((2, 3, 5, 40), (1, 1, 5, 40)),
               "cos [T, D] for x [H, T, D]": ((4, 7, 18), (7, 18)),
               "D = 2": ((3, 2), (3, 2))}


@pytest.mark.parametrize("dtype", FLOATING, ids=str)
@pytest.mark.parametrize("shapes", ROPE_SHAPES.values(), ids=ROPE_SHAPES.keys())
def test_the_rope_kernel_equals_its_reference_bit_for_bit(shapes, dtype, load_method, tmp_path):
    from ops.rope.rope import rope_reference

    x_shape, table_shape = shapes
    generator = torch.Generator().manual_seed(11)
    x = (torch.randn(x_shape, generator=generator) * 30).to(dtype)
    x.view(-1)[:4] = torch.tensor([float("inf"), -0.0, float("nan"), 1e-30])  # specials ride through like ATen's
    cos, sin = (t.to(dtype) for t in angles(table_shape))
    pte = export_to_pte(CallRope(), (x, cos, sin), tmp_path / "rope.pte")
    actual = run_twice(load_method, pte, [x, cos, sin])
    assert bit_difference(actual, rope_reference(x, cos, sin)) is None


def silu_times_in_float64(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = gate.double()
    return g * torch.sigmoid(g) * up.double()


@pytest.mark.parametrize("dtype", FLOATING, ids=str)
def test_the_silu_mul_kernel_is_within_3_ulp_of_float64(dtype, load_method, tmp_path):
    # Every gate from -100 to 100 in 2^15 steps (where exp overflows and underflows, and past), a length that leaves a
    # tail after whole vectors, then the specials; up random.
    gate = torch.cat((torch.linspace(-100, 100, (1 << 15) + 7),
                      torch.tensor([0.0, -0.0, 1e-30, float("inf"), float("-inf"), float("nan")]))).to(dtype)
    up = torch.randn(gate.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    pte = export_to_pte(CallSiluMul(), (gate, up), tmp_path / "silu_mul.pte")
    actual = run_twice(load_method, pte, [gate, up]).double()
    expected = silu_times_in_float64(gate, up)
    special = ~torch.isfinite(gate.double()) | (gate.double() < -80)  # infinite, NaN or tiny products
    assert torch.equal(actual[special].isnan(), expected[special].isnan())
    finite = ~special
    ulp = torch.finfo(dtype).eps * expected[finite].abs() + torch.finfo(dtype).tiny
    # The C library's exp and four roundings in float; the 16-bit types round the sigmoid, the product and the result.
    bound = 3 if dtype == torch.float32 else 2
    assert ((actual[finite] - expected[finite]).abs() <= bound * ulp).all()
    assert ((actual[special] - expected[special]).abs().nan_to_num() <= 1e-30).all()


class CallGeluMul(torch.nn.Module):
    def forward(self, gate, up):
        return torch.ops.my_ops.gelu_mul(gate, up)


def gelu_tanh_times_in_float64(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    # 0.5 g (1 + tanh(z)) = g * sigmoid(2z): the sigmoid keeps float64's precision where tanh(z) rounds to -1.
    g = gate.double()
    return g * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)) * up.double()


@pytest.mark.parametrize("dtype", FLOATING, ids=str)
def test_the_gelu_mul_kernel_is_near_gelu_tanh_in_float64(dtype, load_method, tmp_path):
    # Every gate from -20 to 20 in 2^15 steps (through the tail where tanh(z) nears -1 and the exp overflows), a length
    # that leaves a tail after whole vectors, +-100, then the specials; up random.
    gate = torch.cat((torch.linspace(-20, 20, (1 << 15) + 7),
                      torch.tensor([100.0, -100.0, 0.0, -0.0, 1e-30, float("inf"), float("-inf"), float("nan")])))
    gate = gate.to(dtype)
    up = torch.randn(gate.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    pte = export_to_pte(CallGeluMul(), (gate, up), tmp_path / "gelu_mul.pte")
    actual = run_twice(load_method, pte, [gate, up]).double()
    expected = gelu_tanh_times_in_float64(gate, up)
    finite = torch.isfinite(gate.double())
    assert torch.equal(actual[~finite].isnan(), expected[~finite].isnan())  # inf * 1, -inf * 0, NaN
    assert torch.equal(actual[~finite].nan_to_num(), expected[~finite].nan_to_num())
    # A few roundings in float (the cubic, z, the exp, the quotient, the product; the 16-bit types round the gelu and
    # the product), plus what z's roundings do to exp(-2z) in the negative tail, where the result is far below the
    # inputs: at most float's epsilon of |gate * up| (ATen's 1 + tanh(z) in float loses all of it there).
    a, e = actual[finite], expected[finite]
    scale = (gate.double() * up.double()).abs()[finite]
    ulp = torch.finfo(dtype).eps * e.abs() + torch.finfo(dtype).tiny
    bound = (4 if dtype == torch.float32 else 2) * ulp + torch.finfo(torch.float32).eps * scale
    assert ((a - e).abs() <= bound).all(), (a - e).abs().sub(bound).max()


GATED_PROBE = """
import torch
from flow.runtime import load_kernel_library, load_method_checked
from helpers import path_counts
load_kernel_library({lib!r})
gate, up = torch.randn({n}), torch.randn({n})
result = {{}}
for name, pte in {ptes!r}.items():
    method = load_method_checked(pte)
    before = path_counts({lib!r})
    method.execute([gate, up])
    after = path_counts({lib!r})
    result[name] = {{isa: after[isa] - before[isa] for isa in ("baseline", "avx2", "avx512")}}
"""


def test_the_gated_activations_count_each_element_where_it_ran(combined_build, tmp_path):
    # A float32 range of a vector or more runs the vector exp of the best ISA (its tail of 7 too, counted with the
    # range, as every kernel's tail is); capped at the baseline, the scalar loop runs all of it.
    from helpers import COUNT_PATHS, run_in_fresh_python
    from test_kernel_paths import expected_isa, isas_here

    n = 4 * 1024 + 7
    ptes = {name: export_to_pte(module, (torch.randn(n), torch.randn(n)), str(tmp_path / f"{name}.pte"))
            for name, module in (("silu_mul", CallSiluMul()), ("gelu_mul", CallGeluMul()))}
    for cap in (None, *isas_here()[:-1]):
        env = dict(COUNT_PATHS, **({"CUSTOM_OPS_ISA": cap} if cap else {}))
        counts = run_in_fresh_python(GATED_PROBE.format(lib=combined_build.kernel_lib, n=n, ptes=ptes), env=env)
        isa = expected_isa(cap)
        for name in ptes:
            expected = {"baseline": 0, "avx2": 0, "avx512": 0}
            expected[isa] = n
            assert counts[name] == expected, (cap, name, counts)


@pytest.mark.parametrize("dtype", FLOATING, ids=str)
def test_the_add_rms_norm_kernel_gives_rms_norms_bits_of_the_sum(dtype, load_method, tmp_path):
    # The fusion must change no output: the sum equals ATen's add and the norm equals my_ops::rms_norm of it bit for
    # bit (the same row code); the norm is also held to the ATen reference, within rms_norm's tolerance.
    from ops.add_rms_norm.add_rms_norm import add_rms_norm_reference

    class CallAddRmsNorm(torch.nn.Module):
        def forward(self, x, residual, weight):
            return torch.ops.my_ops.add_rms_norm(x, residual, weight, 1e-5)

    generator = torch.Generator().manual_seed(4)
    x, residual = (torch.randn(2, 3, 200, generator=generator).to(dtype) for _ in range(2))
    weight = (1 + torch.randn(200, generator=generator) / 10).to(dtype)
    pte = export_to_pte(CallAddRmsNorm(), (x, residual, weight), tmp_path / "add_rms_norm.pte")
    method = load_method(pte)
    for _ in range(2):
        total, normed = method.execute([x, residual, weight])
        assert bit_difference(total, x + residual) is None
        assert bit_difference(normed, torch.ops.my_ops.rms_norm(x + residual, weight, 1e-5)) is None
    torch.testing.assert_close(normed, add_rms_norm_reference(x, residual, weight, 1e-5)[1])


class LayerAttention(torch.nn.Module):
    """A layer's attention after its fused projection, as the unfused program runs it (a split, rope on q and k,
    update_cache on k and v, sdpa_with_cache) or as one my_ops::rope_sdpa_with_cache."""

    def __init__(self, fused: bool, dtype, heads=16, kv_heads=4, head_dim=64, positions=32, window=0):
        super().__init__()
        self.fused, self.heads, self.kv_heads, self.head_dim, self.window = fused, heads, kv_heads, head_dim, window
        for name in ("k_cache", "v_cache"):
            self.register_buffer(name, torch.zeros(1, positions, kv_heads, head_dim, dtype=dtype))

    def forward(self, qkv, cos, sin, position):
        start = position.item()
        torch._check(start >= 0)
        torch._check(start + qkv.shape[1] <= self.k_cache.shape[1])
        if self.fused:
            return torch.ops.my_ops.rope_sdpa_with_cache(qkv, cos, sin, self.k_cache, self.v_cache, start, 0.1,
                                                         self.window)
        batch, length, d = qkv.shape[0], qkv.shape[1], self.head_dim
        q, k, v = qkv.split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q, k = (torch.ops.my_ops.rope(x.view(batch, length, -1, d), cos[:, :, None], sin[:, :, None]) for x in (q, k))
        torch.ops.my_ops.update_cache(k, self.k_cache, start)
        torch.ops.my_ops.update_cache(v.view(batch, length, -1, d), self.v_cache, start)
        return torch.ops.my_ops.sdpa_with_cache(q, self.k_cache, self.v_cache, start, 0.1, self.window)


@pytest.mark.parametrize("window", [0, 5], ids=["every position", "a sliding window"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_fused_attention_gives_the_bits_of_rope_update_cache_and_sdpa_with_cache(dtype, window, load_method,
                                                                                     tmp_path):
    # Three steps of 8 positions, the last two large enough for the pool; both caches, then the outputs, equal.
    generator = torch.Generator().manual_seed(7)
    steps = []
    for start in (0, 8, 16):
        cos, sin = (t[None].to(dtype) for t in angles((8, 64)))
        steps.append((torch.randn(1, 8, (16 + 2 * 4) * 64, generator=generator).to(dtype), cos, sin,
                      torch.tensor([start])))
    methods = {}
    for fused in (True, False):
        pte = export_to_pte(LayerAttention(fused, dtype, window=window), steps[0], tmp_path / f"attention_{fused}.pte")
        methods[fused] = load_method(pte)
    for step in steps:
        fused, unfused = (methods[f].execute(list(step))[0] for f in (True, False))
        assert bit_difference(fused, unfused) is None, int(step[3])


class LayerOps(torch.nn.Module):
    """A pre-norm decoder layer, as the unfused program runs it (rms_norm, linear_blocks, rope_sdpa_with_cache, the
    residual add, rms_norm, linear_blocks, the gate/up split, silu_mul, linear_blocks, the residual add) or as one
    my_ops::decoder_layer; each projection in its own format (a fifth format: v's projection apart from q and k's, in
    that format, as a file of llama-quantize's Q4_K_M has some layers). Large enough for the pool at one token."""

    MODEL, HEADS, KV_HEADS, HEAD_DIM, MLP, POSITIONS = 512, 8, 2, 64, 1024, 64

    def __init__(self, fused: bool, formats, extra_output: bool = False, eps=(1e-5, 1e-5), window=0):
        from ops.blocks.blocks import random_weight

        super().__init__()
        self.fused, self.formats, self.extra_output, self.eps, self.window = fused, formats, extra_output, eps, window
        generator = torch.Generator().manual_seed(1)
        m, h, kv, d, i = self.MODEL, self.HEADS, self.KV_HEADS, self.HEAD_DIM, self.MLP
        for name in ("input_norm", "post_norm"):
            self.register_buffer(name, 1 + 0.1 * torch.randn(m, generator=generator))
        v_apart = len(formats) == 5
        for name, fmt, outputs, inputs in (("qkv", formats[0], (h + (1 if v_apart else 2) * kv) * d, m),
                                           ("o", formats[1], m, h * d), ("gate_up", formats[2], 2 * i, m),
                                           ("down", formats[3], m, i), *((("v", formats[4], kv * d, m),) if v_apart
                                                                          else ())):
            self.register_buffer(name, random_weight(fmt, outputs, inputs, generator))
        for name in ("k_cache", "v_cache"):
            self.register_buffer(name, torch.zeros(1, self.POSITIONS, kv, d))

    def forward(self, hidden, cos, sin, position):
        start = position.item()
        torch._check(start >= 0)
        torch._check(start + hidden.shape[1] <= self.POSITIONS)
        ops, f = torch.ops.my_ops, self.formats
        v_apart = (self.v, f[4]) if len(f) == 5 else ()
        if self.fused:
            return ops.decoder_layer(hidden, self.input_norm, self.qkv, f[0], cos, sin, self.k_cache, self.v_cache,
                                     start, None, self.o, f[1], self.post_norm, self.gate_up, f[2], self.down, f[3],
                                     self.eps[0], *v_apart)
        normed = ops.rms_norm(hidden, self.input_norm, self.eps[0])
        qkv = ops.linear_blocks(normed, self.qkv, f[0])
        if v_apart:
            qkv = torch.cat([qkv, ops.linear_blocks(normed, *v_apart)], dim=-1)
        attended = ops.rope_sdpa_with_cache(qkv, cos, sin, self.k_cache, self.v_cache, start, None, self.window)
        h = hidden + ops.linear_blocks(attended.reshape(*hidden.shape[:2], -1), self.o, f[1])
        gate, up = ops.linear_blocks(ops.rms_norm(h, self.post_norm, self.eps[1]), self.gate_up, f[2]).split(
            self.MLP, dim=-1)
        out = h + ops.linear_blocks(ops.silu_mul(gate, up), self.down, f[3])
        return (out, h) if self.extra_output else out

    @classmethod
    def steps(cls):
        """A prompt of 5, two decode steps, 3 more, then 20 and 33 (row formats' activations in panels of 16 tokens,
        a short last one: float32's from 16 tokens, F16's and BF16's from 32): (hidden, cos, sin, position) each."""
        generator, steps = torch.Generator().manual_seed(2), []
        for start, length in ((0, 5), (5, 1), (6, 1), (7, 3), (10, 20), (30, 33)):
            cos, sin = angles((length + start, cls.HEAD_DIM))
            steps.append((torch.randn(1, length, cls.MODEL, generator=generator), cos[None, start:],
                          sin[None, start:], torch.tensor([start])))
        return steps


LAYER_FORMATS = {"Q8_0 Q4_1 Q4_K Q6_K": ("Q8_0", "Q4_1", "Q4_K", "Q6_K"),
                 "F32 BF16 F16 F32": ("F32", "BF16", "F16", "F32"),
                 "Q5_K Q3_K Q2_K Q5_0": ("Q5_K", "Q3_K", "Q2_K", "Q5_0"),
                 # v apart: Q4_K_M's layers with more bits in attn_v; q and k in a row format, v's blocks prepared
                 "Q4_K Q4_K Q4_K Q6_K, v Q6_K": ("Q4_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"),
                 "F32 BF16 F16 F32, v Q8_0": ("F32", "BF16", "F16", "F32", "Q8_0")}

LAYER_PROBE = """
import torch
from executorch.extension.pybindings import portable_lib
from flow import registration
from flow.export import export_to_pte
from models.decoding import register_ops
from flow.runtime import load_kernel_library, load_method_checked, path_counts
from test_fused_ops import LayerOps
register_ops({build_dir!r})
load_kernel_library({kernel_lib!r})
steps = LayerOps.steps()
length = torch.export.Dim("length", min=1, max=LayerOps.POSITIONS - 1)
dynamic = ({{1: length}}, {{1: length}}, {{1: length}}, None)
paths = {{fused: export_to_pte(LayerOps(fused, {formats!r}), steps[0], {out!r} + f"_{{fused}}.pte",
                              dynamic_shapes=dynamic) for fused in (True, False)}}
result = {{"differ": [], "handoffs": {{}}, "layer_work_ns": 0, "panel_outputs": {{"True": 0, "False": 0}}}}
for threads in (1, 2, 3):
    portable_lib._unsafe_reset_threadpool(threads)
    methods = {{fused: load_method_checked(path) for fused, path in paths.items()}}  # fresh caches
    for step in steps:
        outputs = {{}}
        for fused, method in methods.items():
            before = path_counts({kernel_lib!r})
            outputs[fused] = method.execute(list(step))[0]
            after = path_counts({kernel_lib!r})
            result["panel_outputs"][str(fused)] += after["row_panel_outputs"] - before["row_panel_outputs"]
            if threads == 2 and step[0].shape[1] == 1:  # a decode step
                result["handoffs"].setdefault(str(fused), []).append(after["pool_handoffs"] - before["pool_handoffs"])
                if fused:
                    result["layer_work_ns"] += after["layer_work_ns"] - before["layer_work_ns"]
        if not torch.equal(outputs[True], outputs[False]):
            result["differ"].append([threads, int(step[3]), (outputs[True] - outputs[False]).abs().max().item()])
"""


def layer_cases() -> list:
    """Each format set on this CPU's best code; the row formats' also capped at AVX2 where the CPU has more (the
    layer's prefill panels and decode rows on the other vector code)."""
    from test_kernel_paths import hardware_isa

    cases = [pytest.param(formats, None, id=name) for name, formats in LAYER_FORMATS.items()]
    if hardware_isa() == "avx512":
        cases.append(pytest.param(LAYER_FORMATS["F32 BF16 F16 F32"], "avx2", id="F32 BF16 F16 F32, avx2"))
    return cases


@pytest.mark.parametrize("formats, cap", layer_cases())
def test_the_decoder_layer_gives_the_bits_of_the_ops_it_replaces_in_one_hand_off(formats, cap, combined_build,
                                                                                   tmp_path):
    # Each format's kernels, prompts and decode steps over the caches the steps before wrote, at 1, 2 and 3 threads
    # (a fresh process: the pool is the process's): every output equal to the unfused program's, bit for bit. At a
    # decode step on 2 threads the layer hands the pool one range where the ops it replaces hand it four (the
    # projections; attention over 6 positions and a v apart, 128 outputs, stay on the calling thread), and its time
    # counts as a layer's.
    from helpers import COUNT_PATHS, run_in_fresh_python
    from test_kernel_paths import expected_isa

    result = run_in_fresh_python(LAYER_PROBE.format(build_dir=combined_build.build_dir,
                                                    kernel_lib=combined_build.kernel_lib, formats=formats,
                                                    out=str(tmp_path / "layer")),
                                 env=dict(COUNT_PATHS, **({"CUSTOM_OPS_ISA": cap} if cap else {})), timeout=600)
    assert result["differ"] == []
    assert result["handoffs"] == {"True": [1, 1], "False": [4, 4]}, result
    # Row formats' prefills in panels (the vector code's), in the layer as in the ops it replaces (the same outputs).
    panels = result["panel_outputs"]
    in_panels = "F32" in formats and expected_isa(cap) != "baseline"
    assert panels["True"] == panels["False"] and (panels["True"] > 0) == in_panels, result
    assert result["layer_work_ns"] > 0


def test_a_layer_exported_before_v_could_be_apart_still_runs(load_method, combined_build, tmp_path):
    # A program of the schema without v_weight and v_format (its call passes two values fewer) runs as if it passed
    # None for both, in the runner and the Python runtime; a call one value shorter still is refused in one line.
    from flow import program
    from helpers import run_runner
    from pte_surgery import edit_plan
    from test_untrusted_programs import assert_one_error_line

    steps = DecoderLayerNearMiss.steps()
    layer = DecoderLayerNearMiss(True, ("F32", "F16", "BF16", "F32"))
    pte = export_to_pte(layer, steps[0], tmp_path / "layer.pte")

    def drop(count):
        def edit(plan):
            names = [f"{o.name}.{o.overload}" for o in plan.operators]
            (call,) = [i.instr_args for chain in plan.chains for i in chain.instructions
                       if type(i.instr_args).__name__ == "KernelCall"
                       and names[i.instr_args.op_index] == "my_ops::decoder_layer.out"]
            assert [type(plan.values[v].val).__name__ for v in call.args[18:20]] == ["Null", "Null"]
            del call.args[20 - count:20]
        return edit

    older = edit_plan(pte, str(tmp_path / "older.pte"), drop(2))
    expected = run_twice(load_method, pte, list(steps[0]))
    assert bit_difference(run_twice(load_method, older, list(steps[0])), expected) is None
    runs = [run_runner(combined_build.runner, f"--model_path={path}", f"--outputs={path}.out") for path in (pte, older)]
    assert [proc.returncode for proc in runs] == [0, 0], runs[1].stderr
    assert open(f"{pte}.out", "rb").read() == open(f"{older}.out", "rb").read()
    shorter = edit_plan(pte, str(tmp_path / "shorter.pte"), drop(3))
    assert_one_error_line(run_runner(combined_build.runner, f"--model_path={shorter}"),
                          "my_ops::decoder_layer.out: the program passes 19 values, the kernel takes 21 arguments")
    with pytest.raises(program.ProgramError, match="^my_ops::decoder_layer.out is called with 19 values"):
        program.check(shorter)


BAD_LAYER_ARGUMENTS = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
{setup}
from ops.decoder_layer.decoder_layer import example

model, runs = example()
hidden, cos, sin, position = runs[0]
good = dict(hidden=hidden, input_norm=model.input_norm, qkv_weight=model.qkv, qkv_format="F32", cos=cos, sin=sin,
            key_cache=model.k_cache, value_cache=model.v_cache, start_pos=0, scale=None, o_weight=model.o,
            o_format="F16", post_norm=model.post_norm, gate_up_weight=model.gate_up, gate_up_format="BF16",
            down_weight=model.down, down_format="F32", eps=1e-5, v_weight=None, v_format=None)
q_and_k = model.qkv.shape[0] - model.k_cache.shape[2] * model.k_cache.shape[3]  # the rows before v's
bad = {{
    "an unknown format": dict(o_format="Q9_K"),
    "a row format's dtype": dict(gate_up_weight=model.gate_up.float()),
    "bytes that are not whole blocks": dict(qkv_weight=torch.zeros(model.qkv.shape[0], 33, dtype=torch.uint8),
                                            qkv_format="Q8_0"),
    "blocks holding other inputs": dict(down_weight=torch.zeros(64, 2 * 34, dtype=torch.uint8), down_format="Q8_0"),
    "other outputs": dict(o_weight=model.o[:-1]),
    "a table for other positions": dict(sin=sin[:, :1]),
    "tables of two shapes": dict(cos=cos.expand(3, -1, -1)),
    "positions past the cache": dict(start_pos=model.k_cache.shape[1] - 1),
    "a negative start": dict(start_pos=-1),
    "a scale that is not finite": dict(scale=float("inf")),
    "v_weight without its format": dict(qkv_weight=model.qkv[:q_and_k], v_weight=model.qkv[q_and_k:]),
    "v_format without a weight": dict(v_format="F32"),
    "v apart, and q, k and v's rows in qkv_weight": dict(v_weight=model.qkv[q_and_k:], v_format="F32"),
    "a v_weight of other outputs": dict(qkv_weight=model.qkv[:q_and_k], v_weight=model.qkv[q_and_k + 1:],
                                        v_format="F32"),
    "a v_weight in a format it is not": dict(qkv_weight=model.qkv[:q_and_k], v_weight=model.qkv[q_and_k:],
                                             v_format="BF16"),
}}


def refusal(changes, fake):
    arguments = dict(good, **changes)
    arguments["key_cache"], arguments["value_cache"] = model.k_cache.clone(), model.v_cache.clone()
    try:  # the out variant: what the runtime kernel is
        if fake:
            with FakeTensorMode(allow_non_fake_inputs=True):
                torch.ops.my_ops.decoder_layer.out(*arguments.values(), out=torch.empty(0))
        else:
            torch.ops.my_ops.decoder_layer.out(*arguments.values(), out=torch.empty(0))
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None


result = {{case: [refusal(changes, fake) for fake in {fakes}] for case, changes in bad.items()}}
"""


def test_the_layers_python_checks_refuse_as_its_kernel_does(combined_build):
    # decoder_layer.py writes the runtime kernel's checks out again in Python (its projections' formats from
    # ops/blocks/block_layouts.py): its eager and export-time refusals equal the runtime kernel's (decoder_layer_out.cpp,
    # in ATen mode in the library for processes without Python; a process of its own, where decoder_layer.py finds the
    # op defined and only gives the example).
    from helpers import run_in_fresh_python

    def library(name):
        return f"torch.ops.load_library({os.path.join(combined_build.build_dir, name)!r})"

    python = run_in_fresh_python(BAD_LAYER_ARGUMENTS.format(
        setup=library("libcustom_ops_aot_lib.so") + "\nimport ops.rope_sdpa_with_cache.rope_sdpa_with_cache",
        fakes=[False, True]))
    cpp = run_in_fresh_python(BAD_LAYER_ARGUMENTS.format(setup=library("libcustom_ops_without_python.so"),
                                                         fakes=[False]))
    assert all(messages[0] and messages[0].startswith("my_ops::decoder_layer.out: ") for messages in python.values())
    assert {case: [messages[0]] * 2 for case, messages in cpp.items()} == python


class DecoderLayerNearMiss(LayerOps):
    MODEL, HEADS, KV_HEADS, HEAD_DIM, MLP, POSITIONS = 64, 4, 2, 16, 96, 16


@pytest.mark.parametrize("model", [DecoderLayerNearMiss(False, ("F32",) * 4, extra_output=True),
                                   DecoderLayerNearMiss(False, ("F32",) * 4, eps=(1e-5, 1e-6)),
                                   DecoderLayerNearMiss(False, ("F32",) * 4, window=3)],
                         ids=["the residual read elsewhere", "two norms' eps differ",
                              "a sliding window (decoder_layer attends to every position)"])
def test_a_near_miss_of_a_layer_keeps_its_ops(model):
    inputs = DecoderLayerNearMiss.steps()[0]
    report, program = assert_same_bits(model, inputs)
    assert report.counts["layer"] == 0 and report.counts["add_norm"] == 1
    assert "my_ops.decoder_layer.default" not in targets(program)


@pytest.mark.parametrize("formats", [("F32", "F16", "BF16", "F32"), ("F32", "F16", "BF16", "F32", "BF16")],
                         ids=["q, k and v in one projection", "v's projection apart"])
def test_the_pass_finds_the_layer_it_is_written_for(formats):
    report, program = assert_same_bits(DecoderLayerNearMiss(False, formats), DecoderLayerNearMiss.steps()[0])
    assert report.counts["layer"] == 1 and report.missing(report.counts) == []
    assert [t for t in targets(program) if t.startswith("my_ops.")] == ["my_ops.decoder_layer.default"]
    layer = next(n for n in program.graph.nodes if str(n.target) == "my_ops.decoder_layer.default")
    assert layer.args[18:] == (() if len(formats) == 4 else (layer.args[18], "BF16"))  # v's weight and format


# ---- The pass ----------------------------------------------------------------------------------------------------

def exported(module, inputs):
    return torch.export.export(module, tuple(inputs), strict=True)


def fuse(program, fusions=None):
    from my_ops.hf.fuse import fuse as fuse_pass

    return fuse_pass(program, fusions)


def targets(program) -> list[str]:
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def assert_same_bits(module, inputs, **fusions):
    """Fuses an export of `module`; returns the report after checking the fused graph gives the unfused one's bits."""
    plain, fused = exported(module, inputs), exported(module, inputs)
    report = fuse(fused, **fusions)
    for a, b in zip(plain.module()(*inputs), fused.module()(*inputs)):
        assert bit_difference(b, a) is None
    return report, fused


class TransformersRotary(torch.nn.Module):
    """transformers' own apply_rotary_pos_emb: q and k as [B, H, T, D], cos and sin unsqueezed at 1 once for both."""

    def forward(self, q, k, cos, sin):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        return apply_rotary_pos_emb(q, k, cos, sin)


class CommutedRotary(torch.nn.Module):
    """The same rotation written with every multiply and the add the other way round."""

    def forward(self, x, cos, sin):
        half = x.shape[-1] // 2
        return sin * torch.cat((-x[..., half:], x[..., :half]), dim=3) + cos * x


def rotary_inputs(heads=(4, 2), length=3, width=16):
    generator = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, h, length, width, generator=generator) for h in heads)
    cos, sin = angles((1, length, width))
    return q, k, cos, sin


def test_the_pass_finds_transformers_rotary_embedding_and_either_operand_order():
    report, program = assert_same_bits(TransformersRotary(), rotary_inputs())
    assert report.counts["rope"] == 2
    assert not {"aten.cat.default", "aten.neg.default", "aten.mul.Tensor"} & set(targets(program))
    q, _, cos, sin = rotary_inputs()
    report, _ = assert_same_bits(CommutedRotary(), (q, cos[:, None], sin[:, None]))
    assert report.counts["rope"] == 1


class NearMiss(torch.nn.Module):
    def __init__(self, rotate):
        super().__init__()
        self.rotate = rotate

    def forward(self, x, cos, sin):
        return x * cos + self.rotate(x) * sin


NEAR_MISSES = {
    "halves swapped": lambda x: torch.cat((-x[..., :8], x[..., 8:]), dim=-1),
    "a split off the middle": lambda x: torch.cat((-x[..., 5:], x[..., :5]), dim=-1),
    "the other half negated": lambda x: torch.cat((x[..., 8:], -x[..., :8]), dim=-1),
    "the negated half one early": lambda x: torch.cat((-x[..., 7:15], x[..., :8]), dim=-1),
    "the other half one late": lambda x: torch.cat((-x[..., 8:], x[..., 1:9]), dim=-1),
    "rotated along the heads": lambda x: torch.cat((-x[:, 2:], x[:, :2]), dim=1),
}


@pytest.mark.parametrize("rotate", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_a_near_miss_of_rope_stays_aten_ops(rotate):
    q, _, cos, sin = rotary_inputs(heads=(4, 4))
    report, _ = assert_same_bits(NearMiss(rotate), (q, cos[:, None], sin[:, None]))
    assert report.counts["rope"] == 0


class Gated(torch.nn.Module):
    def __init__(self, keep_activation=False, activation=torch.nn.functional.silu):
        super().__init__()
        self.keep_activation = keep_activation
        self.activation = activation

    def forward(self, gate, up):
        activation = self.activation(gate)
        out = up * activation  # the other operand order
        return (out, activation) if self.keep_activation else (out,)


def test_the_pass_finds_swiglu_and_leaves_what_the_op_cannot_take():
    gate, up = torch.randn(2, 5, 24), torch.randn(2, 5, 24)
    report, program = assert_same_bits(Gated(), (gate, up))
    assert report.counts["swiglu"] == 1 and "aten.silu.default" not in targets(program)
    # The activation used elsewhere too, and an up that broadcasts: silu_mul computes neither.
    assert assert_same_bits(Gated(keep_activation=True), (gate, up))[0].counts["swiglu"] == 0
    assert assert_same_bits(Gated(), (gate, torch.randn(24)))[0].counts["swiglu"] == 0


def gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def test_the_pass_finds_geglu_and_leaves_the_exact_gelu():
    gate, up = torch.randn(2, 5, 24), torch.randn(2, 5, 24)
    report, program = assert_same_bits(Gated(activation=gelu_tanh), (gate, up))
    assert (report.counts["geglu"], report.counts["swiglu"]) == (1, 0) and "aten.gelu.default" not in targets(program)
    assert report.missing(["swiglu", "geglu"]) == []  # an MLP gates one way: the other is not missing
    # The exact (erf) gelu is another function, the activation used elsewhere, an up that broadcasts: all left.
    for module, inputs in ((Gated(activation=torch.nn.functional.gelu), (gate, up)),
                           (Gated(keep_activation=True, activation=gelu_tanh), (gate, up)),
                           (Gated(activation=gelu_tanh), (gate, torch.randn(24)))):
        report, program = assert_same_bits(module, inputs)
        assert report.counts["geglu"] == 0 and "aten.gelu.default" in targets(program)
        assert report.missing(["swiglu", "geglu"]) == ["swiglu", "geglu"]


class ResidualNorm(torch.nn.Module):
    def __init__(self, width=24):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x, block_output):
        total = block_output + x  # either operand order: the add is commutative and the op computes x + residual
        return total, torch.ops.my_ops.rms_norm(total, self.weight, 1e-5)


def test_the_pass_finds_a_residual_add_and_its_norm_and_keeps_the_sum():
    x = torch.randn(2, 5, 24)
    report, program = assert_same_bits(ResidualNorm(), (x, torch.randn(2, 5, 24)))
    assert report.counts["add_norm"] == 1
    assert not {"aten.add.Tensor", "my_ops.rms_norm.default"} & set(targets(program))
    # A bias-like add (it broadcasts) is not a residual: left alone.
    assert assert_same_bits(ResidualNorm(), (x, torch.randn(24)))[0].counts["add_norm"] == 0


class SplitAttention(torch.nn.Module):
    """my_ops.hf's attention after its projection, in ATen's rotation: split, view, rotate, write, attend. `peek` also
    reads the key cache after the write (a program that uses it elsewhere), `value_first` splits v before k,
    `query_from_value` (every part 2 heads wide) attends with the rotated v part as the query; `window` > 0 attends
    within a sliding window."""

    def __init__(self, peek=False, value_first=False, query_from_value=False, window=0):
        super().__init__()
        self.peek, self.value_first, self.query_from_value, self.window = peek, value_first, query_from_value, window
        for name in ("k_cache", "v_cache"):
            self.register_buffer(name, torch.zeros(1, 16, 2, 8))

    def forward(self, qkv, cos, sin, position):
        start = position.item()
        torch._check(start >= 0)
        torch._check(start + qkv.shape[1] <= 16)
        q, k, v = qkv.split([16, 16, 16] if self.query_from_value else [32, 16, 16], dim=-1)
        if self.value_first:
            k, v = v, k
        if self.query_from_value:
            q = v
        q = q.view(1, qkv.shape[1], -1, 8)
        k, v = k.view(1, qkv.shape[1], 2, 8), v.view(1, qkv.shape[1], 2, 8)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        rotated = [x * cos + torch.cat((-x[..., 4:], x[..., :4]), dim=-1) * sin for x in (q, k)]
        torch.ops.my_ops.update_cache(rotated[1], self.k_cache, start)
        torch.ops.my_ops.update_cache(v, self.v_cache, start)
        out = torch.ops.my_ops.sdpa_with_cache(rotated[0], self.k_cache, self.v_cache, start, 0.3, self.window)
        return (out, self.k_cache.sum()) if self.peek else (out,)


def attention_inputs(length=3, width=64):
    cos, sin = (t[None] for t in angles((length, 8)))
    return torch.randn(1, length, width, generator=torch.Generator().manual_seed(2)), cos, sin, torch.tensor([1])


@pytest.mark.parametrize("window", [0, 2])
def test_the_pass_fuses_attention_from_atens_rotation_alone_with_the_same_bits(window):
    # Three positions from 1: a window of 2 slides for each of them, so a window dropped by the pass changes bits.
    report, program = assert_same_bits(SplitAttention(window=window), attention_inputs(), fusions=["attention"])
    assert report.counts == {"attention": 1}
    (fused,) = [n for n in program.graph.nodes if str(n.target) == "my_ops.rope_sdpa_with_cache.default"]
    assert fused.args[7] == window
    assert not {"my_ops.update_cache.default", "my_ops.sdpa_with_cache.default", "aten.split_with_sizes.default",
                "aten.cat.default"} & set(targets(program))


@pytest.mark.parametrize("model", [SplitAttention(peek=True), SplitAttention(value_first=True),
                                   SplitAttention(query_from_value=True)],
                         ids=["the cache read elsewhere", "k and v swapped in the split", "the query from v's part"])
def test_a_near_miss_of_attention_stays_four_ops(model):
    report, program = assert_same_bits(model, attention_inputs(width=48 if model.query_from_value else 64))
    assert report.counts["attention"] == 0 and report.counts["rope"] == 2
    assert targets(program).count("my_ops.update_cache.default") == 2


def test_a_fusion_asked_for_by_name_and_absent_is_refused_by_name():
    import my_ops.hf

    program = exported(TransformersRotary(), rotary_inputs())
    with pytest.raises(my_ops.hf.UnsupportedModelError,
                       match=r"no place for swiglu \(my_ops::silu_mul\) in this model: it does not compute "
                             r"silu\(gate\) \* up; leave it out of fusions"):
        fuse(program, ["rope", "swiglu"])
    with pytest.raises(my_ops.hf.UnsupportedModelError, match=r"unknown fusion\(s\) \['gelu'\]"):
        fuse(exported(TransformersRotary(), rotary_inputs()), ["gelu"])
    report = fuse(exported(TransformersRotary(), rotary_inputs()))  # None: what is found, the rest named
    assert report.missing(["rope", "swiglu", "add_norm"]) == ["swiglu", "add_norm"] and report.counts["rope"] == 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import my_ops.hf  # noqa: F401  (after the ops are registered)
    from examples import hf_models

    return hf_models, tmp_path_factory.mktemp("fuse_checkpoints")


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_every_layer_of_a_transformers_decoder_is_fused_and_computes_the_same_bits(name, tiny):
    import my_ops.hf

    hf_models, root = tiny
    directory = hf_models.make_checkpoint(name, str(root / name))
    layers = hf_models.configs()[name].num_hidden_layers
    decoder = my_ops.hf.prepare(hf_models.load(directory), max_seq_len=32)
    inputs = (torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([2]))
    plain = torch.export.export(decoder, inputs, dynamic_shapes=decoder.dynamic_shapes(), strict=True)
    program = torch.export.export(decoder, inputs, dynamic_shapes=decoder.dynamic_shapes(), strict=True)
    report = fuse(program)
    # Llama: each layer one my_ops::decoder_layer, its adds and norms inside (the final norm reads the last layer's
    # output: no add before it). Qwen3's norms on q and k sit between the split and the rotation: its attention stays
    # four ops (rope's already in), so its layers stay several ops, with a norm after each residual add: two a layer.
    llama = name == "llama"
    assert report.counts == {"rope": 2 * layers, "attention": layers if llama else 0, "swiglu": layers, "geglu": 0,
                             "layer": layers if llama else 0, "add_norm": 0 if llama else 2 * layers}
    assert report.missing(report.counts) == ([] if llama else ["attention", "layer"])
    left = targets(program)
    assert not {"aten.cat.default", "aten.neg.default", "aten.silu.default"} & set(left)
    assert left.count("aten.unsqueeze.default") <= 3  # the positions', cos' and sin's: once for all layers
    assert bit_difference(program.module()(*inputs), plain.module()(*inputs)) is None


def kernel_calls(program) -> int:
    """The ops one execution of an ExecutorchProgramManager's forward runs (straight-line code): its kernel calls but
    the runtime's own primitives (executorch_prim: a view's metadata, integer arithmetic), as ETDump counts ops."""
    from executorch.exir.schema import KernelCall

    plan = program.executorch_program.execution_plan[0]
    calls = [plan.operators[i.instr_args.op_index].name for chain in plan.chains for i in chain.instructions
             if isinstance(i.instr_args, KernelCall)]
    return sum(not name.startswith("executorch_prim::") for name in calls)


def test_the_fused_program_gives_the_unfused_programs_bits(tiny, load_method, tmp_path):
    # Each fused op computes what the ops it replaces computed in the runtime (rope and add_rms_norm their ATen ops'
    # bits, silu_mul ExecuTorch's sigmoid and two multiplies): a prompt, then steps, in both programs, every logit equal.
    import my_ops.hf

    hf_models, root = tiny
    directory = hf_models.make_checkpoint("llama", str(root / "same_bits"))
    methods = {}
    for fusions in (None, ()):
        path = tmp_path / f"llama_{'fused' if fusions is None else 'unfused'}.pte"
        path.write_bytes(my_ops.hf.export_program(hf_models.load(directory), max_seq_len=32, fusions=fusions).buffer)
        methods[fusions] = load_method(path)
    steps = [(torch.tensor([[3, 1, 4, 1, 5]]), 0), *((torch.tensor([[t]]), p) for t, p in ((9, 5), (2, 6), (6, 7)))]
    for tokens, position in steps:
        fused, unfused = (methods[f].execute([tokens, torch.tensor([position])])[0] for f in (None, ()))
        assert bit_difference(fused, unfused) is None, position


def test_gemmas_gated_mlp_runs_as_gelu_mul_near_the_unfused_programs_logits(tiny, load_method, tmp_path):
    # Gemma 3's MLP gates with gelu(approximate="tanh"): every layer's becomes my_ops::gelu_mul (ExecuTorch's gelu is
    # gone from the program), whose one exp is not the gelu kernel's tanh: the logits stay within float32 rounding of
    # the unfused program's, and so do the greedy tokens, over a prompt and three steps.
    import my_ops.hf

    hf_models, root = tiny
    directory = hf_models.make_checkpoint("gemma3", str(root / "gemma3"))
    methods = {}
    for fusions in (None, ()):
        program = my_ops.hf.export_program(hf_models.load(directory), max_seq_len=32, fusions=fusions)
        operators = {op.name for op in program.executorch_program.execution_plan[0].operators}
        assert ("my_ops::gelu_mul" in operators, "aten::gelu" in operators) == (fusions is None, fusions == ())
        path = tmp_path / f"gemma3_{'fused' if fusions is None else 'unfused'}.pte"
        path.write_bytes(program.buffer)
        methods[fusions] = load_method(path)
    steps = [(torch.tensor([[3, 1, 4, 1, 5]]), 0), *((torch.tensor([[t]]), p) for t, p in ((9, 5), (2, 6), (6, 7)))]
    for tokens, position in steps:
        fused, unfused = (methods[f].execute([tokens, torch.tensor([position])])[0] for f in (None, ()))
        torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-5 * unfused.abs().max().item())
        assert torch.equal(fused.argmax(-1), unfused.argmax(-1)), position


def test_a_layer_adds_one_op_to_a_step(tiny):
    # The ops one decoder layer adds to the program: a program of two layers less one of one. Fused:
    # my_ops::decoder_layer (9 with the layer's parts fused alone: two residual adds with their norms, four linear
    # layers, attention, the gate/up split and silu_mul; 34 unfused).
    import my_ops.hf

    hf_models, root = tiny
    calls = {}
    for layers in (1, 2):
        directory = hf_models.make_checkpoint("llama", str(root / f"llama_{layers}"), num_hidden_layers=layers)
        calls[layers] = kernel_calls(my_ops.hf.export_program(hf_models.load(directory), max_seq_len=32))
    assert calls[2] - calls[1] == 1, calls


def test_a_model_without_a_pattern_exports_and_is_told_which(tiny):
    import my_ops.hf

    hf_models, root = tiny
    directory = hf_models.make_checkpoint("llama", str(root / "gelu"), hidden_act="gelu", num_hidden_layers=1)
    # The exact gelu is neither gated activation; a layer needs swiglu.
    with pytest.warns(UserWarning, match="this model computes no swiglu, geglu, layer pattern"):
        my_ops.hf.export_program(hf_models.load(directory), max_seq_len=32)
    with pytest.raises(my_ops.hf.UnsupportedModelError, match=r"no place for swiglu \(my_ops::silu_mul\)"):
        my_ops.hf.export_program(hf_models.load(directory), max_seq_len=32, fusions=["rope", "swiglu"])
