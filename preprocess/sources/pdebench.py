"""PDEBench's HDF5 layouts as trajectory sources: the frames of every trajectory once, with the same
manifest record as The Well's files (`sources.well`), so `open_dataset(..., n_steps_input=...)` serves
their windows too.

Two layouts (https://github.com/pdebench/PDEBench):
- **per variable** (2-D/3-D CFD): one dataset per variable, (n_samples, n_t, x, y[, z]) (`density`,
  `pressure`, `Vx`, `Vy`, ...), beside `t-coordinate` (n_t or n_t + 1 values), `x-coordinate`,
  `y-coordinate`[, `z-coordinate`]. Each variable is a field of one channel.
- **per sample** (2-D reaction-diffusion, shallow water): groups `0000`, `0001`, ... each with `data`
  (n_t, x, y[, z], c) and `grid/t`, `grid/x`, `grid/y`[, `grid/z`]. `data` is one field of c channels
  (`data_0`, ...); the time values are kept per trajectory.

Recognised by their names (`t-coordinate` and `x-coordinate` datasets; numbered groups with `data` and
`grid`); `--key` still reads any HDF5 file as plain datasets. PDEBench's 1-D sets and its time-less
Darcy flow are not trajectories of 2-D or 3-D frames and stay plain HDF5. There are no boundary
condition records: windows report every boundary as open, constants and scalars are empty.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.base import field_name
from dctdata.preprocess.sources.hdf5 import check_hdf5_inside
from dctdata.preprocess.sources.well import WellSource

AXES = ("x", "y", "z")


def pdebench_layout(path: str) -> str | None:
    """ "variables", "samples" or None (not a PDEBench trajectory file)."""
    import h5py

    try:
        with h5py.File(path, "r") as fh:
            if "t-coordinate" in fh and "x-coordinate" in fh:
                return "variables" if _variables(fh) else None
            first = next(iter(fh), None)
            if first is not None and first.isdigit() and isinstance(fh[first], h5py.Group):
                g = fh[first]
                if "data" in g and "grid" in g and "t" in g["grid"] and g["data"].ndim in (4, 5):
                    return "samples"
    except OSError:
        return None
    return None


def _variables(fh) -> list[str]:
    """The per-variable datasets: (n, n_t, x, y[, z]) arrays of 2-D or 3-D frames."""
    import h5py

    names = [
        k for k, v in fh.items() if isinstance(v, h5py.Dataset) and v.ndim in (4, 5) and not k.endswith("-coordinate")
    ]
    return sorted(names)


class PDEBenchSource(WellSource):
    """The frames of a PDEBench HDF5 file (see the module docstring)."""

    def __init__(self, path: str, layout: str, allow_external: bool = False, dims: int | None = None) -> None:
        self.description = path
        self.path = path
        self.files = [path]
        self.layout = layout
        self._handles: dict[int, Any] = {}
        self._pid = os.getpid()
        self.scalars, self.constant_fields, self.constant_scalars = [], [], []
        try:
            fh = self._file(0)
        except OSError as exc:
            raise DctDataError(f"{path}: expected a readable HDF5 file. Got {exc}") from exc
        if not allow_external:
            check_hdf5_inside(path)
        if layout == "variables":
            names = _variables(fh)
            lead = {fh[n].shape[:2] for n in names}
            spatial = {fh[n].shape[2:] for n in names}
            if len(lead) != 1 or len(spatial) != 1:
                raise DctDataError(
                    f"{path}: expected every variable shaped (n_samples, n_t, x, y[, z]) alike. Got "
                    f"{ {n: fh[n].shape for n in names} }"
                )
            (n_traj, steps), (shape,) = lead.pop(), spatial
            self.fields = [
                {"name": n, "stored": field_name(n), "order": 0, "channels": [n], "dataset": n} for n in names
            ]
            self._keys: list[str] = []
        else:
            self._keys = sorted(k for k in fh if k.isdigit())
            data = fh[self._keys[0]]["data"]
            n_traj, steps, shape = len(self._keys), data.shape[0], data.shape[1:-1]
            c = data.shape[-1]
            channels = ["data"] if c == 1 else [f"data_{k}" for k in range(c)]
            self.fields = [{"name": "data", "stored": "data", "order": 0, "channels": channels}]
            for k in self._keys:
                if fh[k]["data"].shape != data.shape:
                    raise DctDataError(
                        f"{path}[{k}/data]: expected shape {data.shape} like sample {self._keys[0]}. Got "
                        f"{fh[k]['data'].shape}"
                    )
        self.shape = [int(v) for v in shape]
        self.spatial_dims = list(AXES[: len(self.shape)])
        if dims is not None and dims != len(self.shape):
            raise DctDataError(
                f"{path}: --dims {dims}: expected the data's spatial dims. Got {len(self.shape)}-D frames: pack with "
                f"--dims {len(self.shape)} (Python: dims={len(self.shape)})"
            )
        self.trajectories = [(0, j, int(steps)) for j in range(n_traj)]
        self.offsets = np.concatenate([[0], np.cumsum([s for _, _, s in self.trajectories])]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self._info = None
        self.field_attrs = {
            f["stored"]: {"pdebench_variable": f["name"], "channels": f["channels"]} for f in self.fields
        }

    def _field(self, fh, entry: dict[str, Any], traj: int, steps: slice | None) -> np.ndarray:
        if self.layout == "variables":
            return np.asarray(fh[entry["dataset"]][traj, steps], dtype=np.float32)[:, None]
        a = np.asarray(fh[self._keys[traj]]["data"][steps], dtype=np.float32)
        return np.moveaxis(a, -1, 1)

    def _time(self, fh) -> Any:
        steps = self.trajectories[0][2]
        if self.layout == "variables":
            return np.asarray(fh["t-coordinate"][()], dtype=np.float64)[:steps].tolist()
        return [np.asarray(fh[k]["grid"]["t"][()], dtype=np.float64)[:steps].tolist() for k in self._keys]

    def _grid(self, fh, dim: str) -> Any:
        if self.layout == "variables":
            values = np.asarray(fh[f"{dim}-coordinate"][()], dtype=np.float64)
        else:
            values = np.asarray(fh[self._keys[0]]["grid"][dim][()], dtype=np.float64)
        return values.reshape(-1).tolist()

    def _bcs(self, fh) -> dict[str, Any]:
        return {"groups": {}, "padding": np.ones((len(self.spatial_dims), 2)).tolist()}

    @staticmethod
    def _parameters(fh) -> list[str]:
        return [k for k, v in fh.attrs.items() if np.asarray(v).dtype.kind in "fiub" and np.asarray(v).size == 1]

    def _trajectory_info(self) -> dict[str, Any]:
        info = super()._trajectory_info()
        info["layout"] = "the_well"  # the record's form: what the window loader reads
        info["source_layout"] = f"pdebench-{self.layout}"
        info["dataset_name"] = os.path.splitext(os.path.basename(self.path))[0]
        return info
