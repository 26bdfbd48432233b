"""bench/pretrain.py --smoke (CPU, tiny GPT, the gproj_cuda emulator) writes complete, finite logs;
a run stopped by its time budget and resumed gives the same records as an uninterrupted one; and
bench/plot_pretrain.py draws PNGs from the logs."""

import csv
import importlib.util
import json
import math
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def pretrain():
    return _load("pretrain")


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.mark.parametrize("arm", ["fa3", "fp32"])
def test_smoke_logs(pretrain, tmp_path, arm):
    assert pretrain.main(["--smoke", "--arm", arm, "--workdir", str(tmp_path)]) == 0
    name = f"{arm}-none"
    recs = _records(tmp_path / f"{name}.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 6]        # log every 2, eval every 3, last
    for r in recs:
        for col in pretrain.TOP_COLUMNS:
            assert col in r, col
        for col in ("step", "tokens", "lr", "train_loss", "train_loss_step", "grad_norm",
                    "grad_norm_step", "grad_norm_max"):
            assert _finite(r[col]), (col, r[col])
        assert r["arm"] == arm and len(r["layers"]) == 2
        for L in r["layers"]:
            for s in pretrain.LAYER_STATS:
                assert _finite(L[s]), (r["step"], L["layer"], s, L[s])
            assert 0 < L["dq_err"] < 1 and 0 <= L["sumdk"] < 1 and L["dq_err_fp32"] < 1e-3
    vals = [r["val_loss"] for r in recs if r["val_loss"] is not None]
    assert [r["step"] for r in recs if r["val_loss"] is not None] == [1, 3, 6]
    assert all(_finite(v) for v in vals) and vals[-1] < vals[0]
    with open(tmp_path / f"{name}.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(recs)
    for col in list(pretrain.TOP_COLUMNS) + [f"L{i}_{s}" for i in range(2)
                                              for s in pretrain.LAYER_STATS]:
        assert col in rows[0], col
    assert all(math.isfinite(float(row["L1_dq_err"])) for row in rows)
    summary = json.loads((tmp_path / f"{name}.summary.json").read_text())
    assert summary["stop_reason"] == "steps" and summary["steps_done"] == 6
    if arm == "fp32":        # FP32 attention: its dQ is the float64 one rounded to BF16
        assert all(L["dq_err"] < 0.003 for r in recs for L in r["layers"])


def test_resume_matches_uninterrupted(pretrain, tmp_path):
    base = ["--smoke", "--arm", "fp32", "--workdir", str(tmp_path)]
    assert pretrain.main(base + ["--name", "full"]) == 0
    assert pretrain.main(base + ["--name", "part", "--time-budget-s", "0"]) == 0   # stops at 1
    part = _records(tmp_path / "part.jsonl")
    assert [r["step"] for r in part] == [1]
    assert json.loads((tmp_path / "part.summary.json").read_text())["stop_reason"].startswith(
        "time budget")
    assert pretrain.main(base + ["--name", "part", "--resume"]) == 0
    full, part = _records(tmp_path / "full.jsonl"), _records(tmp_path / "part.jsonl")
    assert [r["step"] for r in part] == [r["step"] for r in full]
    for a, b in zip(full, part):
        assert a["train_loss_step"] == b["train_loss_step"] and a["val_loss"] == b["val_loss"]
        assert a["layers"][1]["dq_err"] == b["layers"][1]["dq_err"]


def test_plot(pretrain, tmp_path):
    pytest.importorskip("matplotlib")
    for arm in ("fp32",):
        assert pretrain.main(["--smoke", "--arm", arm, "--workdir", str(tmp_path), "--steps", "4",
                              "--ckpt-every", "0"]) == 0
    plot = _load("plot_pretrain")
    assert plot.main(["--smoke-dir", str(tmp_path)]) == 0
    for panel in plot.PANELS + ("all",):
        p = tmp_path / f"pretrain_{panel}.png"
        assert p.exists() and p.stat().st_size > 1000, p
