"""The one error hierarchy of aotrt: every failure a user can see is an AotrtError."""


class AotrtError(Exception):
    """Base of every error aotrt raises on purpose."""


class InvalidArgument(AotrtError, ValueError):
    """An argument is wrong: bad shape, dtype, count, stride, offset or handle."""


class OutOfMemory(AotrtError, MemoryError):
    """The device or host could not provide the memory asked for."""


class CompileError(AotrtError):
    """A generated kernel did not compile; `log` holds the compiler's output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(f"{message}\n{log}" if log else message)
        self.log = log


class DeviceError(AotrtError):
    """The device, its driver or its worker failed."""


class ProgramError(AotrtError):
    """A program file is corrupt, hostile or of an unknown version."""


class HazardError(AotrtError):
    """The hazard checker saw an ordering fault: a missing wait or an alias."""


class Unsupported(AotrtError, NotImplementedError):
    """An op, dtype or feature that aotrt does not implement."""


__all__ = [
    "AotrtError",
    "InvalidArgument",
    "OutOfMemory",
    "CompileError",
    "DeviceError",
    "ProgramError",
    "HazardError",
    "Unsupported",
]
