"""`Profile`: measured layer costs (the `pipeweave-profile` JSON format that `plan --profile` and
`tune --profile` read), checked by the library when it is made."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Union

from . import _native
from ._errors import Error


class Profile:
    """A measured profile: per layer its forward, input-gradient and weight-gradient seconds and
    the activation bytes it keeps, and the seconds to send one activation.

    Made by `pipeweave.torch.profile(...)` (a PyTorch model), by `train_gpt --profile` (our GPT),
    or read with `Profile.load(path)` / `Profile.from_json(text)`. Passed to `pipeweave.plan`,
    `tune` and `frontier` as `profile=`. Every field of the JSON document is an attribute
    (`layers`, `send`, `model`, `threads_per_rank`, ...); `data` is the whole document.
    """

    def __init__(self, data: Dict[str, Any]):
        # Checked (and older formats converted) by the library: the one validation.
        self._data = json.loads(_native.profile_normalize(json.dumps(data)))

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        """A profile from its JSON text; `pipeweave.Error` says what is wrong with a bad one."""
        if not isinstance(text, str):
            raise Error(f"a profile's JSON is text, got {type(text).__name__}")
        try:
            data = json.loads(text)
        except ValueError as e:
            raise Error(f"not a profile: {e}") from None
        if not isinstance(data, dict):
            raise Error("not a profile: the JSON document is not an object")
        return cls(data)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Profile":
        """Reads a profile file."""
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise Error(f"{os.fspath(path)}: {e.strerror or e}") from None
        return cls.from_json(text)

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the profile as JSON (readable by `pipeweave plan --profile FILE`)."""
        with open(path, "w") as f:
            f.write(self.to_json())

    def to_json(self) -> str:
        """The profile as JSON text."""
        return json.dumps(self._data, indent=2)

    @property
    def data(self) -> Dict[str, Any]:
        """The whole document."""
        return self._data

    @property
    def layer_names(self) -> List[str]:
        """The layers' names, in order."""
        return [layer["name"] for layer in self._data["layers"]]

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("_data")
        if data is not None and name in data:
            return data[name]
        raise AttributeError(f"Profile has no field `{name}`")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and self._data == other._data

    def __repr__(self) -> str:
        layers = self._data.get("layers", [])
        return f"Profile({len(layers)} layers, format={self._data.get('format')!r})"
