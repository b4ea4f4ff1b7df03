"""What a ``[models.ID]`` table of a built-in adapter may hold, checked when the config is read
(docs/config.md, "Validation rules"; docs/models.md, "Settings").

The built-in HTTP adapters (``openai``, ``anthropic``, ``openai-responses``) read a fixed set of
settings, so any other key there is a typo the adapter would silently ignore
(``temprature = 0.2``). Request options are open-ended (an OpenAI-compatible server takes
fields of its own), so an option is refused only when it is not a known name but is close to
one (``temprature`` → ``temperature``). Another adapter's table is its own to check. This
module knows the adapters' settings without importing them: :mod:`dsh.config` sits below
:mod:`dsh.llm` (tests/test_config_validate_more.py checks the lists against the adapters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dsh.core.errors import ConfigError

#: ``[models.ID]`` keys dsh reads for every adapter.
DSH_KEYS = ("adapter", "model", "options", "price", "context_window", "attachments")
#: Keys every built-in HTTP adapter reads (dsh/llm/http).
HTTP_KEYS = ("base_url", "api_key_env", "api_key", "api_key_name", "headers", "timeout",
             "connect_timeout", "retries", "retry_base", "retry_cap", "max_retry_wait")
#: The built-in HTTP adapters and their own keys.
ADAPTER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("schema_dialect", "reasoning_replay"),
    "openai-responses": (),
    "anthropic": ("cache",),
}
#: Request options of the built-in adapters' APIs and of common OpenAI-compatible servers: a
#: key close to one of these (and not one itself) is a typo.
KNOWN_OPTIONS = frozenset({
    # chat completions
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stop", "seed",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
    "response_format", "tool_choice", "parallel_tool_calls", "user", "reasoning_effort",
    "service_tier", "store", "metadata", "modalities", "audio", "prediction",
    "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier",
    # Responses API
    "max_output_tokens", "reasoning", "text", "truncation", "include", "background",
    "max_tool_calls",
    # Anthropic messages
    "top_k", "stop_sequences", "thinking", "cache",
    # OpenAI-compatible servers (llama.cpp, vLLM, Ollama, LM Studio)
    "min_p", "typical_p", "repetition_penalty", "repeat_penalty", "repeat_last_n", "tfs_z",
    "mirostat", "mirostat_tau", "mirostat_eta", "n_predict", "cache_prompt", "num_ctx",
    "keep_alive", "chat_template_kwargs", "guided_json", "guided_regex", "guided_choice",
    "min_tokens", "best_of", "length_penalty", "ignore_eos", "dry_multiplier",
    # dsh's own
    "reasoning_replay",
})


def adapter_of(model_id: str, settings: Mapping[str, Any] | None) -> str:
    """The adapter prefix ``model_id`` is served by: its table's ``adapter``, else the id's
    ``prefix:``."""
    adapter = (settings or {}).get("adapter")
    return adapter if isinstance(adapter, str) else model_id.partition(":")[0]


def check_model_keys(model_id: str, settings: Mapping[str, Any], where: str, key: str,
                     line_of: Any) -> None:
    """A :class:`ConfigError` for a ``base_url`` without a scheme (any adapter), an unknown
    key of a built-in adapter's table, or a misspelt option of one."""
    base = settings.get("base_url")
    if isinstance(base, str) and base and "://" not in base:
        fix = "http://" + base.lstrip("/")
        raise ConfigError(f"{where}{line_of('base_url')}: key '{key}.base_url': expected an "
                          f"http(s) URL, got {base!r} (no scheme); did you mean {fix!r}?")
    adapter = adapter_of(model_id, settings)
    if adapter not in ADAPTER_KEYS:
        return
    valid = (*DSH_KEYS, *HTTP_KEYS, *ADAPTER_KEYS[adapter])
    for name in settings:
        if name in valid:
            continue
        import difflib

        near = difflib.get_close_matches(name, valid, n=1)
        option = near_option(name) if not near else None
        if name in KNOWN_OPTIONS or option:
            hint = (f"; did you mean 'options.{option or name}'? (request options go in the "
                    f"model's options table: {key}.options)")
        elif near:
            hint = f"; did you mean {near[0]!r}?"
        else:
            hint = f"; the {adapter} adapter reads: {', '.join(valid)}"
        raise ConfigError(f"{where}{line_of(name)}: unknown key '{key}.{name}'{hint}")
    check_options(settings.get("options"), where, f"{key}.options", line_of)


def check_options(options: Any, where: str, key: str, line_of: Any) -> None:
    """A :class:`ConfigError` for an option of a built-in adapter that is not a known one but
    is close to one (``temprature``)."""
    if not isinstance(options, Mapping):
        return
    for name in options:
        near = near_option(name) if isinstance(name, str) else None
        if near:
            raise ConfigError(f"{where}{line_of(name)}: unknown option '{key}.{name}'; did "
                              f"you mean {near!r}? (a key the API does not know is sent "
                              "as it is and ignored or refused by the server)")


def near_option(name: str) -> str | None:
    """The known option ``name`` is a misspelling of, or ``None`` (a known option, or a name
    close to none: a server's own field)."""
    if name in KNOWN_OPTIONS or not re.fullmatch(r"[A-Za-z_]+", name):
        return None
    import difflib

    near = difflib.get_close_matches(name, KNOWN_OPTIONS, n=1, cutoff=0.85)
    return near[0] if near else None
