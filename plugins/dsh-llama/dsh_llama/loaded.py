"""llama.cpp in this process: importing it, loading each model once, what it can do.

:func:`import_llama` imports ``llama_cpp`` or says how to install it. :func:`load` loads a
GGUF file with its settings on first use (seconds) and keeps the :class:`Loaded` model for the
rest of the process, shared by every adapter and run that uses it (its lock serialises
completions: llama.cpp contexts are not thread-safe); :func:`clear_cache` frees them all at
interpreter exit. :func:`takes_tools` says whether a loaded model's chat format reads
``tools``.
"""

from __future__ import annotations

import atexit
import threading
from pathlib import Path
from typing import Any

import attrs

from dsh.core.errors import ConfigError
from dsh_llama.settings import LlamaSettings
from dsh_llama.settings import missing_llama_message
from dsh_llama.settings import pip_command

#: llama-cpp-python chat formats that read ``tools`` and return native tool calls.
TOOL_FORMATS = frozenset({"chatml-function-calling", "functionary", "functionary-v1",
                          "functionary-v2"})


def import_llama() -> Any:
    """The ``llama_cpp`` module, or a :class:`ConfigError` saying how to install it."""
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(missing_llama_message()) from None
    except (OSError, RuntimeError) as exc:  # installed, but its shared library cannot load
        again = pip_command("--force-reinstall", "--no-cache-dir", repr("llama-cpp-python>=0.3"))
        raise ConfigError(
            f"local model: llama-cpp-python is installed but cannot load llama.cpp: {exc}. "
            f"Reinstall it: `{again}`"
        ) from None
    return llama_cpp


# --------------------------------------------------------------------------------------------
# Loaded models, once per process
# --------------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Loaded:
    """A loaded ``Llama`` and what was learnt about it. ``lock`` serialises its use."""

    llm: Any
    path: Path
    native_tools: bool
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    closed: bool = False


_loaded: dict[tuple[Any, ...], Loaded] = {}
_load_lock = threading.Lock()


def load(path: Path, settings: LlamaSettings) -> Loaded:
    """The ``Llama`` for ``path`` and these settings, loaded on first use (seconds) and kept
    for the rest of the process."""
    key = (str(path.resolve()), settings.n_ctx, settings.n_threads, settings.n_gpu_layers,
           settings.chat_format)
    with _load_lock:
        found = _loaded.get(key)
        if found is None:
            llama_cpp = import_llama()
            try:
                llm = llama_cpp.Llama(
                    model_path=str(path), n_ctx=settings.n_ctx, n_threads=settings.n_threads,
                    n_gpu_layers=settings.n_gpu_layers, chat_format=settings.chat_format,
                    verbose=settings.verbose,
                )
            except (ValueError, RuntimeError, OSError) as exc:
                raise ConfigError(f"local model: llama.cpp cannot load {path}: {exc}") from None
            _check_chat_format(llama_cpp, llm, settings.chat_format, path)
            if not _loaded:
                # Free the models while llama_cpp still exists: left to the garbage collector
                # at interpreter exit, Llama.__del__ fails noisily on a torn-down module.
                atexit.register(clear_cache)
            found = _loaded[key] = Loaded(llm, path, takes_tools(llm))
    return found


def _check_chat_format(llama_cpp: Any, llm: Any, fmt: str | None, path: Path) -> None:
    if fmt is None or fmt in getattr(llm, "_chat_handlers", {}):
        return
    try:
        llama_cpp.llama_chat_format.get_chat_completion_handler(fmt)
    except Exception:
        raise ConfigError(
            f"local model: unknown chat_format {fmt!r} for {path} (see llama-cpp-python's "
            "llama_chat_format for the names, or leave it unset to use the GGUF's template)"
        ) from None


def takes_tools(llm: Any) -> bool:
    """True when the model's chat format reads ``tools`` (and ``tool`` messages).

    That is a llama-cpp-python function-calling format, or a GGUF chat template (used when
    ``chat_format`` is unset) that mentions ``tools``. SmolLM2's template does not.
    """
    if getattr(llm, "chat_handler", None) is not None:
        return False
    fmt = getattr(llm, "chat_format", None) or ""
    if fmt in TOOL_FORMATS:
        return True
    if fmt.startswith("chat_template."):
        name = fmt[len("chat_template."):]
        meta = getattr(llm, "metadata", {}) or {}
        key = "tokenizer.chat_template" + ("" if name == "default" else "." + name)
        return "tools" in str(meta.get(key, ""))
    return False


def clear_cache() -> None:
    """Free every loaded model (run at interpreter exit). Adapters that held one load the
    file again on their next request."""
    with _load_lock:
        models = list(_loaded.values())
        _loaded.clear()
    for m in models:
        locked = m.lock.acquire(timeout=5)  # let a completion in flight finish first
        try:
            m.closed = True
            close = getattr(m.llm, "close", None)
            if close is not None:
                close()
        except Exception:  # noqa: BLE001 - freeing at exit must not raise
            pass
        finally:
            if locked:
                m.lock.release()
