"""Benchmarks behind `dctdata bench ...`; each module registers one bench subcommand."""
