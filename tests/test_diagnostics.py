"""diagnostics.py: the audit finds the leak where it is and leaves the model untouched, all three
call paths are captured, the monitor logs every K steps, and the CLI demo runs (CPU, small)."""

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F

import gproj_cuda
from gproj_cuda import diagnostics
from gproj_cuda.__main__ import main

HEAD_DIM = 64


class ToyAttention(torch.nn.Module):
    """One attention layer whose keys get a common offset ``key_offset · w`` (w = fixed ±1)."""

    def __init__(self, width, path, key_offset, gen, heads_k=None):
        super().__init__()
        self.h = width // HEAD_DIM
        self.hk = heads_k or self.h
        self.path = path
        self.q = torch.nn.Linear(width, width)
        self.kv = torch.nn.Linear(width, 2 * self.hk * HEAD_DIM)
        self.o = torch.nn.Linear(width, width)
        signs = torch.randint(0, 2, (self.hk * HEAD_DIM,), generator=gen).float() * 2 - 1
        self.key_bias = torch.nn.Parameter(key_offset * signs)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.h, HEAD_DIM)
        k, v = self.kv(x).view(b, n, 2, self.hk * HEAD_DIM).unbind(2)
        k = (k + self.key_bias).view(b, n, self.hk, HEAD_DIM)
        v = v.reshape(b, n, self.hk, HEAD_DIM)
        if self.path == "sdpa":
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True,
                                               enable_gqa=self.hk != self.h).transpose(1, 2)
        else:
            q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
            if self.path == "attention":
                y = gproj_cuda.attention(q, k, v, causal=True)
            else:
                y = gproj_cuda.flash_attn_func(q, k, v, causal=True)
            y = y.float()
        return x + self.o(y.reshape(b, n, -1))


class Toy(torch.nn.Module):
    def __init__(self, layers=2, heads=2, path="sdpa", key_offset=0.0, seed=0, heads_k=None):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        width = heads * HEAD_DIM
        self.layers = torch.nn.ModuleList(ToyAttention(width, path, key_offset, gen, heads_k)
                                          for _ in range(layers))
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        for layer in self.layers:
            x = self.drop(layer(x))
        return x


def batch(heads=2, seqlen=128, b=1):
    return torch.randn(b, seqlen, heads * HEAD_DIM, generator=torch.Generator().manual_seed(1))


def test_leak_grows_with_key_offset_and_gproj_stays_below_bar():
    worst = []
    for offset in (0.0, 32.0, 256.0):
        rep = diagnostics.audit(Toy(key_offset=offset), batch(), max_rows=32)
        assert len(rep.rows) == 4 and not rep.skipped               # 2 layers x 2 heads
        assert all(r["gproj_dq_err"] < 0.005 for r in rep.rows)
        assert all(math.isfinite(r["fa3_dk_err"]) for r in rep.rows)
        worst.append(max(r["fa3_dq_err"] for r in rep.rows))
        ratios = [r["key_ratio"] for r in rep.rows]
        if offset == 0:
            assert max(ratios) < 1 and rep.verdict().startswith("not affected")
        else:
            assert min(ratios) > 10 and rep.verdict().startswith("AFFECTED")
    assert worst[0] < 0.005
    assert worst[1] > 5 * worst[0]
    assert worst[2] > 5 * worst[1]


def test_audit_leaves_parameters_gradients_mode_and_rng_untouched():
    model = Toy(key_offset=32.0)
    model(batch()).square().mean().backward()           # pre-existing .grad values
    model.layers[1].o.weight.grad = None                # and one parameter without a .grad
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: (p.grad, None if p.grad is None else p.grad.clone())
             for n, p in model.named_parameters()}
    model.train()
    model.layers[0].eval()                               # mixed modes survive
    rng = torch.get_rng_state()
    rep = diagnostics.audit(model, batch(), max_rows=32)
    assert rep.rows and all(math.isfinite(r["fa3_dq_err"]) for r in rep.rows)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), params[n]), n
        obj, val = grads[n]
        assert p.grad is obj, n                          # the very same tensor objects...
        if val is not None:
            assert torch.equal(p.grad, val), n           # ...with the same values
    assert model.training and not model.layers[0].training and model.layers[1].training
    assert torch.equal(torch.get_rng_state(), rng)
    # The functions were put back.
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    assert gproj_cuda.attention is gproj_cuda.api.attention
    assert not hasattr(gproj_cuda.attention, "__wrapped__")


@pytest.mark.parametrize("path,heads_k", [("attention", None), ("flash", None), ("sdpa", None),
                                          ("sdpa", 1), ("attention", 1)])
def test_capture_all_call_paths(path, heads_k):
    model = Toy(heads=2, path=path, key_offset=32.0, heads_k=heads_k)
    rep = diagnostics.audit(model, batch(seqlen=64), max_rows=16)
    assert [(r["layer"], r["head"]) for r in rep.rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    api = {"attention": "gproj_cuda.attention", "flash": "gproj_cuda.flash_attn_func",
           "sdpa": "scaled_dot_product_attention"}[path]
    for r in rep.rows:
        assert r["api"] == api and r["causal"] and r["rows"] == 16 and r["seqlen_q"] == 64
        assert r["module"] == f"layers.{r['call_index']}"
        assert r["kv_head"] == (0 if heads_k == 1 else r["head"])
        assert r["fa3_dq_err"] > 0.01 and r["gproj_dq_err"] < 0.005
        assert 0 < r["max_prob"] <= 1 and r["entropy"] > 0 and r["rowsum_residual"] > 0
    if path != "sdpa" or heads_k:
        return
    # Selection by module name labels rows by name; max_heads samples heads.
    rep = diagnostics.audit(model, batch(seqlen=64), layers=["layers.1"], max_rows=16,
                            max_heads=1)
    assert [(r["layer"], r["head"]) for r in rep.rows] == [("layers.1", 0)]


def test_row_slice_keeps_the_causal_alignment():
    """The last max_rows rows with all keys give exactly the dQ errors those rows have in the
    full problem (dQ rows are independent), for causal and sliding-window masks."""
    from gproj_cuda import reference
    from gproj_cuda.metrics import row_rel_err, stress_inputs
    q, k, v, do = stress_inputs(1, 96, 2, HEAD_DIM, kmean=32, seed=3, heads_k=1)
    for causal, window in ((True, (-1, -1)), (False, (40, 8))):
        kw = dict(causal=causal, window_size=window)
        _, _, rdq, _, _ = reference.attention_grads(q, k, v, do, **kw)
        _, _, dq, _, _ = reference.emulate(q, k, v, do, numerics="fa3", fp32_grads=True, **kw)
        want = [row_rel_err(dq[:, -24:, h], rdq[:, -24:, h]) for h in range(2)]
        call = diagnostics._Call(0, "m", "test", q=q, k=k, v=v, causal=causal,
                                 window=(window[0], 0 if causal else window[1]))
        recs = diagnostics._analyse_call(call, do, 24, None, None, None)
        assert [r["fa3_dq_err"] for r in recs] == pytest.approx(want, rel=1e-9)
        assert [r["kv_head"] for r in recs] == [0, 0] and recs[0]["key_ratio"] > 10


def test_failure_inside_the_audit_restores_everything():
    class Boom(Toy):
        def forward(self, x):
            super().forward(x)
            raise RuntimeError("boom")

    model = Boom(path="attention")
    torch.set_float32_matmul_precision("high")
    try:
        with pytest.raises(RuntimeError, match="boom"):
            diagnostics.audit(model, batch())
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision("highest")
    assert gproj_cuda.attention is gproj_cuda.api.attention
    assert not hasattr(gproj_cuda.api.attention, "__wrapped__")
    assert all(p.grad is None for p in model.parameters()) and model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_sdpa_with_explicit_mask_is_skipped():
    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            q = (x * self.w).view(1, 64, 1, HEAD_DIM).transpose(1, 2)
            mask = torch.ones(64, 64, dtype=torch.bool).tril()
            return (F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
                    + F.scaled_dot_product_attention(q, q, q, None, 0.0, True, scale=0.1))

    rep = diagnostics.audit(Masked(), torch.randn(1, 64, HEAD_DIM))
    assert [s["reason"] for s in rep.skipped] == ["explicit attn_mask"]
    assert [(r["call_index"], r["scale"], r["causal"]) for r in rep.rows] == [(1, 0.1, True)]


def test_report_outputs(tmp_path):
    rep = diagnostics.audit(Toy(key_offset=32.0), batch(), max_rows=32)
    lines = rep.table().splitlines()
    assert "fa3 dQ" in lines[0] and len(lines) == 2 + len(rep.rows)
    errs = [float(x.split()[8].rstrip("%")) for x in lines[2:]]
    assert errs == sorted(errs, reverse=True)                       # riskiest first
    rep.to_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"] == rep.verdict() and len(data["rows"]) == len(rep.rows)
    rep.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="model"):
        diagnostics.audit(lambda x: x, batch())
    with pytest.raises(ValueError, match="max_rows"):
        diagnostics.audit(Toy(), batch(), max_rows=0)
    with pytest.raises(TypeError, match="layers"):
        diagnostics.audit(Toy(), batch(), layers=[1.5])
    with pytest.raises(ValueError, match="loss_fn"):
        diagnostics.audit(Toy(), batch(), loss_fn=lambda out, b: out)
    with pytest.raises(ValueError, match="every"):
        diagnostics.LeakMonitor(Toy(), every=0)


def test_monitor_logs_every_k_steps(tmp_path):
    model = Toy(key_offset=32.0)
    path = tmp_path / "leak.csv"
    mon = diagnostics.LeakMonitor(model, every=3, csv_path=str(path), max_rows=32)
    x = batch(seqlen=64)
    for step in range(7):                                # logs at steps 0, 3, 6
        with mon.maybe_capture(step):
            model(x).square().mean().backward()
    assert mon.step(x, 7) == [] and len(mon.step(x, 9)) == 4
    mon.close()
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0].keys()) == diagnostics.MONITOR_COLUMNS
    assert [int(r["step"]) for r in rows] == [0] * 4 + [3] * 4 + [6] * 4 + [9] * 4
    assert {(r["layer"], r["head"]) for r in rows} == {("0", "0"), ("0", "1"), ("1", "0"),
                                                       ("1", "1")}
    assert all(float(r["key_ratio"]) > 10 and 0 < float(r["max_prob"]) <= 1 for r in rows)
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_cli_demo(capsys, tmp_path):
    rc = main(["audit", "--demo", "--demo-layers", "2", "--demo-width", "128", "--demo-seqlen",
               "64", "--max-rows", "32", "--json", str(tmp_path / "a.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.strip().splitlines()[-2].startswith("AFFECTED: FA3-arithmetic dQ error up to")
    assert "blocks.1" in out and (tmp_path / "a.json").exists()


def test_cli_script(capsys, tmp_path):
    script = tmp_path / "model.py"
    script.write_text("import torch\n"
                      "from test_diagnostics import Toy, batch\n"
                      "def build():\n    return Toy(key_offset=0.0), batch(seqlen=64)\n")
    assert main(["audit", str(script), "--max-rows", "16"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("not affected")
