"""PooledLoader(pad_to_buckets=...): batches padded to a few fixed sizes (for CUDA graphs), and
gnncompile.cuda_graphs.GraphedStep's CPU behaviour (the plain step, the same checks)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from gnncompile.cuda_graphs import GraphedStep, check_model, check_optimizer
from gnncompile.data import PooledLoader, graph_dataset
from gnncompile.data.buckets import BucketPadding, choose_buckets, pick

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data
    from torch_geometric.nn import GCNConv, GINConv, GINEConv, global_add_pool, global_mean_pool


def _data(n=40, edge_dim=0, seed=3):
    ds = graph_dataset(n, min_nodes=4, max_nodes=30, num_features=8, num_classes=3, seed=seed)
    if edge_dim:
        g = torch.Generator().manual_seed(seed)
        for d in ds:
            d.edge_attr = torch.randn(d.edge_index.size(1), edge_dim, generator=g)
    return ds


def _pairs(ds, bs, **kw):
    """(padded, plain) batches of one epoch, the same graphs."""
    a = [b.clone() for b in PooledLoader(ds, batch_size=bs, pad_to_buckets=kw.pop("pad", 3), **kw)]
    b = [b.clone() for b in PooledLoader(ds, batch_size=bs, **kw)]
    assert len(a) == len(b)
    return list(zip(a, b))


# ----------------------------------------------------------------------------- the layout
@pytest.mark.parametrize("workers", [0, 1])
def test_padded_batch_layout(workers):
    ds = _data(edge_dim=3)
    L = PooledLoader(ds, batch_size=8, pad_to_buckets=3, num_workers=workers)
    plain = [b.clone() for b in PooledLoader(ds, batch_size=8)]
    got = [b.clone() for b in L]
    L.close()
    buckets = L.buckets
    assert 1 <= len(buckets) <= 3
    for p, q in zip(got, plain):
        N, E, B, G = q.num_nodes, q.edge_index.size(1), q.num_graphs, 9
        Nb, Eb = p.x.size(0), p.edge_index.size(1)
        assert (Nb, Eb) in buckets and Nb >= N + 1 and Eb >= E
        assert p.padding.num_graphs == B and p.padding.num_nodes == N and p.padding.num_edges == E
        assert p.num_graphs == G and int(p.batch.max()) + 1 == G
        # the real part: the plain batch, bit for bit
        assert torch.equal(p.x[:N], q.x) and torch.equal(p.edge_index[:, :E], q.edge_index)
        assert torch.equal(p.edge_attr[:E], q.edge_attr) and torch.equal(p.batch[:N], q.batch)
        assert torch.equal(p.y[:B], q.y) and torch.equal(p.ptr[:B + 1], q.ptr)
        # padding: zero features, edges among padding nodes only, ignored targets
        assert not p.x[N:].any() and not p.edge_attr[E:].any()
        pe = p.edge_index[:, E:]
        assert bool((pe >= N).all()) and bool((pe < Nb).all())
        assert bool((p.batch[N:] == G - 1).all()) and bool((p.y[B:] == -100).all())
        assert p.ptr.tolist() == q.ptr.tolist() + [N] * (G - 1 - B) + [Nb]
        assert p.graph_mask.tolist() == [True] * B + [False] * (G - B)
        assert int(p.node_mask.sum()) == N and bool(p.node_mask[:N].all())
        assert int(p.edge_mask.sum()) == E and bool(p.edge_mask[:E].all())
        assert p.edge_index.is_contiguous()
    st = L.padding_stats()
    assert st["batches"] == len(got) and st["real_nodes"] == sum(q.num_nodes for q in plain)
    assert st["node_overhead"] > 0 and st["padded_nodes"] == sum(p.x.size(0) for p in got)


def test_padding_draws_nothing_from_the_global_rng():
    ds = _data()
    torch.manual_seed(5)
    a = [b.clone() for b in PooledLoader(ds, batch_size=8, shuffle=True, pad_to_buckets=2)]
    after_a = torch.rand(1)
    torch.manual_seed(5)
    b = [b.clone() for b in PooledLoader(ds, batch_size=8, shuffle=True)]
    assert torch.equal(torch.rand(1), after_a)
    for p, q in zip(a, b):
        assert torch.equal(p.x[:q.num_nodes], q.x)


def test_node_level_target_and_follow_batch():
    ds = _data(n=12)
    for d in ds:
        d.y = torch.arange(d.num_nodes) % 3  # node classification
        d.pos = torch.randn(d.num_nodes, 2)
    L = PooledLoader(ds, batch_size=5, pad_to_buckets=2, follow_batch=["pos"])
    plain = list(b.clone() for b in PooledLoader(ds, batch_size=5, follow_batch=["pos"]))
    for p, q in zip([b.clone() for b in L], plain):
        N = q.num_nodes
        assert torch.equal(p.y[:N], q.y) and bool((p.y[N:] == -100).all())
        assert torch.equal(p.pos_batch[:N], q.pos_batch) and bool((p.pos_batch[N:] == p.num_graphs - 1).all())
        assert p.pos_ptr.size(0) == p.num_graphs + 1 and p.pos_ptr[-1] == p.pos.size(0)


# ----------------------------------------------------------------------------- buckets
def test_choose_buckets_covers_every_batch_with_few_buckets():
    g = torch.Generator().manual_seed(0)
    n = torch.randint(2000, 3000, (200,), generator=g)
    e = n * 2 + torch.randint(0, 300, (200,), generator=g)
    for k in (1, 2, 4):
        bs = choose_buckets(n.tolist(), e.tolist(), k, granule=8)
        assert 1 <= len(bs) <= k
        assert all(a % 8 == 0 and b % 8 == 0 for a, b in bs)
        assert all(pick(bs, int(a), int(b)) is not None for a, b in zip(n, e))
    # more buckets, less padding
    def waste(bs):
        return sum(bs[pick(bs, int(a), int(b))][0] - int(a) for a, b in zip(n, e))
    assert waste(choose_buckets(n.tolist(), e.tolist(), 4)) < waste(choose_buckets(n.tolist(), e.tolist(), 1))


def test_a_batch_no_bucket_holds_gets_a_new_bucket():
    ds = _data()
    L = PooledLoader(ds, batch_size=8, pad_to_buckets=[(16, 16)])  # far too small for any batch
    with pytest.warns(UserWarning, match="new bucket"):
        got = [b.clone() for b in L]
    from gnncompile.data.buckets import MAX_NEW

    assert 1 < len(L.buckets) <= 1 + MAX_NEW + 1  # bounded: then the largest possible batch
    for p in got:
        assert p.x.size(0) >= p.padding.num_nodes + 1 and (p.x.size(0), p.edge_index.size(1)) in L.buckets
    # the next epoch: no new bucket, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(L)) == len(got)


def test_iter_batches_pads_and_refuses_too_many_graphs():
    ds = _data()
    L = PooledLoader(ds, batch_size=4, pad_to_buckets=2)
    got = [b.clone() for b in L.iter_batches([[0, 1], [2, 3, 4]])]
    assert [b.padding.num_graphs for b in got] == [2, 3] and all(b.num_graphs == 5 for b in got)
    with pytest.raises(ValueError, match="at most 4 real graphs"):
        L.iter_batches([list(range(6))])


@pytest.mark.parametrize("bad, match", [
    (0, "in \\[1, 16\\]"), ([], "empty"), ([(0, 5)], "nodes >= 1"), ([(4,)], "nodes >= 1"), ("x", "count or a list"),
])
def test_bad_bucket_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        PooledLoader(_data(n=5), batch_size=2, pad_to_buckets=bad)
    with pytest.raises(ValueError, match="ignore_index"):
        BucketPadding(2, ignore_index=1.5)


def test_datasets_it_cannot_pad():
    ds = _data(n=6)
    for i, d in enumerate(ds):  # neither per node, per edge nor per graph
        d.extra = torch.zeros(i + 2)
    with pytest.raises(ValueError, match="'extra' has neither"):
        PooledLoader(ds, batch_size=2, pad_to_buckets=2)
    ds = _data(n=6)
    for d in ds:
        d.node_mask = torch.ones(d.num_nodes, dtype=torch.bool)
    with pytest.raises(ValueError, match="'node_mask'"):
        PooledLoader(ds, batch_size=2, pad_to_buckets=2)
    ds = [Data(x=torch.randn(3, 2), y=torch.tensor([0])) for _ in range(4)]
    with pytest.raises(ValueError, match="no edge_index"):
        PooledLoader(ds, batch_size=2, pad_to_buckets=2)


# ----------------------------------------------------------------------------- exactness
class GIN(torch.nn.Module):
    def __init__(self, edge_dim=0):
        super().__init__()
        mlp = lambda i, o: torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))
        conv = (lambda i, o: GINEConv(mlp(i, o), edge_dim=edge_dim)) if edge_dim else (lambda i, o: GINConv(mlp(i, o)))
        self.edge_dim = edge_dim
        self.c1, self.c2 = conv(8, 16), conv(16, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, b, size=None):
        args = (b.edge_index, b.edge_attr) if self.edge_dim else (b.edge_index,)
        h = self.c2(self.c1(b.x, *args).relu(), *args)
        return h, self.head(global_add_pool(h, b.batch, size=size))


class GCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = GCNConv(8, 16), GCNConv(16, 16), GCNConv(16, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, b, size=None):
        h = self.c3(self.c2(self.c1(b.x, b.edge_index).relu(), b.edge_index).relu(), b.edge_index)
        return h, self.head(global_add_pool(h, b.batch, size=size))


@pytest.mark.parametrize("name", ["gin", "gine", "gcn"])
def test_padded_outputs_loss_and_gradients_equal_unpadded(name):
    torch.manual_seed(0)
    model = {"gin": lambda: GIN(), "gine": lambda: GIN(edge_dim=3), "gcn": GCN}[name]()
    ds = _data(n=24, edge_dim=3 if name == "gine" else 0)
    for p, q in _pairs(ds, 8):
        N, B = q.num_nodes, q.num_graphs
        grads = []
        for b, size in ((p, p.num_graphs), (q, None)):
            model.zero_grad()
            h, out = model(b, size)
            loss = F.cross_entropy(out, b.y, ignore_index=-100)
            loss.backward()
            grads.append((h, out, loss, [t.grad.clone() for t in model.parameters()]))
        (hp, op, lp, gp), (hq, oq, lq, gq) = grads
        torch.testing.assert_close(hp[:N], hq, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(op[:B], oq, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lp, lq, rtol=1e-6, atol=1e-7)
        for a, c in zip(gp, gq):
            torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_masked_regression_loss_and_mean_pool_equal_unpadded():
    torch.manual_seed(0)
    ds = _data(n=20)
    for d in ds:
        d.y = d.x[:, :1].sum().view(1, 1)  # a float graph-level target
    model = GIN()
    for p, q in _pairs(ds, 6, pad=2):
        B = q.num_graphs
        h, _ = model(p)
        hq, _ = model(q)
        outp = global_mean_pool(h, p.batch, size=p.num_graphs)[:, :1]
        outq = global_mean_pool(hq, q.batch)[:, :1]
        m = p.graph_mask.unsqueeze(1).to(outp.dtype)
        lp = (((outp - p.y) ** 2) * m).sum() / m.sum()
        lq = F.mse_loss(outq, q.y)
        assert not p.y[B:].any()
        torch.testing.assert_close(lp, lq, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- GraphedStep on the CPU
def _loss(m, b):
    return F.cross_entropy(m(b, size=b.num_graphs)[1], b.y, ignore_index=-100)


def test_graphed_step_on_cpu_runs_the_plain_step():
    torch.manual_seed(0)
    ds = _data()
    a = GIN()
    b = copy.deepcopy(a)
    oa = torch.optim.Adam(a.parameters(), lr=1e-2)
    ob = torch.optim.Adam(b.parameters(), lr=1e-2)
    step = GraphedStep(a, oa, _loss)
    assert step.mode == "plain"
    for p, q in _pairs(ds, 8):
        la = step(p)
        ob.zero_grad()
        lb = F.cross_entropy(b(q)[1], q.y)
        lb.backward()
        ob.step()
        torch.testing.assert_close(la, lb.detach(), rtol=1e-6, atol=1e-7)
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    assert step.captures == 0


def test_graphed_step_refuses_batchnorm_in_training_on_padded_batches():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    p, q = _pairs(_data(n=10), 4)[0]
    step = GraphedStep(model, torch.optim.SGD(model.parameters(), lr=0.1), lambda m, b: m(b.x).sum())
    with pytest.raises(ValueError, match="BatchNorm1d.*padding nodes"):
        step(p)
    step(q)  # unpadded: fine
    model.eval()
    step(p)  # BatchNorm in eval mode: fine
    check_model(model, p)


def test_optimizer_checks_for_capture():
    model = torch.nn.Linear(3, 3)
    params = list(model.parameters())
    with pytest.raises(ValueError, match="capturable=True"):
        check_optimizer(torch.optim.Adam(params, capturable=False), params)
    check_optimizer(torch.optim.Adam(params, capturable=True), params)
    check_optimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9), params)
    with pytest.raises(ValueError, match="dampening"):
        check_optimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.1), params)
    with pytest.raises(ValueError, match="one plain step first"):  # its fresh state is not all zeros
        check_optimizer(torch.optim.NAdam(params, capturable=True), params)
    nadam = torch.optim.NAdam(params)
    model(torch.randn(2, 3)).sum().backward()
    nadam.step()  # (a capturable NAdam steps on a GPU only)
    for g in nadam.param_groups:
        g["capturable"] = True
    check_optimizer(nadam, params)  # state exists: copied back exactly


def test_graphed_step_bad_arguments():
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        GraphedStep(lambda x: x, opt, _loss)
    with pytest.raises(TypeError, match="Optimizer"):
        GraphedStep(model, object(), _loss)
    with pytest.raises(ValueError, match="warmup"):
        GraphedStep(model, opt, _loss, warmup=0)
    with pytest.raises(ValueError, match="no parameters"):
        GraphedStep(torch.nn.ReLU(), opt, _loss)


def test_the_warm_up_is_undone_exactly():
    """GraphedStep's _Snapshot (device-independent): steps taken after it and then undone leave
    the model and optimizer as a copy that never took them: the next step is bit-equal,
    for a fresh optimizer state (reset to zero) and for an existing one (copied back)."""
    from gnncompile.cuda_graphs import _Snapshot

    torch.manual_seed(0)
    p, _ = _pairs(_data(n=16), 8)[0]
    for make, pre in ((lambda ps: torch.optim.Adam(ps, lr=1e-2), 0), (lambda ps: torch.optim.AdamW(ps, lr=1e-2), 2),
                      (lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9), 0)):
        a = GIN()
        b = copy.deepcopy(a)
        oa, ob = make(a.parameters()), make(b.parameters())

        def step(m, o):
            o.zero_grad(set_to_none=True)
            _loss(m, p).backward()
            o.step()

        for _ in range(pre):  # an existing state
            step(a, oa), step(b, ob)
        snap = _Snapshot(a, oa)
        for _ in range(3):  # the warm-up
            step(a, oa)
        assert any(not torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
        snap.restore()
        step(a, oa), step(b, ob)
        for x, y in zip(a.parameters(), b.parameters()):
            assert torch.equal(x, y)
        for x, y in zip(a.parameters(), b.parameters()):
            for k, v in ob.state[y].items():
                assert torch.equal(torch.as_tensor(oa.state[x][k]), torch.as_tensor(v)), k


def test_batches_of_one_bucket_share_a_shape_key():
    from gnncompile.cuda_graphs import _shape_key

    L = PooledLoader(_data(), batch_size=8, pad_to_buckets=2)
    got = [b.clone() for b in L]
    keys = {_shape_key(b) for b in got}
    assert len(keys) == len({(b.x.size(0), b.edge_index.size(1)) for b in got}) <= 2


@pytest.mark.parametrize("workers", [0, 1])
def test_padding_with_prepared_structures(workers):
    """structures=True builds the structure of the padded edge_index (its node count padded)."""
    from gnncompile.ops import structure as S

    ds = _data(n=24)
    ref = [b.clone() for b in PooledLoader(ds, batch_size=8, pad_to_buckets=2)]
    L = PooledLoader(ds, batch_size=8, pad_to_buckets=2, structures=True, num_workers=workers)
    for b, r in zip(L, ref):
        for k in ("x", "edge_index", "batch", "ptr", "node_mask"):
            assert torch.equal(b[k], r[k]), k
        s = S.CACHE.get(b.edge_index, b.num_nodes)  # the prepared one (a hit) or a build
        fresh = S.build(b.edge_index.clone(), b.num_nodes)
        assert torch.equal(s.rowptr, fresh.rowptr) and torch.equal(s.col, fresh.col)
    L.close()
