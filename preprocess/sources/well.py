"""The Well's HDF5 layout as a pack source: one sample per frame of every trajectory, each frame once.

A Well file (https://polymathic-ai.org/the_well) holds `n_trajectories` trajectories of `n_steps` frames:
float32 arrays (n_traj, n_steps, x, y[, z]) in the groups `t0_fields` (scalar fields), `t1_fields`
(vectors: last axis the D components) and `t2_fields` (tensors: last two axes D x D), beside
`dimensions` (the time values and the grid), `scalars`, `boundary_conditions` and the root's
simulation parameters. Each array says whether it varies per trajectory (`sample_varying`), in time
(`time_varying`) and along which spatial axes (`dim_varying`; a False axis is stored with length 1 and
tiled, as `WellDataset` does).

Samples: the frames in the order `WellDataset` walks them: files sorted by path, then trajectories, then
time steps, so frame `f` of the pack is step `t` of trajectory `j` of file `i` with `f = offset[i][j] + t`
(the offsets are in the manifest). Fields of a frame:
- every time-varying field of order k, as (C, x, y[, z]) with C = D**k: its components are named
  channels (`velocity_x`, `velocity_y`; `stress_xy` ...: WellDataset's flattened names, in its order);
- every time-varying scalar, one number per frame.
Kept once in the manifest (`pack.source_info["trajectories"]`, `TRAJECTORY_INFO`): the files, the
trajectories and their frame offsets, the channel names, the constant fields (per trajectory when they
vary per trajectory; zlib-compressed float32, base64), the constant scalars, the time values, the grid,
the boundary conditions (each group's attributes and WellDataset's (n_dims, 2) padding code) and the
simulation parameters; and per-field statistics (mean, std, RMS of every channel, and the same of the
differences between consecutive frames of a trajectory), computed in one pass over the files when the
manifest is written.

Constant fields sit in the manifest, which a reader loads whole: fine for the Well's per-trajectory
coefficient maps at its resolutions (a few per trajectory), refused by the manifest's size limit past it.
"""

from __future__ import annotations

import base64
import glob
import itertools
import logging
import os
import zlib
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.base import Source, field_name, trajectory_stats
from dctdata.preprocess.sources.hdf5 import check_hdf5_inside

log = logging.getLogger(__name__)

TRAJECTORY_INFO = "trajectories"  # the key in pack.source_info
WELL_SUFFIXES = (".h5", ".hdf5")
ORDER_GROUPS = ("t0_fields", "t1_fields", "t2_fields")
# WellDataset's boundary codes (the_well.data.utils.BoundaryCondition), for its "padding" return
BC_CODES = {"WALL": 0, "OPEN": 1, "PERIODIC": 2, "SYMMETRIC": 3}


def is_well_file(path: str) -> bool:
    """Whether an HDF5 file has The Well's layout (its field groups and dimensions)."""
    import h5py

    try:
        with h5py.File(path, "r") as fh:
            return "t0_fields" in fh and "dimensions" in fh and "n_trajectories" in fh.attrs
    except OSError:
        return False


def well_files(path: str) -> list[str]:
    """The Well files of a path: the file itself, or a folder's `*.h5`/`*.hdf5` files in sorted order (as
    WellDataset globs them); [] when it holds none."""
    if os.path.isfile(path):
        return [path] if path.lower().endswith(WELL_SUFFIXES) and is_well_file(path) else []
    files = sorted(glob.glob(os.path.join(path, "*.h5")) + glob.glob(os.path.join(path, "*.hdf5")))
    return files if files and is_well_file(files[0]) else []


def _text(values: Any) -> list[str]:
    if isinstance(values, (str, bytes)):
        values = [values]
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()] if value.dtype.kind in "SO" else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """A small float32 array as JSON: shape and zlib-compressed little-endian bytes in base64."""
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "zlib_f4": base64.b64encode(zlib.compress(a.tobytes(), 6)).decode()}


def decode_array(entry: dict[str, Any]) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(entry["zlib_f4"]))
    return np.frombuffer(raw, dtype="<f4").reshape(entry["shape"]).astype(np.float32)


class WellSource(Source):
    """The frames of one Well file or of a folder of them (see the module docstring)."""

    def __init__(
        self, path: str, files: list[str] | None = None, allow_external: bool = False, dims: int | None = None
    ) -> None:
        self.description = path
        self.path = path
        self.files = files if files is not None else well_files(path)
        if not self.files:
            raise DctDataError(f"{path}: expected a Well HDF5 file or a folder of them. Got none")
        self._handles: dict[int, Any] = {}
        self._pid = os.getpid()
        self.fields: list[dict[str, Any]] = []  # time-varying fields: name, stored, order, channels, attrs
        self.scalars: list[str] = []  # time-varying scalars
        self.trajectories: list[tuple[int, int, int]] = []  # (file index, trajectory in file, steps)
        ref = None
        for i, f in enumerate(self.files):
            try:
                fh = self._file(i)
            except OSError as exc:
                raise DctDataError(f"{f}: expected a readable HDF5 file. Got {exc}") from exc
            if not allow_external:
                check_hdf5_inside(f)  # no dataset of it reads another file
            layout = self._layout(fh, f)
            if ref is None:
                ref = layout
                self._adopt(fh, f, layout)
            elif layout != ref:
                raise DctDataError(
                    f"{f}: expected the same fields, scalars and grid as {self.files[0]}. Got {layout} (expected {ref})"
                )
            n_traj = int(fh.attrs["n_trajectories"])
            steps = int(fh["dimensions"]["time"].shape[-1])
            self.trajectories += [(i, j, steps) for j in range(n_traj)]
        if dims is not None and dims != len(self.spatial_dims):
            raise DctDataError(
                f"{self.files[0]}: --dims {dims}: expected the data's spatial dims. Got {len(self.spatial_dims)}-D "
                f"frames ({', '.join(self.spatial_dims)}): pack with --dims {len(self.spatial_dims)} (Python: "
                f"dims={len(self.spatial_dims)})"
            )
        self.offsets = np.concatenate([[0], np.cumsum([s for _, _, s in self.trajectories])]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self._info: dict[str, Any] | None = None
        self.field_attrs = {
            f["stored"]: {"well_field": f["name"], "tensor_order": f["order"], "channels": f["channels"]}
            for f in self.fields
        }

    # layout ---------------------------------------------------------------------------------------
    @staticmethod
    def _layout(fh, where: str) -> tuple:
        try:
            dims = tuple(_text(fh["dimensions"].attrs["spatial_dims"]))
            shape = tuple(int(fh["dimensions"][d].shape[-1]) for d in dims)
            groups = tuple(tuple(_text(fh[g].attrs.get("field_names", []))) if g in fh else () for g in ORDER_GROUPS)
            scalars = tuple(_text(fh["scalars"].attrs.get("field_names", []))) if "scalars" in fh else ()
        except KeyError as exc:
            raise DctDataError(
                f"{where}: expected The Well's layout (dimensions, t0_fields, ...). Got no {exc}"
            ) from exc
        return dims, shape, groups, scalars

    def _adopt(self, fh, where: str, layout: tuple) -> None:
        dims, shape, groups, scalars = layout
        self.spatial_dims, self.shape = list(dims), list(shape)
        if len(dims) not in (2, 3):
            raise DctDataError(f"{where}: expected 2 or 3 spatial dims. Got {list(dims)}")
        self.constant_fields: list[dict[str, Any]] = []
        seen: dict[str, str] = {}
        for order, group in enumerate(ORDER_GROUPS):
            for name in groups[order]:
                ds = fh[group][name]
                suffixes = ["".join(c) for c in itertools.product(dims, repeat=order)]
                entry = {
                    "name": name,
                    "group": group,
                    "order": order,
                    "channels": [f"{name}_{s}" if s else name for s in suffixes],
                    "sample_varying": bool(ds.attrs.get("sample_varying", True)),
                    "dim_varying": [bool(v) for v in ds.attrs.get("dim_varying", [True] * len(dims))],
                }
                if ds.dtype.kind not in "fiu":
                    raise DctDataError(f"{where}[{group}/{name}]: expected a numeric field. Got dtype {ds.dtype}")
                if bool(ds.attrs.get("time_varying", True)):
                    entry["stored"] = self._unique(field_name(name), seen, where)
                    self.fields.append(entry)
                else:
                    self.constant_fields.append(entry)
        self.constant_scalars: list[dict[str, Any]] = []
        for name in scalars:
            ds = fh["scalars"][name]
            entry = {"name": name, "sample_varying": bool(ds.attrs.get("sample_varying", False))}
            if bool(ds.attrs.get("time_varying", False)):
                entry["stored"] = self._unique(field_name(name), seen, where)
                self.scalars.append(entry)
            else:
                self.constant_scalars.append(entry)
        if not self.fields:
            raise DctDataError(f"{where}: expected at least one time-varying field. Got none")

    @staticmethod
    def _unique(name: str, seen: dict[str, str], where: str) -> str:
        if name in seen:
            raise DctDataError(f"{where}: expected distinct field and scalar names. Got {name!r} twice")
        seen[name] = name
        return name

    def _file(self, i: int):
        import h5py

        if self._pid != os.getpid():  # a forked worker opens its own handles
            self._handles, self._pid = {}, os.getpid()
        if i not in self._handles:
            self._handles[i] = h5py.File(self.files[i], "r")
        return self._handles[i]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handles": {}}

    # frames ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n

    def locate(self, frame: int) -> tuple[int, int]:
        """(trajectory number, step) of a frame."""
        k = int(np.searchsorted(self.offsets, frame, side="right") - 1)
        return k, frame - int(self.offsets[k])

    def where(self, index: int) -> str:
        k, t = self.locate(index)
        i, j, _ = self.trajectories[k]
        return f"{self.files[i]} trajectory {j} step {t} (frame {index})"

    def _field(self, fh, entry: dict[str, Any], traj: int, steps: slice | None) -> np.ndarray:
        """A field's values, channels first: (T, C, *spatial) for a step slice, (C, *spatial) without."""
        ds = fh[entry["group"]][entry["name"]]
        index: tuple = ()
        if entry["sample_varying"]:
            index += (traj,)
        if steps is not None:
            index += (steps,)
        a = np.asarray(ds[index], dtype=np.float32)
        lead = 1 if steps is not None else 0
        nd = len(self.shape)
        reps = [1] * a.ndim
        for d, varying in enumerate(entry["dim_varying"]):
            if not varying:
                reps[lead + d] = self.shape[d]
        if any(r != 1 for r in reps):
            a = np.tile(a, reps)
        a = a.reshape(*a.shape[: lead + nd], -1)  # components flattened, in WellDataset's order
        return np.moveaxis(a, -1, lead)

    def _scalar(self, fh, entry: dict[str, Any], traj: int, steps: slice | None) -> np.ndarray:
        ds = fh["scalars"][entry["name"]]
        index: tuple = (traj,) if entry["sample_varying"] else ()
        if steps is not None:
            index += (steps,)
        return np.asarray(ds[index] if index else ds[()], dtype=np.float32)

    def read_batch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {}
        at = start
        while at < stop:
            k, t = self.locate(at)
            i, j, steps = self.trajectories[k]
            end = min(stop - at, steps - t) + t
            fh = self._file(i)
            for entry in self.fields:
                parts.setdefault(entry["stored"], []).append(self._field(fh, entry, j, slice(t, end)))
            for entry in self.scalars:
                parts.setdefault(entry["stored"], []).append(self._scalar(fh, entry, j, slice(t, end)))
            at += end - t
        return {k: np.concatenate(v) for k, v in parts.items()}

    def sample(self, index: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.read_batch(index, index + 1).items()}

    def probe(self):
        if self.n == 0:
            raise DctDataError(f"{self.description}: expected at least one frame. Got 0")
        return {k: (tuple(v.shape[1:]), v.dtype) for k, v in self.read_batch(0, 1).items()}

    # what the manifest keeps ----------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:  # type: ignore[override]
        if self._info is None:
            self._info = {TRAJECTORY_INFO: self._trajectory_info()}
        return self._info

    def _trajectory_info(self) -> dict[str, Any]:
        fh0 = self._file(0)
        files = []
        for i, f in enumerate(self.files):
            fh = self._file(i)
            files.append(
                {
                    "name": os.path.basename(f),
                    "n_trajectories": sum(1 for t in self.trajectories if t[0] == i),
                    "n_steps": max(s for fi, _, s in self.trajectories if fi == i),
                    "time": self._time(fh),
                    "constant_fields": self._constants(fh),
                    "constant_scalars": {
                        e["name"]: _jsonable(np.asarray(fh["scalars"][e["name"]][()], dtype=np.float64))
                        for e in self.constant_scalars
                    },
                    "boundary_conditions": self._bcs(fh),
                    "parameters": {p: _jsonable(fh.attrs[p]) for p in self._parameters(fh)},
                }
            )
        return {
            "layout": "the_well",
            "dataset_name": _jsonable(fh0.attrs.get("dataset_name", "")),
            "grid_type": _jsonable(fh0.attrs.get("grid_type", "cartesian")),
            "spatial_dims": self.spatial_dims,
            "spatial_resolution": self.shape,
            "grid": {d: self._grid(fh0, d) for d in self.spatial_dims},
            "fields": [{k: f[k] for k in ("name", "stored", "order", "channels")} for f in self.fields],
            "scalars": [{"name": s["name"], "stored": s["stored"]} for s in self.scalars],
            "constant_fields": [{k: f[k] for k in ("name", "order", "channels")} for f in self.constant_fields],
            "constant_scalars": [s["name"] for s in self.constant_scalars],
            "files": files,
            "trajectories": [[i, j, steps] for i, j, steps in self.trajectories],
            "offsets": self.offsets.tolist(),
            "stats": self._stats(),
        }

    @staticmethod
    def _parameters(fh) -> list[str]:
        return [p for p in _text(fh.attrs.get("simulation_parameters", [])) if p in fh.attrs]

    def _time(self, fh) -> Any:
        ds = fh["dimensions"]["time"]
        return np.asarray(ds[()], dtype=np.float64).tolist()  # (n_steps,) or per trajectory (n_traj, n_steps)

    def _grid(self, fh, dim: str) -> Any:
        ds = fh["dimensions"][dim]
        values = np.asarray(ds[()], dtype=np.float64)
        if bool(ds.attrs.get("sample_varying", False)):
            log.info("%s: the %s grid varies per trajectory; the first trajectory's is kept", self.files[0], dim)
            values = values[0]
        return values.tolist()

    def _constants(self, fh) -> dict[str, Any]:
        n_traj = int(fh.attrs["n_trajectories"]) if self.constant_fields else 0
        out = {}
        for e in self.constant_fields:
            if e["sample_varying"]:
                out[e["name"]] = [encode_array(self._field(fh, e, j, None)) for j in range(n_traj)]
            else:
                out[e["name"]] = encode_array(self._field(fh, e, 0, None))
        return out

    def _bcs(self, fh) -> dict[str, Any]:
        """Each boundary-condition group's attributes, and WellDataset's padding code: (n_dims, 2), open (1)
        unless a group says otherwise (its `_padding_bcs`)."""
        groups = {}
        code = np.ones((len(self.spatial_dims), 2))
        index = {d: i for i, d in enumerate(self.spatial_dims)}
        bcs = fh.get("boundary_conditions", {})
        for name in bcs:
            g = bcs[name]
            kind = _jsonable(g.attrs.get("bc_type", "OPEN")).upper()
            dims = _text(g.attrs.get("associated_dims", []))
            groups[name] = {"bc_type": kind, "associated_dims": dims}
            if "mask" not in g or kind not in BC_CODES:
                continue
            mask = np.asarray(g["mask"][()])
            agg = np.min if kind == "WALL" else np.max
            for dim in dims:
                first = tuple(slice(None) if dim != other else 0 for other in dims)
                last = tuple(slice(None) if dim != other else -1 for other in dims)
                if agg(mask[first]):
                    code[index[dim]][0] = BC_CODES[kind]
                if agg(mask[last]):
                    code[index[dim]][1] = BC_CODES[kind]
        return {"groups": groups, "padding": code.tolist()}

    def _stats(self) -> dict[str, Any]:
        """Per stored field (and channel): mean, std, RMS of the values and of the differences between
        consecutive frames, over every frame of every trajectory (float64 sums, one trajectory at a time);
        constant fields by their Well name, over trajectories (no differences: those stats are 0)."""
        sums: dict[str, np.ndarray] = {}
        kinds = [(e, "field") for e in self.fields] + [(e, "scalar") for e in self.scalars]
        kinds += [(e, "constant") for e in self.constant_fields]
        for i, j, steps in self.trajectories:
            fh = self._file(i)
            for e, kind in kinds:
                if kind == "field":
                    a = self._field(fh, e, j, slice(0, steps)).astype(np.float64)
                    a = a.reshape(a.shape[0], a.shape[1], -1)  # (T, C, pixels)
                elif kind == "constant":
                    a = self._field(fh, e, j, None).astype(np.float64)
                    a = a.reshape(1, a.shape[0], -1)
                else:
                    a = self._scalar(fh, e, j, slice(0, steps)).astype(np.float64).reshape(-1, 1, 1)
                d = np.diff(a, axis=0)
                row = np.stack(
                    [
                        np.full(a.shape[1], a.shape[0] * a.shape[2], np.float64),
                        a.sum(axis=(0, 2)),
                        (a * a).sum(axis=(0, 2)),
                        np.full(a.shape[1], d.shape[0] * d.shape[2], np.float64),
                        d.sum(axis=(0, 2)),
                        (d * d).sum(axis=(0, 2)),
                    ]
                )
                name = e["name"] if kind == "constant" else e["stored"]
                sums[name] = sums.get(name, 0) + row
        return trajectory_stats(sums)

    def close(self) -> None:
        if self._pid == os.getpid():
            for fh in self._handles.values():
                fh.close()
        self._handles = {}
