"""One exception root so callers can catch every data problem dctdata reports."""


class DctDataError(ValueError):
    """Bad input, bad settings or bad stored data. Messages name the culprit and what was expected."""


class FormatError(DctDataError):
    """A manifest or stored artifact does not follow the dctdata format."""


class IntegrityError(DctDataError):
    """Stored bytes do not match their checksum, or a chunk/shard is missing or truncated."""


class OverflowCountError(DctDataError):
    """Quantized coefficients overflowed the integer range and the caller asked for strictness."""


class MissingExtraError(DctDataError, ImportError):
    """An optional feature's packages are not installed; the message names the extra that installs them."""
