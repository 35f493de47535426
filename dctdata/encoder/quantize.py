"""Apply a CodecSpec: samples -> quantized coefficients (`encode`) and back (`decode_reference`).

Encoding, in order (each step only where the spec asks for it):
1. per-sample side information (spec.side == "range_mid"): each sample channel is coded as
   (x - mid) / range, so every item is quantized against its own range (the project's PSNR);
2. channel weights (spec.weights, codec v3) scale the channels, and a channel rotation (spec.rotation, an
   orthonormal C x C matrix) mixes them, before the DCT;
3. padding to whole blocks (spec.pad) and the block DCT of the kept frequencies;
4. quantization q = round((coef - offset) / step): plain rounding (v1), or dead-zone rounding
   sign(v) floor(|v| + theta) when spec.theta is set.

Overflow is never silent: values outside the wire dtype's range are clamped *and counted*; callers
report the count and `--strict` turns any into an error. Choosing the steps from data (calibration)
lives in dctdata.encoder.calibrate; this module only applies them. `Decompress` (dctdata.decoder.layer) is the fast
decoder; `decode_reference` is the plain one it is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

import dctdata.encoder.encode_kernels as encode_kernels
from dctdata.codec import transform3d
from dctdata.codec.spec import INTEGER_DTYPES, CodecSpec
from dctdata.codec.transform import compress, decompress
from dctdata.decoder.wire import split_wire
from dctdata.errors import DctDataError

_FP16_MAX = float(torch.finfo(torch.float16).max)
# Items the per-sample floor lifts are aimed at this share of its nmse cap: just inside it.
FLOOR_AIM = 0.97
FLOOR_LOOSE = 0.9  # ... and given back part of the lift when they land below this share
# Largest |x| whose 8x8 orthonormal DCT stays finite in float32 (a coefficient is at most 8 max|x|).
F32_SAFE_MAX = float(torch.finfo(torch.float32).max) / 8
BOUND_ROUNDS = 16  # re-codes of an item before its pointwise bound is declared unreachable (`keep_bound`)


def _table(values, spec: CodecSpec, device) -> torch.Tensor:
    """(C, K) table shaped to broadcast over (..., C, R, K, Wb) (`CodecSpec.rows_shape`)."""
    return torch.as_tensor(values, dtype=torch.float32, device=device).reshape(spec.channels, 1, spec.kept, 1)


def check_coeff_shape(coeffs: torch.Tensor, spec: CodecSpec, name: str = "coefficients") -> None:
    """Raise unless coeffs end in the spec's (C, Hb, K, Wb) ((C, Db, Hb, K, Wb) for a volume)."""
    n = len(spec.coeff_shape)
    if tuple(coeffs.shape[-n:]) != spec.coeff_shape or coeffs.dim() < n:
        axes = "C, Hb, K, Wb" if spec.depth is None else "C, Db, Hb, K, Wb"
        raise DctDataError(
            f"{name}: expected shape (..., {', '.join(map(str, spec.coeff_shape))}) = (..., {axes}) "
            f"for cf={spec.cf} mask={spec.mask!r} and size {spec.sample_shape}. Got {tuple(coeffs.shape)}"
        )


def as_rows(t: torch.Tensor, spec: CodecSpec) -> torch.Tensor:
    """A coefficient tensor (..., *coeff_shape) viewed as (..., C, R, K, Wb) block rows (a volume's Db and Hb
    merged; a 2-D spec's tensor as it is)."""
    if spec.depth is None:
        return t
    return t.reshape(*t.shape[: t.dim() - len(spec.coeff_shape)], *spec.rows_shape)


# Per-sample side information and channel rotation ------------------------------------------------
def item_side(
    x: torch.Tensor, valid: torch.Tensor | None = None, dims: int = 2, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(..., C, H, W) (or (..., C, D, H, W) with dims=3) -> (..., C, 2) [range, mid] of every item over its
    valid pixels (range 1 for a constant item or one with no valid pixel), in `dtype`: float32, or float64
    for a field that decodes in float64 (`CodecSpec.side_dtype`)."""
    if valid is None and x.dtype == torch.float32:  # extremes in float32 (exact), one pass, no float64 copy
        flat = x.detach().flatten(-dims)  # (amin and amax: torch's aminmax is many times slower on the CPU)
        lo, hi = flat.amin(-1).to(torch.float64), flat.amax(-1).to(torch.float64)
    elif valid is None:
        flat = x.detach().to(torch.float64).flatten(-dims)
        lo, hi = flat.amin(-1), flat.amax(-1)
    else:
        flat = x.detach().to(torch.float64).flatten(-dims)
        ok = torch.broadcast_to(valid, x.shape).flatten(-dims)
        lo = flat.masked_fill(~ok, math.inf).amin(-1)
        hi = flat.masked_fill(~ok, -math.inf).amax(-1)
        empty = ~ok.any(-1)
        lo, hi = lo.masked_fill(empty, 0.0), hi.masked_fill(empty, 0.0)
    rng = hi - lo
    rng = torch.where(rng > 0, rng, torch.ones_like(rng))
    return torch.stack([rng, (hi + lo) / 2], -1).to(dtype)


def normalize(x: torch.Tensor, side: torch.Tensor, dims: int = 2) -> torch.Tensor:
    """(x - mid) / range per item (the last `dims` axes), computed in float64 (a 300 K field with 0.01 K
    detail keeps it)."""
    fused = encode_kernels.normalize(x, side, dims)  # the same float64 operations in one C pass
    if fused is not None:
        return fused
    at = (...,) + (None,) * dims
    rng, mid = side[..., 0][at].double(), side[..., 1][at].double()
    return ((x.to(torch.float64) - mid) / rng).to(torch.float32)


def rotate(x: torch.Tensor, rotation, transpose: bool = False, dims: int = 2) -> torch.Tensor:
    """Mix the channel axis (-3, or -4 with dims=3) of (..., C, H, W) with a C x C matrix (or its transpose)."""
    r = torch.as_tensor(rotation, dtype=torch.float32, device=x.device)
    flat = x.to(torch.float32).flatten(-dims)
    return torch.einsum("oc,...op->...cp" if transpose else "oc,...cp->...op", r, flat).reshape(x.shape)


def coded_coefficients(
    x: torch.Tensor, spec: CodecSpec, side: torch.Tensor | None = None, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Samples (..., C, H, W) ((..., C, D, H, W) for a volume) -> (float32 coefficients in the coded domain,
    side info or None)."""
    if spec.side is not None:
        side = item_side(x, valid, spec.dims, spec.decode_dtype) if side is None else side
        x = normalize(x, side, spec.dims)
    if spec.weights is not None:
        w = torch.as_tensor(spec.weights, dtype=torch.float32, device=x.device)
        x = x * w.reshape(-1, *(1,) * spec.dims)
    if spec.rotation is not None:
        x = rotate(x, spec.rotation, dims=spec.dims)
    if spec.depth is not None:
        return transform3d.compress(x, spec.cf, spec.mask, spec.pad), side
    return compress(x, spec.cf, spec.mask, spec.pad), side


# Quantization ------------------------------------------------------------------------------------
def quantize(coeffs: torch.Tensor, spec: CodecSpec) -> tuple[torch.Tensor, int]:
    """float32 (..., C, Hb, K, Wb) -> (wire-dtype tensor, number of clamped values).

    Args:
        coeffs: float32 coefficients (..., C, Hb, K, Wb).
        spec: The `CodecSpec` whose dtype, steps, offsets and theta apply.

    Returns:
        The pair (coefficients in the spec's wire dtype, number of values clamped to the dtype's range).
    """
    q, clamped = quantize_per_sample(coeffs, spec)
    return q, int(clamped.sum())


def quantize_per_sample(
    coeffs: torch.Tensor, spec: CodecSpec, checked: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `quantize`, with the clamped count of every sample (the leading dims). checked=True: the
    caller made the coefficients from samples it checked finite (calibration), so they are not checked."""
    check_coeff_shape(coeffs, spec)
    shape = coeffs.shape
    c = as_rows(coeffs.to(torch.float32), spec)
    fused = encode_kernels.quantize(c, tuple(c.shape), spec.torch_dtype, spec.offsets, spec.steps, spec.theta)
    if fused is not None and not fused[2]:  # one C pass, the same values (non-finite input: the message below)
        return fused[0].reshape(shape), fused[1]
    if not checked and not bool(
        torch.isfinite(c).all()
    ):  # NaN would cast to an arbitrary integer: never store it silently
        bad = int((~torch.isfinite(c)).sum())
        raise DctDataError(
            f"coefficients: expected finite values. Got {bad} NaN/Inf (non-finite input, or |x| beyond "
            f"float32 max / 8 = {F32_SAFE_MAX:.3g}, where the 8x8 DCT overflows float32)"
        )
    if spec.offsets is not None:
        c = c - _table(spec.offsets, spec, c.device)
    if spec.steps is not None:
        c = c / _table(spec.steps, spec, c.device)
    lead = c.shape[:-4]
    if spec.dtype in INTEGER_DTYPES:
        info = torch.iinfo(spec.torch_dtype)
        if spec.theta is None:
            q = torch.round(c)
        else:  # sign(c) * floor(|c| + theta), in place on one temporary
            q = c.abs().add_(spec.theta).floor_().mul_(torch.sign(c))
        over = ((q < info.min) | (q > info.max)).reshape(*lead, -1).sum(-1)
        return q.clamp_(info.min, info.max).to(spec.torch_dtype).reshape(shape), over
    if spec.dtype == "float16":
        over = (c.abs() > _FP16_MAX).reshape(*lead, -1).sum(-1)
        return c.clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16).reshape(shape), over
    return c.to(spec.torch_dtype).reshape(shape), torch.zeros(lead, dtype=torch.int64, device=c.device)


def dequantize(q: torch.Tensor, spec: CodecSpec) -> torch.Tensor:
    """Wire-dtype coefficients -> float32 coefficients: step * (q - recon * sign(q)) + offset.

    Args:
        q: Wire-dtype coefficients (..., C, Hb, K, Wb).
        spec: The `CodecSpec` whose steps, offsets and recon apply.

    Returns:
        The float32 coefficients, same shape as `q`.
    """
    check_coeff_shape(q, spec)
    c = as_rows(q.to(torch.float32), spec)
    if spec.recon is not None:
        c = c - _table(spec.recon, spec, c.device) * torch.sign(c)
    if spec.steps is not None:
        c = c * _table(spec.steps, spec, c.device)
    if spec.offsets is not None:
        c = c + _table(spec.offsets, spec, c.device)
    return c.reshape(q.shape)


# Whole samples -----------------------------------------------------------------------------------
def encode(
    x: torch.Tensor,
    spec: CodecSpec,
    side: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    size_of: Callable[[torch.Tensor], int] | None = None,
    decoded: list[torch.Tensor] | None = None,
):
    """(..., C, H, W) float samples -> (wire value, overflow count).

    The wire value is what a packed dataset stores and yields for the field (`dctdata.decoder.wire`): the
    quantized coefficients (..., C, Hb, K, Wb), or the pair (coefficients, side) when the spec carries
    per-sample side information (computed from x over its `valid` pixels unless given). With
    spec.min_psnr, any item (channel of a sample) that would decode below it is coded again with a
    finer effective step (its stored range shrinks by g < 1, the decoder is unchanged), so every sample,
    seen at calibration or not, keeps the floor. With spec.max_error/max_rel_error, every item whose
    float32 decode misses the bound is coded again the same way (`dctdata.encoder.bounds`), or `BoundError` is
    raised. With spec.corrections, each sample is also tried at coarser steps with the values that miss
    corrected one by one (`dctdata.decoder.corrections`), and keeps the encoding that stores least by `size_of`
    (a sample's coefficients (C, ...) -> bytes after the field's lossless stage; default zstd).

    Args:
        x: Float samples (..., C, H, W) (a volume spec: (..., C, D, H, W)).
        spec: The `CodecSpec` of the field.
        side: Per-sample side information (..., C, 2) to use instead of computing it from `x` (side specs only).
        valid: A validity mask broadcastable to `x` (nonzero = valid): side information and bounds consider valid
            pixels only.
        size_of: A sample's coefficients -> stored bytes, to choose among encodings with corrections (default:
            zstd).
        decoded: A list the readers' default decode of the wire value is appended to where the encode made it
            (the per-sample floor decodes what it stores: a pack's figures measure that decode instead of
            making it again); left empty otherwise.

    Returns:
        (tuple): The pair (wire value, overflow count): the wire value is the coefficients or (coefficients, side).

    Raises:
        DctDataError: `x` does not match the spec's shape or `side`/`valid` do not fit it.
        BoundError: An item cannot meet spec.max_error/max_rel_error (`dctdata.encoder.bounds.BoundError`, a
            DctDataError).
    """
    n = len(spec.sample_shape)
    if isinstance(x, torch.Tensor) and tuple(x.shape[-n:]) != spec.sample_shape:
        axes = "C, H, W" if spec.depth is None else "C, D, H, W"
        raise DctDataError(
            f"sample: expected shape (..., {', '.join(map(str, spec.sample_shape))}) = (..., {axes}). Got "
            f"{tuple(x.shape)}"
        )
    if spec.bounded and x.dim() == n:  # one sample: bound it as a batch of one
        wire, over = encode(
            x[None], spec, None if side is None else side[None], None if valid is None else valid[None], size_of
        )
        return (wire[0][0], wire[1][0]), over
    if spec.bounded and x.dtype == torch.float64 and spec.precision is None:  # a float32 decode: its rounding first
        from dctdata.encoder.bounds import check_float32_rounding

        check_float32_rounding(x, spec, valid)
    if spec.precision is not None and x.dtype != spec.decode_dtype:  # a float64 decode's bound: against float64
        x = x.to(spec.decode_dtype)
    if spec.lattice is not None and spec.bounded:
        return _encode_on_lattice(x, spec, side, valid, size_of)
    return _encode(x, spec, side, valid, size_of, decoded=decoded)


def _encode(x, spec: CodecSpec, side=None, valid=None, size_of=None, bounds=None, decoded=None):
    """`encode`'s work on a batch; `bounds`: (bound, margin, range) per item if the caller has them (the
    bound a lattice leaves before its snap), else the spec's (`dctdata.encoder.bounds.item_bounds`)."""
    n = len(spec.sample_shape)
    coeffs, side = coded_coefficients(x, spec, side, valid)
    if spec.bounded:
        from dctdata.encoder.bounds import constant, initial_scale, item_bounds

        bound, margin, rng = item_bounds(x, spec, valid) if bounds is None else bounds
        flat = constant(rng)  # no finer step changes their decode: a miss there is named, not re-coded
        g = initial_scale(bound, rng, spec)
        plain = (coeffs, side, g)  # the coefficients as coded with the items' own ranges, and the bound's scale
        if g is not None:  # every item starts at the step its own bound needs
            coeffs, side = rescaled(coeffs, g, spec), side.clone()
            side[..., 0] = (side[..., 0].double() * g).to(side.dtype)
    q, over = quantize_per_sample(coeffs, spec)
    coded_side = side
    if spec.min_psnr is not None and spec.side is not None and x.dim() == n + 1:
        from dctdata.codec.metrics import ItemErrors

        q, side, over, x_hat, _ = keep_floor(coeffs, spec, q, side.clone(), over, ItemErrors(x, valid, dims=spec.dims))
        if decoded is not None and not spec.bounded and spec.corrections is None:  # the decode of what is stored
            decoded.append(x_hat)
    if spec.bounded:
        if spec.min_psnr is not None:  # the floor re-coded some items: their coefficients, as coded now
            coeffs = rescaled(coeffs, side[..., 0].double() / coded_side[..., 0].double(), spec)
        failed = []  # with corrections, an item re-coding cannot save (integer overflow) may still hold with them
        on_miss = None if spec.corrections is None else failed.append
        q, side, over, _ = keep_bound(
            coeffs, spec, q, side.clone(), over, x, valid, bound, margin, on_miss=on_miss, flat=flat
        )
        if spec.corrections is not None:
            q, side = choose_corrections(plain, spec, q, side, over, x, valid, bound, margin, size_of, failed)
    return ((q, side) if spec.side is not None else q), int(over.sum())


def _encode_on_lattice(x, spec: CodecSpec, side=None, valid=None, size_of=None):
    """`encode` with a lattice (`dctdata.codec.lattice`): the items on a grid are coded to within half its spacing
    (less the margins) instead of their bound, their grid rows appended to the side values, and the
    snapped float32 decode checked against the bound itself (`BoundError` if an item misses it)."""
    from dctdata.codec.lattice import detect
    from dctdata.decoder.layer import Decompress
    from dctdata.encoder.bounds import BoundError, bound_text, item_bounds, item_max_error, missing

    bound, margin, rng = item_bounds(x, spec, valid)
    rows, eff = detect(x, valid, bound, margin, spec.decode_dtype)
    inner = spec.replace(lattice=None)

    def coded(codec: CodecSpec):  # the items coded to their lattice bounds, grid rows appended, and the snapped decode
        (q, sd), over = _encode(x, codec, side, valid, size_of, bounds=(eff, margin, rng))
        sd = torch.cat([sd, rows.to(sd.dtype)], -2)
        with torch.no_grad():
            return q, sd, over, Decompress(spec, normalize=False)((q, sd))

    # a PSNR floor with every item on a grid: the snap returns the grid points, so the floor is checked on the
    # snapped decode below, not kept by re-coding the unsnapped one finer (bytes the floor does not ask for)
    after = spec.min_psnr is not None and bool((rows[..., 0] > 0).all())
    q, sd, over, y = coded(inner.replace(min_psnr=None) if after else inner)
    if after:
        from dctdata.codec.metrics import ItemErrors

        errors = ItemErrors(x, valid, dims=spec.dims)
        if bool((errors.ok & (errors.nmse(y) > 10.0 ** (-spec.min_psnr / 10.0))).any()):  # rare: keep it the usual way
            q, sd, over, y = coded(inner)
    err = item_max_error(x, y, valid, spec.dims)
    bad = missing(err, bound, margin, rows[..., 0] > 0)  # a snapped item's exact decode is exact on every path
    if bool(bad.any()):  # the room `detect` leaves makes this unreachable; the guarantee does not rest on it
        j = int(bad.any(1).nonzero()[0])
        c = int(bad[j].nonzero()[0])
        raise BoundError(
            f"expected |decoded - x| <= {float(bound[j, c]):.6g} ({bound_text(spec)}, less a {_kind(spec)} margin of "
            f"{float(margin[j, c]):.3g}) on every value. Got {float(err[j, c]):.6g} in channel {c} after the "
            "lattice snap (pack without it: loosen or tighten the bound)",
            j,
            c,
        )
    return (q, sd), over


def _kind(spec: CodecSpec) -> str:
    """The arithmetic a field's bound is checked in, as messages name it: float32, or float64 (`precision`)."""
    return "float64" if spec.precision == "float64" else "float32"


def rescaled(coeffs: torch.Tensor, g: torch.Tensor, spec: CodecSpec) -> torch.Tensor:
    """The coded coefficients (B, C, Hb, K, Wb) (or a volume's (B, C, Db, Hb, K, Wb)) the samples would have
    with their stored ranges scaled by g (B, C): each channel's normalized values grow by 1/g, mixed by the
    rotation (y = R W n, so y' = R W diag(1/g) W^-1 R^T y = R diag(1/g) R^T y: diagonal channel weights W
    commute with the scales); the transform is linear, so no DCT is needed."""
    return rescaled_by(coeffs, g, None if spec.rotation is None else torch.as_tensor(spec.rotation))


def rescaled_by(coeffs: torch.Tensor, g: torch.Tensor, rotation: torch.Tensor | None) -> torch.Tensor:
    """`rescaled` for a rotation R (C, C) given as a tensor (None: no rotation), as calibration holds it."""
    inv = (1.0 / g).to(torch.float32)
    if rotation is None:
        return coeffs * inv.reshape(*inv.shape, *([1] * (coeffs.dim() - 2)))
    r = rotation.to(dtype=torch.float32, device=coeffs.device)
    m = torch.einsum("oc,bc,dc->bod", r, inv, r)  # (B, C, C): R diag(1/g_b) R^T
    return torch.einsum("bod,bd...->bo...", m, coeffs)


def keep_floor(coeffs, spec: CodecSpec, q, side, over, errors, x_hat=None, rounds: int = 8, settle: bool = True):
    """Re-code the items below spec.min_psnr with a smaller stored range (a finer effective step; the
    decoder is unchanged): (q, side, over, x_hat, nmse per item). Only the samples re-coded are decoded
    again. `errors` is a `dctdata.codec.metrics.ItemErrors` of the samples; `x_hat` their decode, if known.

    With a channel rotation every channel of a sample is scaled alike: scaling one channel's range mixes
    that channel into the others' coded channels (R diag(1/g) R^T), which spreads its detail over coded
    channels that quantize it coarsely, and the item barely moved (docs/benchmarks/design.md); scaling them
    alike is y / g, each channel's error scales with g^2.

    A trial that left an item as it was (its sample refused for overflow, or a give-back undone) is not
    tried again: the next one would be the same (its error, scale and exponent did not move, and channels
    are coded independently), so only the rounds that change something are spent (the encoding is the one
    the repeats gave; settle=False tries them again, and the tests compare the two)."""
    from dctdata.decoder.layer import Decompress  # the fast decoder; layer does not import this module

    cap = 10.0 ** (-spec.min_psnr / 10.0)
    layer = Decompress(spec.replace(corrections=None), normalize=False)  # the side values as coded so far
    with torch.inference_mode():
        x_hat = layer((q, side)) if x_hat is None else x_hat
    nm = errors.nmse(x_hat)
    g = torch.ones(side.shape[:-1], dtype=torch.float64, device=side.device)
    base = side[..., 0].to(torch.float64)  # the ranges the coefficients were coded with (g = 1)
    # nmse ~ g^a per item: a = 2 for fine steps, nearer 1 where the dead zone zeroes much (real frames land
    # in between, docs/benchmarks/design.md). The first move assumes 2; each later one uses the exponent the
    # item's own last move measured, aiming just inside the cap. Items lifted far past it (below FLOOR_LOOSE
    # of the cap) are given back part of the lift when that keeps them inside it: bits the floor does not ask
    # for (with many items below the floor, over-lifting kept whole channels above their target).
    power = torch.full_like(g, 2.0)
    aim = FLOOR_AIM * cap
    rotated = spec.rotation is not None
    settled = torch.zeros_like(errors.ok)  # items whose last trial left them as they were (see the docstring)
    for _ in range(rounds):
        low = errors.ok & (nm > cap)
        factor = (aim / nm.clamp(min=1e-300)).pow(1.0 / power)
        if rotated:  # one scale for the whole sample (see the docstring): the neediest channel decides
            factor = torch.where(errors.ok, factor, torch.full_like(factor, math.inf)).amin(1, keepdim=True)
            factor = factor.expand_as(nm).clone()
            loose = (g < 1) & (factor > 1.0 / FLOOR_LOOSE**0.5)
        else:
            loose = errors.ok & (g < 1) & (nm < FLOOR_LOOSE * cap)
        move = torch.where(low.any(1, keepdim=True) if rotated else low, factor < 1, loose)
        if settle:
            move &= ~settled
        rows = move.any(1).nonzero().flatten()
        if not len(rows):
            break
        trial_g = torch.where(move[rows], g[rows] * factor[rows], g[rows]).clamp(max=1.0)
        qb, ob = quantize_per_sample(rescaled(coeffs[rows], trial_g, spec), spec, checked=True)
        keep = ob <= over[rows]  # never trade the floor for integer overflow: such samples stay as they were
        settled[rows[~keep]] |= move[rows[~keep]]
        if not bool(keep.any()):
            break
        rows, trial_g, qb, ob = rows[keep], trial_g[keep], qb[keep], ob[keep]
        sb = side[rows].clone()
        sb[:, :, 0] = (base[rows] * trial_g).to(side.dtype)
        with torch.inference_mode():
            xb = layer((qb, sb))
        nb = errors.nmse(xb, rows)
        # a give-back that crossed the cap is undone (per sample with a rotation, else per item)
        undo = (trial_g > g[rows]) & errors.ok[rows] & (nb > cap)
        if rotated:
            undo = undo.any(1, keepdim=True).expand_as(undo)
        if bool(undo.any()):
            trial_g = torch.where(undo, g[rows], trial_g)
            if rotated:
                redo = ~undo[:, 0]
                settled[rows[~redo]] = True
                rows, trial_g, qb, ob, sb, xb, nb = (t[redo] for t in (rows, trial_g, qb, ob, sb, xb, nb))
            else:  # channels are coded independently: put the undone items' own values back
                # an undone give-back is tried again the same way next round; where its sample's overflow is
                # nil, that trial cannot change whether the sample's other moves are kept either: settled
                one = undo.shape[1] == 1
                changed = (trial_g != g[rows]).any(1)
                same = ~changed  # every move of the sample undone: it is as it was (its coefficients, overflow)
                settled[rows[same]] |= undo[same] & ((over[rows[same]] == 0) | one)[:, None]
                rows, trial_g, qb, ob, sb, xb, nb, undo = (
                    t[changed] for t in (rows, trial_g, qb, ob, sb, xb, nb, undo)
                )  # fmt: skip
                if bool(undo.any()):
                    qb = torch.where(undo.reshape(*undo.shape, *(1,) * (qb.dim() - 2)), q[rows], qb)
                    sb[:, :, 0] = torch.where(undo, side[rows, :, 0], sb[:, :, 0])
                    xb = torch.where(undo.reshape(*undo.shape, *(1,) * (xb.dim() - 2)), x_hat[rows].to(xb.dtype), xb)
                    nb = torch.where(undo, nm[rows], nb)
                    at = undo.any(1).nonzero().flatten()  # their overflow as they are now, counted again
                    ob[at] = quantize_per_sample(rescaled(coeffs[rows[at]], trial_g[at], spec), spec, checked=True)[1]
                    settled[rows] |= undo & ((ob == 0) | one)[:, None]
        moved = ((trial_g - g[rows]).abs() > 1e-3 * g[rows]) & (nm[rows] > 0) & (nb > 0)
        measured = torch.log(nb.clamp(min=1e-300) / nm[rows].clamp(min=1e-300)) / torch.log(
            torch.where(moved, trial_g / g[rows], torch.full_like(trial_g, 0.5))
        )
        power[rows] = torch.where(moved, measured.clamp(0.7, 3.0), power[rows])
        g[rows] = trial_g
        side[rows] = sb
        q[rows], over[rows], nm[rows] = qb, ob, nb
        with torch.inference_mode():  # x_hat may be an inference tensor (the layer made it)
            x_hat[rows] = xb.to(x_hat.dtype)
    return q, side, over, x_hat, nm


def keep_bound(coeffs, spec: CodecSpec, q, side, over, x, valid=None, bound=None, margin=None, on_miss=None, flat=None):
    """Re-code the items whose float32 decode misses spec's bound with a smaller stored range until every
    item holds: (q, side, over, largest error per item). `coeffs` are the coded coefficients `q` was
    quantized from with `side`; `x` the samples (B, C, H, W). Raises `BoundError` for an item that cannot
    hold (re-coding it would overflow the integer dtype, or the bound is below float32's precision), or,
    given `on_miss`, calls it with that error and returns the encoding as it is (a caller with corrections
    tries them on the samples that still miss, and raises the error if they cannot hold either): one error
    per sample that misses. `flat` (B, C): the constant items (`dctdata.encoder.bounds.constant`): a finer step does
    not change their decode, so one that misses is named at once with what helps."""
    from dctdata.decoder.layer import Decompress  # the readers' decoder; layer does not import this module
    from dctdata.encoder.bounds import BoundError, bound_text, constant_advice, item_bounds, item_max_error, missing

    if bound is None or margin is None:
        bound, margin, _ = item_bounds(x, spec, valid)
    layer = Decompress(spec.replace(corrections=None), normalize=False)  # the side values as coded so far
    with torch.no_grad():
        err = item_max_error(x, layer((q, side)), valid, spec.dims)
    g = torch.ones(side.shape[:-1], dtype=torch.float64, device=side.device)
    base = side[..., 0].to(torch.float64).clone()  # the ranges `coeffs` were coded with (g = 1)
    stuck = torch.zeros_like(err, dtype=torch.bool)
    for _ in range(BOUND_ROUNDS):
        bad = missing(err, bound, margin) & ~stuck
        if flat is not None:
            stuck |= bad & flat
            bad &= ~flat
        if not bool(bad.any()):
            break
        rows = bad.any(1).nonzero().flatten()
        room = (bound[rows] - margin[rows]).clamp(min=0)
        # pixel errors scale with the step: aim 10% under the room, and move at least 10% per round
        want = (0.9 * room / err[rows].clamp(min=1e-300)).clamp(min=0.05, max=0.9)
        trial = g[rows] * torch.where(bad[rows], want, torch.ones_like(want))
        qb, ob = quantize_per_sample(rescaled(coeffs[rows], trial, spec), spec, checked=True)
        grew = ob > over[rows]  # finer steps would clamp coefficients: these items cannot be helped
        stuck[rows[grew]] |= bad[rows[grew]]
        rows, trial, qb, ob = rows[~grew], trial[~grew], qb[~grew], ob[~grew]
        if not len(rows):
            continue
        sb = side[rows].clone()
        sb[..., 0] = (base[rows] * trial).to(side.dtype)
        with torch.no_grad():
            eb = item_max_error(
                x[rows], layer((qb, sb)), None if valid is None else _valid_rows(valid, rows, x), spec.dims
            )
        g[rows], side[rows], q[rows], over[rows], err[rows] = trial, sb, qb, ob, eb
    bad = missing(err, bound, margin)
    # one error per sample that misses (its first item): raised, or handed to on_miss
    for j, c in ((int(j), int(bad[j].nonzero()[0])) for j in bad.any(1).nonzero().flatten()):
        why = (
            constant_advice(spec)
            if flat is not None and bool(flat[j, c])
            else f"the bound is below {_kind(spec)}'s precision for these values: loosen it or subtract an offset"
            if float(margin[j, c]) >= float(bound[j, c])
            else f"finer steps overflow {spec.dtype}: use --quant int16"
            if bool(stuck[j, c]) and spec.dtype == "int8"
            else "finer steps overflow the integer dtype: loosen the bound"
            if bool(stuck[j, c])
            else f"the bound is near {_kind(spec)}'s precision for these values: loosen it or subtract an offset"
        )
        error = BoundError(
            f"expected |decoded - x| <= {float(bound[j, c]):.6g} ({bound_text(spec)}, less a {_kind(spec)} margin of "
            f"{float(margin[j, c]):.3g}) on every value. Got {float(err[j, c]):.6g} in channel {c} ({why})",
            j,
            c,
        )
        if on_miss is None:
            raise error
        on_miss(error)
    return q, side, over, err


def choose_corrections(plain, spec: CodecSpec, q, side, over, x, valid, bound, margin, size_of=None, failed=None):
    """Per sample, the encoding that stores least among the bound's own (`q`, `side`: every item re-coded
    until it holds, no corrections) and coarser steps (MULTIPLIERS x the bound's step) with the values that
    miss corrected: (q, side with correction rows). `plain` = (coefficients coded with the items' own
    ranges, those side values, the bound's scale per item or None). A candidate is kept only when its
    corrected float32 decode holds the bound less the margin on every valid value, clamps no more
    coefficients and (spec.min_psnr) keeps the floor. `failed`: the `BoundError`s of the samples re-coding
    could not hold (`keep_bound`); each needs a candidate with corrections, or its error is raised."""
    from dctdata.decoder.corrections import MULTIPLIERS, build, stored_bytes, zstd_size
    from dctdata.decoder.layer import Decompress
    from dctdata.encoder.bound_rounding import can_round, round_coded
    from dctdata.encoder.bounds import item_max_error, missing

    size_of = size_of or zstd_size
    coeffs0, side0, g0 = plain
    b, cap = len(q), spec.corrections
    g0 = torch.ones(side0.shape[:-1], dtype=torch.float64) if g0 is None else g0
    layer = Decompress(spec, normalize=False)
    room = bound - margin
    empty = torch.zeros(b, 1 + cap, 2, dtype=side.dtype)
    best_q, best_side = q.clone(), torch.cat([side, empty], 1)
    best = [size_of(q[j]) for j in range(b)]
    failed = {e.sample: e for e in failed or ()}
    for j in failed:  # re-coding left items of these samples missing: they take any candidate that holds
        best[j] = math.inf
    floor = None
    if spec.min_psnr is not None:
        from dctdata.codec.metrics import ItemErrors

        floor = (ItemErrors(x, valid, dims=spec.dims), 10.0 ** (-spec.min_psnr / 10.0))
    going = torch.ones(b, dtype=torch.bool)  # samples whose bytes still fell at the last multiplier
    for m in MULTIPLIERS:
        if not bool(going.any()):
            break
        g = g0 * m
        cm = rescaled(coeffs0, g, spec)
        qm, om = quantize_per_sample(cm, spec, checked=True)
        sm = side0.clone()
        sm[..., 0] = (side0[..., 0].double() * g).to(side0.dtype)
        if can_round(spec):  # each coefficient's level chosen so fewer values miss (`dctdata.encoder.bound_rounding`)
            live = going.nonzero().flatten()
            v = None if valid is None else _valid_rows(valid, live, x)
            qm[live] = round_coded(cm[live], qm[live], sm[live, :, 0], room[live], spec, v)
        with torch.no_grad():
            x_hat = layer((qm, torch.cat([sm, empty], 1)))
        fix, counts = build(x, x_hat, room, cap, valid, dtype=side.dtype)
        rows = ((counts <= cap) & (om <= over) & going).nonzero().flatten()
        going[:] = False
        if not len(rows):
            break
        full = torch.cat([sm[rows], fix[rows]], 1)
        with torch.no_grad():
            fixed = layer((qm[rows], full))
        v = None if valid is None else _valid_rows(valid, rows, x)
        holds = ~missing(item_max_error(x[rows], fixed, v, spec.dims), bound[rows], margin[rows]).any(1)
        if floor is not None:
            errors, cap_nmse = floor
            holds &= ~(errors.ok[rows] & (errors.nmse(fixed, rows) > cap_nmse)).any(1)
        for i, j in enumerate(rows.tolist()):
            if not bool(holds[i]):
                continue
            nbytes = size_of(qm[j]) + stored_bytes(fix[j])
            going[j] = nbytes <= best[j]  # bytes fall, then rise with the multiplier: a sample that got worse stops
            if nbytes < best[j]:
                best[j], best_q[j], best_side[j] = nbytes, qm[j], full[i]
    for j in failed:
        if math.isinf(best[j]):
            raise failed[j]  # neither re-coding nor corrections hold this sample
    return best_q, best_side


def _valid_rows(valid: torch.Tensor, rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.broadcast_to(valid, x.shape)[rows]


def decode_reference(wire, spec: CodecSpec) -> torch.Tensor:
    """The plain decoder, step by step in float64 where it matters: dequantize -> inverse DCT ->
    inverse rotation -> / weights -> range * y + mid -> (x - mean) / std. `Decompress` must agree with it."""
    q, side = split_wire(wire, spec)
    fix = grid = None
    if side is not None and (spec.corrections is not None or spec.lattice is not None):
        from dctdata.decoder.corrections import split

        if spec.lattice is not None:
            from dctdata.codec.lattice import split as split_lattice

            grid = split_lattice(side, spec.channels)[1]
        side, fix = split(side, spec)
    coeffs = dequantize(q, spec)
    if spec.depth is None:
        x = decompress(coeffs, spec.cf, spec.size, spec.mask).to(torch.float64)
    else:
        x = transform3d.decompress(coeffs, spec.cf, spec.size, spec.mask).to(torch.float64)
    at, per_channel = (...,) + (None,) * spec.dims, (-1,) + (1,) * spec.dims
    if spec.rotation is not None:
        r = torch.tensor(spec.rotation, dtype=torch.float64)
        x = torch.einsum("oc,...op->...cp", r, x.flatten(-spec.dims)).reshape(x.shape)
    if spec.weights is not None:
        x = x / torch.tensor(spec.weights, dtype=torch.float64).reshape(per_channel)
    if side is not None:
        x = x * side[..., 0][at].double() + side[..., 1][at].double()
    if fix is not None:
        from dctdata.decoder.corrections import apply

        x = apply(x.reshape(-1, *spec.sample_shape).contiguous(), fix.reshape(-1, *fix.shape[-2:])).reshape(x.shape)
    if grid is not None:
        from dctdata.codec.lattice import snap

        x = snap(x.reshape(-1, *spec.sample_shape), grid.reshape(-1, spec.channels, 2)).reshape(x.shape)
    if spec.mean is not None:
        mean = torch.tensor(spec.mean, dtype=torch.float64).reshape(per_channel)
        std = torch.tensor(spec.std, dtype=torch.float64).reshape(per_channel)
        x = (x - mean) / std
    return x
