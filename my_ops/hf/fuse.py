"""The export pass that puts the project's fused ops into a graph nobody wrote for them: between torch.export and
EXIR's lowering, it finds patterns a decoder computes in ATen ops and replaces each with one op of the project's:

  rope      x * cos + cat(-x[..., D/2:], x[..., :D/2]) * sin   ->  my_ops::rope(x, cos, sin)   (ten ops -> one)
  swiglu    silu(gate) * up                                     ->  my_ops::silu_mul(gate, up)  (three -> one)
  geglu     gelu(gate, approximate="tanh") * up                 ->  my_ops::gelu_mul(gate, up)  (two -> one; Gemma's)
  add_norm  s = x + residual; my_ops::rms_norm(s, w, eps)       ->  my_ops::add_rms_norm(x, residual, w, eps)
                                                                    (two -> one; s is still an output)
  attention q, k, v = split(qkv); update_cache(rope(k), kc, p);     ->  my_ops::rope_sdpa_with_cache(qkv, cos, sin,
            update_cache(v, vc, p); sdpa_with_cache(rope(q), kc, vc, p, s, w)   kc, vc, p, s, w)   (six -> one)
  layer     h = x + o(attention(qkv(rms_norm(x))));                  ->  my_ops::decoder_layer(x, ...)  (a layer's
            h + down(silu_mul(gate_up(rms_norm(h))))                      ops -> one; one hand-off to the thread pool)

then merges the copies of one unsqueeze of cos and sin that every layer makes (transformers unsqueezes them per call).
The patterns are matched on the ops' meaning, not on one model's source: either operand order of a multiply or an add,
any layout of the heads (cos broadcast as [B, 1, T, D] or [B, T, 1, D]), q and k with or without Qwen3's norms before.
What a pattern needs to hold (the rotated dimension is the last and even, the halves are D/2, shapes and dtypes that
the op takes) is checked at each match; a near miss stays as ATen ops. Each fusion reports what it replaced, and a
fusion asked for by name that finds nothing is refused by name (a model without it needs no such op).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch

from .swap import UnsupportedModelError

aten = torch.ops.aten
FUSIONS = {"rope": "my_ops::rope", "attention": "my_ops::rope_sdpa_with_cache",  # fusion -> the op it puts in
           "swiglu": "my_ops::silu_mul", "geglu": "my_ops::gelu_mul", "layer": "my_ops::decoder_layer",
           "add_norm": "my_ops::add_rms_norm"}
# What a fusion's op holds of the others': where it found its pattern, theirs are inside it, not missing.
_CONTAINS = {"attention": ("rope",), "layer": ("rope", "attention", "swiglu", "add_norm")}
# Fusions of which a model computes one: an MLP gates with silu or with gelu, so the other is not missing.
_EITHER = {"swiglu": "geglu", "geglu": "swiglu"}
_FLOATING = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Fused:
    """What the pass did: per fusion, how many places it put its op."""
    counts: dict[str, int] = field(default_factory=dict)
    merged_unsqueezes: int = 0
    gone: frozenset = frozenset()  # my_ops' ops no longer in the graph: all their calls went into fused ops

    def missing(self, fusions) -> list[str]:
        """The fusions that found no place of their own nor inside a fusion that contains them."""
        found = {name for name, count in self.counts.items() if count}
        found |= {part for name in found for part in _CONTAINS.get(name, ())}
        return [name for name in fusions if name not in found and _EITHER.get(name) not in found]

    def ops(self) -> tuple[str, ...]:
        """The fused ops the pass put in that are still in the graph (a rope's may have gone into attention)."""
        return tuple(FUSIONS[name] for name, count in self.counts.items() if count and FUSIONS[name] not in self.gone)

    def __str__(self) -> str:
        found = ", ".join(f"{name} x{count}" for name, count in self.counts.items() if count) or "nothing"
        return f"fused: {found}; {self.merged_unsqueezes} repeated unsqueezes merged"


def _value(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is(node, *targets) -> bool:
    """Whether `node` calls one of `targets`: ops, or my_ops' by name (they may be registered after this import)."""
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and (node.target in targets or str(node.target) in targets))


def _last_dim(dim: int, rank: int) -> bool:
    return dim in (-1, rank - 1)


def _half_of(node, x, first: bool):
    """Whether `node` is x[..., :D/2] (first) or x[..., D/2:] along x's last dimension."""
    if not _is(node, aten.slice.Tensor) or node.args[0] is not x:
        return False
    rank, width = _value(x).dim(), _value(x).shape[-1]
    dim, start, end = (list(node.args[1:]) + [0, None, None])[:3]
    if not _last_dim(dim, rank) or not isinstance(width, int) or width % 2:
        return False
    half = width // 2
    if first:
        return start in (0, None) and end == half
    return start == half and (end is None or (isinstance(end, int) and end >= width))


def _rotated_half_of(cat):
    """x when `cat` is cat([-x[..., D/2:], x[..., :D/2]], -1), else None."""
    if not _is(cat, aten.cat.default) or len(cat.args[0]) != 2:
        return None
    negated, first = cat.args[0]
    if not _is(negated, aten.neg.default) or not _is(first, aten.slice.Tensor):
        return None
    x = first.args[0]
    if _value(x) is None or not _last_dim(cat.args[1] if len(cat.args) > 1 else 0, _value(x).dim()):
        return None
    return x if _half_of(first, x, True) and _half_of(negated.args[0], x, False) else None


def _broadcasts_to(table, x) -> bool:
    t, v = _value(table), _value(x)
    if t is None or t.dtype != v.dtype or not 1 <= t.dim() <= v.dim() or t.shape[-1] != v.shape[-1]:
        return False
    return all(t.shape[-k] == 1 or t.shape[-k] == v.shape[-k] for k in range(2, t.dim() + 1))


def _rope_operands(add):
    """((x, cos, sin), [add], []) when `add` computes x * cos + rotate_half(x) * sin (in either order), else None."""
    if not _is(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    for straight, rotated in (add.args, add.args[::-1]):
        if not (_is(straight, aten.mul.Tensor) and _is(rotated, aten.mul.Tensor)):
            continue
        for cat, sin in (rotated.args, rotated.args[::-1]):
            x = _rotated_half_of(cat)
            if x is None or x not in straight.args or _value(x).dtype not in _FLOATING:
                continue
            cos = straight.args[1] if straight.args[0] is x else straight.args[0]
            if (_broadcasts_to(cos, x) and _broadcasts_to(sin, x) and _value(cos).shape == _value(sin).shape
                    and _value(add).shape == _value(x).shape):
                return (x, cos, sin), [add], []
    return None


def _gated_operands(mul, is_activation):
    """((gate, up), [mul], []) when `mul` computes activation(gate) * up (in either order) on one shape and dtype, the
    activation a node `is_activation` accepts and used only there, else None."""
    if not _is(mul, aten.mul.Tensor) or len(mul.args) != 2:
        return None
    for activation, up in (mul.args, mul.args[::-1]):
        if not is_activation(activation) or len(activation.users) != 1:
            continue
        gate = activation.args[0]
        g, u = _value(gate), _value(up)
        if g is not None and u is not None and g.shape == u.shape and g.dtype == u.dtype and g.dtype in _FLOATING:
            return (gate, up), [mul], []
    return None


def _swiglu_operands(mul):
    """silu(gate) * up: _gated_operands' answer."""
    return _gated_operands(mul, lambda node: _is(node, aten.silu.default))


def _is_gelu_tanh(node) -> bool:
    """Whether `node` is aten.gelu with approximate="tanh" (the exact, erf form is another function)."""
    if not _is(node, aten.gelu.default) or len(node.args) != 1 + ("approximate" not in node.kwargs):
        return False
    return (node.args[1] if len(node.args) > 1 else node.kwargs["approximate"]) == "tanh"


def _geglu_operands(mul):
    """gelu(gate, approximate="tanh") * up: _gated_operands' answer."""
    return _gated_operands(mul, _is_gelu_tanh)


def _eps(norm) -> float:
    """A my_ops::rms_norm node's eps, given or its schema's default."""
    return norm.args[2] if len(norm.args) > 2 else norm.kwargs.get("eps", 1e-6)


def _add_norm_operands(norm):
    """((x, residual, weight, eps), [add, norm], []) when `norm` is my_ops::rms_norm of the sum of two tensors of one
    shape and dtype (the sum may have other users: it is the next residual), else None."""
    if not _is(norm, "my_ops.rms_norm.default"):
        return None
    add = norm.args[0]
    if not _is(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    x, residual = (_value(a) for a in add.args)
    if x is None or residual is None or x.shape != residual.shape or x.dtype != residual.dtype:
        return None
    return (*add.args, norm.args[1], _eps(norm)), [add, norm], []


def _rotation(node):
    """(x, cos, sin) when `node` rotates x: my_ops::rope (the rope fusion ran first) or its ATen pattern."""
    if _is(node, "my_ops.rope.default"):
        return tuple(node.args[:3])
    match = _rope_operands(node)
    return match[0] if match else None


def _heads_of(view, split, index: int, length, heads_dim):
    """The head count when `view` is split's output `index` viewed as [B, T, heads, heads_dim], else None."""
    if not (_is(view, aten.view.default) and _is(view.args[0], operator.getitem) and view.args[0].args[0] is split
            and view.args[0].args[1] == index):
        return None
    shape = _value(view).shape
    return shape[2] if len(shape) == 4 and shape[1] == length and shape[3] == heads_dim else None


def _table_of(table):
    """cos (or sin) [B or 1, T, D] when `table` is it unsqueezed at the heads' dimension, else None."""
    if not (_is(table, aten.unsqueeze.default) and table.args[1] in (2, -2) and _value(table.args[0]) is not None
            and _value(table.args[0]).dim() == 3):
        return None
    return table.args[0]


def _cache_write(cache, start):
    """The one my_ops::update_cache of `cache` at `start` whose result nothing reads, when the cache has no other
    user than it and attention."""
    writes = [user for user in cache.users if _is(user, "my_ops.update_cache.default")]
    if len(writes) != 1 or len(cache.users) != 2 or writes[0].users or writes[0].args[2] is not start:
        return None
    return writes[0]


def _argument(node, index: int, name: str, default=None):
    """An op call's argument, given by position or by name."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _attention_operands(sdpa):
    """((qkv, cos, sin, key_cache, value_cache, start, scale, window), [sdpa], [the two cache writes]) when `sdpa`
    attends with the rotated q over caches just written with the rotated k and v, all three split from one projection,
    else None."""
    if not _is(sdpa, "my_ops.sdpa_with_cache.default"):
        return None
    query, keys, values, start = sdpa.args[:4]
    scale, window = _argument(sdpa, 4, "scale"), _argument(sdpa, 5, "window", 0)
    key_write, value_write = _cache_write(keys, start), _cache_write(values, start)
    q_rotation = _rotation(query)
    k_rotation = key_write and _rotation(key_write.args[0])
    if not (key_write and value_write and q_rotation and k_rotation):
        return None
    (q, cos, sin), (k, k_cos, k_sin), v = q_rotation, k_rotation, value_write.args[0]
    if not (_is(q, aten.view.default) and _is(q.args[0], operator.getitem)):
        return None
    split = q.args[0].args[0]
    if not _is(split, aten.split_with_sizes.default) or split.args[2:] not in ((-1,), (2,)):
        return None
    qkv, (_, length, heads, head_dim) = split.args[0], _value(q).shape
    if _heads_of(q, split, 0, length, head_dim) != heads:  # q must be the first part, as k the second and v the third
        return None
    kv_heads = _heads_of(k, split, 1, length, head_dim)
    if kv_heads is None or _heads_of(v, split, 2, length, head_dim) != kv_heads or _value(qkv).dim() != 3:
        return None
    if list(split.args[1]) != [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]:
        return None
    cos_rows, sin_rows = _table_of(cos), _table_of(sin)
    if (cos_rows is None or sin_rows is None or _table_of(k_cos) is not cos_rows or _table_of(k_sin) is not sin_rows
            or _value(qkv).dtype not in (torch.float32, torch.bfloat16)):
        return None
    return (qkv, cos_rows, sin_rows, keys, values, start, scale, window), [sdpa], [key_write, value_write]


def _only_used_by(node, *users) -> bool:
    return set(node.users) <= set(users)


def _projection(node):
    """(input, weight, format) when `node` is my_ops::linear_blocks without a bias, else None."""
    if not _is(node, "my_ops.linear_blocks.default") or len(node.args) != 3:
        return None
    return node.args


def _q_k_and_v(qkv, v_width: int):
    """(q and k's projection, v's projection) when `qkv` is their outputs side by side, both of one input: a layer
    whose v is in another format than q and k (my_ops.hf.quantize.Linears), v's `v_width` outputs last, else None."""
    if not (_is(qkv, aten.cat.default) and len(qkv.args[0]) == 2 and _argument(qkv, 1, "dim", 0) in (-1, 2)):
        return None
    q_k, v = (_projection(part) for part in qkv.args[0])
    if not (q_k and v and q_k[0] is v[0] and _value(qkv.args[0][1]) is not None
            and _value(qkv.args[0][1]).shape[-1] == v_width):
        return None
    return q_k, v


def _halves(act):
    """(the gate/up projection, its split's nodes) when `act` is my_ops::silu_mul of the two halves of one tensor's
    last dimension (split into equal parts, the first the gate), else None."""
    if not _is(act, "my_ops.silu_mul.default"):
        return None
    gate, up = act.args[:2]
    if not (_is(gate, operator.getitem) and _is(up, operator.getitem) and gate.args[0] is up.args[0]
            and (gate.args[1], up.args[1]) == (0, 1)):
        return None
    split = gate.args[0]
    whole = split.args[0] if split.args else None
    width = _value(whole).shape[-1] if _value(whole) is not None else None
    halves = isinstance(width, int) and width % 2 == 0
    equal = halves and ((_is(split, aten.split.Tensor) and split.args[1] * 2 == width) or (
        _is(split, aten.split_with_sizes.default) and list(split.args[1]) == [width // 2] * 2))
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if not equal or not _last_dim(dim, _value(whole).dim()) or not _only_used_by(split, gate, up):
        return None
    return whole, [split, gate, up]


def _layer_operands(out_add):
    """((hidden, input_norm, qkv weight, format, cos, sin, key_cache, value_cache, start, scale, o weight, format,
    post_norm, gate_up weight, format, down weight, format, eps[, v weight, format]), [out_add], [the attention]) when
    `out_add` ends a pre-norm decoder layer whose parts the earlier fusions made (rope_sdpa_with_cache, silu_mul) over
    linear_blocks projections (q, k and v's one, or q and k's beside v's) and my_ops::rms_norm, each part used by the
    layer alone, else None."""
    if not _is(out_add, aten.add.Tensor) or len(out_add.args) != 2 or out_add.kwargs.get("alpha", 1) != 1:
        return None
    for h, down in (out_add.args, out_add.args[::-1]):
        down_proj = _projection(down)
        halves = down_proj and _halves(down_proj[0])
        gate_up_proj = halves and _projection(halves[0])
        post = gate_up_proj and gate_up_proj[0]
        if not (gate_up_proj and _is(post, "my_ops.rms_norm.default") and post.args[0] is h):
            continue
        if not (_is(h, aten.add.Tensor) and len(h.args) == 2 and h.kwargs.get("alpha", 1) == 1):
            continue
        for hidden, o in (h.args, h.args[::-1]):
            o_proj = _projection(o)
            flat = o_proj and o_proj[0]
            if not (o_proj and _is(flat, aten.reshape.default, aten.view.default)):
                continue
            attention = flat.args[0]
            # decoder_layer attends over every earlier position: a sliding window's layer stays as its parts.
            if not _is(attention, "my_ops.rope_sdpa_with_cache.default") or _argument(attention, 7, "window", 0):
                continue
            qkv = attention.args[0]
            keys = _value(attention.args[3])
            qkv_proj, v_proj = _projection(qkv), None
            if qkv_proj is None and keys is not None and keys.dim() == 4:
                qkv_proj, v_proj = _q_k_and_v(qkv, keys.shape[2] * keys.shape[3]) or (None, None)
            norm = qkv_proj and qkv_proj[0]
            if not (qkv_proj and _is(norm, "my_ops.rms_norm.default") and norm.args[0] is hidden):
                continue
            eps = [_eps(n) for n in (norm, post)]
            users = {norm: [qkv] if v_proj is None else list(qkv.args[0]), qkv: [attention], attention: [flat],
                     flat: [o], o: [h], h: [post, out_add], post: [halves[0]], halves[0]: [halves[1][0]],
                     down_proj[0]: [down], down: [out_add], **({part: [qkv] for part in qkv.args[0]} if v_proj else {})}
            if eps[0] != eps[1] or not all(_only_used_by(node, *users[node]) for node in users):
                continue
            if (_value(hidden) is None or _value(hidden).dtype != torch.float32 or _value(hidden).dim() != 3
                    or _value(flat).shape[:2] != _value(hidden).shape[:2]):
                continue
            qkv, cos, sin, key_cache, value_cache, start = attention.args[:6]
            scale = _argument(attention, 6, "scale")
            operands = (hidden, norm.args[1], qkv_proj[1], qkv_proj[2], cos, sin, key_cache, value_cache, start, scale,
                        o_proj[1], o_proj[2], post.args[1], gate_up_proj[1], gate_up_proj[2], down_proj[1],
                        down_proj[2], eps[0])
            return operands + (() if v_proj is None else (v_proj[1], v_proj[2])), [out_add], [attention]
    return None


_MATCHERS = {"rope": _rope_operands, "attention": _attention_operands, "swiglu": _swiglu_operands,
             "geglu": _geglu_operands, "layer": _layer_operands, "add_norm": _add_norm_operands}
_PATTERNS = {"rope": "x * cos + cat(-x[..., D/2:], x[..., :D/2]) * sin",
             "attention": "my_ops::sdpa_with_cache of rotated q over caches just written with rotated k and v, all "
                          "split from one projection",
             "swiglu": "silu(gate) * up",
             "geglu": 'gelu(gate, approximate="tanh") * up',
             "layer": "h = x + o(attention(qkv(rms_norm(x)))); h + down(silu_mul(gate_up(rms_norm(h)))) on "
                      "linear_blocks projections without a bias (qkv one projection, or q and k's beside v's)",
             "add_norm": "my_ops::rms_norm(x + residual)"}
# The ops a matched pattern is made of: erased once nothing uses them (never an op with an effect: a matcher names the
# writes its op takes over, and only those are erased).
_PURE = (aten.add.Tensor, aten.mul.Tensor, aten.cat.default, aten.neg.default, aten.slice.Tensor, aten.silu.default,
         aten.gelu.default, aten.unsqueeze.default, aten.view.default, aten.reshape.default,
         aten.split_with_sizes.default, aten.split.Tensor, operator.getitem, "my_ops.rms_norm.default",
         "my_ops.rope.default", "my_ops.sdpa_with_cache.default", "my_ops.linear_blocks.default",
         "my_ops.silu_mul.default")


def _erase_unused(graph: torch.fx.Graph, node, erased: set) -> None:
    """Erases `node` if nothing uses it and it is one of _PURE, then its inputs the same way."""
    pending = [node]
    while pending:
        n = pending.pop()
        if n not in erased and _is(n, *_PURE) and not n.users:
            inputs = n.all_input_nodes
            graph.erase_node(n)
            erased.add(n)
            pending.extend(inputs)


def _my_ops(graph: torch.fx.Graph) -> set[str]:
    """The my_ops ops the graph calls, as "my_ops::rope"."""
    return {"my_ops::" + str(n.target).split(".")[1] for n in graph.nodes
            if n.op == "call_function" and str(n.target).startswith("my_ops.")}


def _op(name: str):
    namespace, op = FUSIONS[name].split("::")
    return getattr(getattr(torch.ops, namespace), op).default


def _merge_repeated_unsqueezes(graph: torch.fx.Graph) -> int:
    """One unsqueeze per (input, dim): later copies are replaced by the first (a view: nothing depends on which)."""
    first, merged = {}, 0
    for node in list(graph.nodes):
        if not _is(node, aten.unsqueeze.default):
            continue
        key = (node.args[0], node.args[1])
        if key in first:
            node.replace_all_uses_with(first[key])
            graph.erase_node(node)
            merged += 1
        else:
            first[key] = node
    return merged


def fuse(exported: torch.export.ExportedProgram, fusions=None) -> Fused:
    """Puts the fused ops into `exported`'s graph, in place. fusions: the names to apply (FUSIONS' keys); None applies
    every one found and leaves the rest (Fused.missing names them); named ones that find nothing raise
    UnsupportedModelError naming each."""
    wanted = tuple(FUSIONS) if fusions is None else tuple(fusions)
    if unknown := [name for name in wanted if name not in FUSIONS]:
        raise UnsupportedModelError(f"unknown fusion(s) {unknown}: choose from {sorted(FUSIONS)}")
    graph = exported.graph_module.graph
    report, erased, before = Fused(counts={name: 0 for name in wanted}), set(), _my_ops(graph)
    for name in wanted:
        op = _op(name)
        for node in list(graph.nodes):
            match = None if node in erased else _MATCHERS[name](node)
            if match is None:
                continue
            operands, replaced, taken_over = match
            with graph.inserting_before(replaced[0]):
                fused = graph.call_function(op, operands)
                outputs = [fused] if len(replaced) == 1 else [
                    graph.call_function(operator.getitem, (fused, i)) for i in range(len(replaced))]
            # Each output keeps the meta of the node it replaces (shape, dtype, the source it came from).
            fused.meta = {**replaced[-1].meta, "val": tuple(old.meta["val"] for old in replaced)}
            for old, new in zip(replaced, outputs):
                new.meta = dict(old.meta)
                old.replace_all_uses_with(new)
            for old in reversed(replaced):
                _erase_unused(graph, old, erased)
            for write in taken_over:  # the fused op writes what these wrote; nothing reads their results now
                inputs = write.all_input_nodes
                graph.erase_node(write)
                erased.add(write)
                for node_input in inputs:
                    _erase_unused(graph, node_input, erased)
            report.counts[name] += 1
    report.merged_unsqueezes = _merge_repeated_unsqueezes(graph)
    report.gone = frozenset((before | {FUSIONS[name] for name in wanted if report.counts[name]}) - _my_ops(graph))
    exported.graph_module.recompile()
    if fusions is not None and (missing := report.missing(wanted)):
        raise UnsupportedModelError(
            "no place for " + ", ".join(f"{name} ({FUSIONS[name]})" for name in missing) + " in this model: it does "
            "not compute " + " or ".join(_PATTERNS[name] for name in missing) + "; leave it out of fusions")
    return report

