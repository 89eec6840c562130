"""The disk cache of compiled kernels (:mod:`baracuda_numba.cache`): its configuration, its files (whole entries or
none, concurrent writers, corruption read as a miss, clearing), the kernels' fingerprints (stable across builds,
distinct across configurations) and the launcher's use of it (a hit loads without compiling). Real kernels are
built with ``NUMBA_ENABLE_CUDASIM=0`` in a child process (no GPU needed to build their functions); loading a
cubin needs a GPU (``tests/test_cache_gpu.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

from baracuda_numba import cache as kc
from baracuda_numba.cache import CacheConfig, CachedImage, KernelCache

ROOT = Path(__file__).resolve().parents[1]


def _cache(tmp_path, environment="env-1"):
    return KernelCache(CacheConfig(tmp_path / "cache"), environment)


def test_configuration_from_the_environment(tmp_path):
    assert kc.default_cache_config({"HOME": "/h"}).directory is not None
    assert kc.default_cache_config({"XDG_CACHE_HOME": "/x"}).directory == Path("/x/baracuda-numba")
    assert kc.default_cache_config({"BARACUDA_CACHE_DIR": str(tmp_path)}).directory == tmp_path
    assert kc.default_cache_config({"BARACUDA_CACHE_DIR": "~/k"}).directory == Path("~/k").expanduser()
    for off in ("off", "", "0", "OFF "):
        config = kc.default_cache_config({"BARACUDA_CACHE_DIR": off, "XDG_CACHE_HOME": "/x"})
        assert config.directory is None
        assert not KernelCache(config, "").enabled
        assert KernelCache(config, "").store("k", CachedImage("cubin", "f", b"x")) is False


def test_entries_round_trip_and_a_damaged_one_is_a_miss(tmp_path):
    cache = _cache(tmp_path)
    key = cache.key("identity", (9, 0))
    assert cache.load(key) is None and cache.stats.corrupt == 0
    image = CachedImage("cubin", "_Z6kernel", bytes(range(256)) * 40)
    assert cache.store(key, image)
    assert cache.load(key) == image
    assert [p.name for p in cache.entries()] == [f"{key}.bin"]
    assert not list((tmp_path / "cache" / "kernels").glob("*.tmp"))  # written to a temporary file, renamed
    data = cache.path(key).read_bytes()
    for damaged in (data[:-1], data[:-1] + b"\x00", b"other" + data, data[:40], b""):
        cache.path(key).write_bytes(damaged)
        assert cache.load(key) is None
    assert cache.stats.corrupt == 5
    assert cache.store(key, image) and cache.load(key) == image  # rewritten whole


def test_keys_separate_kernels_devices_and_environments(tmp_path):
    one, other = _cache(tmp_path, "env-1"), _cache(tmp_path, "env-2")
    keys = {one.key("a", (9, 0)), one.key("b", (9, 0)), one.key("a", (8, 0)), one.key("a", (9, 0, "a")),
            other.key("a", (9, 0))}
    assert len(keys) == 5
    assert one.key("a", (9, 0)) == _cache(tmp_path, "env-1").key("a", (9, 0))


def test_concurrent_writers_of_one_entry_leave_it_whole(tmp_path):
    cache = _cache(tmp_path)
    key = cache.key("identity", (9, 0))
    image = CachedImage("ptx", "kernel", b".version 8.0\n" * 5000)
    errors = []

    def write():
        try:
            for _ in range(20):
                cache.store(key, image)
                found = cache.load(key)
                assert found is None or found == image
        except AssertionError as exc:  # pragma: no cover (the failure this test looks for)
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and cache.load(key) == image and cache.stats.corrupt == 0
    assert not list((tmp_path / "cache" / "kernels").glob("*.tmp"))


def test_clear_deletes_every_entry(tmp_path):
    cache = _cache(tmp_path)
    for i in range(3):
        cache.store(cache.key(str(i), (9, 0)), CachedImage("cubin", "f", b"x"))
    (tmp_path / "cache" / "kernels" / ".left.tmp").write_bytes(b"partial")
    assert cache.clear() == 3 and cache.entries() == []
    assert not any((tmp_path / "cache" / "kernels").iterdir())


def _factory(scale, shift):
    def helper(x):
        return x * scale

    def kernel(out, x):
        out[0] = helper(x[0]) + shift

    return kernel


class _Opaque:
    pass


def test_fingerprints_follow_the_code_and_the_closed_over_values():
    same = [kc.fingerprint(_factory(2.0, 1)) for _ in range(2)]
    assert same[0] is not None and same[0] == same[1]  # rebuilt: the same fingerprint
    assert kc.fingerprint(_factory(3.0, 1)) != same[0]  # a value two frames down
    assert kc.fingerprint(_factory(2.0, 2)) != same[0]
    assert kc.fingerprint(_factory(2.0, 1.0)) != same[0]  # 1 and 1.0 compile differently

    def opaque_kernel(out):
        out[0] = opaque

    opaque = _Opaque()
    assert kc.fingerprint(opaque_kernel) is None  # no stable description: never cached

    def recursive(n):
        return 0 if n == 0 else recursive(n - 1)

    assert kc.fingerprint(recursive) is not None


def test_a_hit_loads_without_compiling_and_a_miss_compiles_then_stores(tmp_path, monkeypatch):
    """:func:`kernel_function`, what every launcher calls for a kernel's handle."""
    cache = _cache(tmp_path)
    compiled, loaded = [], []

    class Kernel:
        py_func, signature, options = staticmethod(_factory(2.0, 1)), "void(float32[::1], float32[::1])", ()

        def compiled(self):
            compiled.append(1)
            return types.SimpleNamespace(image=CachedImage("cubin", "_Z6kernel", b"cubin bytes"))

    monkeypatch.setattr(kc, "_image_of", lambda built, hopper: built.image)
    monkeypatch.setattr(kc, "_compiled_function", lambda built: (0xF00, 48))
    monkeypatch.setattr(kc, "_load_image", lambda image: loaded.append(image) or (0xF01, 48))
    contexts = iter(range(100))
    monkeypatch.setattr(kc, "_context_key", lambda: next(contexts))  # each call another context (process)
    kernel = Kernel()
    assert kc.kernel_function(kernel.compiled, cache) == (0xF00, 48)
    assert compiled == [1] and loaded == [] and cache.stats.misses == 1 and cache.stats.stores == 1
    assert kc.kernel_function(Kernel().compiled, cache) == (0xF01, 48)  # another process: the same kernel rebuilt
    assert compiled == [1] and loaded == [CachedImage("cubin", "_Z6kernel", b"cubin bytes")]
    assert cache.stats.hits == 1
    off = KernelCache(CacheConfig(None), "")
    assert kc.kernel_function(kernel.compiled, off) == (0xF00, 48) and compiled == [1, 1]
    opaque = _Opaque()
    Kernel.py_func = staticmethod(lambda out: opaque)  # cannot be fingerprinted: compiled, not stored
    assert kc.kernel_function(Kernel().compiled, cache) == (0xF00, 48)
    assert compiled == [1, 1, 1] and cache.stats.uncacheable == 1 and cache.stats.stores == 1
    monkeypatch.setattr(kc, "_context_key", lambda: -1)  # one context: a kernel loads once, whatever the launchers
    Kernel.py_func = staticmethod(_factory(2.0, 1))
    for _ in range(3):
        assert kc.kernel_function(Kernel().compiled, cache) == (0xF01, 48)
    assert cache.stats.hits == 2 and len(loaded) == 2


_CHILD = r"""
import json, sys
from dataclasses import replace
from baracuda_numba import cache
from baracuda_numba.kernels.linear import clear_kernel_caches, gemm_kernel
from baracuda_numba.plans.linear import H100_SXM, H100_TUNING, choose
from baracuda_numba.plans.base import DEFAULT_PREFERENCE
import baracuda_numba as bn

E = bn.ElementKind
configs = []
for m, n, k, static in ((1, 4096, 4096, False), (1, 11008, 4096, False), (16, 4096, 11008, False),
                        (2048, 4096, 4096, False), (4, 4096, 4096, True)):
    for device in (H100_SXM, replace(H100_SXM, sm90a=True)):
        desc = bn.QuantizedLinearDescriptor(m, n, k, E.BF16, E.BF16, False, True, static)
        spec = choose(desc, device, H100_TUNING, DEFAULT_PREFERENCE, 4096, "x")
        configs += [launch.config for _, launch in spec.variants]
        if spec.static_quantizer is not None:
            configs.append(spec.static_quantizer.config)
configs = list(dict.fromkeys(configs))
from baracuda_numba.kernels import dynamic, elementwise
from baracuda_numba.plans.tuning import H100_TUNING as H100_MEMORY_TUNING
from baracuda_numba.vocabulary import MathPrecision


def others():
    d = H100_MEMORY_TUNING.dynamic
    quantizer = dynamic.dynamic_kernels(E.BF16, E.S8, MathPrecision.F32, True, d.keep, d.threads, tuning=d.kernel)
    fake = elementwise.elementwise_kernel(elementwise.ElementwiseOp.FAKE_QUANTIZE, E.BF16, None, E.BF16,
                                          MathPrecision.F32, elementwise.ScaleMode.ROWS,
                                          tuning=H100_MEMORY_TUNING.elementwise.kernel)
    return [quantizer.segment, quantizer.fixed, quantizer.partial, fake]


names = [c.name for c in configs] + [k.py_func.__name__ for k in others()]
first = [cache.kernel_identity(gemm_kernel(c)) for c in configs] + [cache.kernel_identity(k) for k in others()]
clear_kernel_caches()
dynamic.dynamic_kernels.cache_clear()
elementwise._elementwise_kernel.cache_clear()
second = [cache.kernel_identity(gemm_kernel(c)) for c in configs] + [cache.kernel_identity(k) for k in others()]
print(json.dumps({"names": names, "first": first, "second": second}))
"""


def _identities(seed: str) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # keeps the caller's NumPy
    environ = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=path, PYTHONHASHSEED=seed)
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=environ, cwd=ROOT,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_every_w8a8_kernel_is_fingerprinted_the_same_in_every_build_and_process():
    """The kernels the W8A8 chooser picks (decode, prefill, sm_90a, static), the per-token quantizer's and a fused
    fake quantize, built for a GPU: each has an identity (so the cache holds it), the same after the factories'
    caches are cleared and the kernels rebuilt, and in another process (another hash seed); distinct
    configurations have distinct identities."""
    found = _identities("1")
    names, first, second = found["names"], found["first"], found["second"]
    assert len(names) >= 12
    assert all(identity is not None for identity in first), [n for n, i in zip(names, first, strict=True) if not i]
    assert first == second
    assert len(set(first)) == len(first)
    assert _identities("2")["first"] == first
