"""Where the attention passes fuse: GAT's, GATv2's and TransformerConv's chains on the CPU always, on
CUDA only where the settings opt in to the ops' CUDA kernels, off by default there (one warp per
destination row: GAT's was 19x slower than the chain on an H200; choices['cuda_unverified'],
$GNNCOMPILE_CUDA_UNVERIFIED); otherwise the report says why. The decision itself, without a GPU
(tests/gpu runs the fused models on one)."""
from __future__ import annotations

import pytest
import torch

from gnncompile.passes.attention import CUDA_STATUS, unfused_on
from gnncompile.passes.attention_dot import UNVERIFIED as DOT_UNVERIFIED
from gnncompile.passes.attention_v2 import UNVERIFIED as V2_UNVERIFIED
from gnncompile.settings import Settings

OPS = [("attention_v2", "GATv2", V2_UNVERIFIED), ("attention_dot", "TransformerConv", DOT_UNVERIFIED),
       ("attention", "GAT", None)]


@pytest.mark.parametrize("op,what,note", OPS)
def test_cpu_fuses_cuda_waits_for_the_opt_in(op, what, note):
    default = Settings()
    opted = Settings().replace(choices={"cuda_unverified": op})
    not_op = "attention_v2" if op == "attention_dot" else "attention_dot"
    if note is None:
        note = unfused_on(torch.device("cuda"), op, what, default)
    other = Settings().replace(choices={"cuda_unverified": not_op})
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert unfused_on(cpu, op, what, default) is None and unfused_on(cpu, op, what, opted) is None
    assert unfused_on(cuda, op, what, default) == note
    assert unfused_on(cuda, op, what, other) == note  # the opt-in is per op
    assert unfused_on(cuda, op, what, opted) is None
    assert unfused_on(cuda, op, what, Settings().replace(choices={"cuda_unverified": "all"})) is None
    assert "no kernel for mps" in unfused_on(torch.device("mps"), op, what, opted)
    # the note says what is missing and how to opt in
    assert f"gnncompile::{op}: {CUDA_STATUS[op]}" in note and "one warp per destination row" in note
    assert f"GNNCOMPILE_CUDA_UNVERIFIED={op}" in note and note.startswith(f"{what} attention left as a chain on CUDA")


def test_the_match_phase_leaves_transformerconvs_message_on_cuda_only_with_the_opt_in():
    """leave_for_attention_dot's device rule (a node whose recorded value is a fake CUDA tensor):
    float32 / float64 on the CPU, on CUDA only when asked (the settings' opt-in)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import Graph

    from gnncompile.passes.attention_dot import _float_fusable

    g = Graph()
    with FakeTensorMode():
        vals = {d: torch.empty(5, 2, 3, device=d) for d in ("cpu", "cuda")}
        half = torch.empty(5, 2, 3, device="cuda", dtype=torch.float16)
    nodes = {}
    for name, v in (("cpu", vals["cpu"]), ("cuda", vals["cuda"]), ("half", half)):
        nodes[name] = g.placeholder(name)
        nodes[name].meta["example_value"] = v
    assert _float_fusable(nodes["cpu"], False) and _float_fusable(nodes["cpu"], True)
    assert not _float_fusable(nodes["cuda"], False) and _float_fusable(nodes["cuda"], True)
    assert not _float_fusable(nodes["half"], True)
