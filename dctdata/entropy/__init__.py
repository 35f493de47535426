"""The entropy stage for quantized DCT coefficients: a context-modelled rANS coder whose model is fitted
once per field and stored in the manifest (`ctxrans.CtxCodec`)."""

from dctdata.entropy.ctxrans import CODEC_ID, CtxCodec, CtxCodecError

__all__ = ["CODEC_ID", "CtxCodec", "CtxCodecError"]
