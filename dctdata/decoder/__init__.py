"""Coefficients back to arrays: the first layer (`Decompress`, 2-D and volumes), the functional decode,
the fused CPU (C) and CUDA (Triton) kernels, the wire types a loader yields and the stored-bytes path.

Stands on the codec and the stages; the encoder stands on it (a pack checks itself with this decoder).
"""
