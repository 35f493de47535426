"""Arrays to quantized coefficients: quantization, pointwise bounds and their rounding, and calibration
(the PSNR and bounded searches, the stage choice).

Stands on the decoder, which it uses to check what it wrote.
"""
