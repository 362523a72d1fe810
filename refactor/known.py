"""
What static inference knows about the libraries a training notebook uses: the return types of
calls into torch, numpy, pandas, math and the builtins, and of methods on tensors, modules and
strings. Deliberately small: only what their stubs (or, without stubs, their documentation)
guarantee, so an annotation made from this table is one mypy accepts.
"""

from __future__ import annotations

import ast

from .typeexpr import BOOL, DATAFRAME, FLOAT, INT, NDARRAY, NONE, STR, TENSOR, T, Ty


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_TORCH_TENSOR_FUNCTIONS = words(
    """randn rand randint randn_like rand_like randint_like zeros ones empty full zeros_like
    ones_like empty_like full_like arange linspace logspace eye tensor as_tensor from_numpy cat
    concat concatenate stack hstack vstack matmul mm bmm softmax log_softmax sigmoid tanh relu
    exp log log1p sqrt rsqrt abs argmax argmin clamp clip flatten reshape transpose
    permute squeeze unsqueeze multinomial randperm tril triu einsum outer cdist mean sum prod
    cumsum cumprod sin cos pow masked_fill gather scatter bernoulli normal erf sign round floor
    ceil isnan isinf isfinite logical_and logical_or logical_not bincount
    diag roll flip repeat_interleave tile broadcast_to atan2 minimum maximum lerp dropout
    dot mv inner cross std var add sub mul div true_divide remainder fmod logsumexp amax amin
    nan_to_num diff kron addmm baddbmm square neg exp2 expm1 asin acos atan sinh cosh trace
    tril_indices triu_indices take floor_divide"""
)
# constructors and joins: an array whatever they are given (ufuncs such as np.log give a scalar
# for a scalar, so they are not here)
_NUMPY_ARRAY_FUNCTIONS = words(
    """array asarray zeros ones empty full zeros_like ones_like full_like arange linspace logspace
    eye concatenate stack vstack hstack column_stack expand_dims"""
)
_NUMPY_RANDOM = words("rand randn permutation normal uniform standard_normal")
_PANDAS_READERS = words("read_csv read_json read_parquet read_excel read_table read_feather")

KNOWN_CALLS: dict[str, Ty] = {
    **{f"torch.{n}": TENSOR for n in _TORCH_TENSOR_FUNCTIONS},
    **{f"numpy.{n}": NDARRAY for n in _NUMPY_ARRAY_FUNCTIONS},
    **{f"numpy.random.{n}": NDARRAY for n in _NUMPY_RANDOM},
    **{f"pandas.{n}": DATAFRAME for n in _PANDAS_READERS},
    "torchvision.utils.make_grid": TENSOR,
    "matplotlib.pyplot.figure": T("matplotlib.figure.Figure"),
    "matplotlib.pyplot.gca": T("matplotlib.axes.Axes"),
    "torch.device": T("torch.device"),
    "torch.Generator": T("torch.Generator"),
    "torch.Size": T("torch.Size"),
    "torch.numel": INT,
    "torch.is_tensor": BOOL,
    "torch.cuda.is_available": BOOL,
    "torch.cuda.device_count": INT,
    "torch.save": NONE,
    "time.time": FLOAT,
    "time.perf_counter": FLOAT,
    "time.monotonic": FLOAT,
    "random.random": FLOAT,
    "random.uniform": FLOAT,
    "random.randint": INT,
    "random.seed": NONE,
    "os.path.join": STR,
    "os.path.exists": BOOL,
    "os.path.basename": STR,
    "os.path.dirname": STR,
    "os.getcwd": STR,
    "os.cpu_count": T("|", INT, NONE),
}
MATH_INT = frozenset({"floor", "ceil", "comb", "factorial", "gcd", "isqrt", "perm", "lcm"})
MATH_BOOL = frozenset({"isnan", "isinf", "isfinite", "isclose"})

BUILTIN_SAME = frozenset({"int", "float", "str", "bool", "bytes", "complex"})
BUILTIN_CALLS: dict[str, Ty] = {
    "len": INT,
    "range": T("range"),
    "isinstance": BOOL,
    "issubclass": BOOL,
    "callable": BOOL,
    "hasattr": BOOL,
    "print": NONE,
    "repr": STR,
    "format": STR,
    "input": STR,
    "chr": STR,
    "ord": INT,
    "hash": INT,
    "id": INT,
    "any": BOOL,
    "all": BOOL,
}

# methods of a tensor that give a tensor (the ones a training notebook calls)
TENSOR_TO_TENSOR = words(
    """to cuda cpu float double half bfloat16 long int bool byte detach clone contiguous view
    view_as reshape reshape_as flatten unflatten squeeze unsqueeze permute transpose t expand
    expand_as repeat mean sum prod std var norm abs exp log sqrt pow sigmoid tanh relu softmax
    log_softmax argmax argmin clamp clamp_ clip masked_fill masked_fill_ fill_ zero_ add add_
    sub sub_ mul mul_ div div_ matmul mm bmm eq ne lt le gt ge type_as new_zeros new_ones
    new_full new_empty new_tensor flip roll gather scatter index_select masked_select cumsum
    round floor ceil sign neg requires_grad_ pin_memory all any isnan logical_not dot mv square
    log1p sin cos reciprocal amax amin logsumexp nan_to_num"""
)
TENSOR_METHODS: dict[str, Ty] = {
    "item": FLOAT,
    "numpy": NDARRAY,
    "dim": INT,
    "ndimension": INT,
    "numel": INT,
    "nelement": INT,
    "element_size": INT,
    "backward": NONE,
    "is_floating_point": BOOL,
    "is_contiguous": BOOL,
    "data_ptr": INT,
    "get_device": INT,
}
TENSOR_ATTRIBUTES: dict[str, Ty] = {
    "shape": T("torch.Size"),
    "T": TENSOR,
    "mT": TENSOR,
    "data": TENSOR,
    "grad": T("|", TENSOR, NONE),
    "dtype": T("torch.dtype"),
    "device": T("torch.device"),
    "ndim": INT,
    "requires_grad": BOOL,
    "is_cuda": BOOL,
}
# methods of an nn.Module that return the module itself
MODULE_SELF = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "double", "half"})
MODULE_METHODS: dict[str, Ty] = {"zero_grad": NONE}
# torch.nn classes whose call gives one tensor
NN_TENSOR_LAYERS = words(
    """Linear Bilinear Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d ConvTranspose3d
    BatchNorm1d BatchNorm2d BatchNorm3d LayerNorm GroupNorm InstanceNorm1d InstanceNorm2d
    RMSNorm Dropout Dropout1d Dropout2d Dropout3d AlphaDropout ReLU ReLU6 LeakyReLU PReLU ELU
    SELU CELU GELU SiLU Mish Sigmoid Tanh Softmax LogSoftmax Softplus Hardtanh Hardswish
    Identity Flatten Unflatten Embedding EmbeddingBag MaxPool1d MaxPool2d MaxPool3d AvgPool1d
    AvgPool2d AvgPool3d AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool2d
    Upsample PixelShuffle ZeroPad2d ConstantPad2d ReflectionPad2d TransformerEncoder
    TransformerDecoder Transformer TransformerEncoderLayer TransformerDecoderLayer"""
)
STR_TO_STR = words(
    """lower upper strip lstrip rstrip replace format join title capitalize casefold zfill"""
)
STR_METHODS: dict[str, Ty] = {
    "split": T("list", STR),
    "rsplit": T("list", STR),
    "splitlines": T("list", STR),
    "startswith": BOOL,
    "endswith": BOOL,
    "isdigit": BOOL,
    "isalpha": BOOL,
    "find": INT,
    "count": INT,
    "encode": T("bytes"),
}
NDARRAY_TO_NDARRAY = words("astype reshape copy flatten ravel transpose squeeze clip")
DATAFRAME_TO_DATAFRAME = words(
    """copy dropna fillna drop head tail sort_values sort_index reset_index merge sample rename
    query assign set_index"""
)


def known_call(name: str) -> Ty | None:
    """The return type of a call of the function or class at dotted path `name`, if known."""
    if name in KNOWN_CALLS:
        return KNOWN_CALLS[name]
    head, _, last = name.rpartition(".")
    if head == "torch.nn.functional" and last[:1].islower():
        return TENSOR
    if head == "math":
        return INT if last in MATH_INT else BOOL if last in MATH_BOOL else FLOAT
    if not head or head.startswith((".", "typing", "collections", "dataclasses", "enum")):
        return None
    if last[:1].isupper():  # a class (`AdamW`, `SGD`): its instance
        return T(name)
    return None


# methods only a torch.Tensor has among the objects a notebook holds (nn.Module has `float`,
# `cuda`, `to`; numpy arrays `reshape`, `squeeze`, `view(dtype)`; so those are not here): called
# on a value of unknown type (a data set's `.data`, a batch), the value is a tensor
TENSOR_ONLY = words(
    """unsqueeze unsqueeze_ permute contiguous detach detach_ long masked_fill masked_fill_
    new_zeros new_ones new_full new_empty new_tensor index_select masked_select view_as
    reshape_as expand_as type_as requires_grad_ pin_memory"""
)


def untyped_method(method: str, args: list[ast.expr]) -> Ty | None:
    """What `value.method(args)` returns when the value's type is unknown: a tensor for the
    methods only tensors have (`x.unsqueeze(0)`, `x.view(-1, 784)` with sizes, not a dtype),
    an array for `.numpy()`."""
    if method in TENSOR_ONLY:
        return TENSOR
    if method == "view" and args and all(_size(a) for a in args):
        return TENSOR
    return NDARRAY if method == "numpy" and not args else None


def _size(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def method_type(receiver: Ty, method: str, has_args: bool) -> Ty | None:
    """What `receiver.method(...)` returns, for the library types the table knows."""
    if receiver == TENSOR:
        if method in TENSOR_TO_TENSOR:
            return TENSOR
        if method == "size":
            return INT if has_args else T("torch.Size")
        if method in ("max", "min", "median") and not has_args:  # with a dim: (values, indices)
            return TENSOR
        return TENSOR_METHODS.get(method)
    if receiver == STR:
        return STR if method in STR_TO_STR else STR_METHODS.get(method)
    if receiver == NDARRAY:
        return NDARRAY if method in NDARRAY_TO_NDARRAY else None
    if receiver == DATAFRAME:
        if method in DATAFRAME_TO_DATAFRAME:
            return DATAFRAME
        return NDARRAY if method == "to_numpy" else None
    if receiver.name in ("list", "dict", "set") and method == "copy":
        return receiver
    return None


# torch's dtypes, module attributes (`dtype = torch.float32`, cs231n's assignments)
DTYPES = frozenset(
    {
        "float16", "float32", "float64", "bfloat16", "half", "float", "double",
        "complex64", "complex128", "cfloat", "cdouble",
        "uint8", "int8", "int16", "int32", "int64", "short", "int", "long", "bool",
    }
)  # fmt: skip


def module_attribute_type(path: str) -> Ty | None:
    """The type of a library's module attribute, by its full path (`torch.float32`)."""
    if path in ("math.pi", "math.e", "math.inf", "math.tau"):
        return FLOAT
    module, _, attr = path.rpartition(".")
    if module == "torch" and attr in DTYPES:
        return T("torch.dtype")
    return None


def attribute_type(receiver: Ty, attr: str) -> Ty | None:
    if receiver == TENSOR:
        return TENSOR_ATTRIBUTES.get(attr)
    if receiver == NDARRAY:
        return {"shape": T("tuple", INT, T("...")), "T": NDARRAY, "ndim": INT, "size": INT}.get(
            attr
        )
    if receiver == DATAFRAME:
        return {"values": NDARRAY, "columns": T("pandas.Index"), "shape": T("tuple", INT, INT)}.get(
            attr
        )
    return None


def nn_call(name: str) -> Ty | None:
    """What calling an instance of the torch.nn class `name` gives."""
    last = name.rsplit(".", 1)[-1]
    if name.startswith("torch.nn.") and (last.endswith("Loss") or last in NN_TENSOR_LAYERS):
        return TENSOR
    if name == "torch.nn.Sequential":
        return TENSOR
    return None


# what a parameter must be when a function passes it straight to one of these (by position, and
# by keyword): `nn.Linear(n_in, n_out)` makes `n_in` and `n_out` ints whoever the caller is
_DIMS = ("in_features", "out_features")
_CHANNELS = ("in_channels", "out_channels")
_RNN = ("input_size", "hidden_size", "num_layers")
USES: dict[str, tuple[tuple[str, ...], Ty]] = {
    "torch.nn.Linear": (_DIMS, INT),
    **{f"torch.nn.{k}": (_CHANNELS, INT) for k in words("Conv1d Conv2d Conv3d ConvTranspose2d")},
    "torch.nn.Embedding": (("num_embeddings", "embedding_dim"), INT),
    **{f"torch.nn.{k}": (_RNN, INT) for k in ("LSTM", "GRU", "RNN")},
    **{f"torch.nn.{k}": (("num_features",), INT) for k in words("BatchNorm1d BatchNorm2d")},
    "torch.nn.Dropout": (("p",), FLOAT),
    "builtins.range": (("start", "stop", "step"), INT),
    **{
        f"torch.{k}": (("seed",), INT)
        for k in ("manual_seed", "cuda.manual_seed", "cuda.manual_seed_all")
    },
}
# torch functions whose first argument (`input`) must be a tensor (not the constructors that take
# data, `torch.tensor`, `as_tensor`, `from_numpy`, nor `cat`/`stack`, which take a sequence), and
# the losses of torch.nn.functional, whose target is one too
_TENSOR_INPUT = words(
    """exp log log1p sqrt rsqrt abs sigmoid tanh relu softmax log_softmax argmax argmin clamp
    clip flatten squeeze unsqueeze transpose gather matmul mm bmm cumsum cumprod eq ne lt le gt
    ge zeros_like ones_like rand_like randn_like randint_like empty_like full_like isnan isinf
    masked_fill sign floor ceil round"""
)
_LOSSES = words(
    """mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy
    binary_cross_entropy_with_logits cross_entropy nll_loss kl_div"""
)
USES.update({f"torch.{k}": (("input",), TENSOR) for k in _TENSOR_INPUT})
USES.update({f"torch.nn.functional.{k}": (("input", "target"), TENSOR) for k in _LOSSES})
_ACTIVATIONS = words("relu sigmoid tanh softmax log_softmax gelu leaky_relu dropout normalize")
USES.update({f"torch.nn.functional.{k}": (("input",), TENSOR) for k in _ACTIVATIONS})
