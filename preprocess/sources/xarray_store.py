"""NetCDF files and zarr stores through xarray (local paths and fsspec URLs), or an `xarray.Dataset`
passed from Python: where climate, weather, ocean and much simulation data lives (ERA5,
WeatherBench, CMIP).

- `sample_dim` (`--sample-dim time`) is the axis that becomes samples. Default: the first dimension
  of the chosen variables when they all share it (else an error asking for it).
- `variables` (`--variables t2m,u10,v10`) picks data variables (default: every data variable along
  the sample dimension). Each variable is one field, named after it; per-sample dims are the
  variable's other dims in their stored order, the last two being H and W ((lat, lon) -> (H, W);
  (level, lat, lon) -> channels of levels).
- `stack` (`--stack NAME`): the variables become the channels of one field NAME instead, in the order
  given (they must have the same per-sample dims and sizes). Stack when a network takes them as
  channels of one input; keep them as fields when they differ in shape or need their own targets.
- Volumes (`--dims 3`): the last three dims of a variable are D, H and W ((level, lat, lon), (depth, y,
  x)), so a variable of three per-sample dims is one (1, D, H, W) volume and `stack` makes (V, D, H, W).
- Lazy: a path or URL is opened with xarray's lazy indexing, and each pack batch (16 MiB of source
  values) reads only its slice of the sample axis, i.e. the store chunks that slice touches (a store
  chunked along the sample axis in big blocks costs one such block). An `xarray.Dataset` passed from
  Python is used as it is (dask-backed or not). Why not dask for paths: zarr-python already reads the
  chunks of a slice concurrently, and opening with dask (`chunks={}`) took more memory and time for
  the same pack (docs/benchmarks/design.md). A pack's memory is constant in the store size (one read
  batch, one zarr shard of coefficients being written, zarr's buffers), checked by a test that packs a
  512 MiB store.
- Metadata goes into the manifest: the 1-D coordinates of the sample dim (e.g. the time of every
  sample) and of the per-sample dims (lat, lon, level) as `coords`; each field's variable attributes
  (units, long_name, ...) and source dim names as its `attrs`.
- `time_dim` (`--time-dim time`): the variables are trajectories along that dimension, packed as The
  Well's files are (`sources.well`): every frame of every trajectory once, so `dctdata.open_dataset(pack,
  n_steps_input=..., n_steps_output=...)` serves time windows over them. The dims before it in a variable
  are the trajectory dims (an ensemble `member`, a simulation `sample`: their combinations are the
  trajectories, in C order), the dims after it the frame's; a variable with no dims before it is one
  trajectory. The manifest keeps the trajectory record (`pack.source_info["trajectories"]`): the time
  values (seconds from the first for datetimes), the grid from the frame dims' coordinates, open
  boundaries, and per-field statistics as The Well's source records them (mean, std, RMS of every channel
  and of the differences between consecutive frames of a trajectory; NaNs left out), so
  `open_dataset(..., normalization="zscore" | "rms")` works. They cost one more pass over the store when the
  manifest is written (one trajectory's frames, a read batch at a time): the pack's encoders run in
  workers that see only their part, and a mean and std over every frame need them all.
- Missing values: xarray decodes `_FillValue`/`missing_value` to NaN, so `--nan mask` stores the
  validity mask (ocean-only SST, swath edges).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.format.coords import encode_coord
from dctdata.format.location import is_url
from dctdata.preprocess.sources.base import Source, field_name, trajectory_stats

log = logging.getLogger(__name__)

NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf")
_ZARR_MARKERS = ("zarr.json", ".zgroup", ".zmetadata", ".zarray")
STATS_BATCH_BYTES = (
    16 << 20
)  # float64 values per read of the statistics pass (the pack's read batch, parts.BATCH_BYTES)


def is_xarray_path(path: str) -> bool:
    """A NetCDF file or a zarr store (a `.zarr` name, or a directory with zarr metadata that is not a
    dctdata pack)."""
    p = path.rstrip("/")
    if p.lower().endswith(NETCDF_SUFFIXES) or p.lower().endswith(".zarr"):
        return True
    if is_url(p) or not os.path.isdir(p):
        return False
    names = set(os.listdir(p))
    return bool(names & set(_ZARR_MARKERS)) and "manifest.json" not in names


def is_xarray_object(obj: object) -> bool:
    mod = type(obj).__module__
    return mod.startswith("xarray") and type(obj).__name__ in ("Dataset", "DataArray")


def _import_xarray():
    try:
        import xarray
    except ImportError as exc:
        raise DctDataError(
            f"xarray source: expected xarray to be installed (pip install 'dctdata[xarray]'). Got {exc}"
        ) from exc
    return xarray


def open_xarray(source: Any) -> tuple[Any, str]:
    """(xarray.Dataset opened lazily, description) from a path, URL or xarray object."""
    xr = _import_xarray()
    if is_xarray_object(source):
        ds = source.to_dataset() if type(source).__name__ == "DataArray" else source
        return ds, f"<xarray.Dataset {dict(ds.sizes)}>"
    s = os.fspath(source)
    zarr_like = s.rstrip("/").lower().endswith(".zarr") or (not is_url(s) and os.path.isdir(s))
    if not is_url(s) and not os.path.exists(s):
        raise DctDataError(f"{s}: expected an existing NetCDF file or zarr store. Got no such path")
    try:
        if zarr_like:
            with warnings.catch_warnings():  # a store without consolidated metadata is fine, only slower to open
                warnings.filterwarnings("ignore", message="Failed to open Zarr store with consolidated metadata")
                return xr.open_zarr(s, chunks=None), s
        if is_url(s):
            import fsspec

            return xr.open_dataset(fsspec.open(s, "rb").open(), engine="h5netcdf", chunks=None), s
        return xr.open_dataset(s, chunks=None), s
    except DctDataError:
        raise
    except Exception as exc:  # netCDF4/h5netcdf/zarr raise many types for unreadable stores
        what = "zarr store" if zarr_like else "NetCDF file"
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DctDataError(f"{s}: expected a readable {what}. Got {type(exc).__name__}: {first}") from exc


def _split(value: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    if value is None:
        return None
    parts = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(p, str) for p in parts):
        raise TypeError(f"variables: expected names (a string 'a,b' or a list of strings). Got {value!r}")
    names = [n.strip() for p in parts for n in p.split(",") if n.strip()]
    if not names:
        raise DctDataError(f"--variables: expected one or more variable names. Got {value!r}")
    return names


def _jsonable(v: Any) -> Any:
    """A variable attribute as JSON (numpy scalars/arrays to numbers/lists, bytes to text); None drops it."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        v = v.tolist()
    elif isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, list):
        out = [_jsonable(x) for x in v]
        return None if any(x is None for x in out) else out
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return None


def clean_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in attrs.items():
        j = _jsonable(v)
        if j is not None:
            out[str(k)] = j
    return out


class XarraySource(Source):
    """Samples along `sample_dim` of chosen variables of an xarray Dataset (see the module docstring)."""

    def __init__(
        self,
        source: Any,
        sample_dim: str | None = None,
        variables: str | list[str] | None = None,
        stack: str | None = None,
        dims: int = 2,
        time_dim: str | None = None,
    ) -> None:
        ds, self.description = open_xarray(source)
        self.dims = dims
        names = _split(variables)
        data_vars = list(ds.data_vars)
        if names is not None:
            missing = [v for v in names if v not in ds.data_vars]
            if missing:
                raise DctDataError(
                    f"{self.description}: --variables {missing[0]!r}: expected one of the data variables {data_vars}. "
                    "Got no such variable"
                )
        dims = list(ds.dims)
        if sample_dim is not None and sample_dim not in ds.dims:
            raise DctDataError(
                f"{self.description}: --sample-dim {sample_dim!r}: expected one of the dimensions {dims}. Got no such "
                "dimension"
            )
        if time_dim is not None:
            sample_dim = self._time_dim(ds, time_dim, sample_dim)
        if sample_dim is None:
            chosen = names or data_vars
            firsts = {ds[v].dims[0] for v in chosen if ds[v].dims}
            if len(firsts) != 1:
                raise DctDataError(
                    f"{self.description}: expected --sample-dim (the variables do not share a first dimension: "
                    f"{sorted(firsts)}). Got none"
                )
            sample_dim = firsts.pop()
        if names is None:
            names = [v for v in data_vars if sample_dim in ds[v].dims]
            skipped = [v for v in data_vars if v not in names]
            if skipped:
                log.info("%s: variables without dimension %r are not packed: %s", self.description, sample_dim, skipped)
            if not names:
                raise DctDataError(
                    f"{self.description}: expected data variables along --sample-dim {sample_dim!r}. Got none "
                    f"(variables: {data_vars})"
                )
        flag = "--time-dim" if time_dim is not None else "--sample-dim"
        for v in names:
            if sample_dim not in ds[v].dims:
                raise DctDataError(
                    f"{self.description}: variable {v!r}: expected dimension {sample_dim!r} ({flag}). Got dims "
                    f"{list(ds[v].dims)}"
                )
        self.ds = ds[names]
        self.sample_dim, self.variables, self.stack = sample_dim, names, stack
        self.time_dim = time_dim
        self.traj_dims: tuple[str, ...] = () if time_dim is None else self._trajectory_dims(ds, names, time_dim)
        self.n_steps = int(ds.sizes[sample_dim])
        self.traj_shape = tuple(int(ds.sizes[d]) for d in self.traj_dims)
        self.n = self.n_steps * math.prod(self.traj_shape)
        skip = {sample_dim, *self.traj_dims}
        per = {v: tuple(d for d in ds[v].dims if d not in skip) for v in names}
        if stack is not None:
            if not isinstance(stack, str) or not stack:
                raise DctDataError(f"--stack: expected a field name. Got {stack!r}")
            shapes = {v: (per[v], tuple(ds.sizes[d] for d in per[v])) for v in names}
            if len(set(shapes.values())) > 1:
                desc = ", ".join(f"{v} {dims} {size}" for v, (dims, size) in shapes.items())
                raise DctDataError(
                    f"{self.description}: --stack {stack}: expected variables with the same per-sample dims and sizes. "
                    f"Got {desc} (pack them as separate fields without --stack)"
                )
            if self.dims == 3 and len(per[names[0]]) != 3:
                raise DctDataError(
                    f"{self.description}: --stack {stack} --dims 3: expected variables of 3 per-sample dims (D, H, W). "
                    f"Got {per[names[0]]}"
                )
            if len(per[names[0]]) not in (2, 3):
                raise DctDataError(
                    f"{self.description}: --stack {stack}: expected variables of 2 or 3 per-sample dims ((H, W) or "
                    f"(C, H, W)). Got {per[names[0]]}"
                )
            self.fields = {field_name(stack): names}
        else:
            self.fields = {field_name(v): [v] for v in names}
        self.field_attrs = {}
        for name, vs in self.fields.items():
            dims = list(per[vs[0]])
            if stack is None:
                self.field_attrs[name] = {**clean_attrs(ds[vs[0]].attrs), "variable": vs[0], "dims": dims}
            elif self.dims == 3:  # volumes: a variable is a channel
                self.field_attrs[name] = {
                    "dims": ["variable", *dims],
                    "channels": vs,
                    "variables": {v: clean_attrs(ds[v].attrs) for v in vs},
                }
            else:
                levels = ds.sizes[dims[0]] if len(dims) == 3 else None
                self.field_attrs[name] = {
                    "dims": (["variable"] if levels is None else ["variable*" + dims[0]]) + dims[-2:],
                    "channels": vs if levels is None else [f"{v}[{i}]" for v in vs for i in range(levels)],
                    "variables": {v: clean_attrs(ds[v].attrs) for v in vs},
                }
        self.coords = self._coords(ds, names, per)
        self._labels = np.asarray(ds[sample_dim].values) if sample_dim in ds.coords else None
        self._record = self._info(ds, per)  # checked now; the statistics wait for `info` (a pass over the store)
        self._stats_done = time_dim is None

    @property
    def info(self) -> dict[str, Any]:  # type: ignore[override]
        """What the manifest keeps (`pack.source_info`); with `--time-dim` the statistics are computed on the
        first access (when the manifest is written)."""
        if not self._stats_done:
            from dctdata.preprocess.sources.well import TRAJECTORY_INFO

            self._record[TRAJECTORY_INFO]["stats"] = self._stats()
            self._stats_done = True
        return self._record

    def _info(self, ds, per: dict[str, tuple[str, ...]]) -> dict[str, Any]:
        """What the manifest keeps of the source (`pack.source_info`): with `--time-dim` the trajectory record."""
        stack = {"stack": self.stack} if self.stack else {}
        if self.time_dim is None:
            return {"sample_dim": self.sample_dim, "variables": self.variables, **stack}
        return {"time_dim": self.time_dim, "variables": self.variables, **stack, **trajectory_record(self, ds, per)}

    def _time_dim(self, ds, time_dim: str, sample_dim: str | None) -> str:
        """`--time-dim`, checked: a dimension of the store, and not given with `--sample-dim`."""
        if sample_dim is not None:
            raise DctDataError(
                f"{self.description}: --time-dim {time_dim!r} and --sample-dim {sample_dim!r}: expected one of them "
                "(--time-dim packs trajectories along time, --sample-dim independent samples). Got both"
            )
        if not isinstance(time_dim, str) or time_dim not in ds.dims:
            raise DctDataError(
                f"{self.description}: --time-dim {time_dim!r}: expected one of the dimensions {list(ds.dims)}. Got no "
                "such dimension"
            )
        return time_dim

    def _trajectory_dims(self, ds, names: list[str], time_dim: str) -> tuple[str, ...]:
        """The dims before `time_dim`, the same in every variable."""
        leads = {v: tuple(ds[v].dims[: ds[v].dims.index(time_dim)]) for v in names}
        if len(set(leads.values())) > 1:
            desc = ", ".join(f"{v} {list(d)}" for v, d in leads.items())
            raise DctDataError(
                f"{self.description}: --time-dim {time_dim!r}: expected the same trajectory dims (those before "
                f"{time_dim!r}) in every variable. Got {desc} (pick variables with --variables)"
            )
        return leads[names[0]]

    def _coords(self, ds, names: list[str], per: dict[str, tuple[str, ...]]) -> dict[str, Any]:
        """1-D coordinates along the sample dim and the per-sample dims of the packed variables."""
        wanted = ([] if self.time_dim is not None else [self.sample_dim]) + sorted({d for v in names for d in per[v]})
        out = {}
        for name, c in ds.coords.items():
            if c.ndim == 1 and c.dims[0] in wanted:
                out[str(name)] = encode_coord(
                    c.values, str(c.dims[0]), c.dims[0] == self.sample_dim, clean_attrs(c.attrs)
                )
        return out

    def __len__(self) -> int:
        return self.n

    def where(self, index: int) -> str:
        if self.time_dim is not None and 0 <= index < self.n:
            at, t = self._at(index)
            label = self._labels[t] if self._labels is not None else t
            traj = ", ".join(f"{d}={i}" for d, i in at.items())
            return f"{self.description} frame {index} ({traj + ', ' if traj else ''}{self.time_dim}={label})"
        label = self._labels[index] if self._labels is not None and 0 <= index < self.n else index
        return f"{self.description} sample {index} ({self.sample_dim}={label})"

    def _at(self, frame: int) -> tuple[dict[str, int], int]:
        """({trajectory dim: index}, time step) of a frame (time_dim)."""
        k, t = divmod(frame, self.n_steps)
        at = np.unravel_index(k, self.traj_shape) if self.traj_shape else ()
        return {d: int(i) for d, i in zip(self.traj_dims, at)}, t

    def read_batch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        if self.time_dim is None:
            return self._read(start, stop, {})
        runs, at = [], start
        while at < stop:  # one read per trajectory the frames [start, stop) touch
            where, t = self._at(at)
            end = min(stop - at, self.n_steps - t) + t
            runs.append(self._read(t, end, where))
            at += end - t
        return {k: np.concatenate([r[k] for r in runs]) for k in runs[0]}

    def _read(self, start: int, stop: int, where: dict[str, int]) -> dict[str, np.ndarray]:
        """Steps [start, stop) along the sample (time) dim, at trajectory `where` ({dim: index})."""
        part = self.ds.isel({**where, self.sample_dim: slice(start, stop)})
        try:
            part = part.transpose(self.sample_dim, ...).compute()  # reads this slice of every variable
        except Exception as exc:  # backends raise many types for unreadable chunks
            first = (str(exc).strip().splitlines() or [""])[0]
            raise DctDataError(
                f"{self.where(start)}..{stop - 1}: expected readable values. Got {type(exc).__name__}: {first}"
            ) from exc
        out = {}
        for name, vs in self.fields.items():
            arrays = [np.asarray(part[v].values) for v in vs]
            if self.stack is None:
                out[name] = arrays[0]
            else:
                arrays = [a[:, None] if a.ndim == 3 or self.dims == 3 else a for a in arrays]
                out[name] = np.concatenate(arrays, axis=1)
        return out

    def sample(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.read_batch(index, index + 1).items()}

    def _stats(self) -> dict[str, Any]:
        """Per field (and channel): mean, std, RMS of the values and of the differences between consecutive
        frames, over every frame of every trajectory (`sources.well`'s statistics; float64 sums of the finite
        values, a read batch of one trajectory at a time, its last frame kept for the next batch's first
        difference)."""
        shapes = self.probe()
        frame_bytes = sum(math.prod(shape) * 8 for shape, _ in shapes.values())
        step = max(1, STATS_BATCH_BYTES // max(frame_bytes, 1))
        n_spatial = 3 if self.dims == 3 else 2
        sums: dict[str, np.ndarray] = {}
        for k in range(self.n // self.n_steps):
            where, _ = self._at(k * self.n_steps)
            last: dict[str, np.ndarray] = {}
            for t0 in range(0, self.n_steps, step):
                part = self._read(t0, min(t0 + step, self.n_steps), where)
                for name, values in part.items():
                    a = values.astype(np.float64)
                    per = a.shape[1:]
                    c = math.prod(per[:-n_spatial]) if len(per) > n_spatial else 1
                    a = a.reshape(a.shape[0], c, -1)  # (T, C, pixels); a scalar per frame: (T, 1, 1)
                    d = np.diff(np.concatenate([last[name], a]) if name in last else a, axis=0)
                    last[name] = a[-1:]
                    row = np.stack([_finite_sums(a), _finite_sums(d)]).reshape(6, c)
                    sums[name] = sums.get(name, 0) + row
        return trajectory_stats(sums)

    def probe(self):
        if self.n == 0:
            raise DctDataError(f"{self.description}: expected at least one sample along {self.sample_dim!r}. Got 0")
        out = {}
        for name, vs in self.fields.items():
            v = self.ds[vs[0]]
            shape = tuple(v.sizes[d] for d in v.dims if d != self.sample_dim and d not in self.traj_dims)
            if self.stack is not None:
                volume = self.dims == 3
                shape = (len(vs), *shape) if len(shape) == 2 or volume else (len(vs) * shape[0], *shape[1:])
            dtype = np.result_type(*(self.ds[x].dtype for x in vs))
            out[name] = (shape, np.dtype(dtype))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing is best effort
            self.ds.close()


def _finite_sums(a: np.ndarray) -> np.ndarray:
    """(3, C): the count, sum and sum of squares of the finite values of (T, C, pixels) `a`, per channel."""
    ok = np.isfinite(a)
    z = np.where(ok, a, 0.0)
    return np.stack([ok.sum(axis=(0, 2)).astype(np.float64), z.sum(axis=(0, 2)), (z * z).sum(axis=(0, 2))])


def trajectory_record(src: XarraySource, ds: Any, per: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """The manifest's trajectory record (`pack.source_info["trajectories"]`, the form `sources.well` writes and
    the window loader reads) of a store packed along `--time-dim`: one trajectory per combination of the
    trajectory dims, the fields' channels, the grid of the frame dims, the time values, open boundaries."""
    from dctdata.preprocess.sources.well import TRAJECTORY_INFO

    n_spatial = 3 if src.dims == 3 else 2
    fields, scalars, spatial = [], [], set()
    for name, vs in src.fields.items():
        dims = per[vs[0]]
        if not dims:
            scalars.append({"name": name, "stored": name})
            continue
        if len(dims) < n_spatial:
            raise DctDataError(
                f"{src.description}: --time-dim {src.time_dim!r}: variable {vs[0]!r}: expected frames of at least "
                f"{n_spatial} dims after {src.time_dim!r} (or none: a scalar per frame). Got dims {list(dims)}"
            )
        spatial.add(tuple((d, int(ds.sizes[d])) for d in dims[-n_spatial:]))
        attrs = src.field_attrs.get(name, {})
        named = attrs.get("channels")
        if isinstance(named, list):
            channels = list(named)
        else:
            c = math.prod(int(ds.sizes[d]) for d in dims[:-n_spatial]) if len(dims) > n_spatial else 1
            channels = [name] if c == 1 else [f"{name}_{k}" for k in range(c)]
        fields.append({"name": name, "stored": name, "order": 0, "channels": channels})
    if not fields:
        raise DctDataError(
            f"{src.description}: --time-dim {src.time_dim!r}: expected at least one variable of {n_spatial}-D frames. "
            f"Got none (variables: {src.variables})"
        )
    if len(spatial) > 1:
        raise DctDataError(
            f"{src.description}: --time-dim {src.time_dim!r}: expected every variable's frames on one grid (windows "
            f"stack them as channels). Got grids {sorted(spatial)} (pick variables with --variables)"
        )
    grid_dims = spatial.pop()
    grid = {}
    for d, n in grid_dims:
        values = np.asarray(ds[d].values) if d in ds.coords and ds[d].ndim == 1 else None
        ok = values is not None and values.shape == (n,) and values.dtype.kind in "fiu"
        grid[d] = values.astype(np.float64).tolist() if ok else list(range(n))
    time: list[float] = list(range(src.n_steps))
    dim = src.time_dim
    if dim in ds.coords and ds[dim].ndim == 1:
        values = np.asarray(ds[dim].values)
        if values.dtype.kind == "M":
            time = ((values - values[0]) / np.timedelta64(1, "s")).astype(np.float64).tolist()
        elif values.dtype.kind in "fiu":
            time = values.astype(np.float64).tolist()
    n_traj = src.n // src.n_steps
    names = [d for d, _ in grid_dims]
    record = {
        "layout": "the_well",
        "source_layout": f"xarray along {dim}",
        "trajectory_dims": {d: int(ds.sizes[d]) for d in src.traj_dims},
        "spatial_dims": names,
        "spatial_resolution": [n for _, n in grid_dims],
        "grid": grid,
        "fields": fields,
        "scalars": scalars,
        "constant_fields": [],
        "constant_scalars": [],
        "files": [
            {
                "name": os.path.basename(src.description.rstrip("/")) or src.description,
                "time": time,
                "constant_fields": {},
                "constant_scalars": {},
                "boundary_conditions": {"groups": {}, "padding": [[1.0, 1.0]] * len(names)},
            }
        ],
        "trajectories": [[0, j, src.n_steps] for j in range(n_traj)],
        "offsets": [j * src.n_steps for j in range(n_traj + 1)],
        "stats": {},  # filled by `XarraySource.info` (a pass over the store)
    }
    return {TRAJECTORY_INFO: record}
