"""How the package finds the native libraries it needs (no GPU needed)."""
import ctypes

from flashattn import _lib


def test_cublas_of_nvidia_wheels_is_found_on_sys_path(tmp_path, monkeypatch):
    # The layouts of NVIDIA's wheels: nvidia/cublas/lib (CUDA 12) and nvidia/cu13/lib (CUDA 13).
    expected = []
    for sub, name in (("cublas", "libcublas.so.12"), ("cu13", "libcublas.so.13")):
        folder = tmp_path / "nvidia" / sub / "lib"
        folder.mkdir(parents=True)
        (folder / name).write_bytes(b"")
        expected.append(str(folder / name))
    (tmp_path / "nvidia" / "cu13" / "lib" / "libcublasLt.so.13").write_bytes(b"")
    loaded = []
    monkeypatch.setattr(ctypes, "CDLL", lambda path, *args, **kwargs: loaded.append(path))
    monkeypatch.setattr(_lib.sys, "path", [str(tmp_path / "absent"), str(tmp_path)])
    _lib._load_wheel_cublas.cache_clear()
    try:
        _lib._load_wheel_cublas()
    finally:
        _lib._load_wheel_cublas.cache_clear()
    assert sorted(loaded) == sorted(expected)
