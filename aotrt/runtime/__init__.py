"""The aotrt runtime: devices, memory, shims, library ops and delegates. It never imports torch."""
