"""The codec's math: the block DCT (2-D and 3-D), the codec spec, error figures and the value lattice.

The ground floor of the core: nothing here imports the stages, the decoder, the encoder or the format.
"""
