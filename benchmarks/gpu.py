"""`python -m benchmarks gpu`: `Decompress` on an accelerator, and the whole loader path to it.

Two tables:
- decode: `Decompress` GB/s of decoded output for each CF at each square size, in float32 (the
  default layer) and bfloat16 (`Decompress(spec, dtype=torch.bfloat16).to(torch.bfloat16)`: weights,
  arithmetic and output in bf16), int8 coefficients in, batches of about 64 MB of output, timed with
  CUDA events around 50 queued calls after 50 ms of warm-up calls (the device's rate: at this size one
  call's host work, checks and launch, is about as long as its kernel; `latency_ms` in the JSON is one
  call alone; wall clock off CUDA), v1 and v2 in turns. Codec "v1" folds dequantization into the weights;
  "v2" is what a calibrated single-channel pack carries (dead-zone reconstruction offsets and a
  per-sample (range, mid) side input), which adds elementwise work before the first matmul.
- pipeline: samples/s from local packs of one synthetic set (`benchmarks.loader.synthetic`) through
  `make_loader(..., pin_memory=True)` and `DevicePrefetcher` to the float32 model input on the device,
  for every count of workers and batch size asked for:
  the default pack (its lossless stage chosen by `pack`, the entropy coder on this set) and the same
  settings with `--lossless zstd` (zstd-19), each opened with `decode="cpu"` (the workers decode the
  lossless stage, the coefficients cross) and with `decode="device"` (the workers check the stored bytes,
  they cross as one `StoredBatch`, and `ds.decompressor()` decodes them on the device with whatever
  decoder the stage has there); raw float32 rows -> host-to-device copy; JPEG files at the first quality
  that reaches the default pack's median PSNR -> `torchvision.io.decode_jpeg(device=...)` (nvJPEG on
  CUDA), the loader moving the encoded bytes. Per row: samples/s (best timed epoch), stored bytes per
  sample, bytes per sample that crossed (counted on the batches themselves: tensors, `StoredBatch.nbytes`,
  the JPEG bytes) and the time per batch of the decode call (CUDA events around it; wall clock off CUDA).

Only the public API is used (`open_dataset(decode=...)`, `ds.decompressor()`, `make_loader`,
`DevicePrefetcher`), so a stage's device decoder is measured as soon as it is registered.

Each epoch reads `max(--epoch-samples, 4 x workers x batch)` samples from `--samples` packed ones
(`_Cycled`: a batch never holds one sample twice), so every worker makes at least four batches an epoch
at every setting without packing more samples; packing (zstd-19 above all) is what bounds the run time.
The packs are made in spawned processes while the decode table runs. `--json` writes every row, the
device, the date, the command and the must-show ratios of issue 28 (`must_show`), after every row.

Without CUDA the command prints one line and exits 0 (`--device cpu` runs the same code on the CPU).
"""

from __future__ import annotations

import itertools
import logging
import os
import time

import numpy as np
import torch

from dctdata.codec.spec import CodecSpec
from dctdata.decoder.layer import Decompress
from dctdata.decoder.wire import StoredBatch
from dctdata.errors import DctDataError

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BATCH_BYTES = 64 << 20


def skip_reason(device: str) -> str | None:
    """Why the benchmark cannot run on `device` (None when it can)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


QUEUED_CALLS = 50  # calls queued between two CUDA events in the decode table (device throughput)
WARM_UP_S = 0.05  # calls run this long before timing: the GPU's clocks are up, as in a training loop


def _seconds(fn, device: torch.device, repeat: int, calls: int = 1, warm_s: float = WARM_UP_S) -> float:
    """Best time of one call of `fn` on `device`, after calls for `warm_s` seconds (at least two; none when
    `warm_s` is 0: the caller warmed up). With `calls` > 1 on CUDA, that many calls are queued between two
    events and the time is their mean: the device's rate, which a training loop sees once the host runs
    ahead; one call between events also counts the host's time to launch it."""
    t0 = time.perf_counter()
    warm = 0
    while warm_s > 0 and (warm < 2 or time.perf_counter() - t0 < warm_s):
        fn()
        warm += 1
        if warm % 16 == 0:
            _sync(device)
    _sync(device)
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


def v1_spec(cf: int, size: int) -> CodecSpec:
    """The v1 codec: int8, steps and offsets folded into the weights."""
    k = cf * cf
    return CodecSpec(cf=cf, height=size, width=size, dtype="int8", steps=((0.05,) * k,), offsets=((0.0,) * k,))


def v2_spec(cf: int, size: int) -> CodecSpec:
    """A calibrated single-channel pack's codec: dead zone, reconstruction offsets, per-sample side."""
    k = cf * cf
    return CodecSpec(cf=cf, height=size, width=size, dtype="int8", steps=((0.002,) * k,), offsets=((0.0,) * k,),
                     theta=0.4, recon=((0.1,) * k,), side="range_mid")  # fmt: skip


def wire(spec: CodecSpec, batch: int, dev: torch.device):
    coeffs = torch.randint(-100, 100, (batch, *spec.coeff_shape), dtype=torch.int8, device=dev)
    if spec.side is None:
        return coeffs
    side = torch.stack([torch.full((batch, spec.channels), 290.0), torch.full((batch, spec.channels), 40.0)], -1)
    return coeffs, side.to(dev)


def decode_rows(device="cuda", sizes=(256, 512, 1024, 2048), cfs=(2, 4, 6, 8), dtypes=("float32", "bfloat16"),
                repeat=20, batch_bytes=BATCH_BYTES, codecs=("v1", "v2")) -> list[dict]:  # fmt: skip
    """Rows: size, cf, dtype, codec, batch, ms per batch (`QUEUED_CALLS` calls queued: the device's rate), output
    GB/s and Gpixel/s from it, and latency_ms (one call between the events, the host's launch included).

    The codecs of one size, CF and dtype are timed in turns (one window of each, `repeat` times; best window
    of each): a shared machine's slow spells then hit both, and v2 over v1 compares like with like."""
    dev = torch.device(device)
    rows = []
    for size in sizes:
        for cf in cfs:
            for name in dtypes:
                dtype = DTYPES[name]
                item = torch.empty((), dtype=dtype).element_size()
                batch = max(1, batch_bytes // (size * size * item))
                calls = {}
                for codec in codecs:
                    spec = v1_spec(cf, size) if codec == "v1" else v2_spec(cf, size)
                    layer = Decompress(spec, dtype=dtype).to(device=dev, dtype=dtype)
                    coeffs = wire(spec, batch, dev)
                    calls[codec] = lambda layer=layer, coeffs=coeffs: layer(coeffs)
                best = dict.fromkeys(codecs, float("inf"))
                latency = dict.fromkeys(codecs, float("inf"))
                with torch.inference_mode():
                    for codec in codecs:
                        _seconds(calls[codec], dev, 1)  # warm-up (and the kernel's compile)
                    for _ in range(repeat):
                        for codec in codecs:
                            best[codec] = min(best[codec], _seconds(calls[codec], dev, 1, calls=QUEUED_CALLS, warm_s=0))
                            latency[codec] = min(latency[codec], _seconds(calls[codec], dev, 1, warm_s=0))
                pixels = batch * size * size
                for codec in codecs:
                    t = best[codec]
                    rows.append(
                        {
                            "size": size,
                            "cf": cf,
                            "dtype": name,
                            "codec": codec,
                            "batch": batch,
                            "ms": 1e3 * t,
                            "latency_ms": 1e3 * latency[codec],
                            "GBps": pixels * item / t / 1e9,
                            "Gpix": pixels / t / 1e9,
                        }
                    )
                del calls
    return rows


# The pipeline table -------------------------------------------------------------------------------
PIPELINES = ("default-cpu", "default-device", "default-ahead", "zstd-cpu", "zstd-device", "zstd-ahead", "raw", "jpeg")
AHEAD_GROUP = 8  # loader batches a DecodeAhead group merges into one decode (the "-ahead" pipelines)
MIN_EPOCH_SAMPLES = 4096


class _Rows(torch.utils.data.Dataset):
    """Rows of a .npy file (memory-mapped once per process), batched by `__getitems__`."""

    def __init__(self, path: str) -> None:
        self.path, self._x, self._pid = path, None, None
        self.n = len(np.load(path, mmap_mode="r", allow_pickle=False))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_x": None, "_pid": None}

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, idx):
        if self._pid != os.getpid():
            self._x, self._pid = np.load(self.path, mmap_mode="r", allow_pickle=False), os.getpid()
        return [torch.from_numpy(np.array(self._x[i])) for i in idx]

    def __getitem__(self, i):
        return self.__getitems__([i])[0]


class _EncodedFiles(torch.utils.data.Dataset):
    def __init__(self, files) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i) -> bytes:
        with open(self.files[i], "rb") as fh:
            return fh.read()  # bytes, not a tensor per sample: workers pass one pickle per batch


class _Cycled(torch.utils.data.Dataset):
    """`length` samples read from a dataset of fewer: index i is sample i mod n, and a batch never holds one
    sample twice (a repeat takes the next sample the batch lacks), so what crosses and is decoded per batch
    is what a pack of `length` distinct samples would give (a `StoredBatch` holds a repeated stream once)."""

    def __init__(self, dataset, length: int) -> None:
        self.dataset, self.length, self.n = dataset, int(length), len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitems__(self, idx):
        if len(idx) > self.n:
            raise DctDataError(f"batch: expected at most the {self.n} packed samples (--samples). Got {len(idx)}")
        seen: set[int] = set()
        picked = []
        for i in idx:
            j = int(i) % self.n
            while j in seen:
                j = (j + 1) % self.n
            seen.add(j)
            picked.append(j)
        get = getattr(self.dataset, "__getitems__", None)
        return get(picked) if get is not None else [self.dataset[j] for j in picked]

    def __getitem__(self, i):
        return self.__getitems__([i])[0]


def _as_list(batch):
    return list(batch)


def synthetic_part(n: int, size: int, start: int, stop: int, seed: int = 0) -> np.ndarray:
    """Samples [start, stop) of `benchmarks.loader.synthetic(n, size, seed)` (each sample is drawn and scaled
    on its own, so parts made in several processes concatenate to the whole set)."""
    from dctdata.datasets import em_denoise

    ds = em_denoise(n=n, size=size, seed=seed)
    x = np.stack([ds[i]["noisy"] for i in range(start, stop)]).astype(np.float64)
    lo, hi = x.min(axis=(1, 2, 3), keepdims=True), x.max(axis=(1, 2, 3), keepdims=True)
    return np.rint(255.0 * (x - lo) / np.maximum(hi - lo, 1e-12)).astype(np.float32)


def _pack(source: str, out: str, target_psnr: float, codec) -> None:
    import dctdata

    dctdata.pack(source, out, quant="int8", target_psnr=target_psnr, quiet=True, codec=codec, overwrite=True)


def _jpeg(source: str, directory: str, target_psnr: float):
    from benchmarks.loader import jpeg_files

    x = np.load(source, mmap_mode="r", allow_pickle=False)
    return jpeg_files(np.asarray(x[:, 0]).astype(np.uint8), directory, target_psnr)


class Setup:
    """The stored forms of one synthetic set under `workdir`: `x.npy` (raw float32), the default pack,
    the `--lossless zstd` pack and the JPEG files. `start()` makes them in `jobs` spawned processes (zstd-19
    is the slow one) while the caller goes on (the decode table); `wait()` returns them."""

    def __init__(self, workdir: str, n: int, size: int, target_psnr: float, jobs: int = 1) -> None:
        self.workdir, self.n, self.size, self.target_psnr, self.jobs = workdir, n, size, target_psnr, max(1, jobs)
        self.x = os.path.join(workdir, "x.npy")
        self.default, self.zstd = os.path.join(workdir, "default"), os.path.join(workdir, "zstd")
        self.jpg = os.path.join(workdir, "jpg")
        self.seconds: float | None = None
        self._thread = None
        self._error: BaseException | None = None
        self.jpeg: tuple | None = None

    def start(self) -> Setup:
        import threading

        def run():
            try:
                self._make()
            except BaseException as exc:  # re-raised by wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name="bench-gpu-setup", daemon=True)
        self._thread.start()
        return self

    def wait(self) -> Setup:
        if self._thread is None:
            self._make()
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self

    def _make(self) -> None:
        from dctdata.stages import ZSTD_MAX

        t0 = time.perf_counter()
        zstd = dict(ZSTD_MAX)  # what `--lossless zstd` packs
        if self.jobs > 1:
            from concurrent.futures.process import BrokenProcessPool

            try:
                self._make_in_processes(zstd)
            except BrokenProcessPool as exc:  # a host that cannot spawn: the same work in this process
                log.warning("packing in %d processes failed (%s): packing in this one", self.jobs, exc)
                self.jobs = 1
        if self.jobs == 1:
            np.save(self.x, synthetic_part(self.n, self.size, 0, self.n))
            _pack(self.x, self.default, self.target_psnr, "auto")
            _pack(self.x, self.zstd, self.target_psnr, zstd)
            self.jpeg = _jpeg(self.x, self.jpg, self._psnr())
        self.seconds = time.perf_counter() - t0

    def _make_in_processes(self, zstd: dict) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        cuts = np.linspace(0, self.n, min(self.n, self.jobs) + 1).astype(int)
        spans = [(self.n, self.size, int(a), int(b)) for a, b in itertools.pairwise(cuts) if b > a]
        with ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = [pool.submit(synthetic_part, *span) for span in spans]
            np.save(self.x, np.concatenate([p.result() for p in parts]))
            slow = pool.submit(_pack, self.x, self.zstd, self.target_psnr, zstd)
            pool.submit(_pack, self.x, self.default, self.target_psnr, "auto").result()
            self.jpeg = pool.submit(_jpeg, self.x, self.jpg, self._psnr()).result()
            slow.result()

    def _psnr(self) -> float:
        import dctdata

        return dctdata.open_dataset(self.default).manifest.stats["image"].psnr_median


def timer_name(device: torch.device) -> str:
    """How `_DecodeTimer` times on `device`."""
    return "CUDA events" if device.type == "cuda" else "wall clock"


class _DecodeTimer:
    """Times each call of the decode step: CUDA events around it on the current stream (read after the
    epoch's synchronize, so timing adds no sync), the wall clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pairs: list = []
        self.wall: list[float] = []

    def __call__(self, fn, *args):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args)
            end.record()
            self.pairs.append((start, end))
            return out
        t0 = time.perf_counter()
        out = fn(*args)
        self.wall.append(1e3 * (time.perf_counter() - t0))
        return out

    def ms(self) -> list[float]:
        """The calls' milliseconds so far (call after the device is synchronized)."""
        return [s.elapsed_time(e) for s, e in self.pairs] if self.cuda else list(self.wall)


def _nbytes(batch) -> int:
    """Bytes of a batch as it crosses to the device (tensors, stored batches, or the encoded bytes nvJPEG
    decodes there)."""
    if isinstance(batch, (torch.Tensor, StoredBatch)):
        return batch.nbytes
    if isinstance(batch, (bytes, bytearray)):
        return len(batch)
    if isinstance(batch, (list, tuple)):
        return sum(_nbytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(_nbytes(b) for b in batch.values())
    return 0


def _bytes(root: str, n: int) -> float:
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f != "manifest.json")
    return total / n


def _stage_name(ds) -> str:
    from dctdata.stages import CtxransStage, get_stage

    lossless = dict(ds.manifest.field("image").lossless or {})
    if isinstance(get_stage(lossless), CtxransStage):
        return "entropy coder"
    return f"{lossless.get('id', 'none')}-{lossless['level']}" if "level" in lossless else lossless.get("id", "none")


def stage_decoder(lossless, device: torch.device) -> str:
    """Where `decode="device"` decodes a stage's streams on `device`: "device" (the stage's `device_decoder`
    hook gives one), "cpu" (the device is the CPU) or "cpu fallback" (the streams go to the CPU and back)."""
    from dctdata.stages import get_stage

    if device.type == "cpu":
        return "cpu"
    try:
        return "device" if get_stage(lossless).device_decoder(device) is not None else "cpu fallback"
    except Exception as exc:  # the decode will raise it too: the row records it
        return f"none ({type(exc).__name__}: {exc})"


def _cases(setup: Setup, device: torch.device) -> dict:
    """pipeline key -> {name, dataset, collate (or None), decode step (or None), stored B/sample, psnr (None:
    lossless), where (where the lossless stage decodes: "workers", or `stage_decoder`'s answer)}."""
    import torchvision.io as tio

    import dctdata

    n = setup.n
    cases = {}
    packs = (("default", setup.default, "default pack"), ("zstd", setup.zstd, "`--lossless zstd` pack"))
    for pack, path, what in packs:
        probe = dctdata.open_dataset(path)
        stored, psnr = _bytes(path, n), probe.manifest.stats["image"].psnr_median
        lossless = probe.manifest.field("image").lossless
        for decode in ("cpu", "device"):
            ds = dctdata.open_dataset(path, decode=decode)
            layer = ds.decompressor().to(device)
            cases[f"{pack}-{decode}"] = {
                "name": f'{what} ({_stage_name(probe)}), decode="{decode}" -> ds.decompressor()',
                "dataset": ds,
                "collate": None,
                "decode": lambda b, layer=layer: layer(b[0]),
                "stored": stored,
                "psnr": psnr,
                "where": "workers" if decode == "cpu" else stage_decoder(lossless, device),
            }
        cases[f"{pack}-ahead"] = {
            **cases[f"{pack}-device"],
            "name": f'{what} ({_stage_name(probe)}), decode="device" -> DecodeAhead(..., ds.decompressor(), '
            f"group={AHEAD_GROUP})",
            "decode": None,
            "ahead": cases[f"{pack}-device"]["dataset"].decompressor().to(device),
        }
    x = np.load(setup.x, mmap_mode="r", allow_pickle=False)
    cases["raw"] = {"name": "raw float32 -> host-to-device copy", "dataset": _Rows(setup.x), "collate": None,
                    "decode": None, "stored": x[0].nbytes, "psnr": None, "where": None}  # fmt: skip
    q, files, jpeg_psnr = setup.jpeg

    def jpeg_decode(files):
        images = tio.decode_jpeg([torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files], device=device)
        return torch.stack(images).float()

    cases["jpeg"] = {"name": f"JPEG q={q} -> torchvision decode_jpeg(device) (nvJPEG on CUDA)",
                     "dataset": _EncodedFiles(files), "collate": _as_list, "decode": jpeg_decode,
                     "stored": _bytes(setup.jpg, n), "psnr": jpeg_psnr, "where": None}  # fmt: skip
    return cases


def epoch_samples(workers: int, batch: int, minimum: int = MIN_EPOCH_SAMPLES) -> int:
    """Samples read an epoch: at least `minimum`, and at least four batches a worker."""
    return max(minimum, 4 * max(1, workers) * batch)


def measure(case, device: torch.device, workers: int, batch: int, epochs: int, length: int) -> dict:
    """One pipeline at one setting: one untimed epoch, then `epochs` timed ones (persistent workers)."""
    from dctdata.loaders.decode_ahead import DecodeAhead, DecompressBatches
    from dctdata.loaders.device import DevicePrefetcher
    from dctdata.loaders.distributed import make_loader

    dataset, collate, decode = case["dataset"], case["collate"], case["decode"]
    kw = {"collate_fn": collate} if collate else {}
    pin = device.type == "cuda"
    loader = make_loader(
        _Cycled(dataset, length), batch, num_workers=workers, pin_memory=pin, persistent_workers=workers > 0, **kw
    )
    best, moved, count, times = 0.0, 0, 0, []
    ahead = case.get("ahead")
    try:
        for epoch in range(epochs + 1):
            loader.sampler.set_epoch(epoch)
            timer = _DecodeTimer(device)
            count, moved, t0 = 0, 0, time.perf_counter()
            batches = loader if collate else DevicePrefetcher(loader, device, pin_memory=False)
            groups = None
            if ahead is not None:  # stored batches counted as they cross, decoded a group at a time
                groups = DecompressBatches(ahead, timed=True)
                batches = DecodeAhead(_Counted(batches), groups, group=AHEAD_GROUP)
            with torch.inference_mode():
                for b in batches:
                    out = b[0] if ahead is not None else b if decode is None else timer(decode, b)
                    count += out.shape[0]
                    moved += _nbytes(b) if ahead is None else 0
            _sync(device)
            if ahead is not None:
                moved = batches.batches.nbytes
            if epoch:  # the first epoch starts the workers and warms the decoders: not timed
                best = max(best, count / (time.perf_counter() - t0))
                times += timer.ms() if groups is None else _per_batch_ms(groups, count, batch)
    finally:
        del loader
    return {
        "samples_per_s": best,
        "crossed_per_sample": moved / count,
        "decode_ms": float(np.median(times)) if times else None,
        "decode_ms_min": min(times) if times else None,
        "epoch_samples": count,
    }


class _Counted:
    """Batches passed through, the bytes of each counted as it crosses (before a group decoder replaces them)."""

    def __init__(self, batches) -> None:
        self.batches, self.nbytes = batches, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for b in self.batches:
            self.nbytes += _nbytes(b)
            yield b


def _per_batch_ms(groups, samples: int, batch: int) -> list[float]:
    """GPU milliseconds per loader batch of a DecodeAhead epoch: each group's time over its batches."""
    per_group = [t if isinstance(t, float) else t[0].elapsed_time(t[1]) for t in groups.timings]
    if not per_group:
        return []
    n = -(-samples // batch)
    sizes = [AHEAD_GROUP] * (len(per_group) - 1) + [n - AHEAD_GROUP * (len(per_group) - 1)]
    return [ms / k for ms, k in zip(per_group, sizes) for _ in range(k) if k > 0]


def pipeline_rows(device: str, setup: Setup, workers=(4, 8), batches=(32, 256), epochs=2,
                  min_epoch_samples=MIN_EPOCH_SAMPLES, pipelines=PIPELINES, on_row=None) -> list[dict]:  # fmt: skip
    """Rows (one per pipeline, count of workers and batch size): pipeline key, name, decode, workers,
    batch, samples_per_s, stored_per_sample, crossed_per_sample, decode_ms (median per batch, None for
    the raw copy), decode_ms_min, psnr (None: lossless), stage_decodes_on (where the lossless stage ran:
    "workers", "device", "cpu", "cpu fallback"), epoch_samples, epochs; a row whose loader failed has None
    figures and its `error`. `on_row(rows)` is called after each."""
    dev = torch.device(device)
    setup.wait()
    cases = _cases(setup, dev)
    rows: list[dict] = []
    for b in batches:
        for w in workers:
            for key in pipelines:
                case = cases[key]
                try:
                    got = measure(case, dev, w, b, epochs, epoch_samples(w, b, min_epoch_samples))
                except (DctDataError, RuntimeError, ImportError, OSError) as exc:  # the other rows still run
                    log.error("%s, workers=%d, batch=%d: %s", key, w, b, exc)
                    got = dict.fromkeys(("samples_per_s", "crossed_per_sample", "decode_ms", "decode_ms_min",
                                         "epoch_samples"))  # fmt: skip
                    got["error"] = f"{type(exc).__name__}: {exc}"
                decode = {"cpu": "cpu", "device": "device", "ahead": "device"}.get(key.rsplit("-", 1)[-1])
                rows.append({"pipeline": key, "name": case["name"], "decode": decode, "workers": w, "batch": b,
                             **got, "stored_per_sample": case["stored"], "psnr": case["psnr"],
                             "stage_decodes_on": case["where"], "epochs": epochs})  # fmt: skip
                if on_row is not None:
                    on_row(rows)
    return rows


# The must-show figures of issue 28 -----------------------------------------------------------------
def _find(rows, key: str, workers: int, batch: int) -> dict | None:
    return next((r for r in rows if (r["pipeline"], r["workers"], r["batch"]) == (key, workers, batch)), None)


def must_show(rows: list[dict], decode: list[dict]) -> dict:
    """Issue 28's must-show figures from one run's rows: each with its value, threshold, whether it is met
    and what it compares (8 workers and batch 32 where the run has them, else the most workers and the
    smallest batch)."""
    out: dict = {}
    if rows:
        w = 8 if any(r["workers"] == 8 for r in rows) else max(r["workers"] for r in rows)
        b = 32 if any(r["batch"] == 32 for r in rows) else min(r["batch"] for r in rows)
        big = max(r["batch"] for r in rows)
        single, ahead, cpu, zcpu = (
            _find(rows, k, w, b) for k in ("default-device", "default-ahead", "default-cpu", "zstd-cpu")
        )
        # the default pack's decode="device" row: the faster of one decode a batch and DecodeAhead's groups
        found = [r for r in (single, ahead) if r and r.get("samples_per_s")]
        dev = max(found, key=lambda r: r["samples_per_s"]) if found else None

        def entry(value, op, limit, what):
            met = None if value is None else (value >= limit if op == ">=" else value < limit if op == "<" else
                                              value <= limit)  # fmt: skip
            return {"value": value, "threshold": f"{op} {limit}", "met": met, "workers": w, "batch": b, "what": what}

        if dev and cpu:
            out["device_vs_cpu_8w"] = entry(
                _ratio(dev["samples_per_s"], cpu["samples_per_s"]), ">=", 1.5,
                f'default pack samples/s, decode="device" ({dev["pipeline"]}) over decode="cpu"')  # fmt: skip
            out["device_vs_cpu_8w"]["by_batch"] = {
                f'{r["pipeline"]}/{r["batch"]}': _ratio(r["samples_per_s"], c["samples_per_s"])
                for r in rows if r["pipeline"] in ("default-device", "default-ahead") and r["workers"] == w
                for c in [_find(rows, "default-cpu", w, r["batch"])] if c
            }  # fmt: skip
        if dev and zcpu:
            out["device_vs_zstd_cpu"] = entry(
                _ratio(dev["samples_per_s"], zcpu["samples_per_s"]),
                ">=",
                1.0,
                f'default pack with decode="device" ({dev["pipeline"]}) over the --lossless zstd pack with '
                'decode="cpu", samples/s',
            )
        if dev:
            out["stage_decodes_on"] = dev.get("stage_decodes_on")  # "device" once the stage has a decoder there
            out["crossing_over_stored"] = entry(
                _ratio(dev["crossed_per_sample"], dev["stored_per_sample"]),
                "<=",
                1.02,
                'default pack with decode="device": bytes crossing per sample over stored bytes per sample',
            )
            if single:
                out["batch32_decode_ms"] = entry(
                    single["decode_ms"],
                    "<",
                    1.0,
                    f'default pack with decode="device": median time of the decompressor call on one batch of {b} '
                    "(its latency), ms",
                )
            if ahead:
                out["batch32_decode_ms_grouped"] = entry(
                    ahead["decode_ms"],
                    "<",
                    1.0,
                    f"default pack with DecodeAhead (group={AHEAD_GROUP}): median GPU time per batch of {b} "
                    "(a group's decode over its batches), ms",
                )
            top = _find(rows, "default-device", w, big)
            if top:
                out["batch256"] = {
                    "what": f'default pack with decode="device", workers={w}, batch={big} (no threshold)',
                    "samples_per_s": top["samples_per_s"],
                    "decode_ms": top["decode_ms"],
                    "decode_samples_per_s": None if not top["decode_ms"] else big / (top["decode_ms"] / 1e3),
                    "workers": w,
                    "batch": big,
                }
    ratios = {}
    for r in decode:
        if r["codec"] == "v2":
            v1 = next((v for v in decode if v["codec"] == "v1" and (v["size"], v["cf"], v["dtype"]) ==
                       (r["size"], r["cf"], r["dtype"])), None)  # fmt: skip
            if v1:
                ratios[f"{r['size']}/{r['cf']}/{r['dtype']}"] = r["GBps"] / v1["GBps"]
    if ratios:
        low = min(ratios.values())
        out["v2_over_v1_min"] = {"value": low, "threshold": ">= 0.9", "met": low >= 0.9, "by_size_cf_dtype": ratios,
                                 "what": "Decompress v2 GB/s over v1 GB/s, the lowest of the decode table"}  # fmt: skip
    return out


def _ratio(a, b) -> float | None:
    return None if a is None or not b else a / b


def write_json(path: str, result: dict) -> None:
    """`result` as JSON at `path`, replaced whole (a run cut short leaves the rows it finished)."""
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1, allow_nan=False, default=_plain)
    os.replace(tmp, path)


def _plain(value):
    raise TypeError(f"not JSON: {type(value).__name__}")


def format_decode_rows(rows) -> str:
    lines = [
        "| size | CF | dtype | codec | batch | ms/batch | GB/s out | Gpixel/s |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']}² | {r['cf']} | {r['dtype']} | {r['codec']} | {r['batch']} | {r['ms']:.3f} | "
            f"{r['GBps']:.1f} | {r['Gpix']:.2f} |"
        )
    return "\n".join(lines)


def format_pipeline_rows(rows) -> str:
    """The pipeline rows as markdown; "vs default CPU": samples/s over the default pack's decode="cpu" row
    at the same workers and batch; "stage decoded on": where the lossless stage ran (the loader's workers,
    the device, or the CPU of the main process as a fallback)."""
    lines = [
        "| pipeline | workers | batch | samples/s | vs default CPU | stored B/sample | B/sample to device | "
        "decode ms/batch | stage decoded on | median PSNR dB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        base = _find(rows, "default-cpu", r["workers"], r["batch"])
        vs = _ratio(r["samples_per_s"], base["samples_per_s"] if base else None)
        q = "lossless" if r["psnr"] is None else f"{r['psnr']:.1f}"
        sps = f"failed: {r['error'][:100]}" if r.get("error") else f"{r['samples_per_s']:,.0f}"
        lines.append(
            f"| {r['name']} | {r['workers']} | {r['batch']} | {sps} | {'—' if vs is None else f'{vs:.2f}x'} | "
            f"{r['stored_per_sample']:,.0f} | {_int(r['crossed_per_sample'])} | {_num(r['decode_ms'])} | "
            f"{r.get('stage_decodes_on') or '—'} | {q} |"
        )
    return "\n".join(lines)


def _int(v) -> str:
    return "—" if v is None else f"{v:,.0f}"


def format_must_show(checks: dict) -> str:
    """The must-show figures as markdown."""
    lines = ["| check | value | threshold | met | what |", "|---|---:|---|---|---|"]
    for key, c in checks.items():
        if not isinstance(c, dict):
            lines.append(f'| {key} | {c} | — | — | where the default pack\'s stage decoded with decode="device" |')
            continue
        if "value" not in c:
            value = f"{_int(c['samples_per_s'])} samples/s, {_num(c['decode_ms'])} ms/batch decode"
            lines.append(f"| {key} | {value} | — | — | {c['what']} |")
            continue
        met = "—" if c["met"] is None else ("yes" if c["met"] else "**no**")
        where = f" (workers={c['workers']}, batch={c['batch']})" if "workers" in c else ""
        lines.append(f"| {key} | {_num(c['value'])} | {c['threshold']} | {met} | {c['what']}{where} |")
    return "\n".join(lines)


def _num(v) -> str:
    return "—" if v is None else f"{v:.3f}"
