"""Step 1 of the update_cache flow: registers my_ops::update_cache(Tensor value, Tensor(a!) cache, SymInt start_pos)
-> Tensor with PyTorch from Python (torch.library, Library.define), an op that mutates its argument: it writes `value`
into `cache` at rows start_pos.. of dimension 1 (a KV cache's sequence dimension) and returns the next position, a
one-element int64 tensor. Positions past the cache are an error, never a write past its end. The position is a SymInt
so a program can take it as an input (tensor.item()). The runtime kernel is update_cache_out.cpp.

Importing this module registers the op and does nothing else (it imports only torch).
"""

from __future__ import annotations

import torch


DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
          torch.int32, torch.int64)  # value's, as custom_ops.bzl declares them (checked when the kernels build)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


def _check(op: str, value: torch.Tensor, cache: torch.Tensor, start_pos) -> None:
    """The runtime kernel's checks and messages (update_cache_out.cpp), so both refuse alike."""
    torch._check(value.dtype in DTYPES,
                 lambda: f"{op}: value has unsupported dtype {_name(value.dtype)}; supported: "
                         f"{', '.join(map(_name, DTYPES))}")
    torch._check(value.dtype == cache.dtype,
                 lambda: f"{op}: cache has dtype {_name(cache.dtype)} but value has {_name(value.dtype)}; they must "
                         "match")
    torch._check(value.dim() == cache.dim() and value.dim() >= 2
                 and all(value.shape[d] == cache.shape[d] for d in range(value.dim()) if d != 1),
                 lambda: f"{op}: value {list(value.shape)} and cache {list(cache.shape)} must match in every dimension "
                         "but 1 (the sequence), at least 2")
    torch._check(start_pos >= 0, lambda: f"{op}: start_pos {start_pos} is negative")
    torch._check(start_pos + value.shape[1] <= cache.shape[1],
                 lambda: f"{op}: writing {value.shape[1]} row(s) at start_pos {start_pos} passes the end of the cache "
                         f"({cache.shape[1]} rows)")


def update_cache_reference(value: torch.Tensor, cache: torch.Tensor, start_pos: int) -> torch.Tensor:
    """update_cache in ATen ops, declared as its reference: mutates `cache` like the op."""
    end = start_pos + value.shape[1]
    cache.narrow(1, start_pos, value.shape[1]).copy_(value)
    return torch.full((1,), end, dtype=torch.int64)


def _update(op: str, value, cache, start_pos) -> int:
    _check(op, value, cache, start_pos)
    cache[:, start_pos:start_pos + value.shape[1]] = value
    return start_pos + value.shape[1]


def update_cache(value: torch.Tensor, cache: torch.Tensor, start_pos: int) -> torch.Tensor:
    return torch.tensor([_update("my_ops::update_cache", value, cache, start_pos)], dtype=torch.int64)


def update_cache_out(value: torch.Tensor, cache: torch.Tensor, start_pos: int, *, out: torch.Tensor) -> torch.Tensor:
    op = "my_ops::update_cache.out"
    torch._check(out.dtype == torch.int64,
                 lambda: f"{op}: out has unsupported dtype {_name(out.dtype)}; supported: int64")
    out.resize_(1).fill_(_update(op, value, cache, start_pos))
    return out


def _update_cache_fake(value, cache, start_pos):
    _check("my_ops::update_cache", value, cache, start_pos)
    return torch.empty(1, dtype=torch.int64, device=value.device)


def _register() -> torch.library.Library:
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define("update_cache(Tensor value, Tensor(a!) cache, SymInt start_pos) -> Tensor")
    lib.define("update_cache.out(Tensor value, Tensor(a!) cache, SymInt start_pos, *, Tensor(b!) out) -> Tensor(b!)")
    torch.library.impl("my_ops::update_cache", "CompositeExplicitAutograd", lib=lib)(update_cache)
    torch.library.impl("my_ops::update_cache.out", "CompositeExplicitAutograd", lib=lib)(update_cache_out)
    torch.library.register_fake("my_ops::update_cache", _update_cache_fake, lib=lib)
    return lib


MAX_LEN, HEADS, HEAD_DIM = 8, 2, 4


class KVCacheExample(torch.nn.Module):
    """A cache kept as a mutable buffer across executions, written at a position the caller passes each step."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, MAX_LEN, HEADS, HEAD_DIM))

    def forward(self, value: torch.Tensor, position: torch.Tensor):
        start = position.item()
        torch._check(start >= 0)
        torch._check(start + value.shape[1] <= MAX_LEN)
        next_position = torch.ops.my_ops.update_cache(value, self.cache, start)
        return self.cache.sum(dim=2), next_position  # what a model reads from the cache after writing it


def example():
    """(model, runs): one step per execution at positions 0, 1, 2; the state carries from each to the next."""
    generator = torch.Generator().manual_seed(3)
    runs = [(torch.randn(1, 1, HEADS, HEAD_DIM, generator=generator), torch.tensor([p])) for p in range(3)]
    return KVCacheExample(), runs


# Once per process: a copy of this module registered first (e.g. the my_ops wheel's) leaves the op defined.
_lib = None if hasattr(torch.ops.my_ops, "update_cache") else _register()
