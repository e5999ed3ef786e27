"""The export pass that puts the project's fused ops into a graph nobody wrote for them: between torch.export and
EXIR's lowering, it finds patterns a decoder computes in ATen ops and replaces each with one op of the project's:

  rope      x * cos + cat(-x[..., D/2:], x[..., :D/2]) * sin   ->  my_ops::rope(x, cos, sin)   (ten ops -> one)
  swiglu    silu(gate) * up                                     ->  my_ops::silu_mul(gate, up)  (three -> one)
  add_norm  s = x + residual; my_ops::rms_norm(s, w, eps)       ->  my_ops::add_rms_norm(x, residual, w, eps)
                                                                    (two -> one; s is still an output)

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
FUSIONS = {"rope": "my_ops::rope", "swiglu": "my_ops::silu_mul",  # fusion -> the op it puts in
           "add_norm": "my_ops::add_rms_norm"}
_FLOATING = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Fused:
    """What the pass did: per fusion, how many places it put its op."""
    counts: dict[str, int] = field(default_factory=dict)
    merged_unsqueezes: int = 0

    def missing(self, fusions) -> list[str]:
        return [name for name in fusions if not self.counts.get(name)]

    def ops(self) -> tuple[str, ...]:
        return tuple(FUSIONS[name] for name, count in self.counts.items() if count)

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
    """((x, cos, sin), [add]) when `add` computes x * cos + rotate_half(x) * sin (in either order), else None."""
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
                return (x, cos, sin), [add]
    return None


def _swiglu_operands(mul):
    """((gate, up), [mul]) when `mul` computes silu(gate) * up (in either order) on one shape and dtype, else None."""
    if not _is(mul, aten.mul.Tensor) or len(mul.args) != 2:
        return None
    for activation, up in (mul.args, mul.args[::-1]):
        if not _is(activation, aten.silu.default) or len(activation.users) != 1:
            continue
        gate = activation.args[0]
        g, u = _value(gate), _value(up)
        if g is not None and u is not None and g.shape == u.shape and g.dtype == u.dtype and g.dtype in _FLOATING:
            return (gate, up), [mul]
    return None


def _add_norm_operands(norm):
    """((x, residual, weight, eps), [add, norm]) when `norm` is my_ops::rms_norm of the sum of two tensors of one
    shape and dtype (the sum may have other users: it is the next residual), else None."""
    if not _is(norm, "my_ops.rms_norm.default"):
        return None
    add = norm.args[0]
    if not _is(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    x, residual = (_value(a) for a in add.args)
    if x is None or residual is None or x.shape != residual.shape or x.dtype != residual.dtype:
        return None
    eps = norm.args[2] if len(norm.args) > 2 else norm.kwargs.get("eps", 1e-6)
    return (*add.args, norm.args[1], eps), [add, norm]


_MATCHERS = {"rope": _rope_operands, "swiglu": _swiglu_operands, "add_norm": _add_norm_operands}
_PATTERNS = {"rope": "x * cos + cat(-x[..., D/2:], x[..., :D/2]) * sin", "swiglu": "silu(gate) * up",
             "add_norm": "my_ops::rms_norm(x + residual)"}
# The ops a matched pattern is made of: erased once nothing uses them (never an op with an effect).
_PURE = (aten.add.Tensor, aten.mul.Tensor, aten.cat.default, aten.neg.default, aten.slice.Tensor, aten.silu.default,
         aten.unsqueeze.default, "my_ops.rms_norm.default")


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
    report, erased = Fused(counts={name: 0 for name in wanted}), set()
    for name in wanted:
        op = _op(name)
        for node in list(graph.nodes):
            match = None if node in erased else _MATCHERS[name](node)
            if match is None:
                continue
            operands, replaced = match
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
            report.counts[name] += 1
    report.merged_unsqueezes = _merge_repeated_unsqueezes(graph)
    exported.graph_module.recompile()
    if fusions is not None and (missing := report.missing(wanted)):
        raise UnsupportedModelError(
            "no place for " + ", ".join(f"{name} ({FUSIONS[name]})" for name in missing) + " in this model: it does "
            "not compute " + " or ".join(_PATTERNS[name] for name in missing) + "; leave it out of fusions")
    return report

