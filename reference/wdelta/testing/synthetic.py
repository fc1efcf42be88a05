"""Deterministic synthetic checkpoint pairs shaped like one RL fine-tuning step.

A *base* is a transformer-shaped model (token embeddings, per-layer q/k/v/o
and gate/up/down projections, RMSNorm weights, an untied ``lm_head``) with
weights ~ N(0, 0.02) and norms ~ N(1, 0.05).  A *target* is the base after one
AdamW-like step of learning rate ``lr``:

- bf16 tensors keep fp32 master weights = base bf16 + a residual smaller than
  half a bf16 ulp.  The step scales them by ``1 - lr·wd`` and subtracts
  ``lr·g``, where ``g`` (Adam's normalised update m/(sqrt(v)+eps)) is ±1-ish:
  magnitude 0.5 + 0.5·Exp(1), random sign.  The result is rounded back to bf16
  (round to nearest even), so an update smaller than the distance to the next
  rounding boundary is absorbed and ``lr`` sets the density of changed
  elements.  Embedding rows of tokens absent from the batch get no update.
- fp8 models (DeepSeek-style) store every layer projection as F8_E4M3 with an
  F32 ``weight_scale_inv`` per 128x128 block (amax / 448, so weight ≈ fp8 ·
  scale).  After the step the scales are recomputed from the new fp32 master
  weights and all values re-quantized: when a block's amax moves, any value
  in it may change.

Tensors are generated in row blocks of about BLOCK_ELEMENTS elements, each
from its own seeded stream, and written with positioned writes, so memory
stays at a few blocks whatever the model size.  The bytes written depend only
on the spec, the seed, ``lr`` and BLOCK_ELEMENTS, never on the thread count.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint.safetensors_header import FileLayout, build_header
from ..errors import BadArgumentError
from ..format.dtypes import DTYPES, DType
from ..io.output_file import pwrite_all
from ..ops.pipeline import ordered_map

F32 = np.ndarray[Any, np.dtype[np.float32]]
U8 = np.ndarray[Any, np.dtype[np.uint8]]
U16 = np.ndarray[Any, np.dtype[np.uint16]]
U32 = np.ndarray[Any, np.dtype[np.uint32]]

BLOCK_ELEMENTS = 1 << 21  # elements per generated row block (changing it changes the output)
FP8_BLOCK = 128  # rows and columns covered by one fp8 scale
E4M3_MAX = 448.0
WEIGHT_STD = 0.02
NORM_STD = 0.05
WEIGHT_DECAY = 0.01
SEEN_ROWS = 0.25  # fraction of embedding rows (tokens) present in the step's batch
METADATA = {"format": "pt"}
_BASE, _RESIDUAL, _UPDATE, _ROWS = range(4)  # random stream kinds
BF16, F8_E4M3, F32_DTYPE = DTYPES["BF16"], DTYPES["F8_E4M3"], DTYPES["F32"]


def _as_f32_bits(x: F32) -> U32:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise BadArgumentError("expected a float32 array")
    bits: U32 = np.ascontiguousarray(x).view(np.uint32)
    return bits


def bf16_bits(x: F32) -> U16:
    """bfloat16 bit patterns of float32 values, rounded to nearest, ties to even.

    Works on the uint32 patterns: adding 0x7FFF plus the kept LSB carries into
    the upper half exactly when the dropped half is above (or, for an odd kept
    LSB, at) the midpoint.  Finite values past the largest bf16 become ±inf,
    ±inf and ±0 keep their sign, subnormals round like any other value, and
    NaN becomes the quiet NaN ``sign | 0x7FC0`` (payload dropped, as in
    ml_dtypes and Eigen).
    """
    bits = _as_f32_bits(x)
    rounded = bits + np.uint32(0x7FFF)  # NaN patterns may wrap; they are replaced below
    rounded += (bits >> np.uint32(16)) & np.uint32(1)
    out: U16 = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    out[nan] = ((bits[nan] >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16) | 0x7FC0
    return out


def bf16_to_f32(bits: U16) -> F32:
    """float32 values of bfloat16 bit patterns (exact)."""
    out: F32 = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out


def _rne_shift(value: U32, shift: U32 | np.uint32) -> U32:
    """``value >> shift`` rounded to nearest, ties to even (1 <= shift <= 31)."""
    half_minus_one = (np.uint32(1) << (shift - np.uint32(1))) - np.uint32(1)
    odd = (value >> shift) & np.uint32(1)
    out: U32 = (value + half_minus_one + odd) >> shift
    return out


def e4m3fn_bits(x: F32) -> U8:
    """float8_e4m3fn bit patterns (S.EEEE.MMM, bias 7) of float32 values.

    Rounds to nearest, ties to even; finite values beyond ±448 and ±inf
    saturate to ±448 (0x7E / 0xFE), NaN becomes ``sign | 0x7F`` (the only
    e4m3fn NaN), -0.0 stays 0x80.  Magnitudes below 2^-6 become subnormals
    (multiples of 2^-9) or zero.
    """
    bits = _as_f32_bits(x)
    mag = bits & np.uint32(0x7FFFFFFF)
    # Normal range: keep 3 mantissa bits; the f32 exponent (bias 127) becomes
    # the fp8 exponent (bias 7) by subtracting 120 << 3 from (exp << 3 | mant).
    normal = _rne_shift(mag, np.uint32(20))
    np.clip(normal, 120 << 3, (120 << 3) + 0x7E, out=normal)
    normal -= np.uint32(120 << 3)
    # Subnormal range: the value in units of 2^-9 is sig · 2^(e - 141).
    exp = np.maximum(mag >> np.uint32(23), np.uint32(1))
    sig = mag & np.uint32(0x7FFFFF)
    sig |= (mag >= np.uint32(1 << 23)).astype(np.uint32) << np.uint32(23)
    shift = np.minimum(np.uint32(141) - np.minimum(exp, np.uint32(120)), np.uint32(25))
    sub = _rne_shift(sig, shift)
    code = np.where(mag >= np.uint32(121 << 23), normal, sub)
    code[mag > np.uint32(0x7F800000)] = 0x7F
    code |= (bits >> np.uint32(24)) & np.uint32(0x80)
    out: U8 = code.astype(np.uint8)
    return out


def quantize_e4m3_blocks(x: F32) -> tuple[U8, F32]:
    """(fp8 codes, scale_inv) of a 2-d float32 array with 128x128 block scales.

    ``scale_inv[i, j]`` = amax of block (i, j) / 448 (shape ceil(r/128) x
    ceil(c/128)); each value is encoded as e4m3fn of value / its block scale,
    so the block's largest magnitude maps to 448.  All-zero blocks get scale 1.
    """
    r, c = x.shape
    br, bc = -(-r // FP8_BLOCK), -(-c // FP8_BLOCK)
    padded = np.zeros((br * FP8_BLOCK, bc * FP8_BLOCK), dtype=np.float32)
    padded[:r, :c] = x
    tiles = padded.reshape(br, FP8_BLOCK, bc, FP8_BLOCK)
    amax = np.abs(tiles).max(axis=(1, 3))
    scale: F32 = np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
    tiles /= scale[:, None, :, None]
    return e4m3fn_bits(padded[:r, :c]), scale


@dataclass(frozen=True)
class WeightSpec:
    """One weight tensor; ``index`` (its position in the model) keys its random streams.

    ``role`` is "embedding", "matrix", "head" or "norm"; ``fp8`` weights are stored as
    F8_E4M3 with a companion F32 ``<name>_scale_inv`` tensor.
    """

    name: str
    shape: tuple[int, ...]
    role: str
    index: int
    fp8: bool

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def elements(self) -> int:
        return self.rows * self.cols

    @property
    def dtype(self) -> DType:
        return F8_E4M3 if self.fp8 else BF16

    @property
    def scale_name(self) -> str:
        return f"{self.name}_scale_inv"

    @property
    def scale_shape(self) -> tuple[int, int]:
        return -(-self.rows // FP8_BLOCK), -(-self.cols // FP8_BLOCK)

    @property
    def group(self) -> str:
        """The name with its layer number replaced: layers are i.i.d. per group."""
        return re.sub(r"\.\d+\.", ".N.", self.name)

    def row_blocks(self) -> list[tuple[int, int]]:
        """[start, stop) row ranges of about BLOCK_ELEMENTS; multiples of 128 rows for fp8."""
        step = max(1, BLOCK_ELEMENTS // self.cols)
        if self.fp8:
            step = max(1, step // FP8_BLOCK) * FP8_BLOCK
        return [(r, min(r + step, self.rows)) for r in range(0, self.rows, step)]

    def tensors(self) -> list[tuple[str, DType, tuple[int, ...]]]:
        """The safetensors entries this weight contributes (name, dtype, shape)."""
        out: list[tuple[str, DType, tuple[int, ...]]] = [(self.name, self.dtype, self.shape)]
        if self.fp8:
            out.append((self.scale_name, F32_DTYPE, self.scale_shape))
        return out


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-shaped decoder: sizes in elements; ``kv_hidden`` rows of k/v (GQA)."""

    hidden: int
    layers: int
    intermediate: int
    vocab: int
    kv_hidden: int
    fp8: bool = False

    def weights(self) -> list[WeightSpec]:
        """Every weight tensor, in model order."""
        h, kv, inter = self.hidden, self.kv_hidden, self.intermediate
        entries: list[tuple[str, tuple[int, ...], str]] = [
            ("model.embed_tokens.weight", (self.vocab, h), "embedding")
        ]
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            entries += [
                (p + "input_layernorm.weight", (h,), "norm"),
                (p + "self_attn.q_proj.weight", (h, h), "matrix"),
                (p + "self_attn.k_proj.weight", (kv, h), "matrix"),
                (p + "self_attn.v_proj.weight", (kv, h), "matrix"),
                (p + "self_attn.o_proj.weight", (h, h), "matrix"),
                (p + "post_attention_layernorm.weight", (h,), "norm"),
                (p + "mlp.gate_proj.weight", (inter, h), "matrix"),
                (p + "mlp.up_proj.weight", (inter, h), "matrix"),
                (p + "mlp.down_proj.weight", (h, inter), "matrix"),
            ]
        entries += [
            ("model.norm.weight", (h,), "norm"),
            ("lm_head.weight", (self.vocab, h), "head"),
        ]
        return [
            WeightSpec(name, shape, role, i, self.fp8 and role == "matrix")
            for i, (name, shape, role) in enumerate(entries)
        ]

    @property
    def elements(self) -> int:
        """Elements of all tensors, fp8 scales included."""
        return sum(math.prod(shape) for w in self.weights() for _, _, shape in w.tensors())

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (file sizes without their headers)."""
        return sum(
            math.prod(shape) * dtype.size for w in self.weights() for _, dtype, shape in w.tensors()
        )


_HIDDEN_LADDER = (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 8192)


def spec_for_elements(elements: int, *, fp8: bool = False, vocab: int = 32000) -> ModelSpec:
    """The smallest Llama-like spec with at least ``elements`` elements.

    The hidden size is the largest ladder step whose ~h/128 layers fit in the
    budget (about 12·h³/128 elements); layers are then added until it is met.
    """
    if elements < 1:
        raise BadArgumentError("elements must be >= 1")
    fits = [h for h in _HIDDEN_LADDER if 12 * h**3 // 128 <= elements]
    h = fits[-1] if fits else _HIDDEN_LADDER[0]
    inter = -(-8 * h // 3 // 128) * 128
    kv = h // 4
    per_layer = 2 * h * h + 2 * kv * h + 3 * inter * h + 2 * h
    layers = max(1, -(-(elements - 2 * vocab * h - h) // per_layer))
    return ModelSpec(h, layers, inter, vocab, kv, fp8)


def _rng(seed: int, w: WeightSpec, block: int, kind: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, w.index, block, kind]))


def _master_normal(w: WeightSpec, seed: int, block: int, rows: int) -> F32:
    """The block's fp32 weights before the step: N(0, 0.02), norms N(1, 0.05)."""
    x = _rng(seed, w, block, _BASE).standard_normal((rows, w.cols), dtype=np.float32)
    if w.role == "norm":
        x *= np.float32(NORM_STD)
        x += np.float32(1.0)
    else:
        x *= np.float32(WEIGHT_STD)
    return x


def _seen_rows(w: WeightSpec, seed: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Embedding rows whose token occurs in the batch (the others get no gradient)."""
    mask: np.ndarray[Any, np.dtype[np.bool_]] = _rng(seed, w, 0, _ROWS).random(w.rows) < SEEN_ROWS
    return mask


def _adam_update(w: WeightSpec, seed: int, block: int, r0: int, r1: int) -> F32:
    """Adam's normalised update g for rows [r0, r1): ±(0.5 + 0.5·Exp(1)).

    One uniform u gives both the sign (u < 1/2) and an independent Exp(1)
    draw, -log(2·min(u, 1 - u)).
    """
    u = _rng(seed, w, block, _UPDATE).random((r1 - r0, w.cols), dtype=np.float32)
    tail = np.minimum(u, np.float32(1) - u)
    tail *= np.float32(2)
    np.maximum(tail, np.float32(2**-24), out=tail)
    g: F32 = np.log(tail)
    g *= np.float32(-0.5)
    g += np.float32(0.5)
    u -= np.float32(0.5)
    np.copysign(g, u, out=g)
    if w.role == "embedding":
        g *= _seen_rows(w, seed)[r0:r1, None]
    return g


def _bf16_master(base: U16, u: F32) -> F32:
    """fp32 master weights that round to ``base``: base + a residual under half an ulp."""
    ulp = bf16_to_f32(base & np.uint16(0x7F80)) * np.float32(2**-7)
    u -= np.float32(0.5)
    u *= np.float32(0.998)
    u *= ulp
    # Just below a power of two in magnitude the next bf16 value is only half an ulp away.
    toward_zero = (u < 0) ^ (base >= np.uint16(0x8000))
    u[((base & np.uint16(0x7F)) == 0) & toward_zero] *= np.float32(0.5)
    master = bf16_to_f32(base)
    master += u
    return master


def _step(master: F32, update: F32, lr: float) -> F32:
    """One AdamW step in fp32, in place: decoupled weight decay, then -lr·g."""
    master *= np.float32(1.0 - lr * WEIGHT_DECAY)
    update *= np.float32(lr)
    master -= update
    return master


@dataclass(frozen=True)
class _Block:
    """One generated row block: base and (with an lr) target words; scales for fp8."""

    base: U16 | U8
    target: U16 | U8 | None
    base_scale: F32 | None = None
    target_scale: F32 | None = None

    def changed(self) -> int:
        """Elements whose stored bits differ between base and target."""
        if self.target is None:
            return 0
        n = int(np.count_nonzero(self.base != self.target))
        if self.base_scale is not None and self.target_scale is not None:
            n += int(
                np.count_nonzero(
                    self.base_scale.view(np.uint32) != self.target_scale.view(np.uint32)
                )
            )
        return n


def _generate(w: WeightSpec, seed: int, block: int, r0: int, r1: int, lr: float | None) -> _Block:
    """Base (and, with ``lr``, target) of rows [r0, r1) of a weight."""
    master = _master_normal(w, seed, block, r1 - r0)
    if w.fp8:
        base, base_scale = quantize_e4m3_blocks(master)
        if lr is None:
            return _Block(base, None, base_scale)
        target, target_scale = quantize_e4m3_blocks(
            _step(master, _adam_update(w, seed, block, r0, r1), lr)
        )
        return _Block(base, target, base_scale, target_scale)
    base16 = bf16_bits(master)
    if lr is None:
        return _Block(base16, None)
    u = _rng(seed, w, block, _RESIDUAL).random((r1 - r0, w.cols), dtype=np.float32)
    master = _bf16_master(base16, u)
    return _Block(base16, bf16_bits(_step(master, _adam_update(w, seed, block, r0, r1), lr)))


@dataclass(frozen=True)
class WriteReport:
    """What a generator wrote: ``changed`` counts elements differing from the base."""

    paths: tuple[Path, ...]
    file_bytes: int
    elements: int
    changed: int
    lr: float | None

    @property
    def density(self) -> float:
        """Fraction of all elements whose bit pattern differs from the base."""
        return self.changed / self.elements if self.elements else 0.0


@dataclass(frozen=True)
class _Job:
    weight: WeightSpec
    block: int
    r0: int
    r1: int


def _write_job(job: _Job, offsets: dict[str, tuple[int, int]], seed: int, lr: float | None) -> int:
    """Generate one row block, write it (and its scale rows) in place; return its changes."""
    w = job.weight
    out = _generate(w, seed, job.block, job.r0, job.r1, lr)
    words = out.target if out.target is not None else out.base
    fd, start = offsets[w.name]
    pwrite_all(fd, words.data, start + job.r0 * w.cols * w.dtype.size)
    scale = out.target_scale if out.target_scale is not None else out.base_scale
    if scale is not None:
        fd, start = offsets[w.scale_name]
        pwrite_all(fd, scale.data, start + (job.r0 // FP8_BLOCK) * scale.shape[1] * 4)
    return out.changed()


def _open_file(path: Path, weights: Sequence[WeightSpec]) -> tuple[int, FileLayout]:
    """Create ``path`` at its final size with its safetensors header written."""
    layout = build_header([t for w in weights for t in w.tensors()], dict(METADATA))
    header = layout.header_text.encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, layout.data_start + layout.data_length)
    pwrite_all(fd, len(header).to_bytes(8, "little") + header, 0)
    return fd, layout


def _write_files(
    files: Sequence[tuple[Path, Sequence[WeightSpec]]], seed: int, lr: float | None, threads: int
) -> WriteReport:
    """Write every file under a temporary name, then rename them all into place."""
    tmp = [path.with_name(f".{path.name}.partial") for path, _ in files]
    fds: list[int] = []
    try:
        offsets: dict[str, tuple[int, int]] = {}
        for part, (_, weights) in zip(tmp, files, strict=True):
            fd, layout = _open_file(part, weights)
            fds.append(fd)
            offsets.update({t.name: (fd, layout.data_start + t.begin) for t in layout.tensors})
        jobs = [
            _Job(w, b, r0, r1)
            for _, weights in files
            for w in weights
            for b, (r0, r1) in enumerate(w.row_blocks())
        ]
        changed = sum(ordered_map(lambda j: _write_job(j, offsets, seed, lr), jobs, threads))
    except BaseException:
        for part in tmp:
            part.unlink(missing_ok=True)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    for part, (path, _) in zip(tmp, files, strict=True):
        os.replace(part, path)
    weights_all = [w for _, ws in files for w in ws]
    elements = sum(math.prod(s) for w in weights_all for _, _, s in w.tensors())
    size = sum(path.stat().st_size for path, _ in files)
    return WriteReport(tuple(p for p, _ in files), size, elements, changed, lr)


def write_checkpoint(
    path: str | os.PathLike[str], spec: ModelSpec, *, lr: float | None = None, seed: int = 0,
    threads: int = 2,
) -> WriteReport:  # fmt: skip
    """Write one .safetensors file: the base (``lr`` None) or the target after a step of ``lr``.

    The target is computed from the base regenerated block by block, so the
    report's ``changed`` counts exactly the elements that differ from the base
    written with the same spec and seed.
    """
    return _write_files([(Path(path), spec.weights())], seed, lr, threads)


def shard_weights(weights: Sequence[WeightSpec], shards: int) -> list[list[WeightSpec]]:
    """Split weights, in model order, into ``shards`` non-empty runs of about equal bytes.

    A weight goes to the shard its first byte falls in, advancing at most one
    shard per weight and early enough that no shard is left empty.
    """
    if not 1 <= shards <= len(weights):
        raise BadArgumentError(f"shards must be in 1..{len(weights)}")
    sizes = [sum(math.prod(s) * d.size for _, d, s in w.tensors()) for w in weights]
    total = sum(sizes) or 1
    out: list[list[WeightSpec]] = [[] for _ in range(shards)]
    slot = done = 0
    for i, (w, size) in enumerate(zip(weights, sizes, strict=True)):
        wanted = min(slot + 1, done * shards // total)
        slot = max(slot, min(shards - 1, wanted), shards - (len(weights) - i))
        out[slot].append(w)
        done += size
    return out


def make_sharded(
    folder: str | os.PathLike[str], spec: ModelSpec, shards: int, *, lr: float | None = None,
    seed: int = 0, threads: int = 2,
) -> WriteReport:  # fmt: skip
    """Write a sharded checkpoint into ``folder`` (created if absent).

    Files are ``model-0000i-of-0000N.safetensors`` plus
    ``model.safetensors.index.json`` (``metadata.total_size`` in bytes of
    tensor data and a sorted ``weight_map``), as Hugging Face writes them.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    parts = shard_weights(spec.weights(), shards)
    n = len(parts)
    files = [(root / f"model-{i + 1:05d}-of-{n:05d}.safetensors", ws) for i, ws in enumerate(parts)]
    report = _write_files(files, seed, lr, threads)
    weight_map = {name: path.name for path, ws in files for w in ws for name, _, _ in w.tensors()}
    index = {
        "metadata": {"total_size": spec.nbytes},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return report


@dataclass(frozen=True)
class _Sample:
    """Block 0 of one representative weight, standing for ``scale`` times its size."""

    weight: WeightSpec
    block: _Block
    master: F32
    update: F32
    scale: float
    scale_factor: float

    def changed(self, lr: float) -> float:
        """Expected changed elements in the model part this sample stands for."""
        master = _step(self.master.copy(), self.update.copy(), lr)
        if self.weight.fp8:
            codes, scales = quantize_e4m3_blocks(master)
            assert self.block.base_scale is not None
            hits = np.count_nonzero(codes != self.block.base)
            moved = np.count_nonzero(
                scales.view(np.uint32) != self.block.base_scale.view(np.uint32)
            )
            return float(hits) * self.scale + float(moved) * self.scale_factor
        return float(np.count_nonzero(bf16_bits(master) != self.block.base)) * self.scale


def _sample(
    w: WeightSpec, group_elements: int, group_scales: int, seed: int, budget: int
) -> _Sample:
    unit = FP8_BLOCK if w.fp8 else 1
    rows = min(w.rows, max(unit, budget // w.cols // unit * unit))
    master = _master_normal(w, seed, 0, rows)
    update = _adam_update(w, seed, 0, 0, rows)
    if w.fp8:
        codes, scales = quantize_e4m3_blocks(master)
        block = _Block(codes, None, scales)
        factor = group_scales / scales.size
    else:
        block, factor = _Block(bf16_bits(master), None), 0.0
        u = _rng(seed, w, 0, _RESIDUAL).random((rows, w.cols), dtype=np.float32)
        master = _bf16_master(block.base.view(np.uint16), u)
    return _Sample(w, block, master, update, group_elements / block.base.size, factor)


def _density_estimator(spec: ModelSpec, seed: int, budget: int) -> Callable[[float], float]:
    """density(lr) estimated on block 0 of one weight per group (layers are i.i.d.)."""
    groups: dict[str, list[WeightSpec]] = {}
    for w in spec.weights():
        groups.setdefault(w.group, []).append(w)
    per_group = max(1, budget // len(groups))
    samples = [
        _sample(
            ws[0], sum(w.elements for w in ws),
            sum(math.prod(w.scale_shape) for w in ws if w.fp8), seed, per_group,
        )
        for ws in groups.values()
    ]  # fmt: skip
    total = spec.elements
    return lambda lr: sum(s.changed(lr) for s in samples) / total


@dataclass(frozen=True)
class Calibration:
    """A learning rate and the density it is estimated to produce."""

    lr: float
    estimated_density: float


def calibrate_lr(
    spec: ModelSpec, density: float, *, seed: int = 0, sample_elements: int = 1 << 22
) -> Calibration:
    """The lr whose step changes about ``density`` of all elements (0 < density < 1).

    Bisects log(lr) to within 1% on a sample of ``sample_elements`` drawn
    exactly as the generator draws them; density grows with lr.  The density
    actually written is reported by :func:`write_checkpoint`.
    """
    if not 0 < density < 1:
        raise BadArgumentError("density must be strictly between 0 and 1")
    estimate = _density_estimator(spec, seed, sample_elements)
    lo, hi = 1e-12, 1.0
    if estimate(hi) < density:
        raise BadArgumentError(f"density {density} is not reachable with lr <= 1")
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        if estimate(mid) < density:
            lo = mid
        else:
            hi = mid
    lr = math.sqrt(lo * hi)
    return Calibration(lr, estimate(lr))


@dataclass(frozen=True)
class PairReport:
    """A generated base/target pair: paths, the lr used and the densities."""

    base: Path
    target: Path
    lr: float
    requested_density: float
    estimated_density: float
    achieved_density: float
    file_bytes: int


def make_pair(
    folder: str | os.PathLike[str], spec: ModelSpec, density: float, *, seed: int = 0,
    shards: int = 1, threads: int = 2,
) -> PairReport:  # fmt: skip
    """Write ``base`` and ``target`` checkpoints into ``folder`` at about ``density``.

    Single files ``base.safetensors`` / ``target.safetensors`` when ``shards``
    is 1, otherwise folders ``base/`` and ``target/`` of sharded checkpoints.
    """
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    cal = calibrate_lr(spec, density, seed=seed)
    if shards == 1:
        base, target = root / "base.safetensors", root / "target.safetensors"
        write_checkpoint(base, spec, seed=seed, threads=threads)
        report = write_checkpoint(target, spec, lr=cal.lr, seed=seed, threads=threads)
    else:
        base, target = root / "base", root / "target"
        make_sharded(base, spec, shards, seed=seed, threads=threads)
        report = make_sharded(target, spec, shards, lr=cal.lr, seed=seed, threads=threads)
    return PairReport(
        base, target, cal.lr, density, cal.estimated_density, report.density, report.file_bytes
    )


__all__ = [
    "Calibration",
    "ModelSpec",
    "PairReport",
    "WeightSpec",
    "WriteReport",
    "bf16_bits",
    "bf16_to_f32",
    "calibrate_lr",
    "e4m3fn_bits",
    "make_pair",
    "make_sharded",
    "quantize_e4m3_blocks",
    "shard_weights",
    "spec_for_elements",
    "write_checkpoint",
]
