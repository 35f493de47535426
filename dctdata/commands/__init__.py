"""CLI subcommands: one module each, registered in dctdata.cli.COMMAND_MODULES."""
