"""Keyword arguments of `plan`, `tune` and `frontier` rendered as the CLI's option texts, so the
one parser behind both front ends checks them and its errors name the option."""

from __future__ import annotations

import numbers
import os
from typing import Any, Dict, Mapping, Optional, Sequence

from ._errors import Error


def _number(option: str, key: str, value: Any) -> str:
    """`value` as the CLI's text of it: a whole number as one (`0`, not `0.0`), so that the
    library's message about it reads as the CLI's for the same input."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Error(f"option {option}: `{value!r}` is not a number (key `{key}`)")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    return repr(float(value))


def key_values(option: str, values: Optional[Mapping[str, Any]]) -> Optional[str]:
    """`{"F": 1, "comm": 0.1}` -> `"F=1.0,comm=0.1"` (keys checked by the CLI's parser)."""
    if values is None:
        return None
    if not isinstance(values, Mapping):
        raise Error(f"option {option}: expected a dict of key: number, got {type(values).__name__}")
    parts = []
    for key, value in values.items():
        if not isinstance(key, str) or not key or any(c in key for c in ",="):
            raise Error(f"option {option}: `{key!r}` is not a key")
        parts.append(f"{key}={_number(option, key, value)}")
    return ",".join(parts)


def whole(option: str, value: Any, *, low: int = 1) -> int:
    """A whole number >= `low` (not a bool), or an `Error` naming the option."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise Error(f"option {option}: `{value!r}` is not a whole number")
    value = int(value)
    if value < low or value > 2**32 - 1:
        raise Error(f"option {option}: {value} must be between {low} and {2**32 - 1}")
    return value


# The widest count the native module takes: beyond it, a count is as out of range as any.
_WIDEST = 2**127 - 1


def size(value: Any, option: str) -> int:
    """A count the library range-checks (`ranks`, `microbatches`): any whole number (not a
    bool), so that its range error is the CLI's line for the same number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise Error(f"option {option}: `{value!r}` is not a whole number")
    return max(-_WIDEST, min(_WIDEST, int(value)))


def counts(option: str, values: Optional[Sequence[Any]]) -> Optional[list]:
    """A list of whole numbers >= 0, or None."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise Error(f"option {option}: expected a list of whole numbers, got {type(values).__name__}")
    return [whole(option, v, low=0) for v in values]


def limit_text(value: Any) -> Optional[str]:
    """Units (a number) or bytes (`"2GiB"`), as `--memory-limit` takes them."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return _number("--memory-limit", "memory_limit", value)


def request(
    ranks: Any,
    microbatches: Any,
    *,
    costs: Optional[Mapping[str, Any]] = None,
    activation_memory: Optional[Mapping[str, Any]] = None,
    memory_limit: Any = None,
    profile: Any = None,
    layers_per_stage: Optional[Sequence[int]] = None,
    microbatch_tokens: Optional[Sequence[int]] = None,
    cores: Optional[int] = None,
    ranks_per_link: Optional[int] = None,
) -> Dict[str, Any]:
    """The request the native module takes: every key present."""
    from ._profile import Profile

    profile_json = profile_path = None
    if isinstance(profile, Profile):
        profile_json = profile.to_json()
    elif isinstance(profile, (str, os.PathLike)):
        profile_path = os.fspath(profile)
    elif profile is not None:
        raise Error(
            f"option --profile: expected a path or a pipeweave.Profile, got {type(profile).__name__}"
        )
    return {
        # Any whole number reaches the library, whose range check gives the CLI's message.
        "ranks": size(ranks, "--ranks"),
        "microbatches": size(microbatches, "--microbatches"),
        "costs": key_values("--costs", costs),
        "activation_memory": key_values("--activation-memory", activation_memory),
        "memory_limit": limit_text(memory_limit),
        "profile_json": profile_json,
        "profile_path": profile_path,
        "layers_per_stage": counts("--layers-per-stage", layers_per_stage),
        "microbatch_tokens": counts("--microbatch-tokens", microbatch_tokens),
        "cores": None if cores is None else whole("--cores", cores),
        # Zero reaches the library, whose check gives the CLI's message.
        "ranks_per_link": None if ranks_per_link is None else whole("--ranks-per-link", ranks_per_link, low=0),
    }
