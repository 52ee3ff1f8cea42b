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
INT4: DataType
INT8: DataType
INT16: DataType

class AMCTConfig(_message.Message):
    __slots__ = ("batch_num", "activation_offset", "skip_layers", "skip_layer_types", "do_fusion", "skip_fusion_layers", "common_config", "override_layer_configs", "override_layer_types", "search_config")
    BATCH_NUM_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SKIP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    SKIP_LAYER_TYPES_FIELD_NUMBER: _ClassVar[int]
    DO_FUSION_FIELD_NUMBER: _ClassVar[int]
    SKIP_FUSION_LAYERS_FIELD_NUMBER: _ClassVar[int]
    COMMON_CONFIG_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_LAYER_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_LAYER_TYPES_FIELD_NUMBER: _ClassVar[int]
    SEARCH_CONFIG_FIELD_NUMBER: _ClassVar[int]
    batch_num: int
    activation_offset: bool
    skip_layers: _containers.RepeatedScalarFieldContainer[str]
    skip_layer_types: _containers.RepeatedScalarFieldContainer[str]
    do_fusion: bool
    skip_fusion_layers: _containers.RepeatedScalarFieldContainer[str]
    common_config: CalibrationConfig
    override_layer_configs: _containers.RepeatedCompositeFieldContainer[OverrideLayer]
    override_layer_types: _containers.RepeatedCompositeFieldContainer[OverrideLayerType]
    search_config: SearchConfig
    def __init__(self, batch_num: _Optional[int] = ..., activation_offset: _Optional[bool] = ..., skip_layers: _Optional[_Iterable[str]] = ..., skip_layer_types: _Optional[_Iterable[str]] = ..., do_fusion: _Optional[bool] = ..., skip_fusion_layers: _Optional[_Iterable[str]] = ..., common_config: _Optional[_Union[CalibrationConfig, _Mapping]] = ..., override_layer_configs: _Optional[_Iterable[_Union[OverrideLayer, _Mapping]]] = ..., override_layer_types: _Optional[_Iterable[_Union[OverrideLayerType, _Mapping]]] = ..., search_config: _Optional[_Union[SearchConfig, _Mapping]] = ...) -> None: ...

class SearchConfig(_message.Message):
    __slots__ = ("max_top1_drop", "min_cosine", "prune_ratios", "precisions", "keep_float", "target_macs_ratio")
    MAX_TOP1_DROP_FIELD_NUMBER: _ClassVar[int]
    MIN_COSINE_FIELD_NUMBER: _ClassVar[int]
    PRUNE_RATIOS_FIELD_NUMBER: _ClassVar[int]
    PRECISIONS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FLOAT_FIELD_NUMBER: _ClassVar[int]
    TARGET_MACS_RATIO_FIELD_NUMBER: _ClassVar[int]
    max_top1_drop: float
    min_cosine: float
    prune_ratios: _containers.RepeatedScalarFieldContainer[float]
    precisions: _containers.RepeatedScalarFieldContainer[DataType]
    keep_float: bool
    target_macs_ratio: float
    def __init__(self, max_top1_drop: _Optional[float] = ..., min_cosine: _Optional[float] = ..., prune_ratios: _Optional[_Iterable[float]] = ..., precisions: _Optional[_Iterable[_Union[DataType, str]]] = ..., keep_float: _Optional[bool] = ..., target_macs_ratio: _Optional[float] = ...) -> None: ...

class CalibrationConfig(_message.Message):
    __slots__ = ("ifmr_quantize", "hfmg_quantize", "arq_quantize")
    IFMR_QUANTIZE_FIELD_NUMBER: _ClassVar[int]
    HFMG_QUANTIZE_FIELD_NUMBER: _ClassVar[int]
    ARQ_QUANTIZE_FIELD_NUMBER: _ClassVar[int]
    ifmr_quantize: FMRQuantize
    hfmg_quantize: HFMGQuantize
    arq_quantize: ARQuantize
    def __init__(self, ifmr_quantize: _Optional[_Union[FMRQuantize, _Mapping]] = ..., hfmg_quantize: _Optional[_Union[HFMGQuantize, _Mapping]] = ..., arq_quantize: _Optional[_Union[ARQuantize, _Mapping]] = ...) -> None: ...

class FMRQuantize(_message.Message):
    __slots__ = ("search_range_start", "search_range_end", "search_step", "max_percentile", "min_percentile", "asymmetric", "dst_type")
    SEARCH_RANGE_START_FIELD_NUMBER: _ClassVar[int]
    SEARCH_RANGE_END_FIELD_NUMBER: _ClassVar[int]
    SEARCH_STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_PERCENTILE_FIELD_NUMBER: _ClassVar[int]
    MIN_PERCENTILE_FIELD_NUMBER: _ClassVar[int]
    ASYMMETRIC_FIELD_NUMBER: _ClassVar[int]
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    search_range_start: float
    search_range_end: float
    search_step: float
    max_percentile: float
    min_percentile: float
    asymmetric: bool
    dst_type: DataType
    def __init__(self, search_range_start: _Optional[float] = ..., search_range_end: _Optional[float] = ..., search_step: _Optional[float] = ..., max_percentile: _Optional[float] = ..., min_percentile: _Optional[float] = ..., asymmetric: _Optional[bool] = ..., dst_type: _Optional[_Union[DataType, str]] = ...) -> None: ...

class HFMGQuantize(_message.Message):
    __slots__ = ("num_of_bins", "asymmetric", "dst_type")
    NUM_OF_BINS_FIELD_NUMBER: _ClassVar[int]
    ASYMMETRIC_FIELD_NUMBER: _ClassVar[int]
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    num_of_bins: int
    asymmetric: bool
    dst_type: DataType
    def __init__(self, num_of_bins: _Optional[int] = ..., asymmetric: _Optional[bool] = ..., dst_type: _Optional[_Union[DataType, str]] = ...) -> None: ...

class ARQuantize(_message.Message):
    __slots__ = ("channel_wise", "quant_bits")
    CHANNEL_WISE_FIELD_NUMBER: _ClassVar[int]
    QUANT_BITS_FIELD_NUMBER: _ClassVar[int]
    channel_wise: bool
    quant_bits: int
    def __init__(self, channel_wise: _Optional[bool] = ..., quant_bits: _Optional[int] = ...) -> None: ...

class OverrideLayer(_message.Message):
    __slots__ = ("layer_name", "calibration_config")
    LAYER_NAME_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_CONFIG_FIELD_NUMBER: _ClassVar[int]
    layer_name: str
    calibration_config: CalibrationConfig
    def __init__(self, layer_name: _Optional[str] = ..., calibration_config: _Optional[_Union[CalibrationConfig, _Mapping]] = ...) -> None: ...

class OverrideLayerType(_message.Message):
    __slots__ = ("layer_type", "calibration_config")
    LAYER_TYPE_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_CONFIG_FIELD_NUMBER: _ClassVar[int]
    layer_type: str
    calibration_config: CalibrationConfig
    def __init__(self, layer_type: _Optional[str] = ..., calibration_config: _Optional[_Union[CalibrationConfig, _Mapping]] = ...) -> None: ...
