"""Quantization formats: repacking GGUF blocks into kernel layouts, quantize/dequantize."""
