"""Chapter 18 (operator graphs): the scripts run and print the evidence the README shows:
the traced GPT bitwise equal to eager with its DOT written; each pass equal to the graph
before it (float64 round-off) while bytes moved and saved bytes fall."""
import re

from chapter_runner import number_after, numbers_after, run_script

CH18 = "tutorials/18_operator_graphs/"


def test_trace_and_draw_shows_a_graph_bitwise_equal_to_eager(tmp_path):
    out = run_script(CH18 + "trace_and_draw.py", "--out", tmp_path)
    assert "logits bitwise equal: True, loss bitwise equal: True" in out
    assert re.search(r"parameters whose gradient is bitwise the eager one: 37 of 37", out)  # 2 layers x 16 + 5
    ops = int(re.search(r"^total +(\d+) ops", out, re.M).group(1))
    assert number_after("DOT:", out) == ops == 52
    assert (tmp_path / "graph.dot").read_text().startswith("digraph")


def test_rewrite_and_fuse_keeps_the_function_and_cuts_the_bytes():
    out = run_script(CH18 + "rewrite_and_fuse.py", "--gpt", "small")
    passes = re.findall(r"^after (\w+) +nodes", out, re.M)
    assert passes == ["eliminate_common_subexpressions", "eliminate_transposes", "fuse_qkv", "fuse_bias_gelu",
                      "fuse_softmax_chain", "eliminate_dead_nodes"]
    differences = re.findall(r"output (\S+), gradients (\S+)$", out, re.M)
    assert len(differences) == len(passes) and all(float(a) <= 1e-12 and float(g) <= 1e-12 for a, g in differences)
    nodes = numbers_after("nodes", out)
    assert nodes[1] == nodes[0] - 2  # CSE: the three ln_1(x) are one
    ops_now = re.search(r"^ops now: (.*)$", out, re.M).group(1)
    assert "BiasGelu 1" in ops_now and "Concat 2" in ops_now and "Softmax 1" in ops_now
    assert not re.search(r"\b(Gelu|Where|Mul|Div)\b", ops_now)
    block = re.search(r"naive block: bytes moved (\S+)x, saved bytes (\S+)x", out)
    assert float(block.group(1)) < 0.8 and float(block.group(2)) < 0.9
    assert number_after("small GPT: bytes moved", out) < 0.9
