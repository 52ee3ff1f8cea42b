from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INT4: _ClassVar[DataType]
    INT8: _ClassVar[DataType]
    INT16: _ClassVar[DataType]

class PruneGranularity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANNEL: _ClassVar[PruneGranularity]
    HEAD: _ClassVar[PruneGranularity]

class NOutOfMType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    M4N2: _ClassVar[NOutOfMType]
INT4: DataType
INT8: DataType
INT16: DataType
CHANNEL: PruneGranularity
HEAD: PruneGranularity
M4N2: NOutOfMType

class AMCTRetrainConfig(_message.Message):
    __slots__ = ("skip_layers", "skip_layer_types", "override_layer_configs", "override_layer_types", "batch_num", "retrain_data_quant_config", "retrain_weight_quant_config", "quant_skip_layers", "quant_skip_types", "prune_config", "regular_prune_skip_layers", "regular_prune_skip_types", "fakequant_precision_mode")
    class FakequantPrecisionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FORCE_FP16_QUANT: _ClassVar[AMCTRetrainConfig.FakequantPrecisionMode]
    FORCE_FP16_QUANT: AMCTRetrainConfig.FakequantPrecisionMode
    SKIP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    SKIP_LAYER_TYPES_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_LAYER_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_LAYER_TYPES_FIELD_NUMBER: _ClassVar[int]
    BATCH_NUM_FIELD_NUMBER: _ClassVar[int]
    RETRAIN_DATA_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    RETRAIN_WEIGHT_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    QUANT_SKIP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    QUANT_SKIP_TYPES_FIELD_NUMBER: _ClassVar[int]
    PRUNE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    REGULAR_PRUNE_SKIP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    REGULAR_PRUNE_SKIP_TYPES_FIELD_NUMBER: _ClassVar[int]
    FAKEQUANT_PRECISION_MODE_FIELD_NUMBER: _ClassVar[int]
    skip_layers: _containers.RepeatedScalarFieldContainer[str]
    skip_layer_types: _containers.RepeatedScalarFieldContainer[str]
    override_layer_configs: _containers.RepeatedCompositeFieldContainer[RetrainOverrideLayer]
    override_layer_types: _containers.RepeatedCompositeFieldContainer[RetrainOverrideLayerType]
    batch_num: int
    retrain_data_quant_config: RetrainDataQuantConfig
    retrain_weight_quant_config: RetrainWeightQuantConfig
    quant_skip_layers: _containers.RepeatedScalarFieldContainer[str]
    quant_skip_types: _containers.RepeatedScalarFieldContainer[str]
    prune_config: PruneConfig
    regular_prune_skip_layers: _containers.RepeatedScalarFieldContainer[str]
    regular_prune_skip_types: _containers.RepeatedScalarFieldContainer[str]
    fakequant_precision_mode: AMCTRetrainConfig.FakequantPrecisionMode
    def __init__(self, skip_layers: _Optional[_Iterable[str]] = ..., skip_layer_types: _Optional[_Iterable[str]] = ..., override_layer_configs: _Optional[_Iterable[_Union[RetrainOverrideLayer, _Mapping]]] = ..., override_layer_types: _Optional[_Iterable[_Union[RetrainOverrideLayerType, _Mapping]]] = ..., batch_num: _Optional[int] = ..., retrain_data_quant_config: _Optional[_Union[RetrainDataQuantConfig, _Mapping]] = ..., retrain_weight_quant_config: _Optional[_Union[RetrainWeightQuantConfig, _Mapping]] = ..., quant_skip_layers: _Optional[_Iterable[str]] = ..., quant_skip_types: _Optional[_Iterable[str]] = ..., prune_config: _Optional[_Union[PruneConfig, _Mapping]] = ..., regular_prune_skip_layers: _Optional[_Iterable[str]] = ..., regular_prune_skip_types: _Optional[_Iterable[str]] = ..., fakequant_precision_mode: _Optional[_Union[AMCTRetrainConfig.FakequantPrecisionMode, str]] = ...) -> None: ...

class RetrainDataQuantConfig(_message.Message):
    __slots__ = ("ulq_quantize",)
    ULQ_QUANTIZE_FIELD_NUMBER: _ClassVar[int]
    ulq_quantize: ActULQquantize
    def __init__(self, ulq_quantize: _Optional[_Union[ActULQquantize, _Mapping]] = ...) -> None: ...

class ActULQquantize(_message.Message):
    __slots__ = ("clip_max_min", "fixed_min", "dst_type")
    CLIP_MAX_MIN_FIELD_NUMBER: _ClassVar[int]
    FIXED_MIN_FIELD_NUMBER: _ClassVar[int]
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    clip_max_min: ClipMaxMin
    fixed_min: bool
    dst_type: DataType
    def __init__(self, clip_max_min: _Optional[_Union[ClipMaxMin, _Mapping]] = ..., fixed_min: _Optional[bool] = ..., dst_type: _Optional[_Union[DataType, str]] = ...) -> None: ...

class ClipMaxMin(_message.Message):
    __slots__ = ("clip_max", "clip_min")
    CLIP_MAX_FIELD_NUMBER: _ClassVar[int]
    CLIP_MIN_FIELD_NUMBER: _ClassVar[int]
    clip_max: float
    clip_min: float
    def __init__(self, clip_max: _Optional[float] = ..., clip_min: _Optional[float] = ...) -> None: ...

class RetrainWeightQuantConfig(_message.Message):
    __slots__ = ("arq_retrain", "ulq_retrain")
    ARQ_RETRAIN_FIELD_NUMBER: _ClassVar[int]
    ULQ_RETRAIN_FIELD_NUMBER: _ClassVar[int]
    arq_retrain: ARQRetrain
    ulq_retrain: WtsULQRetrain
    def __init__(self, arq_retrain: _Optional[_Union[ARQRetrain, _Mapping]] = ..., ulq_retrain: _Optional[_Union[WtsULQRetrain, _Mapping]] = ...) -> None: ...

class ARQRetrain(_message.Message):
    __slots__ = ("dst_type", "channel_wise")
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_WISE_FIELD_NUMBER: _ClassVar[int]
    dst_type: DataType
    channel_wise: bool
    def __init__(self, dst_type: _Optional[_Union[DataType, str]] = ..., channel_wise: _Optional[bool] = ...) -> None: ...

class WtsULQRetrain(_message.Message):
    __slots__ = ("dst_type", "channel_wise")
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_WISE_FIELD_NUMBER: _ClassVar[int]
    dst_type: DataType
    channel_wise: bool
    def __init__(self, dst_type: _Optional[_Union[DataType, str]] = ..., channel_wise: _Optional[bool] = ...) -> None: ...

class RetrainOverrideLayer(_message.Message):
    __slots__ = ("layer_name", "retrain_data_quant_config", "retrain_weight_quant_config", "prune_config")
    LAYER_NAME_FIELD_NUMBER: _ClassVar[int]
    RETRAIN_DATA_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    RETRAIN_WEIGHT_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    PRUNE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    layer_name: str
    retrain_data_quant_config: RetrainDataQuantConfig
    retrain_weight_quant_config: RetrainWeightQuantConfig
    prune_config: PruneConfig
    def __init__(self, layer_name: _Optional[str] = ..., retrain_data_quant_config: _Optional[_Union[RetrainDataQuantConfig, _Mapping]] = ..., retrain_weight_quant_config: _Optional[_Union[RetrainWeightQuantConfig, _Mapping]] = ..., prune_config: _Optional[_Union[PruneConfig, _Mapping]] = ...) -> None: ...

class RetrainOverrideLayerType(_message.Message):
    __slots__ = ("layer_type", "retrain_data_quant_config", "retrain_weight_quant_config", "prune_config")
    LAYER_TYPE_FIELD_NUMBER: _ClassVar[int]
    RETRAIN_DATA_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    RETRAIN_WEIGHT_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    PRUNE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    layer_type: str
    retrain_data_quant_config: RetrainDataQuantConfig
    retrain_weight_quant_config: RetrainWeightQuantConfig
    prune_config: PruneConfig
    def __init__(self, layer_type: _Optional[str] = ..., retrain_data_quant_config: _Optional[_Union[RetrainDataQuantConfig, _Mapping]] = ..., retrain_weight_quant_config: _Optional[_Union[RetrainWeightQuantConfig, _Mapping]] = ..., prune_config: _Optional[_Union[PruneConfig, _Mapping]] = ...) -> None: ...

class PruneConfig(_message.Message):
    __slots__ = ("filter_pruner", "n_out_of_m_pruner")
    FILTER_PRUNER_FIELD_NUMBER: _ClassVar[int]
    N_OUT_OF_M_PRUNER_FIELD_NUMBER: _ClassVar[int]
    filter_pruner: FilterPruner
    n_out_of_m_pruner: NOutOfMPruner
    def __init__(self, filter_pruner: _Optional[_Union[FilterPruner, _Mapping]] = ..., n_out_of_m_pruner: _Optional[_Union[NOutOfMPruner, _Mapping]] = ...) -> None: ...

class FilterPruner(_message.Message):
    __slots__ = ("balanced_l2_norm_filter_prune",)
    BALANCED_L2_NORM_FILTER_PRUNE_FIELD_NUMBER: _ClassVar[int]
    balanced_l2_norm_filter_prune: BalancedL2NormFilterPruner
    def __init__(self, balanced_l2_norm_filter_prune: _Optional[_Union[BalancedL2NormFilterPruner, _Mapping]] = ...) -> None: ...

class BalancedL2NormFilterPruner(_message.Message):
    __slots__ = ("prune_ratio", "ascend_optimized", "importance", "prune_schedule", "granularity")
    PRUNE_RATIO_FIELD_NUMBER: _ClassVar[int]
    ASCEND_OPTIMIZED_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    PRUNE_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    prune_ratio: float
    ascend_optimized: bool
    importance: str
    prune_schedule: PruneSchedule
    granularity: PruneGranularity
    def __init__(self, prune_ratio: _Optional[float] = ..., ascend_optimized: _Optional[bool] = ..., importance: _Optional[str] = ..., prune_schedule: _Optional[_Union[PruneSchedule, _Mapping]] = ..., granularity: _Optional[_Union[PruneGranularity, str]] = ...) -> None: ...

class PruneSchedule(_message.Message):
    __slots__ = ("steps", "start_ratio", "interval")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    START_RATIO_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    steps: int
    start_ratio: float
    interval: int
    def __init__(self, steps: _Optional[int] = ..., start_ratio: _Optional[float] = ..., interval: _Optional[int] = ...) -> None: ...

class NOutOfMPruner(_message.Message):
    __slots__ = ("l1_selective_prune",)
    L1_SELECTIVE_PRUNE_FIELD_NUMBER: _ClassVar[int]
    l1_selective_prune: L1SelectivePruner
    def __init__(self, l1_selective_prune: _Optional[_Union[L1SelectivePruner, _Mapping]] = ...) -> None: ...

class L1SelectivePruner(_message.Message):
    __slots__ = ("n_out_of_m_type", "update_freq")
    N_OUT_OF_M_TYPE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FREQ_FIELD_NUMBER: _ClassVar[int]
    n_out_of_m_type: NOutOfMType
    update_freq: int
    def __init__(self, n_out_of_m_type: _Optional[_Union[NOutOfMType, str]] = ..., update_freq: _Optional[int] = ...) -> None: ...
