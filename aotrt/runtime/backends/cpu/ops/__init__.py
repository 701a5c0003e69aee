"""The cpu implementations of the library ops, registered by the cpu device
(backends/cpu/device.py) under CpuDevice; the C they compile sits beside them."""
