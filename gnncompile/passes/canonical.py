"""Phase 1, canonical: the graph cleaned before matching (:func:`drop_identity_dropout`, and
:func:`fast_dropout` in compiled graphs whose inner compiler is not inductor); and the canonical view of the
torch-level FX graph that Dynamo captures, which every phase reads through.

The same operation reaches the graph in several spellings: a method (``x.index_select``), a
function (``torch.index_select``), an unbound method (``torch.Tensor.index_select``), an
operator (``operator.mul``, ``operator.getitem``). :func:`opname` maps all of them to one name,
and :func:`argument` reads an argument by position (with ``self`` at position 0 for methods,
which is the same position the function spelling uses) or by keyword. Matching code therefore never
looks at ``node.op`` / ``node.target`` directly.

Shapes come from the fake values Dynamo records in ``node.meta["example_value"]``. Symbolic
sizes are compared by their printed expression (:func:`size_key`, :func:`same_size`), never with
``==`` (which would add a guard to the shape environment after tracing has finished).
"""
from __future__ import annotations

import operator
import re
from typing import Any, Optional

import torch
from torch.fx import Node

_OPERATORS = {
    operator.mul: "mul", operator.imul: "mul_",
    operator.add: "add", operator.iadd: "add_",
    operator.sub: "sub",
    operator.truediv: "div",
    operator.getitem: "getitem",
    operator.neg: "neg",
}
_ALIASES = {
    "multiply": "mul", "true_divide": "div", "divide": "div", "subtract": "sub",
    "__getitem__": "getitem", "__mul__": "mul", "__rmul__": "mul", "__add__": "add",
    "__radd__": "add", "__sub__": "sub", "__truediv__": "div",
}

# Ops whose result may be dropped when nothing uses it (no side effect, no randomness).
PURE = {
    "getitem", "view", "reshape", "expand", "expand_as", "broadcast_to", "unsqueeze", "squeeze",
    "contiguous", "index_select", "mul", "add", "sub", "div", "exp", "neg", "new_zeros", "zeros",
    "zeros_like", "new_ones", "ones", "ones_like", "new_full", "full", "detach", "clamp",
    "leaky_relu", "size", "to", "float", "select", "relu", "sigmoid", "tanh", "softplus", "elu", "gelu",
    "log", "sqrt", "abs", "pow", "clamp_min", "clamp_max", "clip", "negative", "rsub", "linear", "cat",
    "stack", "flatten", "narrow", "t", "repeat", "mm", "mv", "Size",
}  # (a node that writes in place, inplace=True or out=, is never dropped: see rewrite.drop_dead)

SCATTERS = ("scatter_add_", "scatter_add", "scatter_reduce_", "scatter_reduce", "index_add_",
            "index_add")


def opname(n: Any) -> Optional[str]:
    """Canonical name of the operation a node performs (None for placeholders, outputs...)."""
    if not isinstance(n, Node):
        return None
    if n.op == "call_method":
        return _ALIASES.get(n.target, n.target)
    if n.op != "call_function":
        return None
    t = n.target
    if t in _OPERATORS:
        return _OPERATORS[t]
    name = getattr(t, "__name__", None)
    if name is None:
        return None
    if (getattr(torch, name, None) is t or getattr(torch.Tensor, name, None) is t
            or getattr(torch._C._VariableFunctions, name, None) is t
            or getattr(torch.nn.functional, name, None) is t):
        return _ALIASES.get(name, name)
    for public in _REPLACED:
        if getattr(torch, public, None) is t:
            return public
    return None


# torch functions another library replaces in torch's namespace with a wrapper of its own name
# (PyG: ``torch.index_select = _new_index_select``, for its HashTensor). Whether Dynamo records
# the wrapper or the builtin it calls depends on what the process did first (initialising
# torch.distributed is enough to get the wrapper): both are the op.
_REPLACED = ("index_select",)


def argument(n: Node, pos: int, kw: Optional[str] = None, default: Any = None) -> Any:
    """Argument ``pos`` (self = 0) or keyword ``kw`` of a call node."""
    if pos < len(n.args):
        return n.args[pos]
    if kw is not None and kw in n.kwargs:
        return n.kwargs[kw]
    return default


def fake_value(n: Any):
    """The fake value Dynamo recorded for a node (or the constant itself)."""
    if isinstance(n, Node):
        return n.meta.get("example_value")
    return n


def fake_tensor(n: Any) -> Optional[torch.Tensor]:
    """The fake tensor Dynamo recorded for a node, None when it is not a tensor."""
    v = fake_value(n)
    return v if isinstance(v, torch.Tensor) else None


def size_hint(n: Any) -> Optional[int]:
    """A size as a plain int without specialising it: a symbolic size's hint (its value in the
    example Dynamo traced with), None for an unbacked one. ``int(s)`` on a SymInt would add a
    guard ``s == value`` and recompile the graph for every other size."""
    if isinstance(n, int):
        return n
    return getattr(getattr(n, "node", None), "hint", None)


def size_key(size: Any) -> str:
    """Printable identity of a (possibly symbolic) size: ``str(size)``. For a SymInt that is
    its node's expression (the shape environment's simplified form, read at each call) printed
    by sympy, about 40 us a print; the prints are kept by expression (sympy's are immutable, so
    an expression prints the same every time), as the passes ask for the same few sizes
    hundreds of times a compile."""
    if type(size) is torch.SymInt:
        expr = size.node.expr
        key = _SIZE_KEYS.get(expr)
        if key is None:
            if len(_SIZE_KEYS) >= 4096:
                _SIZE_KEYS.clear()
            key = _SIZE_KEYS[expr] = str(size)
        return key
    return str(size)


_SIZE_KEYS: dict = {}  # sympy expression -> its print (size_key)


def same_size(a: Any, b: Any) -> bool:
    return size_key(a) == size_key(b)


def shape_key(t: torch.Tensor) -> tuple:
    return tuple(size_key(s) for s in t.shape)


def is_one(s: Any) -> bool:
    return size_key(s) == "1"


def layer_of(n: Node) -> str:
    """'conv1 (GCNConv)': the innermost module the node was traced in."""
    stack = n.meta.get("nn_module_stack") or {}
    if not stack:
        return "<model>"
    entries = list(stack.values())
    def is_aggr(c) -> bool:
        if isinstance(c, str):
            return c.endswith("Aggregation")
        return any(b.__name__ == "Aggregation" for b in getattr(c, "__mro__", ()))

    path, cls = "", None
    for p_, c_ in reversed(entries):  # the conv layer, not its aggregation module
        if not is_aggr(c_):
            path, cls = p_, c_
            break
    if cls is None:
        return "<model>"
    name = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].rstrip("'>")
    return module_label(path, name)


# the root of a Dynamo module path: the compiled function's local that holds the model, named
# after ``forward``'s first parameter (``self`` by convention, but ``this`` etc. are legal)
_ROOT = re.compile(r"""^(?:L\[(['"])\w+\1\]|self)(?:\.|$)""")
_GETATTR = re.compile(r"""getattr\(([^()]*), (?:'([^']*)'|"([^"]*)")\)""")


def module_path(source: Any) -> str:
    """'convs.0' from a Dynamo source path such as "L['self'].convs._modules['0']" (whatever
    ``forward``'s first parameter is called); parameters and buffers likewise ('lin.weight')."""
    path = str(source)
    while True:  # getattr(L['self'].convs, '0').x (a name that is not an identifier) -> ...convs.0.x
        inner = _GETATTR.sub(lambda m: f"{m[1]}.{m[2] if m[2] is not None else m[3]}", path)
        if inner == path:
            break
        path = inner
    path = _ROOT.sub("", path, count=1)
    for part in ("_modules['", "_parameters['", "_buffers['", "']"):
        path = path.replace(part, "")
    return path


def module_label(path: Any, name: str) -> str:
    """'convs.0 (SAGEConv)' from a Dynamo module path (see :func:`module_path`)."""
    return f"{module_path(path) or '<model>'} ({name})"


def index_dim(d: Any, ndim: int) -> Optional[int]:
    """A literal dim ``d`` of an ``ndim``-dimensional tensor as a non-negative int (None when
    ``d`` is not a literal int in range)."""
    if not isinstance(d, int):
        return None
    return d % ndim if -ndim <= d < ndim else None


def drop_identity_dropout(graph) -> int:
    """Removes ``dropout`` nodes that are the identity: ``p`` a literal 0 or ``training`` a
    literal False (PyG's models call ``F.dropout(x, p=0.0, training=self.training)`` between
    layers by default). AOTAutograd would otherwise turn each into a full copy of its input.
    Returns how many were removed."""
    removed = 0
    for n in list(graph.nodes):
        if opname(n) != "dropout" or not n.args:
            continue
        p = argument(n, 1, "p", 0.5)
        training = argument(n, 2, "training" if n.target is not torch.dropout else "train", True)
        if isinstance(p, Node) or isinstance(training, Node):
            continue
        if p == 0 or training is False:
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
            removed += 1
    return removed


def fast_dropout(graph) -> int:
    """Replaces ``F.dropout(x, p, training=True)`` on CPU float tensors (``p`` a literal in
    (0, 1), not in place) with ``gnncompile::dropout``: one parallel counter-based pass whose
    backward recomputes the mask, where torch's kernel draws from one sequential generator.
    The seed is drawn from torch's default generator in the graph (``torch.manual_seed`` makes
    runs repeat; the masks differ from eager's, as with any compiler's dropout). Returns how
    many were replaced. For inner compilers that generate their own (inductor) it is not run."""
    from ..ops import targets
    from ..ops.checks import FLOAT_DTYPES

    done = 0
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not torch.nn.functional.dropout or not n.args:
            continue
        x = n.args[0]
        p = argument(n, 1, "p", 0.5)
        training = argument(n, 2, "training", True)
        inplace = argument(n, 3, "inplace", False)
        xv = fake_tensor(x)
        if (not isinstance(p, float) or not 0.0 < p < 1.0 or training is not True or inplace is not False
                or xv is None or xv.device.type != "cpu" or xv.dtype not in FLOAT_DTYPES):
            continue
        with graph.inserting_before(n):
            seed = graph.call_function(torch.randint, (0, 1 << 62, ()), {"dtype": torch.int64})
            out = graph.call_function(targets.DROPOUT, (x, p, seed))
        n.replace_all_uses_with(out)
        graph.erase_node(n)
        done += 1
    return done
