"""Field kinds: the one type every module uses to say how a field is stored.

A `str` enum, so the manifest's JSON keeps the plain names ("dct", "array", "label") and a kind
compares equal to its name; code branches on the members, never on bare strings.
"""

from __future__ import annotations

import enum

from dctdata.errors import DctDataError


class FieldKind(str, enum.Enum):
    DCT = "dct"  # image-like float arrays, stored as quantized block-DCT coefficients
    ARRAY = "array"  # stored exactly with the lossless codec (masks, targets)
    LABEL = "label"  # one scalar per sample

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # messages say kind 'dct', as the manifest does
        return repr(self.value)

    @classmethod
    def parse(cls, value: object, where: str = "kind") -> FieldKind:
        """A kind from its name (or itself); anything else names the choices."""
        try:
            return cls(value)
        except ValueError:
            raise DctDataError(f"{where}: expected one of {FIELD_KINDS}. Got {value!r}") from None


FIELD_KINDS = tuple(k.value for k in FieldKind)
