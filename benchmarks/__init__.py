"""dctdata's benchmarks, peer harnesses and measurement scripts: a folder of the repository, not part of
the installed package. Run them from the repository root with `python -m benchmarks NAME [options]`
(`python -m benchmarks --help` lists them; benchmarks/README.md says what each measures)."""
