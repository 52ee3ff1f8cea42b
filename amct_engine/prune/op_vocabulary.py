"""The ops the channel dependency graph follows without a layer pruner, by name (docs/spec/engine.md §4.4 step 1).

These layers and functions hold no per-channel parameters, so pruning never edits them; it only
needs to know what they do to the channel axis. Layers with per-channel parameters (conv, linear,
norms) are the layer-pruner table's (``layer_pruners.py``). Names are module class names and
function / method / aten op names (``graph.lifting.op_name`` spells aten ops the same way).
"""

from __future__ import annotations

# Modules and functions whose every output channel depends on the same input channel only.
ELEMENTWISE_MODULES = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "Sigmoid", "Tanh", "GELU", "SiLU", "Mish", "Hardswish", "Hardsigmoid",
    "Hardtanh", "ELU", "SELU", "CELU", "Softplus", "Softsign", "Dropout", "Dropout1d", "Dropout2d",
    "Dropout3d", "AlphaDropout", "Identity", "Softmax", "LogSoftmax", "Softmax2d",
})
SPATIAL_MODULES = frozenset({
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
    "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d",
    "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d",
    "CircularPad2d", "CircularPad3d",
})
RESHAPE_MODULES = frozenset({"Flatten", "Unflatten"})

ELEMENTWISE_FUNCTIONS = frozenset({
    "add", "add_", "iadd", "sub", "sub_", "isub", "rsub", "mul", "mul_", "imul", "div", "div_", "truediv",
    "itruediv", "maximum", "minimum", "pow", "clamp", "clamp_", "clip", "clamp_min", "clamp_max",
    "relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "hardtanh", "hardtanh_", "gelu", "silu",
    "silu_", "mish", "sigmoid", "sigmoid_", "tanh", "tanh_", "hardswish", "hardswish_", "hardsigmoid",
    "elu", "elu_", "selu", "celu", "softplus", "softsign", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
    "square", "sign", "erf", "dropout", "dropout_", "alpha_dropout", "feature_dropout", "dropout2d",
    "contiguous", "clone", "detach", "to", "float", "half", "double", "type", "cpu", "cuda", "_to_copy",
    "alias", "softmax", "log_softmax", "_softmax", "_log_softmax", "stochastic_depth",
})
SPATIAL_FUNCTIONS = frozenset({
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "interpolate", "upsample",
    "upsample_nearest2d", "upsample_bilinear2d", "pad", "constant_pad_nd",
})
RESHAPE_FUNCTIONS = frozenset({
    "flatten", "view", "reshape", "_unsafe_view", "unflatten", "squeeze", "squeeze_", "unsqueeze",
    "unsqueeze_",
})
PERMUTE_FUNCTIONS = frozenset({"permute", "transpose", "transpose_", "swapaxes", "swapdims", "t"})
REDUCE_FUNCTIONS = frozenset({"mean", "sum", "amax", "amin", "nansum"})
CONCAT_FUNCTIONS = frozenset({"cat", "concat", "concatenate"})
# Results that are not tensors: reading a shape does not use the channels' values.
SHAPE_QUERIES = frozenset({"size", "dim", "numel", "getattr", "sym_size", "_assert_tensor_metadata"})
# The function nodes a prune record lists as members (AMCT writes adds and concats too), by ONNX op type.
OP_TYPES = {"add": "Add", "iadd": "Add", "add_": "Add", "sub": "Sub", "isub": "Sub", "sub_": "Sub",
            "rsub": "Sub", "mul": "Mul", "imul": "Mul", "mul_": "Mul", "div": "Div", "truediv": "Div",
            "itruediv": "Div", "div_": "Div", "cat": "Concat", "concat": "Concat", "concatenate": "Concat"}
OP_NODE_TYPES = frozenset(OP_TYPES.values())
