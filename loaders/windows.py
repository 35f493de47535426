"""`WindowDataset`: time windows over a pack of trajectories (`dctdata pack` of The Well's or PDEBench's
HDF5 layouts, or of a NetCDF/zarr store with `--time-dim`; a store packed with `--sample-dim time` is one
trajectory: `series_info`), served as `the_well.data.WellDataset` serves them, from frames stored once.

    ds = dctdata.open_dataset("sw.zarr", n_steps_input=4, n_steps_output=1)
    item = ds[i]   # {"input_fields": (4, x, y, F), "output_fields": (1, x, y, F), "constant_fields": ...}

**Windows and their order.** A trajectory of S stored frames has `W = S - (1 + dt * (n_in + n_out - 1)) + 1`
windows of stride `dt` (the minimum stride; `raw_steps_to_possible_sample_t0s` in The Well), starting at
steps 0..W-1. Windows are numbered trajectory after trajectory in the pack's order (files sorted by path,
then trajectories, then start steps), so window `i` is start step `i - first[k]` of trajectory `k`, where
`first[k]` counts the windows of the trajectories before it: WellDataset's `file_index_offsets` walk,
which gives the same numbers because every trajectory of a file has as many steps. A window never
crosses trajectories. `full_trajectory_mode=True`: one window per trajectory, its output the rest of the
shortest trajectory (at most `max_rollout_steps`), from step 0 or so that the output starts at
`start_output_steps_at_t`. A stride range (`min_dt_stride < max_dt_stride`) draws each window's stride
like WellDataset (the largest the window's start allows, at most `max_dt_stride`), but from a generator
seeded by (seed, epoch, window): the same draw when a run is resumed.

**Items.** WellDataset's keys, shapes and layout, float32 tensors: `input_fields` (n_in, x, y, F) and
`output_fields` (n_out, x, y, F), channels last, the time-varying fields' components in WellDataset's
order (order-0 fields, then vectors, then tensors, each field's components together); `constant_fields`
(x, y, Fc); `input_scalars`/`output_scalars` (T, S); `constant_scalars` (Sc,); `boundary_conditions`
(n_dims, 2: WellDataset's "padding" codes); `space_grid` (x, y, n_dims); `input_time_grid` and
`output_time_grid` (relative to the window's first step unless `normalize_time_grid=False`). Keys whose
value would be empty are left out, as WellDataset does. `normalization="zscore"` or `"rms"` divides the
time-varying fields by the statistics the pack recorded (WellDataset's ZScoreNormalization and
RMSNormalization; `min_std` as there).

**Reads.** By frame, in both storages. zarr (`WindowDataset`, map-style): a batch (`__getitems__`, what a
DataLoader calls with `make_loader`) reads the distinct frames its windows need once, decodes them once (the
pack's `Decompress` on the CPU; the reading and integrity checks are `DCTZarrDataset`'s), and gathers the
windows from them. webdataset (`dctdata.loaders.wds_windows.WebWindowDataset`, iterable): the same windows
and items, dealt to ranks and workers by the shard of their first frame, each frame decoded once per pass.
`make_loader` (`dctdata.loaders.distributed`) gives every window once per epoch across ranks and workers and
resumes mid-epoch, as for samples.

**decode="device".** The workers hand over each window's frames as their checked stored bytes
(`dctdata.loaders.window_decode.WindowFrames` in the item's `frames` key, the other keys as above); a
batch's collate keeps each distinct frame once, and `ds.decompressor()` (`WindowDecompress`) decodes them
once where it runs, normalization folded in, into `input_fields`/`output_fields`; `DecodeAhead(loader,
ds.decompressor(), group=8)` (`dctdata.loaders.decode_ahead`) decodes the distinct frames of `group` batches
in one call per field, the next group queued while this one is consumed, as for samples.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dctdata.errors import DctDataError, FormatError
from dctdata.format.manifest import Manifest, read_manifest
from dctdata.parse import SEED_MAX, is_int, parse_int

TRAJECTORY_INFO = "trajectories"  # pack.source_info key (dctdata.preprocess.sources.well writes it)
WINDOW_OPTIONS = frozenset(
    {
        "n_steps_input",
        "n_steps_output",
        "dt_stride",
        "min_dt_stride",
        "max_dt_stride",
        "full_trajectory_mode",
        "max_rollout_steps",
        "start_output_steps_at_t",
    }
)
NORMALIZATIONS = ("zscore", "rms")
# every keyword of `_Windows._setup`: the window options and how items are made
SETUP_OPTIONS = WINDOW_OPTIONS | {
    "return_grid",
    "normalize_time_grid",
    "boundary_return_type",
    "normalization",
    "min_std",
}


def windows_per_trajectory(steps: int, n_in: int, n_out: int, dt: int) -> int:
    """How many windows of n_in + n_out frames, `dt` apart, fit in a trajectory of `steps` frames."""
    return max(0, steps - (1 + dt * (n_in + n_out - 1)) + 1)


def max_stride_at(start: int, steps: int, n_in: int, n_out: int) -> int:
    """The largest stride a window starting at `start` allows (WellDataset's maximum_stride_for_initial_index)."""
    return max(0, (steps - start - 1) // (n_in + n_out - 1))


def _decode_array(entry: dict[str, Any]) -> np.ndarray:
    import base64
    import zlib

    raw = zlib.decompress(base64.b64decode(entry["zlib_f4"]))
    return np.frombuffer(raw, dtype="<f4").reshape(entry["shape"]).astype(np.float32)


def window_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of `kwargs` that `_Windows._setup` takes (popped), leaving the storage's own."""
    return {k: kwargs.pop(k) for k in list(kwargs) if k in SETUP_OPTIONS}


class _Windows:
    """What both window datasets share: the window options, the window -> (trajectory, start, stride) map,
    the frames' decode and the items (see the module docstring). The storage class reads the frames."""

    manifest: Manifest
    root: str
    decode: str
    epoch: int

    def _setup(
        self,
        *,
        n_steps_input: int = 1,
        n_steps_output: int = 1,
        dt_stride: int | tuple[int, int] | None = None,
        min_dt_stride: int = 1,
        max_dt_stride: int | None = None,
        full_trajectory_mode: bool = False,
        max_rollout_steps: int = 100,
        start_output_steps_at_t: int = -1,
        return_grid: bool = True,
        normalize_time_grid: bool = True,
        boundary_return_type: str | None = "padding",
        normalization: str | None = None,
        min_std: float = 1e-4,
    ) -> None:
        info = (self.manifest.pack.get("source_info") or {}).get(TRAJECTORY_INFO)
        if info is None:
            info = series_info(self.manifest)
        if not isinstance(info, dict) or info.get("layout") != "the_well":
            raise DctDataError(
                f"{self.root}: n_steps_input/n_steps_output/dt_stride: expected a pack of trajectories (packed from "
                "The Well's or PDEBench's HDF5 layout, or a NetCDF/zarr store with --time-dim or --sample-dim TIME). "
                "Got a pack of independent samples"
            )
        self.info = info
        n_in = parse_int(n_steps_input, "n_steps_input", minimum=1)
        n_out = parse_int(n_steps_output, "n_steps_output", minimum=0 if full_trajectory_mode else 1)
        if dt_stride is not None:
            if isinstance(dt_stride, (tuple, list)) and len(dt_stride) == 2:
                min_dt_stride, max_dt_stride = dt_stride
            elif is_int(dt_stride):
                min_dt_stride = max_dt_stride = dt_stride
            else:
                raise TypeError(f"dt_stride: expected an int or a (min, max) pair of ints. Got {dt_stride!r}")
        lo = parse_int(min_dt_stride, "min_dt_stride", minimum=1)
        hi = parse_int(lo if max_dt_stride is None else max_dt_stride, "max_dt_stride", minimum=1)
        if hi < lo:
            raise DctDataError(f"dt_stride: expected min <= max. Got min {lo}, max {hi}")
        if full_trajectory_mode and hi > lo:
            raise DctDataError(
                f"full_trajectory_mode: expected one stride. Got a stride range {lo}..{hi} (a rollout has one dt)"
            )
        if boundary_return_type not in (None, "padding"):
            raise DctDataError(f"boundary_return_type: expected 'padding' or None. Got {boundary_return_type!r}")
        if normalization is not None and normalization not in NORMALIZATIONS:
            raise DctDataError(f"normalization: expected one of {NORMALIZATIONS} or None. Got {normalization!r}")
        self.n_steps_input, self.min_dt_stride, self.max_dt_stride = n_in, lo, hi
        self.full_trajectory_mode = bool(full_trajectory_mode)
        self.start_output_steps_at_t = int(start_output_steps_at_t)
        self.return_grid, self.normalize_time_grid = bool(return_grid), bool(normalize_time_grid)
        self.boundary_return_type = boundary_return_type
        self.normalization, self.min_std = normalization, float(min_std)
        self.trajectories = [tuple(int(v) for v in t) for t in info["trajectories"]]  # (file, traj, steps)
        self.offsets = np.asarray(info["offsets"], dtype=np.int64)
        steps = np.array([s for _, _, s in self.trajectories], dtype=np.int64)
        if self.full_trajectory_mode:
            lowest = int(steps.min())
            n_out = (lowest - max(n_in * lo, self.start_output_steps_at_t)) // lo
            if n_out <= 0:
                raise DctDataError(
                    f"{self.root}: full_trajectory_mode: expected trajectories longer than the input steps. Got "
                    f"{lowest} steps for {n_in} input steps at stride {lo}"
                )
            per = np.ones(len(steps), dtype=np.int64)
        else:
            per = np.array([windows_per_trajectory(int(s), n_in, n_out, lo) for s in steps], dtype=np.int64)
            if (per == 0).any():
                k = int(np.argmin(per))
                raise DctDataError(
                    f"{self.root}: trajectory {k} ({self._where(k)}): expected at least {1 + lo * (n_in + n_out - 1)} "
                    f"steps for {n_in} input and {n_out} output steps at stride {lo}. Got {int(steps[k])}"
                )
        self.n_steps_output = n_out
        self.output_steps = min(n_out, int(max_rollout_steps))
        self.windows_per_trajectory = per
        self.first = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
        self._fields = info["fields"]
        self._scalars = info["scalars"]
        self._constants: dict[int, dict[str, torch.Tensor]] = {}
        self._layers: dict[str, torch.nn.Module] = {}
        self._norm = self._norm_of([f["stored"] for f in self._fields]) if normalization else None

    # windows --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._total()

    def _total(self) -> int:
        """Windows of the pack (a webdataset rank's `len()` is its share)."""
        return int(self.first[-1])

    def _where(self, k: int) -> str:
        i, j, _ = self.trajectories[k]
        return f"file {self.info['files'][i]['name']} trajectory {j}"

    def locate(self, index: int) -> tuple[int, int, int]:
        """(trajectory number, first step, stride) of window `index`."""
        if isinstance(index, torch.Tensor) and index.ndim == 0:
            index = index.item()
        if not is_int(index):
            raise TypeError(f"index: expected an int. Got {type(index).__name__}")
        n = self._total()
        j = int(index) + n if index < 0 else int(index)
        if not 0 <= j < n:
            raise IndexError(f"window {index} out of range for a dataset of {n} windows")
        k = int(np.searchsorted(self.first, j, side="right") - 1)
        start = j - int(self.first[k])
        steps = self.trajectories[k][2]
        dt = self.min_dt_stride
        if self.max_dt_stride > self.min_dt_stride:
            top = min(max_stride_at(start, steps, self.n_steps_input, self.n_steps_output), self.max_dt_stride)
            if top > dt:
                rng = np.random.default_rng([self.seed, self.epoch, j])
                dt = int(rng.integers(self.min_dt_stride, top + 1))
        if self.full_trajectory_mode and self.start_output_steps_at_t >= 0:
            start = self.start_output_steps_at_t - self.n_steps_input * dt
        return k, start, dt

    def frame_indices(self, index: int) -> np.ndarray:
        """The pack's frame numbers of window `index`, inputs then outputs."""
        k, start, dt = self.locate(index)
        steps = start + dt * np.arange(self.n_steps_input + self.output_steps)
        return self.offsets[k] + steps

    def first_frames(self) -> np.ndarray:
        """The first frame of every window, in window order (nondecreasing: windows are numbered trajectory
        after trajectory, start step after start step); it does not depend on the drawn strides."""
        j = np.arange(self._total(), dtype=np.int64)
        k = np.searchsorted(self.first, j, side="right") - 1
        start = j - self.first[k]
        if self.full_trajectory_mode and self.start_output_steps_at_t >= 0:
            start = np.full_like(start, self.start_output_steps_at_t - self.n_steps_input * self.min_dt_stride)
        return self.offsets[k] + start

    # frames and items -------------------------------------------------------------------------------
    def _layer(self, name: str) -> torch.nn.Module:
        if name not in self._layers:
            self._layers[name] = self.field_decompressor(name)
        return self._layers[name]

    def field_decompressor(self, name: str) -> torch.nn.Module:
        """The `Decompress` layer of one stored field of the frames."""
        raise NotImplementedError

    def _decode(self, samples: list[dict[str, Any]]) -> tuple[Any, np.ndarray | None]:
        """Read frames (one dict of stored values each) decoded and normalized once, channels last (n,
        *spatial, F), and their time-varying scalars (n, S) or None. numpy from here on: the gathers are many
        small copies, which torch's intra-op threads only slow down on a busy CPU. With decode="device" the
        frames stay stored: a list of {field: StoredSample} per frame, which `WindowFrames` carries."""
        from dctdata.loaders.zarr_dataset import _stack

        scalars = None
        if self._scalars:
            scalars = np.stack(
                [np.asarray([np.asarray(s[e["stored"]]) for s in samples], np.float32) for e in self._scalars], -1
            )
        if self.decode == "device":
            return [{f["stored"]: s[f["stored"]] for f in self._fields} for s in samples], scalars
        parts = []
        with torch.no_grad():
            for f in self._fields:
                value = _stack([s[f["stored"]] for s in samples])
                spec = self.manifest.field(f["stored"])
                parts.append(self._layer(f["stored"])(value).float() if spec.coded else torch.as_tensor(value).float())
            n_spatial = len(self.info["spatial_dims"])
            parts = [p.unsqueeze(1) if p.ndim == 1 + n_spatial else p for p in parts]  # a field without channels
            x = torch.cat(parts, dim=1)  # (n, F, *spatial)
            if self._norm is not None:
                shift, scale = self._norm
                x = (x - shift) / scale
        return np.ascontiguousarray(np.moveaxis(x.numpy(), 1, -1)), scalars

    def _item(self, fields: Any, scalars: np.ndarray | None, loc: tuple[int, int, int], rows: np.ndarray, frames=None):
        """Window `loc`'s item from decoded frames `fields` (rows `rows` of them) or, with decode="device",
        from the stored frames `fields` (a list, rows `rows`; `frames`: their frame numbers)."""
        from dctdata.loaders.window_decode import WindowFrames

        k, start, dt = loc
        n_in, n = self.n_steps_input, self.n_steps_input + self.output_steps
        const = self._constant(k)  # normalized there
        if self.decode == "device":
            item: dict[str, Any] = {"frames": WindowFrames(tuple(int(f) for f in frames), [fields[r] for r in rows])}
        else:
            x = torch.from_numpy(fields[rows])  # (T, *spatial, F): channels last, as WellDataset
            item = {"input_fields": x[:n_in], "output_fields": x[n_in:]}
        item["constant_fields"] = const["fields"]
        if scalars is not None:
            s = torch.from_numpy(scalars[rows])
            item["input_scalars"], item["output_scalars"] = s[:n_in], s[n_in:]
        item["constant_scalars"] = const["scalars"]
        if self.boundary_return_type is not None:
            item["boundary_conditions"] = const["bcs"]
        if self.return_grid:
            item["space_grid"] = const["grid"]
            t = const["time"][start : start + n * dt : dt]
            if self.normalize_time_grid:
                t = t - t.min()
            item["input_time_grid"], item["output_time_grid"] = t[:n_in], t[n_in:]
        return {key: v for key, v in item.items() if not isinstance(v, torch.Tensor) or v.numel() > 0}

    def decompressor(self, field: str | None = None, **kwargs: Any) -> torch.nn.Module:
        """With decode="device": the module that turns a loader batch's stored frames into WellDataset's
        `input_fields`/`output_fields` on the device the module is on (`WindowDecompress`: each distinct
        frame of the batch decoded once, normalization folded in). With a field name: that stored field's
        `Decompress` layer."""
        if field is not None:
            return self.field_decompressor(field)
        from dctdata.loaders.window_decode import WindowDecompress

        n_spatial = len(self.info["spatial_dims"])
        layers = {
            f["stored"]: self.field_decompressor(f["stored"]) if self.manifest.field(f["stored"]).coded else None
            for f in self._fields
        }
        return WindowDecompress(layers, self.n_steps_input, n_spatial, self._norm)

    def _constant(self, k: int) -> dict[str, torch.Tensor]:
        """What a trajectory's windows share (cached): its constant fields (x, y, Fc), constant scalars,
        boundary codes, grid and time values."""
        if k in self._constants:
            return self._constants[k]
        i, j, _ = self.trajectories[k]
        entry = self.info["files"][i]
        try:
            parts = []
            for f in self.info["constant_fields"]:
                value = entry["constant_fields"][f["name"]]
                parts.append(_decode_array(value[j] if isinstance(value, list) else value))
            if parts:
                stacked = torch.from_numpy(np.concatenate(parts))
                if self._norm is not None:
                    shift, scale = self._norm_of([f["name"] for f in self.info["constant_fields"]])
                    stacked = (stacked - shift) / scale
                fields = stacked.movedim(0, -1).contiguous()
            else:
                fields = torch.zeros(0)
            scalars = []
            for name in self.info["constant_scalars"]:
                value = np.asarray(entry["constant_scalars"][name], dtype=np.float32)
                scalars.append(value[j] if value.ndim else value)
            time = np.asarray(entry["time"], dtype=np.float32)
            time = time[j] if time.ndim == 2 else time
            axes = [torch.tensor(self.info["grid"][d], dtype=torch.float32) for d in self.info["spatial_dims"]]
            out = {
                "fields": fields,
                "scalars": torch.tensor(np.array(scalars, dtype=np.float32).reshape(-1)),
                "bcs": torch.tensor(entry["boundary_conditions"]["padding"], dtype=torch.float32),
                "grid": torch.stack(torch.meshgrid(*axes, indexing="ij"), -1),
                "time": torch.from_numpy(time),
            }
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise FormatError(
                f"{self.root}: pack.source_info.trajectories: expected the constants of {self._where(k)}. Got {exc!r}"
            ) from exc
        self._constants[k] = out
        return out

    def _norm_of(self, names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(shift, scale) of the channels of fields `names`, (F, 1, ..., 1): WellDataset's z-score
        ((x - mean) / max(std, min_std)) or RMS (x / max(rms, min_std)) from the pack's statistics."""
        stats = self.info.get("stats") or {}
        shift, scale = [], []
        for name in names:
            s = stats.get(name)
            if s is None:
                raise FormatError(f"{self.root}: normalization: expected statistics of field {name!r}. Got none")
            if self.normalization == "zscore":
                shift += s["mean"]
                scale += s["std"]
            else:
                shift += [0.0] * len(s["rms"])
                scale += s["rms"]
        view = (-1,) + (1,) * len(self.info["spatial_dims"])
        shift_t = torch.tensor(shift, dtype=torch.float32).view(view)
        scale_t = torch.tensor(scale, dtype=torch.float32).clamp_min(self.min_std).view(view)
        return shift_t, scale_t

    @property
    def field_names(self) -> list[str]:
        """The channels of `input_fields`/`output_fields`, in order (WellDataset's flattened names)."""
        return [c for f in self._fields for c in f["channels"]]

    @property
    def constant_field_names(self) -> list[str]:
        return [c for f in self.info["constant_fields"] for c in f["channels"]]

    @property
    def stats(self) -> dict[str, dict[str, Any]]:
        """The pack's statistics in The Well's stats.yaml form: {"mean": {field: value}, "std": ..., "rms":
        ..., "mean_delta": ..., "std_delta": ..., "rms_delta": ...}; a value is a number for a scalar
        field, a list of its components for a vector or tensor field."""
        out: dict[str, dict[str, Any]] = {}
        stored = [(f, f["stored"]) for f in self._fields] + [(f, f["name"]) for f in self.info["constant_fields"]]
        for f, name in stored:
            for key, values in (self.info.get("stats") or {}).get(name, {}).items():
                out.setdefault(key, {})[f["name"]] = values[0] if f["order"] == 0 else list(values)
        return out

    def close(self) -> None:
        """Nothing to close by default (the storage class closes its readers)."""


class WindowDataset(_Windows, torch.utils.data.Dataset):
    """Windows over a zarr pack of trajectories (see the module docstring): map-style, frames read at
    random by `DCTZarrDataset`."""

    def __init__(
        self,
        path_or_url: str | os.PathLike,
        *,
        seed: int = 0,
        storage_options: dict[str, Any] | None = None,
        manifest: Manifest | None = None,
        **kwargs: Any,
    ) -> None:
        from dctdata.decoder.wire import parse_decode
        from dctdata.loaders.zarr_dataset import DCTZarrDataset

        options = window_options(kwargs)
        if kwargs.get("on_error", "raise") != "raise":
            raise DctDataError(
                f"on_error={kwargs['on_error']!r}: expected 'raise' for windows (a window needs all its frames)"
            )
        self.decode = parse_decode(kwargs.get("decode", "cpu"))
        self.manifest = (
            manifest if manifest is not None else read_manifest(path_or_url, storage_options=storage_options)
        )
        self.frames = DCTZarrDataset(
            path_or_url, as_dict=True, storage_options=storage_options, manifest=self.manifest, **kwargs
        )
        self.root = self.frames.root
        self.seed = parse_int(seed, "seed", minimum=0, maximum=SEED_MAX)
        self.epoch = 0
        self._setup(**options)

    @property
    def fingerprint(self) -> str:
        return self.frames.fingerprint

    def set_epoch(self, epoch: int) -> None:
        """The epoch a stride range's draws depend on (`make_loader`'s `set_epoch` calls it)."""
        self.epoch = parse_int(epoch, "set_epoch: epoch", minimum=0, maximum=SEED_MAX)

    def field_decompressor(self, name: str) -> torch.nn.Module:
        return self.frames.decompressor(name)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        where = [(self.locate(i), self.frame_indices(i)) for i in indices]
        wanted = sorted({int(f) for _, frames in where for f in frames})
        samples = self.frames.__getitems__(wanted)
        if len(samples) != len(wanted):
            raise DctDataError(f"{self.root}: expected {len(wanted)} frames. Got {len(samples)} (frames skipped)")
        fields, scalars = self._decode(samples)
        row = {f: r for r, f in enumerate(wanted)}
        return [
            self._item(fields, scalars, loc, np.array([row[int(f)] for f in frames]), frames) for loc, frames in where
        ]

    def close(self) -> None:
        self.frames.close()

    def __repr__(self) -> str:
        return (
            f"WindowDataset({self.root!r}, windows={len(self)}, n_steps_input={self.n_steps_input}, "
            f"n_steps_output={self.n_steps_output}, dt_stride={self.min_dt_stride}"
            + (f"..{self.max_dt_stride}" if self.max_dt_stride > self.min_dt_stride else "")
            + ")"
        )


def series_info(manifest: Manifest) -> dict[str, Any] | None:
    """The trajectory record of a NetCDF/zarr store packed along its time dim (`--sample-dim time`): one
    trajectory of every sample, the dct fields as its time-varying fields (all of one spatial shape), time
    values in seconds from the first (numbers as they are), the grid from the per-sample coordinates
    (indices where there are none), open boundaries, no constants and no statistics. None for any other
    pack."""
    from dctdata.format.coords import decode_coord
    from dctdata.format.fields import user_fields

    source = manifest.pack.get("source_info") or {}
    dim = source.get("sample_dim") if isinstance(source, dict) else None
    fields = [f for f in user_fields(manifest.fields) if f.coded]
    if dim is None or not fields:
        return None
    spatial = {tuple(f.shape[-f.codec.dims :]) for f in fields}
    if len(spatial) != 1:
        return None
    shape = list(spatial.pop())
    names = list(fields[0].attrs.get("dims") or [])[-len(shape) :]
    if len(names) != len(shape):
        names = [f"dim_{k}" for k in range(len(shape))]
    coords = manifest.coords
    grid = {}
    for d, n in zip(names, shape):
        entry = coords.get(d)
        values = decode_coord(entry) if entry is not None and not entry.get("sample") else None
        ok = values is not None and values.shape == (n,) and values.dtype.kind in "fiu"
        grid[d] = values.astype(np.float64).tolist() if ok else list(range(n))
    time = list(range(manifest.samples))
    for entry in coords.values():
        if entry.get("sample") and entry.get("dim") == dim:
            values = decode_coord(entry)
            if values.dtype.kind == "M":
                time = ((values - values[0]) / np.timedelta64(1, "s")).astype(np.float64).tolist()
            elif values.dtype.kind in "fiu":
                time = values.astype(np.float64).tolist()
            break
    return {
        "layout": "the_well",
        "source_layout": f"series along {dim}",
        "spatial_dims": names,
        "spatial_resolution": shape,
        "grid": grid,
        "fields": [
            {"name": f.name, "stored": f.name, "order": 0, "channels": _channels(f, len(shape))} for f in fields
        ],
        "scalars": [],
        "constant_fields": [],
        "constant_scalars": [],
        "files": [
            {
                "name": str(manifest.pack.get("source", "")),
                "time": time,
                "constant_fields": {},
                "constant_scalars": {},
                "boundary_conditions": {"groups": {}, "padding": [[1.0, 1.0]] * len(shape)},
            }
        ],
        "trajectories": [[0, 0, manifest.samples]],
        "offsets": [0, manifest.samples],
        "stats": {},
    }


def _channels(f: Any, n_spatial: int) -> list[str]:
    """A field's channel names: the stacked variables' names it records, else name or name_0, name_1, ..."""
    named = f.attrs.get("channels")
    if isinstance(named, list) and all(isinstance(c, str) for c in named):
        return list(named)
    c = 1 if len(f.shape) == n_spatial else int(f.shape[0])
    return [f.name] if c == 1 else [f"{f.name}_{k}" for k in range(c)]


def open_windows(path_or_url, manifest: Manifest, shards: Any, **kwargs: Any) -> WindowDataset:
    """`dctdata.open_dataset` with window options on a zarr pack (a webdataset pack's windows:
    `dctdata.loaders.wds_windows.open_web_windows`)."""
    if shards is not None:
        raise DctDataError(
            f"{path_or_url}: a list of shard files: expected a webdataset pack (tar shards). Got a "
            f"{manifest.storage} pack, which is opened by its directory or URL"
        )
    return WindowDataset(path_or_url, manifest=manifest, **kwargs)


__all__ = [
    "SETUP_OPTIONS",
    "WINDOW_OPTIONS",
    "WindowDataset",
    "max_stride_at",
    "open_windows",
    "window_options",
    "windows_per_trajectory",
]
