"""dctdata's benchmarks, peer harnesses and measurement scripts: a folder of the repository, not part of
the installed package. Run them from the repository root with `python -m benchmarks NAME [options]`
(`python -m benchmarks --help` lists them; benchmarks/README.md says what each measures)."""

import pathlib
import sys

# The data the benchmarks share with the tests (photos and arrays shipped inside packages, the SciML stand-ins'
# stacks, the loopback HTTP server, the pack comparison) are helper modules of tests/, which import nothing
# from here; they are imported by their module names, as the tests do, with tests/ appended to the path (after
# site-packages, so nothing installed is shadowed).
_TEST_HELPERS = str(pathlib.Path(__file__).resolve().parents[1] / "tests")
if _TEST_HELPERS not in sys.path:
    sys.path.append(_TEST_HELPERS)
