"""docs/configuration.md names every setting of `weir.config.Settings`: each field, as `name` with its environment
variable `WEIR_NAME`, and each field of a nested model under its path (`processors.<name>.trigger`)."""

from __future__ import annotations

import types
import typing
from pathlib import Path

from pydantic import BaseModel

from weir.config import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _models(annotation: object) -> list[tuple[str, type[BaseModel]]]:
    """The models an annotation holds, each with the path step it adds: "" for the model itself or an optional
    one, "<name>" for a table of models keyed by name, "<n>" for a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        return [(".<name>" + step, model) for step, model in _models(args[1])]
    if origin in (list, tuple, set, frozenset):
        return [(".<n>" + step, model) for arg in args if arg is not Ellipsis for step, model in _models(arg)]
    if origin in (typing.Union, types.UnionType):
        return [found for arg in args for found in _models(arg)]
    return []


def settings_names(model: type[BaseModel] = Settings, prefix: str = "") -> list[str]:
    """Every setting's path: `home`, `processors.<name>.trigger`, ..."""
    names = []
    for name, field in model.model_fields.items():
        path = prefix + name
        names.append(path)
        for step, nested in _models(field.annotation):
            names += settings_names(nested, f"{path}{step}.")
    return names


def test_every_setting_is_named_in_docs_configuration():
    text = PAGE.read_text()
    missing = [name for name in settings_names() if f"`{name}`" not in text]
    assert not missing, f"docs/configuration.md does not name these settings of weir.config.Settings: {missing}"


def test_every_top_level_setting_has_its_environment_variable_named():
    text = PAGE.read_text()
    missing = [f"WEIR_{name.upper()}" for name in Settings.model_fields if f"`WEIR_{name.upper()}`" not in text]
    assert not missing, f"docs/configuration.md does not name these environment variables: {missing}"


def test_nested_models_are_found():
    assert "processors.<name>.trigger" in settings_names()
    assert "processors.<name>.kafka_reader" in settings_names()
