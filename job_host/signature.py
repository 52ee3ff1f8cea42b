"""A model's signature: its inputs by name, shape (dynamic axes as names) and dtype, and its output structure.

Torch-free at import: the API parses and stores signatures (service/routes/models.py) and checks
datasets against them (service/datasets.py); the job process builds example tensors from them and
names the ONNX inputs and outputs after them (docs/service.md, "Model signatures").

An input is `{"name": "input_ids", "shape": ["batch", 128], "dtype": "int64"}`: a dimension is a
positive integer or a name (a dynamic axis). The first dimension is the batch; a named one is
exported as dynamic. The output structure, recorded when the upload is checked, is a tree:
`{"type": "tensor", "shape": [...], "dtype": ...}`, `{"type": "tuple", "items": [...]}` or
`{"type": "dict", "items": {key: ...}}`; its leaves are the model's outputs, named `output` (one
tensor), `output_0`, `output_1`, … (a tuple), the keys (a dict), and `a.0` when nested.
"""

from __future__ import annotations

import re

DTYPES = ("float32", "float16", "int64", "int32", "bool")
# The one-input shorthand (`input_shape` + `input_dtype`) also takes these, as it always has.
SHORTHAND_DTYPES = (*DTYPES, "bfloat16", "float64")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
MAX_INPUTS, MAX_DIMS, MAX_ELEMENTS = 16, 8, 10**8
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
# Sizes the example tensors give dynamic axes: the batch 2 (a batch of one hides batch-axis bugs), the
# others distinct odd sizes, so an output's axis can be told dynamic by its size (dynamic_axes()).
EXAMPLE_BATCH, EXAMPLE_DYNAMIC = 2, (7, 11, 13, 17, 19, 23)
# What an error about a signature shows as a good one (the API's 422 and the CLI's --inputs).
INPUTS_EXAMPLE = (
    '[{"name": "input_ids", "shape": ["batch", 128], "dtype": "int64"}, '
    '{"name": "attention_mask", "shape": ["batch", 128], "dtype": "int64"}]'
)


class SignatureError(ValueError):
    def __init__(self, message: str, field: str = "inputs") -> None:
        super().__init__(message)
        self.field = field


def parse_inputs(raw: object) -> list[dict]:
    """The `inputs` of an upload (already JSON-decoded), checked; SignatureError names what is wrong."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_INPUTS:
        raise SignatureError(f"inputs must be a JSON list of 1 to {MAX_INPUTS} objects {{name, shape, dtype}}")
    inputs, seen = [], set()
    for i, item in enumerate(raw):
        where = f"inputs[{i}]"
        if not isinstance(item, dict) or not {"name", "shape"} <= set(item) or set(item) - {"name", "shape", "dtype"}:
            raise SignatureError(f"{where} must be an object with name, shape and optional dtype", where)
        name, shape, dtype = item["name"], item["shape"], item.get("dtype", "float32")
        if not isinstance(name, str) or not NAME.match(name) or name in seen or name == "labels":
            raise SignatureError(
                f"{where}.name {name!r} must be a unique identifier (letters, digits, _ .), not 'labels'",
                f"{where}.name",
            )
        seen.add(name)
        if dtype not in DTYPES:
            raise SignatureError(f"{where}.dtype must be one of {', '.join(DTYPES)}", f"{where}.dtype")
        inputs.append({"name": name, "shape": _check_shape(shape, f"{where}.shape"), "dtype": dtype})
    return inputs


def _check_shape(shape: object, where: str) -> list:
    if not isinstance(shape, list) or not 1 <= len(shape) <= MAX_DIMS:
        raise SignatureError(f"{where} must be a list of 1 to {MAX_DIMS} dimensions", where)
    for d in shape:
        ok = (isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_ELEMENTS) or (
            isinstance(d, str) and NAME.match(d)
        )
        if not ok:
            raise SignatureError(
                f"{where}: each dimension is an integer >= 1 or an axis name such as 'batch', got {d!r}", where
            )
    if _elements(example_shape(shape)) > MAX_ELEMENTS:
        raise SignatureError(f"{where} {shape} has more than {MAX_ELEMENTS} elements", where)
    return list(shape)


def _elements(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def from_input_shape(shape: list[int], dtype: str) -> list[dict]:
    """The shorthand `input_shape=1,1,28,28`: one input named `input`, its batch axis dynamic."""
    return [{"name": "input", "shape": ["batch", *shape[1:]], "dtype": dtype}]


def dynamic_sizes(inputs: list[dict], batch: int = EXAMPLE_BATCH) -> dict[str, int]:
    """The example size of every axis name: the first dimension's name gets `batch`."""
    sizes: dict[str, int] = {}
    spare = iter(EXAMPLE_DYNAMIC)
    for spec in inputs:
        for axis, d in enumerate(spec["shape"]):
            if isinstance(d, str) and d not in sizes:
                sizes[d] = batch if axis == 0 else next(spare, 29)
    return sizes


def example_shape(shape: list, sizes: dict[str, int] | None = None) -> list[int]:
    sizes = sizes or {}
    return [
        d if isinstance(d, int) else sizes.get(d, EXAMPLE_BATCH if axis == 0 else EXAMPLE_DYNAMIC[0])
        for axis, d in enumerate(shape)
    ]


def first_example_shape(inputs: list[dict], batch: int = EXAMPLE_BATCH) -> list[int]:
    """The shape of the first input's example tensor: what a model's `input_shape` records for a signature."""
    return example_shape(inputs[0]["shape"], dynamic_sizes(inputs, batch))


def example_inputs(inputs: list[dict], batch: int = EXAMPLE_BATCH) -> tuple:
    """One tensor per input, in input order, with values every model of that signature accepts.

    Floats: seeded normal noise. Integers: 0/1 alternating (valid token ids, token types and class
    indices for any vocabulary); a name with `mask` in it gets ones (nothing masked). Bool: True.
    """
    import torch

    sizes = dynamic_sizes(inputs, batch)
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for spec in inputs:
        shape, dtype = example_shape(spec["shape"], sizes), getattr(torch, spec["dtype"])
        if dtype.is_floating_point:
            tensors.append(torch.randn(*shape, generator=generator).to(dtype))
        elif dtype == torch.bool or "mask" in spec["name"].lower():
            tensors.append(torch.ones(*shape, dtype=dtype))
        else:
            tensors.append((torch.arange(_elements(shape)) % 2).reshape(shape).to(dtype))
    return tuple(tensors)


def describe_output(out) -> dict:
    """The output structure of one forward pass (tensor, tuple/list, dict of str, nested)."""
    if hasattr(out, "shape") and hasattr(out, "dtype"):
        return {"type": "tensor", "shape": list(out.shape), "dtype": str(out.dtype).replace("torch.", "")}
    if isinstance(out, (tuple, list)):
        return {"type": "tuple", "items": [describe_output(o) for o in out]}
    if isinstance(out, dict) and all(isinstance(k, str) for k in out):
        return {"type": "dict", "items": {k: describe_output(v) for k, v in out.items()}}
    raise SignatureError(
        f"the model returned a {type(out).__name__}; outputs must be tensors, or tuples, lists or dicts of them", "file"
    )


def output_structure(model, inputs: list[dict], batch: int = EXAMPLE_BATCH) -> dict:
    """What the upload check records (job_process/validate_model.py): the model run once on the example
    tensors of its signature, its output structure described with the shapes those sizes give."""
    import torch

    with torch.no_grad():
        return describe_output(model(*example_inputs(inputs, batch)))


def output_leaves(structure: dict, prefix: str = "") -> list[tuple[str, dict]]:
    """(name, tensor description) of every output, in the order ONNX export flattens them."""
    if structure["type"] == "tensor":
        return [(prefix or "output", structure)]
    items = structure["items"]
    pairs = enumerate(items) if structure["type"] == "tuple" else items.items()
    leaves = []
    for key, item in pairs:
        name = f"{prefix}.{key}" if prefix else (f"output_{key}" if structure["type"] == "tuple" else str(key))
        leaves.extend(output_leaves(item, name))
    return leaves


def flatten_outputs(out) -> list:
    """The output tensors of a forward pass in `output_leaves` order."""
    if hasattr(out, "shape"):
        return [out]
    values = out.values() if isinstance(out, dict) else out
    return [t for o in values for t in flatten_outputs(o)]


def io_names(inputs: list[dict], outputs: dict | None, batch: int = EXAMPLE_BATCH) -> dict:
    """`input_names`, `output_names` and `dynamic_axes` for the ONNX export, after the signature.

    An output axis is dynamic when its size in the recorded example is the example size of an axis
    name (the batch on axis 0, the other names on later axes): e.g. `[batch, seq, 384]` stays `seq`.
    """
    sizes = dynamic_sizes(inputs, batch)  # `batch`: the example batch the outputs were recorded with
    axes: dict[str, dict[int, str]] = {}
    for spec in inputs:
        named = {a: d for a, d in enumerate(spec["shape"]) if isinstance(d, str)}
        if named:
            axes[spec["name"]] = named
    leaves = output_leaves(outputs) if outputs else [("output", {"shape": []})]
    batch_names = [spec["shape"][0] for spec in inputs if isinstance(spec["shape"][0], str)]
    later = {size: name for name, size in sizes.items() if name not in batch_names}
    for name, leaf in leaves:
        named = {}
        for a, size in enumerate(leaf.get("shape", [])):
            if a == 0 and batch_names and size == sizes[batch_names[0]]:
                named[0] = batch_names[0]
            elif a > 0 and size in later:
                named[a] = later[size]
        if named:
            axes[name] = named
    if not outputs and batch_names:
        axes["output"] = {0: batch_names[0]}
    return {"input_names": [s["name"] for s in inputs], "output_names": [n for n, _ in leaves], "dynamic_axes": axes}


def input_arrays(inputs: list[dict], arrays: dict) -> dict[str, str]:
    """Which array feeds each input: the one named after it, or `inputs` for a one-input model."""
    chosen = {}
    for spec in inputs:
        if spec["name"] in arrays:
            chosen[spec["name"]] = spec["name"]
        elif len(inputs) == 1 and "inputs" in arrays:
            chosen[spec["name"]] = "inputs"
        else:
            have = ", ".join(sorted(arrays)) or "none"
            raise SignatureError(
                f"the model's input {spec['name']!r} has no array of that name in the dataset (it has: {have})",
                spec["name"],
            )
    return chosen


def target_arrays(outputs: dict | None, arrays: dict) -> dict[str, str]:
    """Which array is the target of each output (the `mse` / `l1` objectives): named after it, or `targets`."""
    leaves = output_leaves(outputs) if outputs else [("output", {})]
    found = {name: name for name, _ in leaves if name in arrays}
    if not found and len(leaves) == 1 and "targets" in arrays:
        found = {leaves[0][0]: "targets"}
    return found


def class_width(outputs: dict | None) -> int | None:
    """The class count of a classifier: the width of the first output when it is `[batch, classes]`."""
    if not outputs:
        return None
    leaves = output_leaves(outputs)
    shape = leaves[0][1].get("shape", [])
    return int(shape[1]) if len(shape) == 2 else None
