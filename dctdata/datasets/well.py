"""A synthetic stand-in for a data set of The Well: a small 2-D shallow-water simulation written in The
Well's HDF5 layout, so the trajectory source, the window loader, their tests and the trajectory bench
have realistic fields (smooth waves over a bathymetry) without a download.

Layout written (what `the_well.data.WellDataset` reads): root attributes `dataset_name`, `grid_type`,
`n_spatial_dims`, `n_trajectories`, `simulation_parameters` (and each parameter); groups `dimensions`
(`time`, `x`, `y`), `boundary_conditions` (periodic in x and y), `scalars` (`g`, constant), `t0_fields`
(`height`, time varying; `bathymetry`, constant per trajectory), `t1_fields` (`velocity`, its last axis
the x and y components) and an empty `t2_fields`. Arrays are float32 (n_traj, n_steps, x, y[, 2]).

The model: the linearised shallow-water equations on a periodic unit square, eta_t = -div((H0 - b) u),
u_t = -g grad(eta) - r u, stepped forward-backward (stable: the wave speed times dt/dx stays below 1/2)
from a few Gaussian bumps; every stored frame is several solver steps apart.
"""

from __future__ import annotations

import os

import numpy as np

G = 1.0
DEPTH = 1.0
DRAG = 0.05


def _ddx(a: np.ndarray, axis: int, dx: float) -> np.ndarray:
    return (np.roll(a, -1, axis) - np.roll(a, 1, axis)) / (2 * dx)


def shallow_water(
    n_traj: int = 3, n_steps: int = 20, size: int = 32, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(height (n_traj, n_steps, size, size), velocity (..., 2), bathymetry (n_traj, size, size), time
    (n_steps,)), all float32."""
    rng = np.random.default_rng(seed)
    dx = 1.0 / size
    dt = 0.3 * dx / np.sqrt(G * DEPTH)
    every = 4
    x = (np.arange(size) + 0.5) * dx
    X, Y = np.meshgrid(x, x, indexing="ij")
    height = np.zeros((n_traj, n_steps, size, size), np.float32)
    velocity = np.zeros((n_traj, n_steps, size, size, 2), np.float32)
    bathy = np.zeros((n_traj, size, size), np.float32)

    def bump(center: np.ndarray, w: float) -> np.ndarray:
        cx, cy = center
        ddx = (X - cx + 0.5) % 1.0 - 0.5
        ddy = (Y - cy + 0.5) % 1.0 - 0.5
        return np.exp(-(ddx**2 + ddy**2) / (2 * w * w))

    for t in range(n_traj):
        b = sum(rng.uniform(0.1, 0.3) * bump(rng.uniform(0, 1, 2), rng.uniform(0.1, 0.2)) for _ in range(2))
        H = DEPTH - b
        eta = sum(rng.uniform(0.05, 0.2) * bump(rng.uniform(0, 1, 2), rng.uniform(0.04, 0.1)) for _ in range(3))
        u = np.zeros((2, size, size))
        for s in range(n_steps):
            height[t, s] = eta
            velocity[t, s] = np.moveaxis(u, 0, -1)
            for _ in range(every):
                eta = eta - dt * (_ddx(H * u[0], 0, dx) + _ddx(H * u[1], 1, dx))
                u = u - dt * (G * np.stack([_ddx(eta, 0, dx), _ddx(eta, 1, dx)]) + DRAG * u)
        bathy[t] = b
    time = (np.arange(n_steps) * every * dt).astype(np.float32)
    return height, velocity, bathy, time


def write_well_file(path: str | os.PathLike, n_traj: int = 3, n_steps: int = 20, size: int = 32, seed: int = 0) -> str:
    """Write a shallow-water simulation (`shallow_water`) to `path` in The Well's HDF5 layout; returns
    the path."""
    import h5py

    height, velocity, bathy, time = shallow_water(n_traj, n_steps, size, seed)
    coords = ((np.arange(size) + 0.5) / size).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.attrs["dataset_name"] = "shallow_water_synth"
        f.attrs["grid_type"] = "cartesian"
        f.attrs["n_spatial_dims"] = 2
        f.attrs["n_trajectories"] = n_traj
        f.attrs["simulation_parameters"] = ["g"]
        f.attrs["g"] = G
        dims = f.create_group("dimensions")
        dims.attrs["spatial_dims"] = ["x", "y"]
        for name, values in (("time", time), ("x", coords), ("y", coords)):
            d = dims.create_dataset(name, data=values)
            d.attrs["sample_varying"] = False
            d.attrs["time_varying"] = name == "time"
        bcs = f.create_group("boundary_conditions")
        for axis in ("x", "y"):
            mask = np.zeros(size, bool)
            mask[0] = mask[-1] = True
            g = bcs.create_group(f"{axis}_periodic")
            g.attrs["associated_dims"] = [axis]
            g.attrs["associated_fields"] = []
            g.attrs["bc_type"] = "PERIODIC"
            g.attrs["sample_varying"] = False
            g.attrs["time_varying"] = False
            g.create_dataset("mask", data=mask)
            g.create_dataset("values", data=np.array([], np.float32))
        scalars = f.create_group("scalars")
        scalars.attrs["field_names"] = ["g"]
        d = scalars.create_dataset("g", data=np.array(G, np.float32))
        d.attrs["time_varying"] = False
        d.attrs["sample_varying"] = False

        def field(group: h5py.Group, name: str, data: np.ndarray, time_varying: bool) -> None:
            d = group.create_dataset(name, data=data)
            d.attrs["dim_varying"] = [True, True]
            d.attrs["sample_varying"] = True
            d.attrs["time_varying"] = time_varying

        t0 = f.create_group("t0_fields")
        t0.attrs["field_names"] = ["height", "bathymetry"]
        field(t0, "height", height, True)
        field(t0, "bathymetry", bathy, False)
        t1 = f.create_group("t1_fields")
        t1.attrs["field_names"] = ["velocity"]
        field(t1, "velocity", velocity, True)
        f.create_group("t2_fields").attrs["field_names"] = []
    return os.fspath(path)


def write_pdebench_file(
    path: str | os.PathLike, n_traj: int = 3, n_steps: int = 20, size: int = 32, seed: int = 0
) -> str:
    """Write the same shallow-water simulation in PDEBench's per-variable 2-D CFD layout (what
    `dctdata.preprocess.sources.pdebench` reads): `density` (the water depth DEPTH + height), `pressure`
    (the depth-integrated hydrostatic g h^2 / 2), `Vx`, `Vy`, each (n_traj, n_steps, x, y) float32, beside
    `t-coordinate` (n_steps + 1 values, as PDEBench's CFD files have), `x-coordinate`, `y-coordinate` and
    the root attribute `g`; returns the path."""
    import h5py

    height, velocity, _, time = shallow_water(n_traj, n_steps, size, seed)
    depth = (DEPTH + height).astype(np.float32)
    coords = ((np.arange(size) + 0.5) / size).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("density", data=depth)
        f.create_dataset("pressure", data=(0.5 * G * depth * depth).astype(np.float32))
        f.create_dataset("Vx", data=velocity[..., 0])
        f.create_dataset("Vy", data=velocity[..., 1])
        f.create_dataset("t-coordinate", data=np.append(time, 2 * time[-1] - time[-2]).astype(np.float32))
        f.create_dataset("x-coordinate", data=coords)
        f.create_dataset("y-coordinate", data=coords)
        f.attrs["g"] = G
    return os.fspath(path)
