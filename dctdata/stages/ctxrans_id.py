"""The entropy coder stage's id, in a module of its own that imports nothing: `dctdata.entropy` (the codec the
stage wraps, which writes the id into its configs) names it from here without importing the stage, which
imports the codec. Stage ids are spelled in `dctdata.stages` only.
"""

CODEC_ID = "dctdata_ctxrans"
