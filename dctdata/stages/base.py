"""The lossless stage's base classes: what every stage knows about itself, so that readers, writers and
calibration ask the stage instead of comparing ids (numcodecs' model: one small class per codec, a
registry, a JSON config that round-trips through the manifest).

`Stage` is the interface and the generic parts: bounded decoding with errors that name the chunk or
sample (`decode`), runs of streams (`decode_many`), a batch of streams cut from one byte buffer by an
offsets table (`decode_batch`: through the stage's `DeviceDecoder` where it has one for the buffer's device,
the `device_decoder` hook, else on the host). `BytesStage` is a codec over
an array's raw bytes whose stream declares its decoded size in a header (zstd, blosc, LZ4): the size is
checked against the expected one before anything is decoded, so a small hostile stream cannot make a
reader allocate more than the array it expects (a "bomb" stops at the header). `RawStage` is no stage at
all (the manifest's `{}`), so callers never special-case it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt

from dctdata.errors import DctDataError, IntegrityError

if TYPE_CHECKING:  # torch is imported where a batch is decoded: the stages load without it
    import torch

log = logging.getLogger(__name__)
_HOST_NOTED: set[tuple[str, str]] = set()  # (stage, device type) whose batches were decoded on the host, logged once
# A stored stream as readers hold it: bytes from a store or a member, or a slice of a uint8 array.
Stream: TypeAlias = bytes | bytearray | memoryview | npt.NDArray[Any]


def byte_view(buf: Stream) -> memoryview:
    """`buf` as flat unsigned bytes, without a copy (an array's `.data` is its memoryview)."""
    return (buf.data if isinstance(buf, np.ndarray) else memoryview(buf)).cast("B")


class DeviceDecoder:
    """A stage's decoder of collated batches on one device, what `Stage.device_decoder(device)` returns (one small
    class per stage, numcodecs' model): `decode_batch(buffer, offsets, sample_shape, dtype)` decodes sample i
    from buffer[offsets[i]:offsets[i+1]] into an (N, *sample_shape) tensor of torch `dtype` on the buffer's
    device, and returns it with an int32 status per sample (0: decoded; anything else: refused, and
    `describe(status)` says why). Bad bytes never raise here: `Stage.decode_batch` raises an IntegrityError
    naming the first refused sample. The arguments were checked by the stage (`Stage.decode_batch`)."""

    def supports(self, sample_shape: tuple[int, ...]) -> bool:
        """Whether this decoder takes streams of `sample_shape` (others are decoded on the host and copied)."""
        return True

    def decode_batch(
        self, buffer: torch.Tensor, offsets: torch.Tensor, sample_shape: tuple[int, ...], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self, status: int) -> str:
        """A refused sample's status in words."""
        return f"status {int(status)}"


class Refused(Exception):
    """A check of `Stage.decode` failed: its message, which `decode` prefixes with `where`."""


def described(where: str | Callable[[], str]) -> str:
    """`where`, or `where()`: a reader of many small chunks passes a function, so the description is built
    only for an error."""
    return where() if callable(where) else where


class Stage:
    """One lossless stage: a config (the manifest's JSON), how to encode and decode, and the facts the
    readers, writers and calibration need. Subclasses set the class attributes and implement
    `from_config`, `encode`, `_decode`; the rest has generic defaults."""

    codec_id: ClassVar[str | None]  # the config's "id" (None: no stage)
    member_suffix: ClassVar[str]  # a webdataset member is `<key>.<field>.<member_suffix>`
    # Compatibility: the suffix is another stage's, as packs have always been written (readers take the
    # stage from the manifest, never from the suffix)
    shares_suffix: ClassVar[bool] = False
    # An array stage: codes arrays of a shape the caller states (no bytes codec before it in zarr, its
    # stream raw in a webdataset member), rather than an array's raw bytes
    needs_shape: ClassVar[bool] = False
    integer_only: ClassVar[bool] = False  # codes int8/int16 coefficients only
    # Decode-cost estimate: decoded bytes per microsecond on one busy core, rounded up (so an estimate errs
    # toward fewer threads; `dctdata.format.zarr.reader.decode_threads`)
    decode_bytes_per_us: ClassVar[int]
    # `decode_many` decodes a run of streams in one call that releases the GIL once (a reader thread then
    # takes runs of one-sample chunks)
    decodes_runs: ClassVar[bool] = False
    # `--lossless NAME[:ARG]`: NAME (None: not selectable by name; see `from_option`), the spellings listed in
    # errors and the CLI's metavar ("zstd:LEVEL (LEVEL in 1..22)"), and the CLI help's words for them
    option: ClassVar[str | None] = None
    option_spellings: ClassVar[tuple[str, ...]] = ()
    option_help: ClassVar[str] = ""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = dict(config)

    # ---- config --------------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """The config as the manifest stores it (exactly what `from_config` was given)."""
        return dict(self._config)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Stage:
        """The stage of a config naming this class's id; DctDataError if it cannot be built."""
        raise NotImplementedError

    @classmethod
    def from_option(cls, arg: str | None) -> dict[str, Any] | None:
        """The config of `--lossless <option>[:arg]` (arg None without a colon); None if `arg` is not one of
        this stage's spellings."""
        return None

    @classmethod
    def fit(cls, q: npt.NDArray[Any], cf: int, mask: str) -> Stage:
        """This stage configured for coefficients `q` (B, C, Hb, K, Wb): a stage with a model fits it; a bytes
        codec returns its default."""
        raise NotImplementedError

    def model_nbytes(self) -> int:
        """Bytes of fitted model the config carries into the manifest (calibration weighs them)."""
        return 0

    @property
    def label(self) -> str:
        """How messages name the stage's streams."""
        return f"{self.codec_id}-coded"

    @property
    def display_name(self) -> str:
        """How tables name the stage (`dctdata info`'s lossless column): its id, with the settings that
        matter to a reader where it has them (`zstd-19`, `blosc zstd-5`)."""
        return str(self.codec_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._config!r})"

    # ---- sizes ---------------------------------------------------------------------------------
    def declared_size(self, buf: Stream) -> int | None:
        """The decoded size the stream declares (None: none, or a damaged header)."""
        return None

    def max_encoded_size(self, nbytes: int) -> int:
        """The most bytes `nbytes` of input can take after this stage (a webdataset shard cap relies on it):
        a generous generic bound."""
        return nbytes + nbytes // 16 + 1024

    def estimate_size(self, q: npt.NDArray[Any], cf: int, mask: str, integer: bool) -> int:
        """Stored bytes of quantized planes `q` (R, C, 1, K, Wb; bfloat16 viewed as int16) for calibration's
        search, which compares settings by it: the encoded size unless a stage has a cheaper estimate."""
        return len(self.encode(q))

    def choose(self, q: npt.NDArray[Any], cf: int, mask: str, integer: bool, compare_values: int) -> dict[str, Any]:
        """The config a field calibrated to `q` gets with this stage as the pack's setting: this one."""
        return self.get_config()

    # ---- zarr, webdataset ----------------------------------------------------------------------
    def zarr_codec(self, itemsize: int) -> dict[str, Any] | None:
        """This stage in a zarr v3 array's codec list ({"name", "configuration"}); None for no entry."""
        return None

    def zarr_codecs(self, itemsize: int, little: bool = True) -> list[dict[str, Any]]:
        """The inner chunk codecs before crc32c: the bytes codec (array -> bytes), then this stage; an array
        stage takes arrays itself."""
        own = self.zarr_codec(itemsize)
        if self.needs_shape:
            return [own] if own else []
        endian = {"endian": "little" if little else "big"}
        first = {"name": "bytes", "configuration": endian} if itemsize > 1 else {"name": "bytes"}
        return [first] + ([own] if own else [])

    # ---- coding --------------------------------------------------------------------------------
    def encode(self, data: npt.NDArray[Any] | bytes) -> bytes:
        """The stored bytes of an array (C order) or of bytes."""
        raise NotImplementedError

    def decode(
        self,
        buf: Stream,
        shape: Sequence[int],
        dtype: npt.DTypeLike,
        where: str | Callable[[], str] = "stream",
        out: npt.NDArray[Any] | None = None,
        writeable: bool = True,
    ) -> npt.NDArray[Any]:
        """The array of `shape` and `dtype` stored in `buf`, or written into `out` (C-contiguous, writeable, of
        that shape and dtype) and returned. Anything else (a stream that decodes to another size, truncated
        or mutated bytes) is an IntegrityError naming `where` (or `where()`). Never allocates more than the
        expected array. `writeable=False` lets a stage hand back read-only memory without a copy (for a
        caller that copies what it keeps)."""
        dt = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        if out is not None:
            _check_out(out, shape, dt)
        try:
            return self._decode(buf, shape, dt, out, writeable)
        except Refused as exc:
            raise IntegrityError(f"{described(where)}: {exc}") from None
        except IntegrityError as exc:
            raise IntegrityError(f"{described(where)}: expected {self.label} bytes of {dt} {shape}. Got {exc}") from exc
        except Exception as exc:  # any decoder failure is a data error naming the sample or chunk
            raise IntegrityError(
                f"{described(where)}: expected {self.label} bytes of {dt} {shape}. Got undecodable bytes "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def _decode(
        self,
        buf: Stream,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        out: npt.NDArray[Any] | None,
        writeable: bool,
    ) -> npt.NDArray[Any]:
        raise NotImplementedError

    def check_stream(self, stream: Stream, decoded: int, where: str | Callable[[], str]) -> None:
        """The checks a stream passes before it leaves a reader undecoded (decode="device"): none here, a stream
        without a size header (its decoder is bounded to the output and names a bad stream)."""

    def decode_many(self, bufs: Sequence[Stream], out: npt.NDArray[Any]) -> int:
        """Streams `bufs` into out[0], out[1], ... (each out[i] the declared array of bufs[i]). Returns how many
        decoded before the first that did not (len(bufs) when all did); `decode` of that one gives its error."""
        for i, buf in enumerate(bufs):
            try:
                self.decode(buf, out.shape[1:], out.dtype, out=out[i])
            except IntegrityError:
                return i
        return len(bufs)

    # ---- batches -------------------------------------------------------------------------------
    def decode_batch(
        self,
        buffer: torch.Tensor,
        offsets: torch.Tensor,
        sample_shape: Sequence[int],
        dtype: torch.dtype | npt.DTypeLike,
        where: str | Callable[[int], str] = "batch",
    ) -> torch.Tensor:
        """Samples stored back to back in one 1-D uint8 tensor, sample i in buffer[offsets[i]:offsets[i+1]]
        (offsets: int64, N+1 entries), decoded into a (N, *sample_shape) tensor of `dtype` on the buffer's
        device. Where the stage has a `DeviceDecoder` for that device (`device_decoder`) it does the work;
        otherwise the streams are decoded on the host (each into the preallocated output) and, for a buffer
        on an accelerator, copied there (logged once per stage and device: the decoded bytes cross instead of
        the stored ones). A stream that does not decode is an IntegrityError naming its sample: "<where>
        sample i", or `where(i)` when `where` is a function (a reader's sample names)."""
        out, verdict = self.decode_batch_deferred(buffer, offsets, sample_shape, dtype, where)
        verdict.check()
        return out

    def decode_batch_deferred(
        self,
        buffer: torch.Tensor,
        offsets: torch.Tensor,
        sample_shape: Sequence[int],
        dtype: torch.dtype | npt.DTypeLike,
        where: str | Callable[[int], str] = "batch",
    ) -> tuple[torch.Tensor, Verdict]:
        """`decode_batch` without waiting for a device decoder's verdict: (the output, its `Verdict`). The
        output is only valid once `verdict.check()` has returned. Why: reading the per-sample status back from
        an accelerator waits for the decode, so a caller that queues several batches (`DecodeAhead`) checks
        them later, together. Host decoders still raise at once."""
        shape, dt, np_dt = _check_batch(buffer, offsets, sample_shape, dtype)
        name: Callable[[int], str] = where if callable(where) else (lambda i: f"{where} sample {i}")
        device = buffer.device
        decoder = self.device_decoder(device)
        if decoder is not None and decoder.supports(shape):
            out, status = decoder.decode_batch(buffer, offsets, shape, dt)
            return out, Verdict(status, partial(self._refusal, decoder, name, np_dt, shape, device.type))
        if device.type == "cpu":
            return self._decode_batch_host(buffer, offsets, shape, dt, np_dt, name, pin=False), Verdict()
        key = (self.label, device.type)
        if key not in _HOST_NOTED:
            _HOST_NOTED.add(key)
            log.info("the %s stage has no %s decoder for these streams: they are decoded on the host and copied", *key)
        host = self._decode_batch_host(buffer.cpu(), offsets.cpu(), shape, dt, np_dt, name, pin=device.type == "cuda")
        return host.to(device, non_blocking=True), Verdict()

    def _refusal(
        self,
        decoder: DeviceDecoder,
        name: Callable[[int], str],
        np_dt: np.dtype[Any],
        shape: tuple[int, ...],
        device_type: str,
        status: torch.Tensor,
        bad: list[int],
    ) -> IntegrityError:
        """The error of a batch whose samples `bad` the device decoder refused."""
        i = bad[0]
        more = f" ({len(bad) - 1} more samples of the batch were refused)" if len(bad) > 1 else ""
        return IntegrityError(
            f"{name(i)}: expected {self.label} bytes of {np_dt} {shape}. Got a stream the {device_type} "
            f"decoder refused ({decoder.describe(int(status[i]))}){more}"
        )

    def _decode_batch_host(
        self,
        buffer: torch.Tensor,
        offsets: torch.Tensor,
        shape: tuple[int, ...],
        dt: torch.dtype,
        np_dt: np.dtype[Any],
        name: Callable[[int], str],
        pin: bool,
    ) -> torch.Tensor:
        """`decode_batch` of CPU tensors with the stage's own decoders (runs through `decode_many`), into pinned
        memory when `pin` (the result is copied to a CUDA device next)."""
        import torch

        n = int(offsets.numel()) - 1
        out = torch.empty((n, *shape), dtype=dt)
        if pin and n:
            out = out.pin_memory()
        arr = out.numpy()
        data = buffer.numpy()
        at = offsets.tolist()
        bufs = [data[at[i] : at[i + 1]] for i in range(n)]
        done = 0
        while done < n:
            done += self.decode_many(bufs[done:], arr[done:])
            if done < n:  # this one did not decode: `decode` raises its error naming the sample
                self.decode(bufs[done], shape, np_dt, where=partial(name, done), out=arr[done])
                done += 1
        return out

    def device_decoder(self, device: torch.device) -> DeviceDecoder | None:
        """The decoder of this stage's batches on `device` (a torch.device), or None where the stage has none
        (its batches are then decoded on the host by `decode_batch`). A stage whose decoder needs an optional
        package raises MissingExtraError naming the extra where it is missing."""
        return None


class Verdict:
    """Whether a device decoder accepted every sample of a batch, read when `check()` is called (on an
    accelerator that waits for the decode). `status`: int32 per sample, 0 when accepted, or None (nothing to
    check: a host decoder raised at once); `refusal(status_on_host, bad_samples)` builds the error."""

    __slots__ = ("refusal", "status")

    def __init__(
        self,
        status: torch.Tensor | None = None,
        refusal: Callable[[torch.Tensor, list[int]], IntegrityError] | None = None,
    ) -> None:
        self.status, self.refusal = status, refusal

    def check(self) -> None:
        """Raise the refusal's IntegrityError if a sample was refused."""
        if self.status is None or self.refusal is None:  # a status always comes with its refusal
            return
        host = self.status.detach().cpu()
        bad = host.nonzero().flatten().tolist()
        if bad:
            raise self.refusal(host, bad)


class BytesStage(Stage):
    """A codec over an array's raw bytes whose stream declares its decoded size: the declared size must be
    the expected one before anything is decoded (numcodecs decodes a stream shorter than its output buffer
    without complaint, and a declared size larger than expected would be a bomb)."""

    def __init__(self, config: Mapping[str, Any], codec: Any = None) -> None:
        super().__init__(config)
        self.codec = codec  # the numcodecs codec that encodes (and, by default, decodes)

    @classmethod
    def fit(cls, q: npt.NDArray[Any], cf: int, mask: str) -> Stage:
        return cls.from_config(cls.default_config())

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _numcodecs(cls, config: Mapping[str, Any]) -> Any:  # numcodecs has no type hints
        """The numcodecs codec of a config; DctDataError naming the config if numcodecs cannot build it."""
        import numcodecs  # heavy to import: only where a stage is built

        try:
            return numcodecs.get_codec(dict(config))
        except (ValueError, TypeError, KeyError) as exc:
            raise DctDataError(f"numcodecs cannot build {dict(config)!r}: {exc}") from exc

    def encode(self, data: npt.NDArray[Any] | bytes) -> bytes:
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
        return bytes(self.codec.encode(data))

    def _decode(
        self,
        buf: Stream,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        out: npt.NDArray[Any] | None,
        writeable: bool,
    ) -> npt.NDArray[Any]:
        size = math.prod(shape) * dtype.itemsize
        declared = self.declared_size(buf)
        if declared != size:
            said = "a damaged or truncated header" if declared is None else f"one declaring {declared}"
            raise Refused(f"expected a stream of {size} decoded bytes. Got {said}")
        target = None if out is None else out.reshape(-1).view(np.uint8)
        flat = self._decode_exact(buf, size, target, writeable)
        return out if out is not None else flat.view(dtype).reshape(shape)

    def _decode_exact(
        self, buf: Stream, size: int, target: npt.NDArray[np.uint8] | None, writeable: bool
    ) -> npt.NDArray[np.uint8]:
        """The `size` bytes of a stream that declares them (checked by the caller), into `target` (uint8 of
        `size`) when given; more than `size` bytes is an error."""
        out = np.empty(size, np.uint8) if target is None else target
        self.codec.decode(buf, out=out)
        return out

    def check_stream(self, stream: Stream, decoded: int, where: str | Callable[[], str]) -> None:
        """Refuse a stream whose header does not declare exactly `decoded` bytes (a raw stream: is not that
        long)."""
        n = self.declared_size(stream)
        if n != decoded:
            said = "a damaged or truncated header" if n is None else f"one of {n}"
            raise IntegrityError(f"{described(where)}: expected a stream of {decoded} decoded bytes. Got {said}")

    def decode_bounded(self, buf: Stream, limit: int, where: str) -> memoryview:
        """The bytes of a stream declaring at most `limit` decoded bytes (a member whose contents say their own
        shape, like .npy, is checked by its parser afterwards); more is an IntegrityError, never decoded.
        They may be read-only: the parser copies what it keeps."""
        declared = self.declared_size(buf)
        if declared is None or declared > limit:
            said = "a damaged or truncated header" if declared is None else f"one declaring {declared}"
            raise IntegrityError(f"{where}: expected a stream of at most {limit} decoded bytes. Got {said}")
        return self.decode(buf, (declared,), np.uint8, where, writeable=False).data


class RawStage(BytesStage):
    """No lossless stage (the manifest's `{}`): the array's raw bytes."""

    codec_id = None
    member_suffix = "npy"
    decode_bytes_per_us = 16_000  # crc32c and a copy

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RawStage:
        return cls({})

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {}

    @property
    def label(self) -> str:
        return "raw"

    @property
    def display_name(self) -> str:
        return "none"

    def max_encoded_size(self, nbytes: int) -> int:
        return nbytes

    def declared_size(self, buf: Stream) -> int:
        return len(byte_view(buf))

    def encode(self, data: npt.NDArray[Any] | bytes) -> bytes:
        return np.ascontiguousarray(data).tobytes() if isinstance(data, np.ndarray) else bytes(data)

    def _decode(
        self,
        buf: Stream,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        out: npt.NDArray[Any] | None,
        writeable: bool,
    ) -> npt.NDArray[Any]:
        raw = byte_view(buf)
        size = math.prod(shape) * dtype.itemsize
        if len(raw) != size:
            raise Refused(f"expected {size} bytes of {dtype} {shape}. Got {len(raw)}")
        got = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if out is None:
            return got.copy()
        out[...] = got
        return out

    def decode_bounded(self, buf: Stream, limit: int, where: str) -> memoryview:
        return byte_view(buf)


def _check_out(out: object, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out: expected a numpy array. Got {type(out).__name__}")
    if not out.flags.c_contiguous or not out.flags.writeable or out.shape != shape or out.dtype != dtype:
        raise DctDataError(
            f"out: expected a writeable C-contiguous {dtype} array of shape {shape}. Got {out.dtype} {out.shape}"
        )


def _check_batch(
    buffer: object, offsets: object, sample_shape: Sequence[int], dtype: torch.dtype | npt.DTypeLike
) -> tuple[tuple[int, ...], torch.dtype, np.dtype[Any]]:
    """(sample shape, torch dtype, numpy dtype) of a batch to decode, after checking its arguments."""
    import torch

    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8 or buffer.dim() != 1:
        got = f"{buffer.dtype} {tuple(buffer.shape)}" if isinstance(buffer, torch.Tensor) else type(buffer).__name__
        raise TypeError(f"buffer: expected a 1-D uint8 tensor. Got {got}")
    if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int64 or offsets.dim() != 1:
        got = f"{offsets.dtype} {tuple(offsets.shape)}" if isinstance(offsets, torch.Tensor) else type(offsets).__name__
        raise TypeError(f"offsets: expected a 1-D int64 tensor of N+1 entries. Got {got}")
    if not buffer.is_contiguous():
        raise DctDataError("buffer: expected a contiguous tensor")
    try:
        shape = tuple(int(s) for s in sample_shape)
    except (TypeError, ValueError):
        raise TypeError(f"sample_shape: expected a sequence of ints. Got {sample_shape!r}") from None
    if any(s < 0 for s in shape):
        raise DctDataError(f"sample_shape: expected non-negative sizes. Got {shape}")
    if isinstance(dtype, torch.dtype):
        dt = dtype
    else:
        try:
            dt = torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
        except TypeError:
            raise TypeError(f"dtype: expected a torch or numpy dtype. Got {dtype!r}") from None
    try:
        np_dt = torch.empty(0, dtype=dt).numpy().dtype
    except TypeError:
        raise DctDataError(f"dtype: expected a dtype numpy has (stored dtypes are). Got {dt}") from None
    at = offsets.cpu()
    if at.numel() < 1 or int(at[0]) < 0 or int(at[-1]) > buffer.numel() or bool((at[1:] < at[:-1]).any()):
        raise DctDataError(
            f"offsets: expected N+1 non-decreasing positions in 0..{buffer.numel()} (the buffer's length). Got "
            f"{at.tolist()[:8]}{'...' if at.numel() > 8 else ''}"
        )
    return shape, dt, np_dt
