"""The peers'-basis benchmark's pieces, one process: the large model's accounting (bench/large_model.py: the bytes
per parameter of each rank, the passes of a round outside training and their bound at the triad's bandwidth, the
targets' status), the held memory that leaves out the other ranks' slots (bench/_rank.py's smaps reading) and the
peers'-basis targets on both bases (bench/peers_basis.py), on hand-computed numbers."""


import pytest
from conftest import ROOT, bench_module

large_model = bench_module("large_model", "test_bench42")
paired = bench_module("paired", "test_bench42")
peers_basis = bench_module("peers_basis", "test_bench42")


def test_round_bytes_count_the_passes_outside_training():
    # -n 3: rank 0 reads 3 slots and writes the sums (32), the server step (16), the checks (12), the
    # broadcast's copy into rank 0's slot (8, which the workers read in place) and a worker's cleared slot (8).
    assert large_model.round_bytes(3) == 32 + 16 + 12 + 8 + 8 == 76
    assert large_model.round_bytes(2) - large_model.round_bytes(3) == -8     # one slot fewer to read


def test_memory_is_bytes_per_parameter_over_the_small_models_run():
    d = 2**20                      # a MiB over a parameter count of 2^20: one byte per MiB of difference
    small = {f"peak_{k}_mb": [100.0, 50.0] for k in ("rss", "pss", "uss", "held")}
    big = {f"peak_{k}_mb": [124.0, 70.0] for k in ("rss", "pss", "uss", "held")}
    assert large_model.memory_row(small, big, d)["held"] == [24.0, 20.0]


@pytest.mark.parametrize("held, cost, met", [([24.0, 20.0, 19.5], 3.5, (True, True, True)),
                                             ([24.5, 20.0, 20.1], 9.0, (False, False, False))])
def test_the_targets_read_the_held_memory_and_the_cost_over_the_bound(held, cost, met):
    row = {"n": 3, "params": 100e6, "ns_per_byte": cost, "memory": {k: held for k in ("rss", "pss", "uss", "held")}}
    lines, status = large_model.report(row, bandwidth=19.0 / 2.0)   # 76 bytes / 4 per byte at 9.5 GB/s: 2 ns
    assert status["bound_ns"] == pytest.approx(2.0) and status["cost_over_bound"] == pytest.approx(cost / 2.0)
    assert status["worker_held"] == max(held[1:]) and status["server_held"] == held[0]
    target = lines[5]
    assert ("a worker holds <= 20: " in target and "rank 0 <= 24" in target)
    assert target.count("NOT met") == (not met[0]) + (not met[1])
    assert ("NOT met" in lines[6]) == (not met[2])


def test_held_memory_leaves_out_the_other_ranks_slots(tmp_path, monkeypatch):
    """bench/_rank.py's smaps reading: the resident kB of the mappings that overlap the window, less this rank's
    own slots (a mapping outside the window does not count)."""
    source = (ROOT / "bench" / "_rank.py").read_text()
    helper = source[source.index("WINDOW = {}"):source.index("def _write_stats")]
    scope = {"os": __import__("os")}
    exec(helper, scope)                              # the two definitions alone: the script itself runs fedmpi
    smaps = tmp_path / "smaps"
    smaps.write_text("1000-2000 rw-s 00000000 00:1b 1 /dev/shm/mpich_shar_tmp\nSize: 4 kB\nRss:  40 kB\n"
                     "3000-4000 rw-p 00000000 00:00 0\nRss:  1000 kB\n")
    real_open = open
    scope["open"] = lambda path, *a, **k: real_open(smaps if path == "/proc/self/smaps" else path, *a, **k)
    scope["WINDOW"].update(start=0x1800, end=0x2800, own_kb=12)
    assert scope["_others_slots_kb"]() == 28         # 40 resident in the window's mapping, 12 of them its own
    scope["WINDOW"].clear()
    assert scope["_others_slots_kb"]() == 0


def test_peers_basis_targets_are_half_the_floor_on_both_workloads_and_ranks():
    assert peers_basis.TARGETS == {(wl, f"-n {n}"): ("ratio", 0.50) for wl in ("W1", "W5") for n in (2, 3)}
    assert paired.target_status("W5", "-n 3", 0.49, peers_basis.TARGETS) == "met (<= 0.5)"
    assert paired.target_status("W5", "-n 3", 0.51, peers_basis.TARGETS) == "NOT met (<= 0.5)"
    assert [pace for _, pace in peers_basis.BASES] == ["run", "round"]      # the peers' basis first
    s = {"ratio": (0.49, 0.45, 0.52), "s_round": 3.0, "busy_ratio": 0.5, "eff": 1.0, "first_s": 1.0, "whole_s": 9.0,
         "cpu_s": 9.0, "server_cpu_s": 1.0, "rss_ranks": [1.0], "mpi_mb": 1.0, "fl_mb": 1.0, "device": "cpu",
         "acc": 0.5, "runs": 3}
    assert paired.format_row("W5", "-n 2", s, 50, targets=peers_basis.TARGETS)[-1] == "met (<= 0.5)"
    assert paired.format_row("W5", "-n 2", s, 50)[-1] == "met (<= 0.55)"      # the paired targets' bound by default


def test_where_rank_0_trains_its_fingerprint_joins_the_bound():
    # -n 2 on two cores: rank 0 hashes the model (4 bytes a parameter: 1 per byte of it) on its own path.
    memory = {k: [24.0, 16.0] for k in ("rss", "pss", "uss", "held")}
    row = {"n": 2, "params": 1e6, "ns_per_byte": 6.0, "memory": memory}
    memory_only = large_model.report(row, bandwidth=17.0)[1]["bound_ns"]          # 68 bytes / 4 at 17 GB/s: 1 ns
    _, status = large_model.report({**row, "server_trains": True}, bandwidth=17.0, sha_speed=0.5)
    assert memory_only == pytest.approx(1.0) and status["bound_ns"] == pytest.approx(1.0 + 2.0)
    assert status["cost_over_bound"] == pytest.approx(2.0)


def test_its_markdown_block_is_marked_in_the_performance_page_and_refused_elsewhere(tmp_path, capsys):
    markdown = bench_module("markdown", "test_bench42")
    docs = markdown.targets([str(ROOT / "docs" / "results" / "performance.md")], *peers_basis.MARKS)
    assert list(docs) == [str(ROOT / "docs" / "results" / "performance.md")]
    other = tmp_path / "notes.md"
    other.write_text("no markers\n")
    with pytest.raises(SystemExit) as stop:
        markdown.targets([str(other)], *peers_basis.MARKS)
    assert stop.value.code == 2 and "notes.md" in capsys.readouterr().err
    target = tmp_path / "page.md"
    target.write_text(f"a\n{peers_basis.MARKS[0]}\nold\n{peers_basis.MARKS[1]}\nb\n")
    docs = markdown.targets([str(target)], *peers_basis.MARKS)
    target.write_text(target.read_text() + "edited during the run\n")      # kept: the block alone is rewritten
    markdown.write(docs, "new table", *peers_basis.MARKS)
    begin, end = peers_basis.MARKS
    assert target.read_text() == f"a\n{begin}\nnew table\n{end}\nb\nedited during the run\n"
    target.write_text("markers gone\n")
    markdown.write(docs, "newer table", *peers_basis.MARKS)
    assert target.read_text() == "markers gone\n" and "not rewritten" in capsys.readouterr().err


def test_peers_basis_measures_the_two_process_floor_beside_fedmpi_in_the_same_pairs(tmp_path):
    """On the peers' basis each workload's rows include "ref x2" (two plain floor processes side by side), and
    the targets' summary names its figure beside fedmpi's."""
    asked = []

    class Parts:
        @staticmethod
        def plan_rows(wl, ranks, loop_ranks, vectorize, floor=False):
            asked.append(floor)
            return [("ref x2", "floor", "auto")] * floor + [(f"-n {n}", n, vectorize) for n in ranks]

        @staticmethod
        def measure(wl, rows, pairs, base, rounds, pace, targets):
            ratio = {"ref x2": "0.560", "-n 2": "0.520", "-n 3": "0.530"}
            table = [(wl, label, "3", "1.0", ratio[label], "0.5-0.6", *[""] * 13,
                      "" if label == "ref x2" else "NOT met (<= 0.5)") for label, *_ in rows]
            return table, {}, 0.1

        print_table = staticmethod(lambda rows: None)
        markdown = staticmethod(lambda rows: "")
        when = staticmethod(lambda: "now")

    record = peers_basis.run(Parts, tmp_path, pairs=3, large=False)
    assert asked == [True, True, False, False]          # W1 and W5 on the peers' basis, then paced without
    lines = record["markdown"].splitlines()
    for wl in ("W1", "W5"):
        for basis in ("peers", "paced"):
            floor = f"- {wl} ref x2 ({basis}): 0.560 of the floor (0.5-0.6), two plain floor processes side by side"
            assert (floor in lines) == (basis == "peers")
            assert f"- {wl} -n 3 ({basis}): 0.530 of the floor (0.5-0.6), NOT met (<= 0.5)" in lines
