"""Third audit of the multi-GPU surface: --nodes that the layout leaves idle, a key given twice
in an inline shape, collective sizes the collector rounds, and a calibration far slower than
the system it is fitted for. Each is one error line, or a note, never a silent change."""
import pytest

from cli_support import one_error_line as _err
from kit.cli import main




GPT = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1000"


def test_nodes_the_layout_leaves_idle_are_refused(capsys):
    # was: the 8-GPU layout placed on the first node, the other three idle, the same time as 1 node
    line = _err(capsys, ["predict", GPT, "--system", "dgx-h100", "--nodes", "4", "--tp", "2",
                         "--pp", "2", "--dp", "2"])
    assert "--nodes 4 gives 32 GPUs" in line and "fill 1 node" in line and "--nodes 1" in line
    assert main(["predict", GPT, "--system", "dgx-h100", "--nodes", "2", "--dp", "16", "--json"]) == 0
    capsys.readouterr()
    # without --nodes a preset may be used in part (2 of a DGX's 8 GPUs), as before
    assert main(["predict", GPT, "--system", "dgx-h100", "--tp", "2", "--json"]) == 0


def test_a_key_given_twice_in_an_inline_shape_is_refused(capsys):
    line = _err(capsys, ["predict", GPT + ",vocab=3", "--system", "dgx-h100"])
    assert "vocab is given twice" in line


def test_collect_comm_says_which_sizes_it_rounded(tmp_path, recwarn):
    from kit.comm.measure import collect

    collect(ranks=3, sizes="7,1K", kinds=("allgather", "allreduce"), iters=1, warmup=0, repeats=1,
            start_method="fork")
    notes = [str(w.message) for w in recwarn if "rounded" in str(w.message)]
    assert len(notes) == 1
    assert "7 B -> 12 B (allgather)" in notes[0] and "1,024 B -> 1,020 B (allgather)" in notes[0]
    assert "7 B -> 4 B (allreduce)" in notes[0] and notes[0].count("(allreduce)") == 1  # 1 KiB is whole


def _section(name, sizes, plateau_gbs, ranks=2):
    out = f"# Collective test starting: {name}\n" + "".join(
        f"#  Rank {i:2d} Group  0 Pid 1 on n device {i} [0x07] A100\n" for i in range(ranks))
    for s in sizes:
        t = 20 + s / (plateau_gbs * 1e3)
        alg = s / t / 1e3
        cells = f"{t:.2f}  {alg:.4f}  {alg:.4f}  0"
        out += f"  {s}  {s // 4}  float  sum  -1  {cells}  {cells}\n"
    return out


@pytest.mark.parametrize("plateau_gbs, noted", [(3.0, True), (150.0, False)])
def test_comm_fit_notes_a_calibration_far_slower_than_the_system(tmp_path, capsys, plateau_gbs, noted):
    f = tmp_path / "m.txt"
    f.write_text(_section("all_reduce_perf", [1024 * 4**i for i in range(9)], plateau_gbs))
    assert main(["comm", "fit", str(f), "--system", "dgx-a100"]) == 0
    err = capsys.readouterr().err
    assert ("plateaus at" in err and "another machine" in err) == noted
