"""Feeding a followed chain into an inference engine with fused, tensor-parallel parameters.

Engines such as vLLM and SGLang do not hold the checkpoint's tensors as
they are: ``q_proj``/``k_proj``/``v_proj`` are stacked into one ``qkv_proj``
parameter and ``gate_proj``/``up_proj`` into ``gate_up_proj`` (the model's
``stacked_params_mapping``), and every linear layer is split across the
tensor-parallel ranks: column-parallel layers by output rows (dim 0),
row-parallel layers (``o_proj``, ``down_proj``) by input columns (dim 1).
Their ``load_weights`` takes an iterator of ``(checkpoint name, full
tensor)`` and each parameter's ``weight_loader`` copies the rank's slice
into place.

:class:`TensorParallel` is that mapping for one rank, taking the engine's own
``stacked_params_mapping`` (vLLM's tuple format).  Its ``load_weights``
writes each tensor's rank slice into the fused parameter, bit for bit (same
dtype, ``copy_``), so a node that keeps a host copy in checkpoint names
(``follow_weights``, or ``chain.move_weights`` to a chosen version, whose
result names the changed tensors) updates each rank with only the tensors a
version changed: :func:`changed_names` reads them from the links' headers
(every part of a multi-part link).
torch is needed only by ``load_weights`` and imported there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..arguments import check_int, check_mapping
from ..chain.live.move import link_changes, plan_move
from ..chain.model.manifest import Manifest
from ..chain.store import Chain
from ..errors import BadArgumentError

# vLLM's LLAMA_STACKED_PARAMS_MAPPING (Llama, Qwen2/3, Mistral, ...): (param, shard, shard id).
LLAMA_STACKED: tuple[tuple[str, str, str | int], ...] = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
)
# Module names split by output rows (ColumnParallelLinear, VocabParallelEmbedding, ParallelLMHead).
COLUMN_PARALLEL = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",
                             "embed_tokens", "lm_head"})  # fmt: skip
# Module names split by input columns (RowParallelLinear); their bias is not split.
ROW_PARALLEL = frozenset({"o_proj", "down_proj"})
_QKV = ("q", "k", "v")


@dataclass(frozen=True)
class Placement:
    """Where a checkpoint tensor's rank slice goes: ``param`` (the engine's name), the
    split ``dim`` (None: the whole tensor, replicated), the slice's ``start`` and
    ``length`` along it, and its ``offset`` along dim 0 of a fused parameter."""

    param: str
    dim: int | None
    start: int = 0
    length: int = 0
    offset: int = 0


class TensorParallel:
    """One rank's mapping from checkpoint tensors to an engine's fused, split parameters.

    ``shapes``: every checkpoint tensor's shape (a fused parameter's layout
    needs its siblings' shapes).  ``stacked``: the engine model's
    ``stacked_params_mapping``.  ``head_dim`` (needed when q/k/v are
    stacked): q/k/v rows are split by whole attention heads, and k/v
    projections with fewer heads than ranks are replicated as the engines do
    (rank r holds kv head ``r // (tp_size // heads)``).
    """

    def __init__(
        self, shapes: Mapping[str, Sequence[int]], tp_size: int, rank: int, *,
        stacked: Sequence[tuple[str, str, str | int]] = LLAMA_STACKED,
        column: Iterable[str] = COLUMN_PARALLEL, row: Iterable[str] = ROW_PARALLEL,
        head_dim: int | None = None,
    ) -> None:  # fmt: skip
        check_mapping(shapes, "shapes")
        self.tp_size = check_int(tp_size, "tp_size", 1)
        self.rank = check_int(rank, "rank", 0, self.tp_size - 1)
        self.head_dim = None if head_dim is None else check_int(head_dim, "head_dim", 1)
        self.shapes = {n: tuple(int(d) for d in s) for n, s in shapes.items()}
        self.stacked = [(str(p), str(w), s) for p, w, s in stacked]
        self.column, self.row = frozenset(column), frozenset(row)

    def _kind(self, name: str) -> str:
        """``column``, ``row`` or ``replicated``, from the tensor's module name."""
        module, _, leaf = name.rpartition(".")
        module = module.rpartition(".")[2]
        if module in self.column:
            return "column"
        if module in self.row and leaf == "weight":
            return "row"
        return "replicated"

    def _rows(self, name: str, shard_id: str | int | None) -> tuple[int, int]:
        """This rank's (start, length) of ``name``'s split dimension: whole attention heads
        for the q/k/v parts, k/v heads replicated when there are fewer than ranks."""
        dim = 0 if self._kind(name) == "column" else 1
        size = self.shapes[name][dim]
        if shard_id in _QKV:
            return self._heads(name, size, shard_id)
        if size % self.tp_size == 0:
            n = size // self.tp_size
            return self.rank * n, n
        raise BadArgumentError(
            f"tensor {name!r}: {size} along dim {dim} cannot be split across {self.tp_size} ranks"
        )

    def _heads(self, name: str, size: int, shard_id: str | int | None) -> tuple[int, int]:
        if self.head_dim is None:
            raise BadArgumentError(
                f"tensor {name!r}: q/k/v are split by attention heads: give head_dim="
            )
        heads, rest = divmod(size, self.head_dim)
        if not rest and heads % self.tp_size == 0:
            n = heads // self.tp_size * self.head_dim
            return self.rank * n, n
        if not rest and shard_id != "q" and self.tp_size % heads == 0:
            return (self.rank // (self.tp_size // heads)) * self.head_dim, self.head_dim
        raise BadArgumentError(
            f"tensor {name!r}: {size} rows are not whole heads of {self.head_dim} that "
            f"{self.tp_size} ranks can share"
        )

    def place(self, name: str) -> Placement:
        """Where tensor ``name``'s slice for this rank goes (BadArgumentError if unknown)."""
        shape = self.shapes.get(name)
        if shape is None:
            raise BadArgumentError(f"tensor {name!r} is not in the checkpoint's shapes")
        for param, weight, shard_id in self.stacked:
            if weight in name:
                return self._fused(name, name.replace(weight, param), param, shard_id)
        kind = self._kind(name)
        if kind == "replicated" or not shape:
            return Placement(name, None)
        start, length = self._rows(name, None)
        return Placement(name, 0 if kind == "column" else 1, start, length)

    def _fused(self, name: str, target: str, param: str, shard_id: str | int) -> Placement:
        """A part of a fused parameter: its slice, after the parts listed before it."""
        if self._kind(name) != "column" or not self.shapes[name]:
            raise BadArgumentError(f"tensor {name!r}: only column-parallel tensors can be fused")
        offset = 0
        for p, weight, sid in self.stacked:
            if p != param:
                continue
            if sid == shard_id:
                start, length = self._rows(name, shard_id)
                return Placement(target, 0, start, length, offset)
            sibling = target.replace(param, weight)
            if sibling not in self.shapes:
                raise BadArgumentError(f"tensor {name!r}: fused with {sibling!r}, not in shapes")
            offset += self._rows(sibling, sid)[1]
        raise AssertionError("unreachable: the shard id came from the same mapping")

    def shard_shapes(self) -> dict[str, tuple[int, ...]]:
        """The engine's parameters on this rank and their shapes (to allocate them)."""
        out: dict[str, tuple[int, ...]] = {}
        for name, shape in self.shapes.items():
            p = self.place(name)
            if p.dim is None:
                out[p.param] = shape
                continue
            rows = list(shape)
            rows[p.dim] = p.offset + p.length
            old = out.get(p.param)
            out[p.param] = tuple(rows) if old is None or old[p.dim] < rows[p.dim] else old
        return out

    def load_weights(
        self, params: MutableMapping[str, Any], weights: Iterable[tuple[str, Any]]
    ) -> set[str]:
        """Copy each ``(checkpoint name, full tensor)``'s rank slice into ``params`` (the
        engine's torch parameters, in place, bit for bit); the names of those updated.

        A tensor of another shape than ``shapes`` says, a parameter missing or of
        another dtype or shape than the slice: BadArgumentError, before any copy of
        that tensor.
        """
        import torch

        loaded: set[str] = set()
        for name, tensor in weights:
            p = self.place(name)
            if tuple(tensor.shape) != self.shapes[name]:
                raise BadArgumentError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, not {self.shapes[name]}"
                )
            dst = params.get(p.param)
            if dst is None:
                raise BadArgumentError(f"the engine has no parameter {p.param!r} for {name!r}")
            src = tensor if p.dim is None else tensor.narrow(p.dim, p.start, p.length)
            if p.dim is not None and p.param != name:
                dst = dst.narrow(0, p.offset, p.length)
            if dst.dtype != src.dtype or tuple(dst.shape) != tuple(src.shape):
                raise BadArgumentError(
                    f"{p.param!r} ({dst.dtype}, {tuple(dst.shape)}) cannot hold {name!r}'s "
                    f"slice ({src.dtype}, {tuple(src.shape)}) bit for bit"
                )
            with torch.no_grad():
                dst.copy_(src)
            loaded.add(p.param)
        return loaded


def changed_names(chain: Chain, m: Manifest, before: int, after: int) -> list[str] | None:
    """The tensors that moving from version ``before`` to ``after`` changed or added
    (sorted), read from the headers of the links between them: any number of links,
    either way over reversible ones, every part of a multi-part link (the cached
    files, or two ranged reads per file); None if no links join them (a jump to a
    snapshot: treat all as changed).  A tensor changed and changed back is listed."""
    hops = plan_move(chain, m, before, after)
    if hops is None:
        return None
    names: set[str] = set()
    for hop in hops:
        assert hop.link is not None  # a plan over links only
        names |= link_changes(chain, m, hop.link, hop.reverse)
    return sorted(names)


def updates(weights: Mapping[str, Any], names: Iterable[str] | None) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of ``weights`` for ``names`` (None: every tensor), in the form
    ``load_weights`` iterates; names no longer in ``weights`` (removed) are skipped."""
    for name in weights if names is None else names:
        if name in weights:
            yield name, weights[name]
