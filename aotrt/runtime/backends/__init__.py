"""One package per backend: cpu/ and cuda/, each with its device, stream, library bindings
and op implementations; device.DEVICES names each backend's entry point."""
