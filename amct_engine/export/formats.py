"""The deploy-format table: every `deploy_format` a `save_*` call, a job or the CLI accepts.

Torch-free on purpose: the API and the CLI list the formats (OpenAPI enum, `--deploy-format`
choices) without importing torch. Each entry names the object that writes, finalises and checks
that format (an `amct_engine.export.onnx_formats.OnnxFormat`, loaded on first use). Adding a
format is one `register_deploy_format` call plus that object (docs/architecture.md, "Add a
deploy format").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amct_engine.registry import Registry, load_object


@dataclass(frozen=True)
class DeployFormatEntry:
    name: str  # the `deploy_format` value
    summary: str  # one line for the OpenAPI description and `--help`
    implementation: str  # "package.module:object": the format's writer, finaliser and reference check

    def load(self) -> Any:  # an amct_engine.export.onnx_formats.OnnxFormat
        return load_object(self.implementation)


DEPLOY_FORMATS: Registry[DeployFormatEntry] = Registry("deploy format")
DEFAULT_DEPLOY_FORMAT = "onnx"  # what every `save_*`, job and command writes unless told otherwise


def register_deploy_format(entry: DeployFormatEntry, *, replace: bool = False) -> DeployFormatEntry:
    return DEPLOY_FORMATS.register(entry.name, entry, replace=replace)


def check_deploy_format(name: object) -> DeployFormatEntry:
    """The entry of a `deploy_format` argument; ValueError naming the known formats otherwise."""
    if not isinstance(name, str) or name not in DEPLOY_FORMATS:
        raise ValueError(f"deploy_format: {DEPLOY_FORMATS.unknown_message(name)}")
    return DEPLOY_FORMATS[name]


register_deploy_format(
    DeployFormatEntry(
        DEFAULT_DEPLOY_FORMAT,
        "integer model for onnxruntime (QuantizeLinear, integer Conv/MatMul kernels, int32 bias)",
        "amct_engine.export.onnx_formats:ONNX_DEPLOY",
    )
)
register_deploy_format(
    DeployFormatEntry(
        "ascend",
        "AMCT's layout for the ATC converter (AscendQuant/AscendDequant, INT8 weights, UINT64 dequant param)",
        "amct_engine.export.onnx_formats:ASCEND_DEPLOY",
    )
)
