"""The byte model: what one TP rank of a hybrid model must move, as vLLM sizes it.

Library entry points (the CLI is a thin layer over these)::

    config, name = load_config("nemotron-nano-12b-v2")
    model = size_model(geometry_from_config(config, name), SizingOptions(tp_size=4))
    rows = worksheet(model, [512, 4096], state_blocks=1)
"""

from hybridtrace.model.catalog import DEFAULT_MODEL, builtin_names, load_config
from hybridtrace.model.families import geometry_from_config, supported_architectures
from hybridtrace.model.geometry import ModelGeometry
from hybridtrace.model.sizing import ByteModel, SizingOptions, raw_byte_model, size_model
from hybridtrace.model.worksheet import WorksheetRow, crossover_tokens, worksheet


def byte_model_for(source: str, options: SizingOptions | None = None) -> ByteModel:
    """Byte model of a config path or built-in model name."""
    config, name = load_config(source)
    return size_model(geometry_from_config(config, name), options)


__all__ = [
    "DEFAULT_MODEL",
    "ByteModel",
    "ModelGeometry",
    "SizingOptions",
    "WorksheetRow",
    "builtin_names",
    "byte_model_for",
    "crossover_tokens",
    "geometry_from_config",
    "load_config",
    "raw_byte_model",
    "size_model",
    "supported_architectures",
    "worksheet",
]
