"""Compiled kernels cached on disk across processes, so that a process after the first compiles nothing.

Every kernel the package launches goes through :class:`~baracuda_numba.launch.KernelLauncher`, which asks
:func:`kernel_function` for the kernel's handle: on a hit the kernel's image is loaded from the cache into the
current context, with no numba compilation; on a miss the kernel is compiled as before and its image stored.
The image is the cubin numba linked for the device (``cuda.jit`` kernels) or the PTX of a kernel compiled for
``sm_90a`` (:class:`~baracuda_numba.kernels.linear.sm90a.HopperKernel`; the driver's own cache keeps its
SASS).

**Key.** A kernel's entry is named by a hash of:

- the kernel: its name, signature and compile options, and a fingerprint of its Python function: the bytecode
  and constants of it and of every function it reaches (device functions, intrinsics' definitions), the values
  of their closure cells and of the globals they read (configuration dataclasses, enums, numbers, numba types;
  functions recursively). A kernel whose function reaches a value the fingerprint cannot describe (an object
  without a stable description) is not cached: it compiles every process, as without a cache;
- the device's compute capability;
- the environment (:func:`environment`): the package's version and a hash of its source files, and the versions
  of Python, NumPy, numba, numba-cuda, llvmlite, NVVM, cuda-bindings and the driver. Any change there names
  every entry anew (the old files stay until :meth:`KernelCache.clear`).

**Files.** ``<directory>/kernels/<hash>.bin``: a header (a magic line, then one JSON line with the kind of
image, the entry point's name, the payload's length and SHA-256) and the image. An entry is written to a
temporary file in the same directory and renamed over its name (``os.replace``: atomic on one filesystem), so a
reader sees a whole entry or none, and concurrent writers of one entry each write the same bytes. A file whose
header or checksum does not match is a miss (and is rewritten).

**Configuration** (:class:`CacheConfig`, read from the environment once by :func:`kernel_cache`):
``BARACUDA_CACHE_DIR`` names the directory (default ``$XDG_CACHE_HOME/baracuda-numba``, else
``~/.cache/baracuda-numba``); ``BARACUDA_CACHE_DIR=off`` (or an empty value) turns the cache off.
``baracuda_numba.cache.kernel_cache().clear()`` deletes every entry.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CacheConfig", "CachedImage", "KernelCache", "CacheStats", "fingerprint", "environment", "kernel_cache",
           "kernel_function", "default_cache_config"]

_MAGIC = b"baracuda-numba kernel 1\n"
_ENV_DIR = "BARACUDA_CACHE_DIR"
_OFF = ("", "off", "0", "none")


@dataclass(frozen=True)
class CacheConfig:
    """Where compiled kernels are kept (``directory`` None: nowhere, the cache is off)."""

    directory: Path | None


def default_cache_config(environ: dict[str, str] | None = None) -> CacheConfig:
    """The configuration the environment gives (``os.environ`` unless ``environ``): see the module doc."""
    environ = os.environ if environ is None else environ
    given = environ.get(_ENV_DIR)
    if given is not None:
        return CacheConfig(None if given.strip().lower() in _OFF else Path(given).expanduser())
    base = environ.get("XDG_CACHE_HOME") or str(Path("~").expanduser() / ".cache")
    return CacheConfig(Path(base) / "baracuda-numba")


@dataclass(frozen=True)
class CachedImage:
    """A compiled kernel as stored: ``kind`` ``"cubin"`` or ``"ptx"``, the entry point's ``name``, the bytes."""

    kind: str
    name: str
    image: bytes


@dataclass
class CacheStats:
    """What a :class:`KernelCache` did in this process: entries found (``hits``), kernels compiled for want of
    one (``misses``: compiled, then stored where they could be), entries written, entries unreadable,
    kernels that cannot be fingerprinted (compiled each process)."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    corrupt: int = 0
    uncacheable: int = 0


@dataclass
class KernelCache:
    """Cached kernel images under ``config.directory`` (see the module doc); ``environment_key``: the hash of
    :func:`environment` (a test passes its own)."""

    config: CacheConfig
    environment_key: str
    stats: CacheStats = field(default_factory=CacheStats)

    @property
    def enabled(self) -> bool:
        return self.config.directory is not None

    def _folder(self) -> Path:
        return Path(self.config.directory) / "kernels"

    def key(self, identity: str, compute_capability: tuple) -> str:
        """The entry name of a kernel of ``identity`` (its fingerprint) for ``compute_capability``."""
        text = "\n".join((self.environment_key, repr(tuple(compute_capability)), identity))
        return hashlib.sha256(text.encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self._folder() / f"{key}.bin"

    def load(self, key: str) -> CachedImage | None:
        """The entry ``key``, or None (absent, off, or not whole: counted in ``stats.corrupt``)."""
        if not self.enabled:
            return None
        try:
            data = self.path(key).read_bytes()
        except OSError:
            return None
        image = _parse(data)
        if image is None:
            self.stats.corrupt += 1
        return image

    def store(self, key: str, image: CachedImage) -> bool:
        """Write the entry ``key`` (a temporary file renamed over it); False where the directory cannot be
        written (the kernel still runs, compiled)."""
        if not self.enabled:
            return False
        header = json.dumps({"kind": image.kind, "name": image.name, "bytes": len(image.image),
                             "sha256": hashlib.sha256(image.image).hexdigest()}).encode()
        folder = self._folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(_MAGIC + header + b"\n" + image.image)
                os.replace(temporary, self.path(key))
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError:
            return False
        self.stats.stores += 1
        return True

    def entries(self) -> list[Path]:
        """The entry files held (none when off)."""
        if not self.enabled or not self._folder().is_dir():
            return []
        return sorted(self._folder().glob("*.bin"))

    def clear(self) -> int:
        """Delete every entry (and leftover temporary files); returns how many entries were deleted."""
        if not self.enabled or not self._folder().is_dir():
            return 0
        count = 0
        for path in self._folder().iterdir():
            if path.suffix in (".bin", ".tmp"):
                path.unlink(missing_ok=True)
                count += path.suffix == ".bin"
        return count


def _parse(data: bytes) -> CachedImage | None:
    if not data.startswith(_MAGIC):
        return None
    end = data.find(b"\n", len(_MAGIC))
    if end < 0:
        return None
    try:
        header = json.loads(data[len(_MAGIC):end])
        payload = data[end + 1:]
        if (len(payload) != header["bytes"] or hashlib.sha256(payload).hexdigest() != header["sha256"]
                or header["kind"] not in ("cubin", "ptx")):
            return None
        return CachedImage(header["kind"], str(header["name"]), payload)
    except (ValueError, KeyError, TypeError):
        return None


# -- the kernel's fingerprint ----------------------------------------------------------------------


class Unfingerprintable(Exception):
    """A value reached from a kernel that has no stable description."""


def fingerprint(function: Any) -> str | None:
    """A stable description of everything ``function`` (a Python function, or a numba dispatcher or intrinsic
    wrapping one) compiles from: see the module doc. None where some value it reaches has no stable description."""
    try:
        return _describe(function, {}, 0)
    except (Unfingerprintable, RecursionError):
        return None


def _describe(value: Any, seen: dict[int, int], depth: int) -> str:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, enum.Enum):
        return f"enum:{type(value).__module__}.{type(value).__qualname__}.{value.name}"
    if isinstance(value, np.generic):
        return f"np:{value.dtype.str}:{value.tobytes().hex()}"
    if isinstance(value, np.dtype):
        return f"dtype:{value.str}"
    if isinstance(value, np.ndarray):
        return f"ndarray:{value.dtype.str}:{value.shape}:{hashlib.sha256(np.ascontiguousarray(value)).hexdigest()}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}[" + ",".join(_describe(v, seen, depth + 1) for v in value) + "]"
    if isinstance(value, (set, frozenset)):
        return "set[" + ",".join(sorted(_describe(v, seen, depth + 1) for v in value)) + "]"
    if isinstance(value, dict):
        items = sorted((_describe(k, seen, depth + 1), _describe(v, seen, depth + 1)) for k, v in value.items())
        return "dict[" + ",".join(f"{k}={v}" for k, v in items) + "]"
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if isinstance(value, type):
        return f"type:{value.__module__}.{value.__qualname__}"
    if dataclasses.is_dataclass(value):
        fields = ",".join(f"{f.name}={_describe(getattr(value, f.name), seen, depth + 1)}"
                          for f in dataclasses.fields(value) if f.compare)
        return f"dataclass:{type(value).__module__}.{type(value).__qualname__}({fields})"
    if isinstance(value, types.FunctionType):
        return _function(value, seen, depth)
    if isinstance(value, (types.BuiltinFunctionType, np.ufunc)):
        return f"builtin:{getattr(value, '__module__', None)}.{value.__name__}"
    if isinstance(value, functools.partial):
        return (f"partial({_describe(value.func, seen, depth + 1)},{_describe(value.args, seen, depth + 1)},"
                f"{_describe(value.keywords, seen, depth + 1)})")
    py_func = getattr(value, "py_func", None)
    if isinstance(py_func, types.FunctionType):  # a numba dispatcher (device functions): its options matter too
        options = getattr(value, "targetoptions", {})
        return f"dispatcher:{type(value).__name__}({_describe(dict(options), seen, depth + 1)})" + _function(
            py_func, seen, depth)
    definition = getattr(value, "_defn", None)
    if isinstance(definition, types.FunctionType):  # a numba intrinsic: its typing and code generation
        return f"intrinsic:{getattr(value, '_name', '')}" + _function(definition, seen, depth)
    module = type(value).__module__
    if module.startswith(("numba.", "llvmlite.")):  # numba types, llvmlite IR types: their text is their identity
        text = str(value)
        if " at 0x" not in text:
            return f"{module}.{type(value).__qualname__}:{text}"
    raise Unfingerprintable(f"{type(value).__module__}.{type(value).__qualname__}")


def _function(function: types.FunctionType, seen: dict[int, int], depth: int) -> str:
    marker = seen.get(id(function))
    if marker is not None:  # recursion, or a function reached twice: named by its first visit
        return f"function#{marker}"
    seen[id(function)] = len(seen)
    parts = [f"function:{function.__module__}.{function.__qualname__}", _code(function.__code__, seen, depth),
             _describe(function.__defaults__, seen, depth + 1), _describe(function.__kwdefaults__, seen, depth + 1)]
    for cell in function.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            parts.append("cell:empty")
            continue
        parts.append(_describe(contents, seen, depth + 1))
    names = set()
    _global_names(function.__code__, names)
    for name in sorted(names):
        if name in function.__globals__:
            parts.append(f"global:{name}=" + _describe(function.__globals__[name], seen, depth + 1))
    return "{" + ";".join(parts) + "}"


def _code(code: types.CodeType, seen: dict[int, int], depth: int) -> str:
    consts = ",".join(_code(c, seen, depth) if isinstance(c, types.CodeType) else _describe(c, seen, depth + 1)
                      for c in code.co_consts)
    return (f"code:{code.co_code.hex()}:{code.co_names}:{code.co_varnames}:{code.co_freevars}:{code.co_argcount}:"
            f"{code.co_flags}:[{consts}]")


def _global_names(code: types.CodeType, names: set[str]) -> None:
    names.update(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _global_names(const, names)


# -- the environment -------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": sys.version, "numpy": np.__version__}
    for package in ("numba", "numba-cuda", "llvmlite", "cuda-bindings", "cuda-core"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "-"
    return found


def _source_hash() -> str:
    """SHA-256 over the package's Python sources (names and bytes): an edit anywhere names every entry anew."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _toolchain() -> dict[str, str]:
    """NVVM's and the driver's versions, and the numba settings that change generated code (GPU only)."""
    from numba import config as numba_config

    found = {"opt": str(numba_config.OPT), "debuginfo": str(numba_config.CUDA_DEBUGINFO_DEFAULT),
             "pynvjitlink": str(getattr(numba_config, "CUDA_ENABLE_PYNVJITLINK", "-"))}
    try:
        from numba.cuda.cudadrv import nvvm

        found["nvvm"] = ".".join(map(str, nvvm.NVVM().get_version()))
    except Exception as exc:  # no NVVM: nothing compiles either; the key says so
        found["nvvm"] = f"unavailable ({type(exc).__name__})"
    try:
        from numba.cuda.cudadrv import driver

        found["driver"] = ".".join(map(str, driver.driver.get_version()))
    except Exception as exc:
        found["driver"] = f"unavailable ({type(exc).__name__})"
    return found


@functools.cache
def environment() -> dict[str, str]:
    """What every entry's key holds besides the kernel and the device (see the module doc)."""
    from . import __version__

    return {"package": __version__, "sources": _source_hash(), **_versions(), **_toolchain()}


def environment_key(values: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


@functools.cache
def kernel_cache() -> KernelCache:
    """The process's cache, configured by the environment (:func:`default_cache_config`)."""
    config = default_cache_config()
    return KernelCache(config, environment_key(environment()) if config.directory is not None else "")


# -- what the launcher calls -----------------------------------------------------------------------

_LOCK = threading.RLock()


def kernel_identity(kernel: Any) -> str | None:
    """The identity of a kernel object the launchers compile (one with ``py_func`` and ``signature``: an
    :class:`~baracuda_numba.kernels.elementwise.ElementwiseKernel` or a
    :class:`~baracuda_numba.kernels.linear.sm90a.HopperKernel`), or None."""
    py_func, signature = getattr(kernel, "py_func", None), getattr(kernel, "signature", None)
    if not isinstance(py_func, types.FunctionType) or not isinstance(signature, str):
        return None
    body = fingerprint(py_func)
    if body is None:
        return None
    options = fingerprint_value(getattr(kernel, "options", ()))
    if options is None:
        return None
    return "\n".join((type(kernel).__qualname__, py_func.__qualname__, signature, options, body))


def fingerprint_value(value: Any) -> str | None:
    try:
        return _describe(value, {}, 0)
    except (Unfingerprintable, RecursionError):
        return None


def kernel_function(compile_kernel: Callable[[], Any], cache: KernelCache | None = None) -> tuple[int, int]:
    """``(handle, static shared bytes)`` of the kernel ``compile_kernel`` compiles (a launcher's bound
    ``compiled`` method), loaded in the current context: from ``cache`` (default :func:`kernel_cache`) where it
    holds the kernel for the current device, else compiled and then stored."""
    from numba import cuda

    cache = kernel_cache() if cache is None else cache
    kernel = getattr(compile_kernel, "__self__", None)
    identity = kernel_identity(kernel) if cache.enabled and kernel is not None else None
    if cache.enabled and kernel is not None and identity is None:
        cache.stats.uncacheable += 1
    if identity is None:
        return _compiled_function(compile_kernel())
    hopper = hasattr(kernel, "kernel_handle")
    capability = tuple(cuda.get_current_device().compute_capability) + (("a",) if hopper else ())
    key = cache.key(identity, capability)
    loaded_key = (key, _context_key())
    with _LOCK:  # launchers of many plans share a kernel: loaded once per context
        found = _LOADED.get(loaded_key)
        if found is not None:
            return found
        image = cache.load(key)
        if image is not None:
            cache.stats.hits += 1
            found = _load_image(image)
        else:
            cache.stats.misses += 1
            compiled = compile_kernel()
            image = _image_of(compiled, hopper)
            if image is not None:
                cache.store(key, image)
            found = _compiled_function(compiled)
        _LOADED[loaded_key] = found
        return found


_LOADED: dict[tuple[str, int], tuple[int, int]] = {}  # (entry, context) -> (handle, static shared bytes)


def _context_key() -> int:
    from numba import cuda

    handle = cuda.current_context().handle
    return int(getattr(handle, "value", handle) or 0)


def _compiled_function(compiled: Any) -> tuple[int, int]:
    """``(handle, static shared bytes)`` of a compiled kernel in the current context."""
    if hasattr(compiled, "kernel_handle"):  # loaded outside numba's dispatcher (kernels.linear.sm90a)
        return compiled.kernel_handle()
    overload = next(iter(compiled.overloads.values()))
    return int(overload._codelibrary.get_cufunc().handle), overload.shared_mem_per_block


def _image_of(compiled: Any, hopper: bool) -> CachedImage | None:
    """What a compiled kernel stores: the PTX of a Hopper kernel, the cubin numba linked for the current device
    (None where the kernel links anything beyond its own code, which the image would not carry)."""
    if hopper:
        ptx = compiled.ptx()
        return CachedImage("ptx", compiled.entry_name(), ptx.encode())
    overload = next(iter(compiled.overloads.values()))
    library = overload._codelibrary
    if library._setup_functions or library._linking_files or getattr(library, "needs_cudadevrt", False):
        return None
    cubin = library.get_cubin()
    code = getattr(cubin, "code", cubin)
    return CachedImage("cubin", library._entry_name, bytes(code))


def _load_image(image: CachedImage) -> tuple[int, int]:
    """Load a cached image into the current context (numba's context keeps the module): its kernel's handle and
    static shared bytes."""
    from numba import cuda

    context = cuda.current_context()
    if image.kind == "ptx":
        module = context.create_module_ptx(image.image)
    else:
        from cuda.core import ObjectCode

        module = context.create_module_image(ObjectCode.from_cubin(image.image, name=image.name))
    function = module.get_function(image.name)
    return int(function.handle), int(function.attrs.shared)
