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
INT4: DataType
INT8: DataType

class AMCTDistillConfig(_message.Message):
    __slots__ = ("batch_num", "group_size", "data_dump", "distill_group", "distill_data_quant_config", "distill_weight_quant_config", "distill_override_layers", "distill_override_layer_types", "quant_skip_layers", "quant_skip_layer_types")
    BATCH_NUM_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_DUMP_FIELD_NUMBER: _ClassVar[int]
    DISTILL_GROUP_FIELD_NUMBER: _ClassVar[int]
    DISTILL_DATA_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    DISTILL_WEIGHT_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    DISTILL_OVERRIDE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    DISTILL_OVERRIDE_LAYER_TYPES_FIELD_NUMBER: _ClassVar[int]
    QUANT_SKIP_LAYERS_FIELD_NUMBER: _ClassVar[int]
    QUANT_SKIP_LAYER_TYPES_FIELD_NUMBER: _ClassVar[int]
    batch_num: int
    group_size: int
    data_dump: bool
    distill_group: _containers.RepeatedCompositeFieldContainer[DistillGroup]
    distill_data_quant_config: DistillDataQuantConfig
    distill_weight_quant_config: DistillWeightQuantConfig
    distill_override_layers: _containers.RepeatedCompositeFieldContainer[DistillOverrideLayer]
    distill_override_layer_types: _containers.RepeatedCompositeFieldContainer[DistillOverrideLayerType]
    quant_skip_layers: _containers.RepeatedScalarFieldContainer[str]
    quant_skip_layer_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, batch_num: _Optional[int] = ..., group_size: _Optional[int] = ..., data_dump: _Optional[bool] = ..., distill_group: _Optional[_Iterable[_Union[DistillGroup, _Mapping]]] = ..., distill_data_quant_config: _Optional[_Union[DistillDataQuantConfig, _Mapping]] = ..., distill_weight_quant_config: _Optional[_Union[DistillWeightQuantConfig, _Mapping]] = ..., distill_override_layers: _Optional[_Iterable[_Union[DistillOverrideLayer, _Mapping]]] = ..., distill_override_layer_types: _Optional[_Iterable[_Union[DistillOverrideLayerType, _Mapping]]] = ..., quant_skip_layers: _Optional[_Iterable[str]] = ..., quant_skip_layer_types: _Optional[_Iterable[str]] = ...) -> None: ...

class DistillGroup(_message.Message):
    __slots__ = ("start_layer_name", "end_layer_name")
    START_LAYER_NAME_FIELD_NUMBER: _ClassVar[int]
    END_LAYER_NAME_FIELD_NUMBER: _ClassVar[int]
    start_layer_name: str
    end_layer_name: str
    def __init__(self, start_layer_name: _Optional[str] = ..., end_layer_name: _Optional[str] = ...) -> None: ...

class DistillDataQuantConfig(_message.Message):
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

class DistillWeightQuantConfig(_message.Message):
    __slots__ = ("arq_distill", "ulq_distill")
    ARQ_DISTILL_FIELD_NUMBER: _ClassVar[int]
    ULQ_DISTILL_FIELD_NUMBER: _ClassVar[int]
    arq_distill: ARQDistill
    ulq_distill: WtsULQDistill
    def __init__(self, arq_distill: _Optional[_Union[ARQDistill, _Mapping]] = ..., ulq_distill: _Optional[_Union[WtsULQDistill, _Mapping]] = ...) -> None: ...

class ARQDistill(_message.Message):
    __slots__ = ("dst_type", "channel_wise")
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_WISE_FIELD_NUMBER: _ClassVar[int]
    dst_type: DataType
    channel_wise: bool
    def __init__(self, dst_type: _Optional[_Union[DataType, str]] = ..., channel_wise: _Optional[bool] = ...) -> None: ...

class WtsULQDistill(_message.Message):
    __slots__ = ("dst_type", "channel_wise")
    DST_TYPE_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_WISE_FIELD_NUMBER: _ClassVar[int]
    dst_type: DataType
    channel_wise: bool
    def __init__(self, dst_type: _Optional[_Union[DataType, str]] = ..., channel_wise: _Optional[bool] = ...) -> None: ...

class DistillOverrideLayer(_message.Message):
    __slots__ = ("layer_name", "distill_data_quant_config", "distill_weight_quant_config")
    LAYER_NAME_FIELD_NUMBER: _ClassVar[int]
    DISTILL_DATA_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    DISTILL_WEIGHT_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    layer_name: str
    distill_data_quant_config: DistillDataQuantConfig
    distill_weight_quant_config: DistillWeightQuantConfig
    def __init__(self, layer_name: _Optional[str] = ..., distill_data_quant_config: _Optional[_Union[DistillDataQuantConfig, _Mapping]] = ..., distill_weight_quant_config: _Optional[_Union[DistillWeightQuantConfig, _Mapping]] = ...) -> None: ...

class DistillOverrideLayerType(_message.Message):
    __slots__ = ("layer_type", "distill_data_quant_config", "distill_weight_quant_config")
    LAYER_TYPE_FIELD_NUMBER: _ClassVar[int]
    DISTILL_DATA_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    DISTILL_WEIGHT_QUANT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    layer_type: str
    distill_data_quant_config: DistillDataQuantConfig
    distill_weight_quant_config: DistillWeightQuantConfig
    def __init__(self, layer_type: _Optional[str] = ..., distill_data_quant_config: _Optional[_Union[DistillDataQuantConfig, _Mapping]] = ..., distill_weight_quant_config: _Optional[_Union[DistillWeightQuantConfig, _Mapping]] = ...) -> None: ...
