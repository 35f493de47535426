"""`dctdata demo`: the whole path on embedded synthetic data (see `dctdata.demo.pipeline`)."""

from dctdata.demo.pipeline import RESULT_COLUMNS, DemoSettings, format_table, run_demo, table_notes

__all__ = ["RESULT_COLUMNS", "DemoSettings", "format_table", "run_demo", "table_notes"]
