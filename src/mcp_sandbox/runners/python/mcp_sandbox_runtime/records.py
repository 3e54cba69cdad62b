"""``record``: ``@dataclass(frozen=True, slots=True)`` for the frame classes, without importing ``dataclasses``.

Why not the real one: ``dataclasses`` imports ``inspect`` and ``ast``, which would make the
runner's start-up in a fresh sandbox half again as long. The type checker sees the real decorator; at run time
this builds the same thing for the simple classes of ``frames.py`` (a test pins the behaviour).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["record"]

if TYPE_CHECKING:
    from dataclasses import dataclass as record
else:

    def record(*, frozen: bool, slots: bool) -> Any:
        """What ``@dataclass(frozen=True, slots=True)`` makes of a class, without importing ``dataclasses``.

        ``dataclasses`` imports ``inspect`` and ``ast``, half again the runner's own start-up. The
        type checker sees the real decorator (above); this builds the same thing for the simple
        classes of frames.py: fields are the annotations (``ClassVar`` ones excepted), in order;
        a class attribute of a field's name is its default.
        """
        assert frozen and slots

        def build(cls: type) -> type:
            annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (inspect: the import avoided)
            names = tuple(name for name, kind in annotations.items() if not str(kind).startswith("ClassVar"))
            defaults = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
            namespace = {key: value for key, value in cls.__dict__.items() if key not in defaults}
            namespace.pop("__dict__", None)
            namespace.pop("__weakref__", None)
            namespace.update(__slots__=names, __match_args__=names)
            namespace.update(__init__=_init, __eq__=_eq, __hash__=_hash, __repr__=_repr)
            namespace.update(__setattr__=_frozen, __delattr__=_frozen, _defaults=defaults)
            return type(cls.__name__, cls.__bases__, namespace)

        return build

    def _init(self: Any, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} arguments, not {len(args)}")
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TypeError(f"{type(self).__name__} got an unexpected or repeated argument {name!r}")
            values[name] = value
        for name in names:
            if name not in values:
                if name not in self._defaults:
                    raise TypeError(f"{type(self).__name__} is missing the argument {name!r}")
                values[name] = self._defaults[name]
            object.__setattr__(self, name, values[name])

    def _values(self: Any) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def _eq(self: Any, other: object) -> Any:
        if other.__class__ is self.__class__:
            return _values(self) == _values(other)
        return NotImplemented

    def _hash(self: Any) -> int:
        return hash(_values(self))

    def _repr(self: Any) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__qualname__}({fields})"

    def _frozen(self: Any, *_: Any) -> None:
        raise AttributeError(f"a {type(self).__name__} frame cannot be changed")
