"""Device implementations, one file each, registered in aotrt.runtime.device.DEVICES."""
