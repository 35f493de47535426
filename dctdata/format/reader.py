"""The reader interface every storage implements, beside the writer one (`dctdata.format.base`);
MosaicML Streaming's reader base class is the model.

A reader is opened from a pack's location and manifest (and the fields to read) and gives:

    samples                                  # the sample count
    read_samples(fields, indices, stored=()) # random access (`random_access`: zarr)
    units() -> [Unit]                        # the stored units in order: what is read and checked as a whole
    open_unit(unit) -> UnitReader            # one unit, checked; `sample(j, stored=())` per sample (streaming)
    read_unit(unit, batch) -> (first, values | DctDataError), ...   # a unit's samples in batches (verify, peek)
    check_files() -> [problem]               # size and sha256 of the stored files reading does not hash whole
    file_samples(rel) -> " (samples a..b)"   # which samples a stored file holds, for messages

Every value a reader hands back is integrity-checked. `stored` names dct fields whose samples come
back as their checked stored bytes (`dctdata.decoder.wire.StoredSample`) instead of decoded coefficients, for
`open_dataset(..., decode="device")`. `batch_values` is the one place stored arrays become what a user
sees (tensors in the wire dtype; a dct field with side information as its (coefficients, side) pair).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch

from dctdata.decoder.wire import PackCodec, StreamForm
from dctdata.errors import DctDataError
from dctdata.format.checksum import sha256_file
from dctdata.format.fields import FieldSpec, assemble, user_fields, with_partners
from dctdata.format.location import join
from dctdata.format.manifest import Manifest, manifest_seal


def pack_identity(manifest: Manifest) -> str:
    """A pack's identity: its manifest's seal ("sha256:" + hex, `dctdata.format.manifest.manifest_seal`) over
    what decoding depends on (fields and codecs, layout, the sha256 of every stored file, sample count), the
    same for every copy of the pack and different for any other. Computed from the manifest as read, so packs
    of every version have one (version 5 packs: the seal they were written with; version 8 writes the same
    digest as base64url, given here as hex like the others)."""
    seal = manifest_seal(manifest.to_dict())
    return seal if seal.startswith("sha256:") else "sha256:" + base64.urlsafe_b64decode(seal + "=").hex()


@dataclasses.dataclass(frozen=True)
class Unit:
    """A piece of a pack read and checked as a whole: a webdataset shard (samples [start, stop)), or
    every chunk of one zarr field (`fields`: the user fields it holds). `name` is where it is (the file,
    or the pack for a field), for messages; `key` is the storage's own."""

    name: str
    start: int
    stop: int
    fields: tuple[str, ...]
    key: Any = None


class UnitReader:
    """One opened unit: `len()` samples from `first`, `sample(j, stored)` the stored values of its j-th
    sample, one per field of `fields` (a webdataset shard holds every field of the pack)."""

    first: int = 0
    fields: tuple[FieldSpec, ...] = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def sample(self, j: int, stored: Collection[str] = ()) -> list[Any]:
        raise NotImplementedError


class StorageReader:
    """Base of the storage readers (see the module docstring). Subclasses set `storage`, say whether
    they read samples at random (`random_access`) and whether reading a unit reads one stored file whole
    and checks its size and sha256 (`units_hash_files`: then `check_files` leaves those files to it)."""

    storage: ClassVar[str] = ""
    random_access: ClassVar[bool] = False
    units_hash_files: ClassVar[bool] = False

    root: str
    manifest: Manifest
    fields: tuple[FieldSpec, ...]
    storage_options: dict[str, Any]

    @property
    def samples(self) -> int:
        return self.manifest.samples

    def stamp(self, form: StreamForm, f: FieldSpec) -> StreamForm:
        """`form` with this pack's identity and field f's codec (`dctdata.decoder.wire.PackCodec`): what its stored
        bytes carry with decode="device", so that no batch decodes them as another pack's."""
        ident = self.__dict__.get("_pack_identity")
        if ident is None:
            ident = self._pack_identity = pack_identity(self.manifest)
        return dataclasses.replace(form, pack=ident, codec=PackCodec(ident, self.root, f.codec, f.lossless))

    # What a storage provides ---------------------------------------------------------------------
    def read_samples(
        self, fields: Sequence[FieldSpec], indices: Sequence[int], stored: Collection[str] = ()
    ) -> dict[str, Any]:
        """{field name: its stored samples `indices`, in that order}: a (N, *stored_shape) array, or for
        the dct fields named in `stored` a list of `StoredSample`. Random-access storages only."""
        raise DctDataError(
            f"{self.root}: expected a storage with random access (zarr) to read samples by index. Got a "
            f"{self.storage} pack, read shard by shard"
        )

    def units(self) -> list[Unit]:
        raise NotImplementedError

    def open_unit(self, unit: Unit) -> UnitReader:
        raise NotImplementedError

    def read_unit(self, unit: Unit, batch: int) -> Iterator[tuple[int, list[Any] | DctDataError]]:
        """The unit's samples of `unit.fields` in batches of at most `batch`: (first sample index, user
        values batched). A unit that is bad as a whole raises; a bad batch inside a unit that can go on
        past it (a zarr chunk) is yielded as its DctDataError. `batch=0` only opens (checks) the unit."""
        opened = self.open_unit(unit)
        fields = self._fields_of(unit)
        at = [opened.fields.index(g) for g in fields]
        for a in range(0, len(opened) if batch else 0, batch):
            rows = [opened.sample(j) for j in range(a, min(a + batch, len(opened)))]
            arrays = {g.name: torch.stack([r[k] for r in rows]) for g, k in zip(fields, at)}
            yield opened.first + a, batch_values(fields, arrays)

    def read(self, f: FieldSpec, a: int, b: int) -> npt.NDArray[Any]:
        """Stored samples [a, b) of one field (random-access storages)."""
        arr: npt.NDArray[Any] = self.read_samples((f,), range(a, b))[f.name]
        return arr

    def check_files(self) -> list[str]:
        """One line per stored file the manifest lists whose size or sha256 is not what it says (files a
        unit reads whole are checked there instead when `units_hash_files`)."""
        if self.units_hash_files:
            return []
        problems = []
        for rel, e in self.manifest.checksums.items():
            path = join(self.root, *rel.split("/"))
            which = self.file_samples(rel)
            try:
                digest, size = sha256_file(path, self.storage_options, root=self.root, limit=e["bytes"])
            except FileNotFoundError:
                problems.append(f"{path}: expected a stored file. Got none (missing){which}")
                continue
            except OSError as exc:  # a FIFO, device or link out of the pack (SpecialFileError), permissions
                problems.append(f"{path}: expected a readable stored file. Got {type(exc).__name__}: {exc}{which}")
                continue
            if size != e["bytes"] or digest != e["sha256"]:
                problems.append(
                    f"{path}: expected sha256 {e['sha256'][:16]}... and {e['bytes']} bytes. Got {digest[:16]}... and "
                    f"{size} bytes{which}"
                )
        return problems

    def file_samples(self, rel: str) -> str:
        """' (samples a..b)' (or more) for a stored file, '' when `rel` is not one of the pack's."""
        return ""

    # Shared --------------------------------------------------------------------------------------
    def _fields_of(self, unit: Unit) -> tuple[FieldSpec, ...]:
        """The stored fields (side partners included) holding `unit.fields`, in the reader's order."""
        return with_partners(self.fields, [f.name for f in user_fields(self.fields) if f.name in unit.fields])


def batch_values(fields: Sequence[FieldSpec], arrays: Mapping[str, Any]) -> list[Any]:
    """The user's values of a batch from the stored samples of `fields` (side partners included), in
    user-field order: tensors in the wire dtype, a dct field with side information as its (coefficients,
    side) pair. `arrays` holds (N, *stored_shape) numpy arrays or tensors."""
    tensors = [
        f.to_tensor(arrays[f.name]) if isinstance(arrays[f.name], np.ndarray) else arrays[f.name] for f in fields
    ]
    return assemble(tuple(fields), tensors)
