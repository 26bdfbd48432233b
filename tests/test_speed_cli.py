"""bench/speed.py's code paths on the CPU (tiny shapes, --device cpu): every record is complete and
finite, and --kmean gives the keys their offset and says so in each record."""

import importlib.util
import json
import math
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _speed():
    spec = importlib.util.spec_from_file_location("speed", os.path.join(ROOT, "bench", "speed.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(speed, tmp_path, *extra):
    """speed.main on one tiny dense shape (B = 2, N = 64, two heads of 64); its records."""
    out = tmp_path / "speed.json"
    args = ["--device", "cpu", "--tokens", "128", "--width", "128", "--hdims", "64",
            "--seqlens", "64", "--no-gqa", "--varlen-means", "", "--varlen-mixes", "",
            "--budget-s", "0.01", "--pause", "0", "--out", str(out), *extra]
    assert speed.main(args) == 0
    return json.loads(out.read_text())


def test_speed_cpu_records_are_complete(tmp_path):
    recs = _run(_speed(), tmp_path)
    assert recs and all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in recs)
    assert all("kmean" not in r for r in recs)
    assert {r["op"] for r in recs} == {"fwd", "bwd"}


def test_speed_kmean_offsets_the_keys(tmp_path, monkeypatch):
    speed = _speed()
    seen = []
    real = speed.bench_one

    def spy(make, shape, ops, *a, **kw):  # the keys each implementation is handed
        def make_spy(*m):
            f = make(*m)
            return lambda q, k, v: (seen.append(k.detach().float().mean(dim=(0, 1))), f(q, k, v))[1]
        return real(make_spy, shape, ops, *a, **kw)

    monkeypatch.setattr(speed, "bench_one", spy)
    recs = _run(speed, tmp_path, "--ops", "fwd", "--kmean", "32")
    assert recs and all(r["kmean"] == 32 for r in recs)
    # every coordinate's mean over the keys is +-32 (N(0,1) noise over 64 x 2 keys: |err| < 1)
    assert seen and all(((m.abs() - 32).abs() < 1).all() for m in seen)


def test_speed_render_merges_shards(tmp_path):
    """--shard i/n runs measure disjoint shapes; --render merges their records into one JSON
    and table without timing anything."""
    speed = _speed()
    base = ["--device", "cpu", "--tokens", "128", "--width", "128", "--hdims", "64",
            "--seqlens", "64", "--no-gqa", "--varlen-means", "", "--varlen-mixes", "",
            "--budget-s", "0.01", "--pause", "0", "--ops", "fwd"]
    parts = []
    for i in range(2):  # two shapes (causal and not), one per shard
        out = tmp_path / f"part{i}.json"
        assert speed.main(base + ["--shard", f"{i}/2", "--out", str(out)]) == 0
        parts.append(json.loads(out.read_text()))
    assert parts[0] and parts[1]
    assert {r["causal"] for r in parts[0]}.isdisjoint({r["causal"] for r in parts[1]})
    merged, md = tmp_path / "merged.json", tmp_path / "merged.md"
    assert speed.main(["--render", ",".join(str(tmp_path / f"part{i}.json") for i in range(2)),
                       "--out", str(merged), "--md", str(md)]) == 0
    assert json.loads(merged.read_text()) == parts[0] + parts[1]
    text = md.read_text()
    assert text.startswith("Measured on cpu") and "merged by" in text and "| 64 |" in text
