"""The CPU spmm advises its large outputs to use transparent huge pages (native/cpu/glue.h,
advise_huge_pages): the whole 2 MiB pages inside an output of at least 4 MiB are
madvise(MADV_HUGEPAGE)d before the kernel first writes them (read back from /proc/self/smaps:
the mapping that holds them carries the `hg` flag), a small output is left alone, and the values
are the reference's. Run in a fresh interpreter, so that no other part of the suite has wrapped
torch's allocator (gnncompile.hardware.memory advises every large allocation itself)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnncompile.hardware import memory
from gnncompile.ops import _native

REPO = Path(__file__).resolve().parents[2]

CODE = r"""
import json, torch
import gnncompile
from gnncompile.hardware import memory
ops = torch.ops.gnncompile

def flags(addr):
    cur = None
    for line in open('/proc/self/smaps'):
        head = line.split()
        if len(head) >= 5 and '-' in head[0] and not head[0].endswith(':'):
            lo, hi = (int(v, 16) for v in head[0].split('-'))
            cur = lo <= addr < hi
        elif cur and head[0] == 'VmFlags:':
            return head[1:]
    return None

def interior(t):  # an address inside the first whole 2 MiB page of t, or None
    a = t.data_ptr()
    b = (a + (2 << 20) - 1) & ~((2 << 20) - 1)
    return b if b + (2 << 20) <= a + t.numel() * t.element_size() else None

assert not memory.status()["installed"]
res = {}
g = torch.Generator().manual_seed(0)
N, E = 20000, 100000
ei = torch.randint(0, N, (2, E), generator=g)
csr = ops.build_csr(ei[1], ei[0], N, N)
csc = ops.transpose_structure(*csr, N)
# the check itself: a plain 10 MB tensor of torch's, written, is not advised
plain = torch.ones(N, 128)
res["plain_hg"] = "hg" in (flags(interior(plain)) or [])
# small: 20000 x 8 float32 (640 KB), not advised
small = ops.spmm(*csr, None, torch.randn(N, 8, generator=g), "sum", [])[0]
res["small_hg"] = "hg" in (flags(small.data_ptr()) or [])
# large: 20000 x 128 float32 (10 MB): the forward's output and the backward's gradient of x
x = torch.randn(N, 128, generator=g, requires_grad=True)
out = ops.spmm(*csr, None, x, "sum", [], *csc)[0]
res["out_hg"] = "hg" in (flags(interior(out)) or [])
gx = torch.autograd.grad(out, x, torch.ones_like(out))[0]
res["grad_hg"] = "hg" in (flags(interior(gx)) or [])
ref = gnncompile.ops.reference.spmm(*csr, None, x.detach(), "sum")[0]
res["max_err"] = float((out.detach() - ref).abs().max())
# max keeps its int64 arg [N, F] too (20 MB)
y, arg = ops.spmm(*csr, None, x.detach(), "max", [])
res["arg_hg"] = "hg" in (flags(interior(arg)) or [])
res["max_equal"] = bool(torch.equal(y, gnncompile.ops.reference.spmm(*csr, None, x.detach(), "max")[0]))
print(json.dumps(res))
"""


@pytest.mark.skipif(not _native.native_loaded(), reason="the native extension is not loaded")
@pytest.mark.skipif(memory.thp_mode() is None, reason="this kernel has no transparent huge pages")
@pytest.mark.skipif(not torch._C._dispatch_has_kernel_for_dispatch_key("gnncompile::spmm", "CPU"),
                    reason="no native CPU kernel registered for gnncompile::spmm")
def test_large_spmm_outputs_are_advised_to_huge_pages_and_small_ones_are_not():
    env = {**os.environ, "GNNCOMPILE_HUGE_PAGES": "off"}
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["out_hg"] and res["grad_hg"] and res["arg_hg"], res
    assert not res["small_hg"] and not res["plain_hg"], res
    assert res["max_err"] < 1e-4 and res["max_equal"], res
