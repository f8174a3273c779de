"""Name -> plugin registries shared by workloads, environments and policies.

A registry refuses a second plugin under a name already taken, and answers an
unknown name with the list of valid ones, so that a typo in a plan gets a fix and
not a KeyError. Third-party plugins arrive through the entry point group given to
the registry (``virtlab.workloads``, ``virtlab.environments``); one that cannot be loaded is kept
aside with the reason (``broken``), so that it costs only the plans that name it. A built-in plugin
whose optional Python package is not installed (``scripts/setup.sh --study`` leaves out the
Kubernetes client, for one) is kept aside the same way (``unavailable``), as a fact of the
installation rather than an error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Generic, TypeVar

from virtlab.errors import INSTALL_OPTIONAL_PARTS, InputError

T = TypeVar("T")


class UnknownPluginError(LookupError):
    """A name that no plugin of this kind is registered under."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        self.kind, self.name, self.valid = kind, name, valid
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(valid) or '(none)'}")


class PluginLoadError(InputError):
    """A third-party plugin whose entry point cannot be loaded (its module fails to import, or has
    no such attribute): the plugin, its package and the error, and how to get rid of it."""

    def __init__(self, kind: str, entry_point: metadata.EntryPoint, error: BaseException) -> None:
        dist = entry_point.dist
        package = f"{dist.name} {dist.version}" if dist is not None else "an unknown package"
        super().__init__(
            f"{kind} plugin {entry_point.name!r}",
            f"cannot be loaded from {entry_point.value} (entry point of {package}): "
            f"{type(error).__name__}: {error}",
            f"fix or reinstall it, or remove it: pip uninstall {dist.name if dist is not None else '...'}",
        )


class MissingDependencyError(InputError):
    """A built-in plugin whose module needs a Python package this installation lacks."""

    def __init__(self, kind: str, name: str, package: str) -> None:
        self.package = package
        super().__init__(
            f"{kind} {name!r}",
            f"needs the Python package {package!r}, which is not installed",
            INSTALL_OPTIONAL_PARTS,
        )


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self._entry_point_group = entry_point_group
        self._plugins: dict[str, T] = {}
        self._lazy: dict[str, str] = {}
        self._broken: dict[str, PluginLoadError] = {}
        self._unavailable: dict[str, MissingDependencyError] = {}
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
        """The plugin called ``name``; UnknownPluginError when there is none, PluginLoadError
        (an InputError) when it is a third-party plugin that cannot be loaded."""
        self._load_entry_points()
        if name in self._broken:
            raise self._broken[name]
        if name in self._unavailable:
            raise self._unavailable[name]
        if name not in self._plugins and name in self._lazy:
            module_name, _, attribute = self._lazy[name].partition(":")
            try:
                # Importing the module registers the plugin under its own name.
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as error:
                package = (error.name or "").partition(".")[0]
                if package in ("", "virtlab"):
                    raise  # virtlab's own module missing is a bug, not an installation's choice
                self._unavailable[name] = MissingDependencyError(self.kind, name, package)
                raise self._unavailable[name] from None
            self._plugins.setdefault(name, getattr(module, attribute))
        try:
            return self._plugins[name]
        except KeyError:
            raise UnknownPluginError(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        """Every plugin's name, the ones that cannot be loaded too (``get`` says why)."""
        self._load_entry_points()
        return sorted({*self._plugins, *self._lazy, *self._broken})

    def broken(self) -> list[PluginLoadError]:
        """The third-party plugins that cannot be loaded, each with its reason."""
        self._load_entry_points()
        return [self._broken[name] for name in sorted(self._broken)]

    def unavailable(self) -> list[MissingDependencyError]:
        """The built-in plugins found so far to need a Python package that is not installed
        (iterating the registry finds them all)."""
        return [self._unavailable[name] for name in sorted(self._unavailable)]

    def __iter__(self) -> Iterator[tuple[str, T]]:
        """Every plugin that can be loaded, by name (``broken`` and ``unavailable`` list the others)."""
        for name in self.names():
            if name in self._broken:
                continue
            try:
                plugin = self.get(name)
            except MissingDependencyError:
                continue
            yield name, plugin

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._plugins or name in self._lazy or name in self._broken

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or self._entry_point_group is None:
            return
        self._entry_points_loaded = True
        for entry_point in metadata.entry_points(group=self._entry_point_group):
            if entry_point.name in self._plugins or entry_point.name in self._lazy:
                continue
            try:
                plugin = entry_point.load()
            except Exception as error:  # a third party's import: anything may go wrong in it
                self._broken[entry_point.name] = PluginLoadError(self.kind, entry_point, error)
                continue
            self.add(entry_point.name, plugin)
