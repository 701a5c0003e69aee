"""The cuda backend: CudaDevice and its stream (device.py, the entry point), copies, graphs,
the cuBLAS/cuDNN bindings (libraries.py) and the op implementations it registers (ops/)."""
