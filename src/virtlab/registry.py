"""Name -> plugin registries shared by workloads, environments and policies.

A registry refuses a second plugin under a name already taken, and answers an
unknown name with the list of valid ones, so that a typo in a plan gets a fix and
not a KeyError. Third-party plugins arrive through the entry point group given to
the registry (``virtlab.workloads``, ``virtlab.environments``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownPluginError(LookupError):
    """A name that no plugin of this kind is registered under."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        self.kind, self.name, self.valid = kind, name, valid
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(valid) or '(none)'}")


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self._entry_point_group = entry_point_group
        self._plugins: dict[str, T] = {}
        self._lazy: dict[str, str] = {}
        self._entry_points_loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(plugin: T) -> T:
            self.add(name, plugin)
            return plugin

        return decorator

    def add(self, name: str, plugin: T) -> None:
        if name in self._lazy and self._lazy[name].split(":")[0] == getattr(plugin, "__module__", None):
            self._plugins[name] = plugin
            return
        if name in self._plugins and self._plugins[name] is not plugin:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._plugins[name] = plugin

    def add_lazy(self, name: str, target: str) -> None:
        """Register ``module:attribute`` without importing it until a plan names it, so that a
        driver's dependencies (libvirt, QEMU bindings) are needed only where it is used."""
        if name in self._plugins or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._lazy[name] = target

    def get(self, name: str) -> T:
        self._load_entry_points()
        if name not in self._plugins and name in self._lazy:
            module_name, _, attribute = self._lazy[name].partition(":")
            # Importing the module registers the plugin under its own name.
            plugin = getattr(importlib.import_module(module_name), attribute)
            self._plugins.setdefault(name, plugin)
        try:
            return self._plugins[name]
        except KeyError:
            raise UnknownPluginError(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted({*self._plugins, *self._lazy})

    def __iter__(self) -> Iterator[tuple[str, T]]:
        for name in self.names():
            yield name, self.get(name)

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._plugins or name in self._lazy

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or self._entry_point_group is None:
            return
        self._entry_points_loaded = True
        for entry_point in metadata.entry_points(group=self._entry_point_group):
            if entry_point.name not in self._plugins:
                self.add(entry_point.name, entry_point.load())
