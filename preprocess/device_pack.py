"""Packing with the transform on a device (`--device cuda`): the same parts, the same codec, the entropy coder
on CPU threads overlapped with the device.

Three stages run at once, joined by bounded queues:

1. a reader thread reads the parts' batches from the source in order (ahead of the device: at most
   `READ_AHEAD` batches wait), takes their crc32 for the `--resume` journal and, for CUDA, copies the dct
   fields into pinned memory so the upload does not wait on the pageable copy;
2. this thread runs `DeviceEncoder` on each batch: the per-item side values, the block DCT as batched matrix
   multiplications, quantization, the PSNR floor and pointwise bounds (`dctdata.encoder.quantize.encode`, the CPU
   pack's own torch code, on device tensors) and the float64 decode for the error figures; only the stored
   coefficients come back;
3. `threads` writer threads each finish a part: the writer runs the lossless stage (the entropy coder's
   encode, which releases the GIL) and writes the part's files. At most `2 * threads + 2` encoded batches
   wait for them, so memory stays bounded however large the set.

The bytes are the CPU pack's wherever the device's float32 arithmetic rounds like the CPU's; where it does
not, a coefficient near a quantization boundary can land on the neighbouring integer (`python -m benchmarks
pack-speed` measures the share on a GPU: its `difference`). The promises are checked on the device values
exactly as on the CPU: the floor and the bounds re-code items from the device decode, and the figures come
from it.

Batches the device path does not take go through the CPU pack's `Encoder` unchanged (the same stats): any
non-finite value (its error or NaN policy), validity masks, sources float32 cannot carry exactly (float64,
wide integers: their float32 check), and codecs with corrections or a lattice (their per-sample choice
weighs bytes on the CPU).

`torch_device` is the one place the device is chosen; the tests replace it to run this module's code on
CPU tensors (CI has no GPU), as the decoders' device paths are tested.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from dctdata.encoder.quantize import F32_SAFE_MAX
from dctdata.errors import DctDataError
from dctdata.preprocess.parts import BATCH_BYTES, Encoder, PartJob, _digest, batch_size

log = logging.getLogger(__name__)

READ_AHEAD = 3  # batches the reader keeps ready ahead of the device
# Source bytes per device batch: larger than the CPU pack's (`parts.BATCH_BYTES`) so the host's work per batch
# (Python, launches, the syncs of the floor's loop and the figures) is spread over more data.
DEVICE_BATCH_BYTES = 64 << 20
# The figures' float64 decode in slices this large on a CUDA device (the CPU's 4 MB keeps its temporaries in
# cache; a GPU wants fewer, larger launches and one read-back a slice).
DEVICE_FIGURE_BYTES = 256 << 20
_DONE = object()  # end of a queue
# source dtypes the device converts to float32 exactly (the CPU path checks the others: `check_float32`)
_EXACT = {np.dtype(t) for t in ("float32", "float16", "uint8", "int8", "uint16", "int16")}
_EXACT_TORCH = {torch.float32, torch.float16, torch.uint8, torch.int8, torch.int16, torch.uint16}


def torch_device(name: str) -> torch.device:
    """The torch device of `--device NAME` ("cuda", "cuda:N"), or one clear error where it is missing."""
    if not torch.cuda.is_available():
        raise DctDataError(
            f"--device {name}: expected a CUDA device (torch.cuda.is_available()). Got none: this torch "
            f"({torch.__version__}) sees no GPU; pack without --device, or on a machine with one"
        )
    dev = torch.device(name)
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DctDataError(
            f"--device {name}: expected a CUDA device index below {torch.cuda.device_count()}. Got {dev.index}"
        )
    return dev


def writer_threads(workers: int | None) -> int:
    """Entropy-coder threads of a device pack: --workers, else every core but the one that drives the device."""
    return max(1, workers or (os.cpu_count() or 2) - 1)


def on_device(codec) -> bool:
    """Whether a field's encode runs on the device (corrections and lattices choose per sample on the CPU)."""
    return codec.corrections is None and codec.lattice is None


class DeviceEncoder(Encoder):
    """`Encoder` with the dct fields' encode and figures on `device`; batches it does not take (see the module
    docstring) go through the CPU `Encoder`, which shares its stats."""

    def __init__(self, specs, nan, strict: bool, derived: tuple[str, ...], device: torch.device) -> None:
        super().__init__(specs, nan, strict, derived)
        self.device = device
        if device.type == "cuda":
            self.figure_bytes = DEVICE_FIGURE_BYTES
        self.cpu = Encoder(specs, nan, strict, derived)
        self.cpu.stats = self.stats
        self.direct = not derived and all(
            on_device(f.codec) and f.valid is None for f in self.by_name.values() if f.coded
        )

    def track_steps(self, source_info) -> None:
        super().track_steps(source_info)
        self.cpu.offsets, self.cpu.step_figures = self.offsets, self.step_figures  # one record, either route

    def encode(self, batch: dict[str, Any], first: int, where) -> dict[str, np.ndarray]:
        moved = self._upload(batch) if self.direct else None
        if moved is None:
            return self.cpu.encode({k: np.asarray(v) for k, v in batch.items()}, first, where)
        stored: dict[str, np.ndarray] = {}
        b = len(next(iter(batch.values())))
        at = lambda j: where(first + j)  # noqa: E731
        for name, f in self.by_name.items():
            if not f.coded:
                stored[name] = f.kind_type.store(f, np.asarray(batch[name]), at(0))
                continue
            self.encode_field(f, moved[name], None, first, b, at, stored)
        return stored

    def _upload(self, batch: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        """{dct field: float32 (B, *shape) on the device}, or None where the batch takes the CPU route (a field
        missing or misshapen, a dtype float32 cannot carry exactly, a non-finite value or one past the DCT's
        float32 bound: the CPU route's checks name them)."""
        out = {}
        for name, f in self.by_name.items():
            x = batch.get(name)
            if x is None:
                return None
            expect = f.kind_type.batch_shape(f, x.ndim)
            if tuple(x.shape[1:]) != tuple(expect):
                return None
            if not f.coded:
                if np.dtype(x.dtype).name != f.dtype:
                    return None
                continue
            t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
            if t.dtype not in _EXACT_TORCH:
                return None
            wrap = t.dtype == torch.uint16  # uploaded as int16 (uint16 has few CUDA kernels), unwrapped as float32
            t = t.view(torch.int16) if wrap else t
            t = t.to(self.device, non_blocking=True).reshape(len(t), *f.shape).to(torch.float32)
            if wrap:
                t = torch.where(t < 0, t + 65536.0, t)
            peak = t.abs().amax() if t.numel() else torch.zeros((), device=t.device)
            if not bool(peak <= F32_SAFE_MAX):  # NaN fails the comparison too
                return None
            out[name] = t
        return out


def _read(src, job: PartJob, start: int, stop: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """The samples [start, stop) in device batches (`parts._read`'s checks, DEVICE_BATCH_BYTES a batch)."""
    size = batch_size(job.specs) * max(1, DEVICE_BATCH_BYTES // BATCH_BYTES)
    seen = start
    for a, batch in src.batches(size, start, stop):
        yield a, batch
        seen += len(next(iter(batch.values())))
    if seen != stop:
        raise DctDataError(
            f"{src.description}: expected samples {start}..{stop - 1}. Got {seen - start} (the source ended early)"
        )


def _pinned(batch: dict[str, np.ndarray], names: set[str]) -> dict[str, Any]:
    """The dct fields of a batch in pinned host memory (a faster, asynchronous upload); others as they are."""
    out: dict[str, Any] = {}
    for k, v in batch.items():
        a = np.asarray(v)
        if k in names and a.dtype in _EXACT:
            t = torch.empty(a.shape, dtype=torch.from_numpy(a[:0]).dtype, pin_memory=True)
            t.numpy()[...] = a
            out[k] = t
        else:
            out[k] = a
    return out


class _Stop(Exception):
    """Raised in a writer thread's batch iterator when the pack stops elsewhere."""


def run_parts(  # noqa: C901 (over the limit: to split)
    job: PartJob,
    todo: list[tuple[int, int, int]],
    src,
    device: torch.device,
    on_done: Callable[[dict], None],
    threads: int,
) -> None:
    """Encode and write the parts in `todo` ((index, start, stop)) with the device pipeline of the module
    docstring; `on_done(result)` is called in this thread for each finished part, as `run_part` returns it."""
    if not todo:
        return
    names = {f.name for f in job.specs if f.coded}
    pin = device.type == "cuda"
    stop = threading.Event()
    reads: queue.Queue = queue.Queue(maxsize=READ_AHEAD)
    room = threading.BoundedSemaphore(2 * threads + 2)  # encoded batches waiting for the writers
    failure: list[BaseException] = []

    def reader() -> None:
        try:
            for index, a, b in todo:
                digest: dict[str, int] = {}
                for first, batch in _read(src, job, a, b):
                    _digest(digest, batch)
                    if not _put(reads, (index, first, _pinned(batch, names) if pin else batch), stop):
                        return
                _put(reads, (index, None, digest), stop)
            _put(reads, _DONE, stop)
        except BaseException as exc:  # handed to the device thread, which raises it
            failure.append(exc)
            _put(reads, _DONE, stop)

    def batches(q: queue.Queue) -> Iterator[dict[str, np.ndarray]]:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if item is None:
                raise _Stop()
            room.release()
            yield item

    def write(index: int, a: int, b: int, q: queue.Queue, encoder: Encoder, digest: dict) -> dict:
        out = job.writer.write_part(job.root, job.specs, job.samples, index, a, b, batches(q))
        return {"index": index, "start": a, "stop": b, "stats": encoder.result_stats(), "source": digest, **out}

    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dctdata-pack-write")
    read = threading.Thread(target=reader, name="dctdata-pack-read", daemon=True)
    futures: dict[int, Future] = {}
    queues: dict[int, queue.Queue] = {}
    digests: dict[int, dict] = {}
    bounds = {i: (a, b) for i, a, b in todo}
    reported: set[int] = set()

    def report(block: bool) -> None:
        for i, fut in list(futures.items()):
            if i not in reported and (block or fut.done()):
                result = fut.result()
                reported.add(i)
                on_done(result)

    read.start()
    try:
        with torch.inference_mode():
            encoder = None
            while True:
                item = reads.get()
                if item is _DONE:
                    break
                index, first, batch = item
                if first is None:  # the part's last batch was read: its digest, then the writer's end
                    digests[index].update(batch)
                    queues[index].put(_DONE)
                    report(False)
                    continue
                if index not in futures:
                    a, b = bounds[index]
                    encoder = DeviceEncoder(job.specs, job.nan, job.strict, job.derived, device)
                    encoder.track_steps(src.info)
                    queues[index], digests[index] = queue.Queue(), {}
                    futures[index] = pool.submit(write, index, a, b, queues[index], encoder, digests[index])
                stored = encoder.encode(batch, first, src.where)
                while not room.acquire(timeout=0.1):
                    _check_writers(futures)
                queues[index].put(stored)
        if failure:
            raise failure[0]
        report(True)
    except BaseException:
        stop.set()
        for q in queues.values():
            q.put(None)  # a writer still waiting stops (a finished one never reads it)
        raise
    finally:
        stop.set()
        read.join(timeout=10)
        pool.shutdown(wait=True, cancel_futures=True)


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Put `item` unless the pack stopped (then False, after a short wait)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _check_writers(futures: dict[int, Future]) -> None:
    """Raise a writer thread's error now rather than wait on its room forever."""
    for fut in futures.values():
        if fut.done() and fut.exception() is not None:
            raise fut.exception()
