"""Stand-in for PyAV (``av``) in the GPU check's bundle (scripts/gpu-bundle.sh says why).

ComfyUI imports ``av`` at start-up for reading and writing video files, which the GPU check never
does. Every name resolves to a placeholder class, so imports and annotations work; constructing
one raises, so any real use fails loudly instead of doing nothing."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder(type):
    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")

    def __call__(cls, *args: object, **kwargs: object) -> object:
        raise RuntimeError(f"av.{cls.__name__}: PyAV is not installed here (the GPU check's stand-in)")


def _placeholder(name: str) -> type:
    return _Placeholder(name, (Exception,), {})


def _module_getattr(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


__getattr__ = _module_getattr
sys.meta_path.insert(0, _SubmoduleFinder())
