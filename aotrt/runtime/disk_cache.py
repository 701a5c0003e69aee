"""Compiled code on disk, one entry per key, each verified by a sha256 sidecar: the cpu
backend's shared libraries and the cuda backend's cubins share the directory and its rules."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

from aotrt import settings
from aotrt.errors import CompileError

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where compiled kernels are cached: $AOTRT_CACHE_DIR, else ~/.cache/aotrt."""
    root = settings.env().cache_dir or os.path.join(os.path.expanduser("~"), ".cache",
                                                    "aotrt")
    return Path(root)


class DiskCache:
    """Compiled code on disk, one entry per key, each verified by a sha256 sidecar.

    An entry is written atomically (the file, then its sidecar, each through os.replace),
    and a missing, truncated or mismatching one is rebuilt. A set AOTRT_CACHE_DIR that is
    unusable is an error naming it; an unusable default directory falls back to a private
    temporary one, with a warning.
    """

    def __init__(self) -> None:
        self._fallback: Path | None = None
        self._lock = threading.Lock()

    def root(self) -> Path:
        """The directory entries are read from and written to."""
        return self._fallback if self._fallback is not None else cache_dir()

    def read(self, name: str) -> bytes | None:
        """The bytes of entry `name` when they match its sidecar, else None."""
        path = self.root() / name
        try:
            data = path.read_bytes()
            want = (path.parent / (name + ".sha256")).read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None
        if hashlib.sha256(data).hexdigest() != want:
            log.warning("kernel cache: %s does not match its checksum; rebuilding", path)
            return None
        return data

    def writable_root(self) -> Path:
        """The cache directory, created and checked for writing (see the class)."""
        with self._lock:
            root = self.root()
            try:
                root.mkdir(parents=True, exist_ok=True)
                fd, probe = tempfile.mkstemp(dir=root, prefix=".probe-")
                os.close(fd)
                os.unlink(probe)
                return root
            except OSError as e:
                reason = f"{type(e).__name__}: {e.strerror or e}"
                if settings.env().cache_dir and self._fallback is None:
                    raise CompileError(
                        f"kernel cache directory {str(root)!r} (AOTRT_CACHE_DIR) is unusable: "
                        f"{reason}; set AOTRT_CACHE_DIR to a writable directory") from None
                if self._fallback is not None:
                    raise CompileError(f"kernel cache directory {str(root)!r} is unusable: "
                                       f"{reason}") from None
            self._fallback = Path(tempfile.mkdtemp(prefix="aotrt-cache-"))
            # Private to this cache object: removed with it (mapped libraries stay valid).
            weakref.finalize(self, shutil.rmtree, self._fallback, True)
            log.warning("kernel cache directory %s is unusable (%s); using %s for this "
                        "process (set AOTRT_CACHE_DIR)", root, reason, self._fallback)
            return self._fallback

    def write(self, path: Path, tmp: Path) -> None:
        """Publish the finished file `tmp` (in the cache directory) as entry `path`."""
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        side = tmp.with_name(tmp.name + ".sha256")
        side.write_text(digest + "\n")
        # The file first, then its sidecar: a reader never trusts a file whose sidecar is
        # older, because the digests then differ and it rebuilds.
        os.replace(tmp, path)
        os.replace(side, path.with_name(path.name + ".sha256"))


__all__ = ["DiskCache", "cache_dir"]
