"""The cpu backend: CpuDevice (device.py, the entry point), its stream, queue and native
plan, the oneDNN bindings (dnnl*.py) and the op implementations it registers (ops/)."""
