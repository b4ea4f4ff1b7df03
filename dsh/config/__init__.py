"""Configuration: the TOML file, its strict loading, its editing, and stored API keys.

``loader`` (TOML → attrs classes through a strict cattrs converter), ``edit`` (``dsh config
init|set``) and ``keys`` (the key store behind ``dsh keys``).

May import: :mod:`dsh.core`, :mod:`dsh.host` (``Limits``). Never the ledger, a provider, the
run or the screen.

``dsh.config`` was one module before 0.3: its names (``load_config``, ``Config``…) still resolve
here, from :mod:`dsh.config.loader`, deprecated (CHANGELOG.md's deprecation policy).
"""

from dsh._compat import package_getattr

__getattr__ = package_getattr(__name__, "dsh.config.loader",
                              frozenset({"loader", "edit", "keys"}))
