"""The weight-quantiser table: one entry per algorithm, read by the QAT layer and the config readers.

Torch-free on purpose: `amct_engine.config` reads the names and cfg fields without importing torch;
the QAT layer loads the class on first use. Adding an algorithm is one `register_weight_quantizer`
call plus its class (docs/architecture.md, "Add a weight quantiser"); a `.cfg` can only name it
once the retrain/distill proto has a field for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from amct_engine.registry import Registry, load_object


@dataclass(frozen=True)
class WeightQuantizerEntry:
    name: str  # the short name the engine uses ("arq", "ulq")
    retrain_field: str  # its field in retrain cfgs and the retrain JSON (`arq_retrain`)
    distill_field: str  # its field in distill cfgs and the distill JSON (`arq_distill`)
    implementation: str  # "package.module:Class", a WeightQuantizer subclass

    def quantizer_class(self) -> type:
        return load_object(self.implementation)


WEIGHT_QUANTIZERS: Registry[WeightQuantizerEntry] = Registry("weight quantizer")


def register_weight_quantizer(entry: WeightQuantizerEntry, *, replace: bool = False) -> WeightQuantizerEntry:
    return WEIGHT_QUANTIZERS.register(entry.name, entry, replace=replace)


def by_field(field: str) -> WeightQuantizerEntry:
    """The entry whose retrain or distill cfg/JSON field is `field`."""
    for entry in WEIGHT_QUANTIZERS.values():
        if field in (entry.retrain_field, entry.distill_field):
            return entry
    raise KeyError(field)


# docs/spec/engine.md §4.2: ARQ recomputes a symmetric scale from the weights each step; ULQ learns it.
register_weight_quantizer(
    WeightQuantizerEntry("arq", "arq_retrain", "arq_distill", "amct_engine.quant.arq:ArqWeightQuantizer")
)
register_weight_quantizer(
    WeightQuantizerEntry("ulq", "ulq_retrain", "ulq_distill", "amct_engine.quant.ulq_weight:UlqWeightQuantizer")
)
