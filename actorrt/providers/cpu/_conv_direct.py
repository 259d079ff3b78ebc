"""Direct (no patch matrix) float32 2-D convolution with a register-blocked
micro-kernel: 8-lane (AVX2) tiles for the small-``M`` convolutions where
im2col + OpenBLAS sgemm loses most to onnxruntime's NCHWc kernels; 16-lane
(AVX-512, :data:`VW`) tiles for every non-depthwise conv up to a weight-size
bound, 1x1 convs included (at stride 1 without pads a GEMM ``W (M, C) @ x (C,
H*W)`` read in place, the epilogue in the store).

Used by :class:`.conv.Conv` / ``FusedConv`` for float32 2-D convolutions when
:func:`applies` (numba with AVX2 / FMA, see :data:`ENABLED`, :data:`WIDE_ALL`
and :data:`MAX_REDUCTION`); the numpy / BLAS path stays the fallback.

Layout and method:

* The input is copied once, zero-padded, into a *phase-split* buffer ``xs``
  ``(N, C, SH, SW, HI, WJ)`` with ``xs[n, c, py, px, i, j] = xpad[n, c, i*SH + py,
  j*SW + px]`` (for stride 1 it is just the padded input). Output ``(oy, ox)``'s
  tap ``(ky, kx)`` then reads ``xs[n, c, (ky*DH) % SH, (kx*DW) % SW, oy + (ky*DH)
  // SH, ox + (kx*DW) // SW]``: for consecutive ``ox`` consecutive elements, for any
  stride and dilation. A table ``offs`` holds each reduction index ``r = (c, ky,
  kx)``'s element offset from the row start.
* The micro-kernel (an LLVM IR intrinsic, :mod:`._conv_tiles`) computes ``MR`` output channels x
  ``VW * NV`` consecutive output columns of one output row (or of 2 / 4 short
  rows, :data:`BLOCKS`): ``MR * NV`` ``<VW x float>`` accumulators in
  registers; per ``r`` it loads ``NV`` input vectors
  and broadcasts ``MR`` weights (packed ``(G, M/G/MR, R, MR)``, zero rows past
  ``M/G``). The store applies the epilogue (bias, residual ``Z``, then
  ``max(v, alpha*v)`` clamped to ``[lo, hi]``: Relu, LeakyRelu, Clip or none)
  and writes only the valid lanes and rows (``llvm.masked.store``), straight
  into ``y (N, M, OH, OW)``.
* Work items are (image, group, output row group, channel part), each its
  column tiles times its channel blocks (the tile's input window stays in
  L1); more than one intra-op thread splits them (and the phase copy's input
  planes) into ranges on the compiled partner threads (:mod:`._conv_split`),
  else on :func:`._parallel.run_chunks`.

Shapes: ``x (N, C, H, W)`` float32, ``w`` packed from the ``(G, M/G, C/G*KH*KW)``
GEMM layout of :func:`.conv._pack`; ``y (N, M, OH, OW)`` float32.
"""

from __future__ import annotations

from . import _numba_cache  # noqa: F401  (numba's disk cache keyed on every kernel file)

import math

import numpy as np

from . import _conv_tiles as _ct
from ._conv_tiles import HAVE_KERNEL, VW

__all__ = ["HAVE_KERNEL", "ENABLED", "applies", "takes_pointwise", "block_for", "VW",
           "pack_weights", "conv2d", "make_plan", "run", "phase_copy", "Plan", "act_params",
           "block_of", "ACT_BOUNDS", "pack_bias"]

#: use the direct kernel where :func:`applies` (tests switch it off to check
#: the BLAS path and on to check this one)
ENABLED = True
#: ... and only up to this many output channels per group, unless the output
#: plane is at most :data:`SMALL_PLANE` pixels: in the A/B (loaded machine) 64+
#: channels over larger planes went 0.74-2.3x (1x16x55x55 -> 64: 1.55-1.99,
#: squeezenet's 7x7 stem -> 96: 2.26, 1x64x56x56 -> 64: 0.95-1.23), while every
#: layer of up to 32 channels, and the 64-channel ones on 4x4 planes, won (0.18-0.71);
#: squeezenet's 192/256-channel 13x13 expands (kernel A/B 0.84-1.01) made the model
#: 0.2-0.4 slower in four interleaved runs, so the plane limit is 8x8
MAX_MG = 32
SMALL_PLANE = 64
#: ... and only reductions of at least this many: shorter ones (3-channel 3x3
#: stems, 27) pay the tile's masked epilogue per 27 steps; shufflenet with its
#: 3x3 stem on the direct kernel measured 0.15-0.5 higher ratios in three
#: interleaved runs
MIN_REDUCTION = 64
#: reductions are cut into blocks of this many (channel, tap) pairs: a
#: block's input window stays in L1; later blocks add onto the stored sums,
#: the last applies the epilogue
REDUCTION_BLOCK = 576
#: bytes of packed weights (channel blocks x one reduction block) swept per
#: column tile: they stay in L2
WEIGHT_BLOCK_BYTES = 160 << 10
#: only convolutions whose reduction ``C/G * KH * KW`` is at most this take the
#: direct kernel: past it a tile's input window and a channel block's weights
#: outgrow L1 (no reduction blocking here) and im2col + sgemm was faster in the
#: A/B (3x3 over 128-512 channels: direct 1.2-1.9x slower; over 64 channels
#: 0.76-1.07; resnetish's 16-64-channel layers 0.18-0.58). Cutting the
#: reduction into L1-sized blocks (:data:`REDUCTION_BLOCK`) did not close that
#: gap (1.16-2.0x on the 128-512-channel layers, same A/B)
MAX_REDUCTION = 576
#: with the 16-lane (AVX-512) tiles every non-depthwise float32 2-D conv takes
#: the direct kernel (1x1 as a GEMM on x in place); the limits above are the
#: 8-lane (AVX2) tiles'. Depthwise convs stay on :mod:`._conv_numba`
WIDE_ALL = True
#: ... up to this many bytes of weights: every row group sweeps all of them,
#: so past L2-L3 sizes im2col + sgemm may reuse them better. Round 7 (per
#: layer, load 4-7) set 4 MB: 3x3 512 -> 512 on 7x7, 9.4 MB, direct 7.5 ms vs
#: 6.3. Round 11 (idle, 32 MB L3): that layer direct 1.74 ms vs 2.48 on the
#: GEMM path (onnxruntime 0.98), and whole models with 16 MB against 4 MB
#: (sessions interleaved in one process): vgg19 0.84x the time at 1 thread,
#: 0.80x at 2; resnet50 0.98x / 0.89x
WIDE_MAX_WEIGHT_BYTES = 16 << 20
#: 1x1 convs take the direct kernel only on inputs of at most this many bytes
#: (:func:`takes_pointwise`; larger ones the GEMM on the input's view). No
#: limit by default: isolated layers ran 1.0-1.3x onnxruntime on the direct
#: kernel against 1.6-2.0x on the GEMM (interleaved, one process); inside
#: mobilenetish / densenet121 (sessions with and without a 512 KB limit
#: interleaved in one process, load 2-5) the two did not differ beyond what
#: two identical sessions differed by (0.2-0.3 of the ratio)
POINTWISE_MAX_INPUT_BYTES = 1 << 62
#: widest row a flattened 1x1 conv is cut into (:func:`_flat_rows`)
FLAT_ROW_MAX = 512
#: flattened 1x1 convs of at most this many pixels, divisible by 8 or 7, run
#: as rows of 8 / 7 pixels on the channel-vector tiles (1 thread, against the
#: 32-column row tiles: 2048 -> 512 on 7x7 603 -> 504 us, onnxruntime 429;
#: 512 -> 2048 600 -> 514 (415); 1024 -> 352 216 -> 180 (150); on 14x14 and
#: larger planes slower: 1024 -> 256 542 -> 597, 64 -> 256 on 56x56 2x)
POINTWISE_CT_MAX_PIXELS = 64
#: several short output rows in one 16-lane tile (:data:`BLOCKS` 2, 3)
MULTI_ROW = True
#: a plan's work items (row groups x channel parts) are at least this many
#: where the channel blocks allow, so two threads share them evenly
MIN_ITEMS = 8
#: a work item takes all the output rows of its image (each weight block read
#: once for all of them, not once per row group) where the weights pass
#: :data:`ROWS_PASS_MIN_WEIGHT_BYTES` (they would come from L3 / memory for
#: every row) and one reduction block's input planes stay within
#: :data:`ROWS_PASS_MAX_WINDOW_BYTES` (in L2 across the rows)
ROWS_PER_WEIGHT_PASS = True
ROWS_PASS_MIN_WEIGHT_BYTES = 1 << 20
ROWS_PASS_MAX_WINDOW_BYTES = 256 << 10

#: ``(MR, NV)`` register blocks: output channels x VW-float vectors of
#: columns, and output rows per tile, indexed by a plan's ``kind``
#: (:func:`block_for`): 0 wide rows, 1 narrow rows (at most VW columns), 2 / 3
#: two / four rows of at most VW / 2 / VW / 4 columns in one tile (each row's
#: lanes a merge-masked load at its own offset; the rows are contiguous in y).
#: The one-vector blocks take 16 output channels with the 16-lane tiles
#: (round 8: 17 accumulators instead of 9, half the input loads per FMA; per
#: layer, thread CPU time, interleaved, 3x3 on 14x14 / 7x7 planes: 1.60-3.50x
#: onnxruntime -> 1.38-1.91x; 24 channels the same within noise but wasting rows
#: on 64 / 224-channel layers; 12 / 14 channels for the wide block: no change)
#: Kinds 4-6 (16-lane tiles only, :data:`CHANNEL_TILES`) turn the vectors
#: round: ``<16 x float>`` over output channels (``MR = 16 * NV``), one
#: accumulator per pixel and channel vector (``P`` pixels of one row), the
#: input broadcast per pixel -- onnxruntime's NCHWc arrangement on NCHW data,
#: so rows narrower than a vector waste no lanes; the store scatters each
#: pixel's channels (``llvm.masked.scatter``). ``(P, NV)`` per kind: 4x4 for
#: rows of at most 4 columns and 48+ channels, 7x2 for rows of at most 7,
#: 8x2 for rows of 8 (per layer against the row tiles, 1 thread: 3x3 512 ->
#: 512 on 7x7 1,670 -> 1,140 us (onnxruntime 1,014), 192 -> 224 on 7x7 265 ->
#: 188 (173), 64 -> 64 on 4x4 49 -> 28 (23); 12 pixels spilled registers)
CT_TILES = ((4, 4), (7, 2), (8, 2))
BLOCKS = ((8, 2, 1), (16, 1, 1), (16, 1, 2), (16, 1, 4)) + \
    tuple((16 * nv, 1, 1) for _, nv in CT_TILES) if VW == 16 else \
    ((4, 2, 1), (8, 1, 1), (8, 1, 2), (8, 1, 4))
BLOCK_WIDE, BLOCK_NARROW = BLOCKS[0][:2], BLOCKS[1][:2]
_KIND_MR = tuple(b[0] for b in BLOCKS)
_KIND_COLS = tuple(VW * b[1] for b in BLOCKS[:4]) + \
    (tuple(p for p, _ in CT_TILES) if VW == 16 else ())
_KIND_RPT = tuple(b[2] for b in BLOCKS)
#: rows of at most 8 output columns take the channel-vector tiles (kinds
#: 4-6) with the 16-lane tiles
CHANNEL_TILES = True
#: ... where the reduction ``C/G * KH * KW`` is at least this long: their
#: scattered store costs more per tile than the row tiles' masked one, which
#: short reductions do not repay (1 thread: resnetish's 1x1 16 -> 32 at r = 16
#: 8.0 -> 12.9 us, 3x3 16 -> 32 at r = 144 20.8 -> 23.5, 32 -> 32 at r = 288
#: 29.5 -> 30.3; 64 -> 64 at r = 576 34 -> 28-30; resnetish 1-3 % slower
#: with them at every r)
CT_MIN_REDUCTION = 512
#: software prefetches (1: on): with each tile, write hints for the same
#: tile's lines of the next row group's output (and read hints for the
#: residual ``Z``'s). Inside a model a layer's output and residual are rarely
#: still in cache; the tiles write ``MR`` channel planes at once, more
#: concurrent streams than the hardware prefetchers follow, and the
#: read-for-ownership misses then come one at a time: resnet50's layers ran
#: 1.3-3x their cache-hot time in the model (docs/speed.md round 13). All of a
#: row group's hints at once before its tiles gained less (resnet50 0.97-1.01x
#: against 0.93-0.97x); read hints for a 1x1 conv's next input tile gained
#: nothing (0.97-1.03x)
PREFETCH = 1
#: ... for outputs of at least this many bytes (smaller ones mostly stay in
#: L2 / L3 between layers, where the hints cost instructions: mobilenetish's
#: 0.8-1.6 MB outputs 1.03-1.06x the time with them, resnetish 1-4 %)
PREFETCH_MIN_BYTES = 2 << 20

if HAVE_KERNEL:
    from numba import njit

    from ._atomics import prefetch_line, prefetch_line_w

    @njit(nogil=True, cache=True, inline="always")
    def _prefetch_outputs(y, z, has_z, y_at, nrow, plane, nch):  # pragma: no cover - compiled
        """Write-prefetch hints for ``nch`` channel planes of ``y`` (read
        hints for ``z``) from element ``y_at``, ``nrow`` elements each."""
        for c in range(nch):
            e0 = y_at + c * plane
            a = (e0 * 4) & ~63
            while a < (e0 + nrow) * 4:
                prefetch_line_w(y, a)
                if has_z:
                    prefetch_line(z, a)
                a += 64

    from ._conv_tiles import channel_tile_codegen, tile_intrinsic

    _tile0, _tile1, _tile2, _tile3 = (tile_intrinsic(*b) for b in BLOCKS[:4])
    if VW == 16:
        _tile4, _tile5, _tile6 = (tile_intrinsic(*b, codegen=channel_tile_codegen(*ct))
                                  for b, ct in zip(BLOCKS[4:], CT_TILES))
    else:  # never called (no kinds 4-6 without the 16-lane tiles)
        _tile4 = _tile5 = _tile6 = _tile3

    @njit(nogil=True, cache=True, inline="always")
    def _tile(kind, xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
              has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride):  # pragma: no cover
        if kind == 0:
            _tile0(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
                   has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride)
        elif kind == 1:
            _tile1(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
                   has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride)
        elif kind == 2:
            _tile2(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
                   has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride)
        elif kind == 3:
            _tile3(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
                   has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride)
        elif kind == 4:
            _tile4(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
                   has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride)
        elif kind == 5:
            _tile5(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
                   has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride)
        else:
            _tile6(xs, x_off, offs, nr, wp, w_off, y, y_off, y_stride, ncols, bias, b_off, z,
                   has_z, lo, hi, alpha, mvalid, r0, flags, row_w, x_rstride)

    @njit(nogil=True, cache=True)
    def _rows(xs, offs, wp, y, bias, z, has_z, lo, hi, alpha, g, mb, mg, nr, x_img, x_grp,
              oh, ow, wj, kc, obg, kind, mparts, rgroups, pf, start, stop):  # pragma: no cover
        """Work items ``[start, stop)``, each (image, group, ``rgroups`` row
        groups, channel part): per item, reduction blocks of kc, groups of obg
        channel blocks of the part (their weights stay in L2), the item's row
        groups, column tiles, channel blocks (a tile's input window stays in
        L1 while every block reads it). ``kind``: the register block
        (:data:`BLOCKS`); a row group is one output row, or for the multi-row
        blocks ``rpt`` rows of at most ``VW / rpt`` columns in one tile.
        Several row groups per item (:data:`ROWS_PER_WEIGHT_PASS`) read each
        weight block once for all of them. (One module-level function:
        numba's cache keys closures by their cells, which an intrinsic does
        not pickle stably, so a closure recompiled per process.)
        ``pf``: the plan's :data:`PREFETCH`: with each tile, write hints for
        its lines of the next row group's output (read hints for the
        residual's)."""
        mr = _KIND_MR[kind]
        cols = _KIND_COLS[kind]
        rpt = _KIND_RPT[kind]
        ngroups = (oh + rpt - 1) // rpt
        nblocks = (ngroups + rgroups - 1) // rgroups
        mbp = (mb + mparts - 1) // mparts
        m = g * mg
        plane = oh * ow
        for t in range(start, stop):
            part = t % mparts
            t2 = t // mparts
            gr0 = (t2 % nblocks) * rgroups
            gr1 = min(ngroups, gr0 + rgroups)
            rest = t2 // nblocks
            gi = rest % g
            n = rest // g
            b0 = part * mbp
            b1 = min(mb, b0 + mbp)
            for r0 in range(0, nr, kc):
                kn = min(kc, nr - r0)
                flags = (1 if r0 > 0 else 0) | (2 if r0 + kn >= nr else 0)
                for og in range(b0, b1, obg):
                    for gr in range(gr0, gr1):
                        oy = gr * rpt
                        x_row = n * x_img + gi * x_grp + oy * wj
                        ahead = pf & 1 and gr + 1 < ngroups
                        for ox0 in range(0, ow, cols):
                            ncols = ow - ox0 if rpt == 1 else min(rpt, oh - oy) * ow
                            for ob in range(og, min(b1, og + obg)):
                                mvalid = min(mr, mg - ob * mr)
                                w_off = ((gi * mb + ob) * nr + r0) * mr
                                y_at = ((n * m + gi * mg + ob * mr) * oh + oy) * ow + ox0
                                if ahead:  # this tile's lines of the next row group
                                    _prefetch_outputs(
                                        y, z, has_z, y_at + rpt * ow,
                                        min(cols, ow - ox0) if rpt == 1 else
                                        min(rpt, oh - oy - rpt) * ow, plane, mvalid)
                                _tile(kind, xs, x_row + ox0, offs, kn, wp, w_off, y, y_at,
                                      plane, ncols, bias, (gi * mb + ob) * mr, z, has_z, lo, hi,
                                      alpha, mvalid, r0, flags, ow, wj)

    #: public name of :func:`_rows` (the compiled split of :mod:`._conv_split`)
    rows_range = _rows

#: activation -> (alpha, lo, hi) of ``min(max(where(v < 0, alpha*v, v), lo), hi)``
ACT_BOUNDS = {"": (1.0, -np.inf, np.inf), "Relu": (1.0, 0.0, np.inf)}


def act_params(act: str, params=()) -> tuple[float, float, float] | None:
    """``(alpha, lo, hi)`` of an activation the kernel's store applies, or None."""
    if act in ACT_BOUNDS:
        return ACT_BOUNDS[act]
    if act == "LeakyRelu":
        return (float(params[0]) if params else 0.01, -np.inf, np.inf)
    if act == "Clip":
        lo = float(params[0]) if len(params) > 0 else -np.inf
        hi = float(params[1]) if len(params) > 1 else np.inf
        return (1.0, lo, hi)
    return None


def block_of(ow: int, mg: int | None = None, r: int | None = None) -> tuple[int, int]:
    """The ``(MR, NV)`` register block for rows of ``ow`` output columns,
    ``mg`` output channels per group and a reduction of ``r`` (None: many)."""
    return BLOCKS[block_for(ow, mg, r)][:2]


def block_for(ow: int, mg: int | None = None, r: int | None = None) -> int:
    """The register block (index into :data:`BLOCKS`) for rows of ``ow``
    output columns, ``mg`` output channels per group and a reduction of
    ``r`` (None: many): wide; narrow for rows of at most VW; with the
    16-lane tiles the channel-vector tiles for rows of at most 8
    (:data:`CT_TILES`) and reductions of :data:`CT_MIN_REDUCTION` or more,
    else several rows in one tile for rows of at most VW / 2 columns."""
    if ow > VW:
        return 0
    if VW == 16 and CHANNEL_TILES and ow <= CT_TILES[-1][0] and \
            (r is None or r >= CT_MIN_REDUCTION):
        if ow <= CT_TILES[0][0] and (mg is None or mg >= 48):
            return 4
        return 5 if ow <= CT_TILES[1][0] else 6
    if VW == 16 and MULTI_ROW and 2 * ow <= VW:
        return 3 if 4 * ow <= VW else 2
    return 1


def applies(dtype, channels: int, kernel, group: int, mg: int, out_shape) -> bool:
    """Whether :func:`conv2d` takes a convolution of ``channels`` input
    channels in ``dtype`` to ``mg`` output channels per group (float32, 2-D,
    the kernel built, enabled, a reduction ``channels / group * KH * KW`` in
    ``[MIN_REDUCTION, MAX_REDUCTION]``, and at most :data:`MAX_MG` output channels
    per group unless the output plane has at most :data:`SMALL_PLANE` pixels;
    with the 16-lane tiles every non-depthwise one up to
    :data:`WIDE_MAX_WEIGHT_BYTES` of weights, see :data:`WIDE_ALL`)."""
    if not (ENABLED and HAVE_KERNEL) or np.dtype(dtype) != np.float32 or len(kernel) != 2:
        return False
    if channels // group == 1 and group > 1:
        return False  # depthwise: the compiled per-plane kernel of _conv_numba
    if VW == 16 and WIDE_ALL:
        return 4 * group * mg * (channels // group) * math.prod(kernel) <= WIDE_MAX_WEIGHT_BYTES
    if not MIN_REDUCTION <= (channels // group) * math.prod(kernel) <= MAX_REDUCTION:
        return False
    return mg <= MAX_MG or math.prod(out_shape) <= SMALL_PLANE


def takes_pointwise(x_shape=None) -> bool:
    """Whether a 1x1 convolution of an input of ``x_shape`` (None: any) takes
    the direct kernel (the 16-lane tiles with :data:`WIDE_ALL`, an input of at
    most :data:`POINTWISE_MAX_INPUT_BYTES`), rather than the GEMM on the
    input's view."""
    if not (ENABLED and HAVE_KERNEL and VW == 16 and WIDE_ALL):
        return False
    return x_shape is None or 4 * math.prod(x_shape) <= POINTWISE_MAX_INPUT_BYTES


def pack_weights(wpack: np.ndarray, ow: int, mr: int | None = None) -> np.ndarray:
    """``(G, Mg, R)`` GEMM-layout weights -> ``(G, ceil(Mg/MR), R, MR)`` float32
    (zero rows past ``Mg``), ``MR`` given (a plan's ``mr``) or from
    :func:`block_of` ``(ow, Mg, R)``."""
    g, mg, r = wpack.shape
    mr = mr or block_of(ow, mg, r)[0]
    mb = -(-mg // mr)
    wp = np.zeros((g, mb * mr, r), np.float32)
    wp[:, :mg] = wpack
    return np.ascontiguousarray(wp.reshape(g, mb, mr, r).transpose(0, 1, 3, 2))


def _flat_rows(hw: int, cols: int) -> int:
    """Row width for a 1x1 stride-1 conv's ``hw`` output pixels seen as
    ``(hw / width, width)`` rows (any factorisation is the same GEMM): the
    divisor of ``hw`` up to :data:`FLAT_ROW_MAX` wasting the fewest tile lanes,
    the widest among those."""
    best, best_key = hw, None
    for d in range(1, min(hw, FLAT_ROW_MAX) + 1):
        if hw % d:
            continue
        waste = (-(-d // cols) * cols - d) / d
        key = (round(waste, 3), -d)
        if best_key is None or key < best_key:
            best, best_key = d, key
    return best


def _offsets(cg, kernel, strides, dilations, hi, wj):
    sh, sw = strides
    dh, dw = dilations
    kh, kw = kernel
    plane = sh * sw * hi * wj
    offs = np.empty((cg, kh, kw), np.int64)
    for ky in range(kh):
        py, iy = divmod(ky * dh, sh)[1], (ky * dh) // sh
        for kx in range(kw):
            px, ix = (kx * dw) % sw, (kx * dw) // sw
            offs[:, ky, kx] = np.arange(cg) * plane + (py * sw + px) * hi * wj + iy * wj + ix
    return offs.reshape(-1)


class Plan:
    """Everything :func:`run` needs that depends only on the input signature
    (from :func:`make_plan`; immutable, shareable between threads).

    ``blocks`` (None until first used) and ``bufs`` are the plan's free lists
    of scratch that calls take and hand back (list pop / append: concurrent
    calls each take their own): :mod:`._conv_split`'s template parameter
    blocks and :func:`run`'s phase-split buffers (:data:`REUSE_BUFFERS`)."""

    __slots__ = ("offs", "total", "copies", "table", "xs_shape", "y_shape", "rows", "ints", "items",
                 "mr", "mb", "mg", "g", "split", "flops", "key", "blocks", "bufs")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def make_plan(x_shape, wpack_shape, group: int, kernel, strides, dilations, pb,
              out_shape, *, flatten: bool = False) -> Plan:
    """The :class:`Plan` of ``x (N, C, H, W)`` convolved with ``(G, M/G, R)``
    GEMM-layout weights (geometry as :func:`conv2d`'s arguments). ``flatten``
    (convolutions only): a 1x1 stride-1 unpadded conv with the 16-lane tiles
    reads ``x`` in place as rows of :func:`_flat_rows` pixels (``copies`` is
    then None)."""
    n, c, h, w = x_shape
    g, mg, r = wpack_shape
    cg = c // group
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilations
    oh, ow = out_shape
    y_shape = (n, group * mg, oh, ow)
    inplace = flatten and VW == 16 and (kh, kw) == (1, 1) and (sh, sw) == (1, 1) \
        and tuple(pb) == (0, 0) and (oh, ow) == (h, w)
    if inplace:  # the same GEMM on rows of another width: fewer wasted lanes
        ow = _flat_rows(h * w, _KIND_COLS[block_for(h * w)])
        if VW == 16 and CHANNEL_TILES and h * w <= POINTWISE_CT_MAX_PIXELS and \
                r >= CT_MIN_REDUCTION:
            # rows of 8 / 7 pixels for the channel-vector tiles (no lanes wasted)
            ow = next((d for d in (CT_TILES[2][0], CT_TILES[1][0]) if (h * w) % d == 0), ow)
        oh = h * w // ow
        h, w = oh, ow
    kind = block_for(ow, mg, r)
    mr, nv, rpt = BLOCKS[kind]
    mb = -(-mg // mr)
    # padded extent that the taps reach, rounded up to whole phases
    hp = max((oh - 1) * sh + (kh - 1) * dh + 1, pb[0] + h)
    wpd = max((ow - 1) * sw + (kw - 1) * dw + 1, pb[1] + w)
    hi_, wj = -(-hp // sh), -(-wpd // sw)
    # every row group of an image in one item (one pass over the weights)
    # where the weights outgrow L2 and one reduction block's input planes fit it
    ngroups = -(-oh // rpt)
    window = 4 * -(-min(r, REDUCTION_BLOCK) // (kh * kw)) * sh * sw * hi_ * wj
    rgroups = ngroups if ROWS_PER_WEIGHT_PASS and 4 * g * mg * r > ROWS_PASS_MIN_WEIGHT_BYTES \
        and window <= ROWS_PASS_MAX_WINDOW_BYTES else 1
    # channel parts per row block: at least MIN_ITEMS items to share out
    row_items = n * g * -(-ngroups // rgroups)
    mparts = max(1, min(mb, -(-MIN_ITEMS // row_items)))
    x_grp = cg * sh * sw * hi_ * wj
    x_img = group * x_grp
    offs = _offsets(cg, kernel, strides, dilations, hi_, wj)
    ncol = -(-ow // (VW * nv)) * VW * nv
    need = (n - 1) * x_img + (group - 1) * x_grp + (oh - 1) * wj + ncol + int(offs.max())
    t, l = pb
    copies, table = [], []
    # phases some tap reads (a 1x1 stride-2 conv reads one of four)
    used = {((ky * dh) % sh, (kx * dw) % sw) for ky in range(kh) for kx in range(kw)}
    for py in range(sh):
        # padded rows i*sh + py that hold input rows: input row = i*sh + py - t
        i0 = max(0, -(-(t - py) // sh))
        i1 = min(hi_, (h - 1 + t - py) // sh + 1)
        if i1 <= i0:
            continue
        for px in range(sw):
            j0 = max(0, -(-(l - px) // sw))
            j1 = min(wj, (w - 1 + l - px) // sw + 1)
            if j1 <= j0 or (py, px) not in used:
                continue
            r0, c0 = i0 * sh + py - t, j0 * sw + px - l
            table.append((py * sw + px, i0, i1, j0, j1, i0 * sh + py - t, j0 * sw + px - l, sh))
            copies.append(((slice(None), slice(None), py * sw + px, slice(i0, i1), slice(j0, j1)),
                           (slice(None), slice(None), slice(r0, r0 + (i1 - i0 - 1) * sh + 1, sh),
                            slice(c0, c0 + (j1 - j0 - 1) * sw + 1, sw))))
    return Plan(offs=offs, total=max(need, n * x_img), copies=None if inplace else tuple(copies),
                table=np.array(table, np.int64).reshape(-1, 8),
                xs_shape=(n, c, sh * sw, hi_, wj), y_shape=y_shape,
                rows=_rows,
                ints=(g, mb, mg, r, x_img, x_grp, oh, ow, wj, REDUCTION_BLOCK,
                      max(1, WEIGHT_BLOCK_BYTES // (4 * mr * min(r, REDUCTION_BLOCK))),
                      kind, mparts, rgroups,
                      PREFETCH if 4 * n * group * mg * oh * ow >= PREFETCH_MIN_BYTES else 0),
                items=row_items * mparts, mr=mr, mb=mb,
                mg=mg, g=g, split=2 * n * group * mg * r * oh * ow >= PARALLEL_MIN_FLOPS,
                flops=2 * n * group * mg * r * oh * ow,
                key=(tuple(x_shape), tuple(wpack_shape), group, tuple(kernel), tuple(strides),
                     tuple(dilations), tuple(pb), tuple(out_shape)), blocks=None, bufs=[])


def pack_bias(plan: Plan, bias) -> np.ndarray:
    """``bias (M,)`` or None as the tiles read it: ``(G * MB * MR,)`` float32,
    zero past each group's ``M/G`` (``bias`` itself where that is its layout)."""
    mr, mb, mg = plan.mr, plan.mb, plan.mg
    if bias is not None and mb * mr == mg and bias.dtype == np.float32 and bias.ndim == 1 \
            and bias.flags.c_contiguous:
        return bias
    bp = np.zeros(plan.g * mb * mr, np.float32)
    if bias is not None:
        bp.reshape(plan.g, mb * mr)[:, :mg] = np.asarray(bias, np.float32).reshape(plan.g, mg)
    return bp


def run(plan: Plan, x: np.ndarray, wp: np.ndarray, bias, z, alpha: float, lo: float,
        hi: float, packed_bias: np.ndarray | None = None) -> np.ndarray:
    """``y = min(max(where(v < 0, alpha*v, v), lo), hi)`` for ``v = conv(x, w) +
    bias + z``: ``x`` of the plan's input shape (float32), ``wp`` the
    :func:`pack_weights` of the weights for the plan's output width, ``bias``
    ``(M,)`` or None (or ``packed_bias``, its :func:`pack_bias`, kept by the
    caller), ``z`` of the output's shape or None."""
    rows, items = plan.rows, plan.items
    threads = 1
    if items > 1 and (plan.split or plan.flops >= _split().MIN_CONV_FLOPS):
        threads = current_threads()
        if not plan.split and not _split().splits(threads):
            threads = 1  # small for the chunk loop: only the partners take it
    # the row copies and the in-place tiles read x with masked vectors
    x = _ct.readable(np.ascontiguousarray(x, dtype=np.float32))
    if plan.copies is None:  # read in place
        buf = x.reshape(-1)
    else:
        buf = None
        if REUSE_BUFFERS:
            try:
                buf = plan.bufs.pop()  # pads still zero: the copy writes only input cells
            except IndexError:
                pass
        if buf is None:
            buf = np.zeros(plan.total, np.float32)
        if threads <= 1 or plan.xs_shape[0] * plan.xs_shape[1] < 2 or \
                not _split().phase_copy(plan, x, buf, threads):
            phase_copy(plan, x, buf)
    y = _ct.empty_with_slack(plan.y_shape, np.float32)
    bp = pack_bias(plan, bias) if packed_bias is None else packed_bias
    if z is not None:
        zz = _ct.readable(np.ascontiguousarray(z, dtype=np.float32)).reshape(-1)
        has_z = 1
    else:
        # no z: the tile's z loads are all masked off, but their addresses are
        # still z's base plus y's offsets. Here they are y's own (mapped)
        # cells; with the bias as the placeholder (as before) they ran up to
        # y's size past it, into memory that may be unmapped or never touched,
        # and a masked load whose masked-off lanes reach a page not present in
        # the page tables takes a microcode assist on AMD Zen: 1.1-8x the whole
        # convolution's time, set by where the bias happened to lie
        # (docs/speed.md round 11)
        zz, has_z = y.reshape(-1), 0
    args = (buf, plan.offs, wp.reshape(-1), y.reshape(-1), bp, zz, has_z, np.float32(lo),
            np.float32(hi), np.float32(alpha), *plan.ints)
    if threads <= 1:
        rows(*args, 0, items)
    elif _split().conv_rows(plan, *args[:10], threads):
        pass  # on the compiled partner threads
    else:
        from . import _parallel
        per = -(-items // (_parallel.CHUNKS_PER_THREAD * threads))
        _parallel.run_chunks(lambda i: rows(*args, i * per, min(items, (i + 1) * per)),
                             -(-items // per), threads)
    if REUSE_BUFFERS and plan.copies is not None:
        plan.bufs.append(buf)
    return y


#: hand :func:`run`'s phase-split buffers back to the plan for later calls
#: (off: a new zeroed buffer per call, the A/B baseline)
REUSE_BUFFERS = True


def _split():
    """:mod:`._conv_split` (imported on first use: it imports this module)."""
    global _split_mod
    if _split_mod is None:
        from . import _conv_split
        _split_mod = _conv_split
    return _split_mod


_split_mod = None


def phase_copy(plan: Plan, x: np.ndarray, buf: np.ndarray) -> None:
    """Copy ``x`` (the plan's input shape, ``buf``'s dtype) into the
    phase-split buffer ``buf`` (flat, pads left as they are): the compiled row
    copies (:data:`COMPILED_COPY`), else numpy slice assignments."""
    n, c, nphase, hi, wj = plan.xs_shape
    if COMPILED_COPY and HAVE_KERNEL and x.ndim == 4:
        from ._conv_vec import phase_copy_rows
        xf = np.ascontiguousarray(x, dtype=buf.dtype).reshape(-1)
        sw = plan.key[4][1]  # the column stride
        phase_copy_rows(xf, buf, plan.table, c, x.shape[2], x.shape[3], nphase, hi, wj, sw, 0, n * c)
        return
    xs = buf[:math.prod(plan.xs_shape)].reshape(plan.xs_shape)
    for dst, src in plan.copies:
        xs[dst] = x[src]


#: copy the input into the phase-split buffer with the compiled row copies
COMPILED_COPY = True


def current_threads() -> int:
    """The intra-op thread count (:func:`._threads.current`)."""
    global _current
    if _current is None:
        from ._threads import current
        _current = current
    return _current()


_current = None


def conv2d(x: np.ndarray, wpack: np.ndarray, wp: np.ndarray | None, group: int, kernel,
           strides, dilations, pb, out_shape, bias=None, z=None, act: str = "",
           params=()) -> np.ndarray:
    """``y (N, M, OH, OW)`` float32 = ``act(conv(x, w) + bias + z)`` (a
    :func:`make_plan` and :func:`run`; callers that convolve one signature
    repeatedly keep the plan).

    Args:
        x: ``(N, C, H, W)`` float32; wpack: ``(G, M/G, C/G*KH*KW)``; wp: the
            :func:`pack_weights` of it for this ``OW`` (packed here when None);
            pb: leading pads ``(top, left)`` (trailing pads follow from
            ``out_shape``); bias ``(M,)`` or None; z ``(N, M, OH, OW)`` or None.
        act: "", "Relu", "LeakyRelu" or "Clip" (``params`` as onnxruntime's).

    Raises:
        ValueError: an activation the kernel's store does not apply.
    """
    ap = act_params(act, params)
    if ap is None:
        raise ValueError(f"direct conv: activation {act!r} is not fused in the store")
    plan = make_plan(x.shape, wpack.shape, group, kernel, strides, dilations, pb, out_shape,
                     flatten=True)
    if wp is None or wp.shape[-1] != plan.mr:
        wp = pack_weights(wpack, out_shape[1], plan.mr)
    return run(plan, x, wp, bias, z, *ap)


#: the direct kernel splits over the intra-op threads from this many flops
PARALLEL_MIN_FLOPS = 1 << 23
