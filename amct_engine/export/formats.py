"""The deploy-format table: every `deploy_format` a `save_*` call, a job or the CLI accepts.

Torch-free on purpose: the API and the CLI list the formats (OpenAPI enum, `--deploy-format`
choices) without importing torch. Each entry names the object that writes, finalises and checks
that format (loaded on first use). Adding a format is one `register_deploy_format` call plus that
object (docs/architecture.md, "Add a deploy format").
"""

from __future__ import annotations

from dataclasses import dataclass

from amct_engine.registry import Registry, load_object


@dataclass(frozen=True)
class DeployFormatEntry:
    name: str  # the `deploy_format` value
    summary: str  # one line for the OpenAPI description and `--help`
    implementation: str  # "package.module:object": the format's writer, finaliser and reference check

    def load(self):
        return load_object(self.implementation)


DEPLOY_FORMATS: Registry[DeployFormatEntry] = Registry("deploy format")


def register_deploy_format(entry: DeployFormatEntry, *, replace: bool = False) -> DeployFormatEntry:
    return DEPLOY_FORMATS.register(entry.name, entry, replace=replace)


register_deploy_format(DeployFormatEntry(
    "onnx", "integer model for onnxruntime (QuantizeLinear, integer Conv/MatMul kernels, int32 bias)",
    "amct_engine.export.save:ONNX_DEPLOY"))
register_deploy_format(DeployFormatEntry(
    "ascend", "AMCT's layout for the ATC converter (AscendQuant/AscendDequant, INT8 weights, UINT64 dequant param)",
    "amct_engine.export.save:ASCEND_DEPLOY"))
