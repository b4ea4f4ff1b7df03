"""Tools (MISSION A3): the registry, JSON Schema from signatures, validation, the execute chain.

``registry`` (``tool``, ``ToolDef``, ``ToolInvocation``, the built-in ``dsh.tools`` plugin and
``HookDispatch``, the layer that runs ``pre_execute``/``post_execute``).

May import: :mod:`dsh.core`, :mod:`dsh.host`, :mod:`dsh.hookspecs`. Never a provider, the
run or the screen.

``dsh.tools`` was one module before 0.3: its names still resolve here, deprecated
(CHANGELOG.md's deprecation policy).
"""

from dsh._compat import package_getattr

__getattr__ = package_getattr(__name__, "dsh.tools.registry", frozenset({"registry"}))
