"""The op DAG: node set, edges and latencies per docs/design.md §3."""

from __future__ import annotations

from pp_opt.dag import build_dag, required_ops
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.problem import uniform_problem

K = OpKind


def test_split_dag_edges_and_latency() -> None:
    problem = uniform_problem(p=2, m=3, t_comm=0.5)
    dag = build_dag(problem)
    assert dag.number_of_nodes() == 2 * 3 * 3
    assert dag.edges[OpKey(K.F, 0, 1), OpKey(K.F, 1, 1)]["latency"] == 0.5
    assert dag.edges[OpKey(K.B, 1, 2), OpKey(K.B, 0, 2)]["latency"] == 0.5
    assert dag.edges[OpKey(K.F, 1, 0), OpKey(K.B, 1, 0)]["latency"] == 0.0
    assert dag.has_edge(OpKey(K.B, 0, 0), OpKey(K.W, 0, 0))
    assert not dag.has_edge(OpKey(K.F, 0, 0), OpKey(K.B, 0, 0))


def test_fused_dag_has_no_w() -> None:
    dag = build_dag(uniform_problem(p=2, m=2), split_backward=False)
    kinds = {key.kind for key in dag}
    assert kinds == {K.F, K.BW}
    assert dag.nodes[OpKey(K.BW, 0, 0)]["duration"] == 2.0
    assert dag.nodes[OpKey(K.BW, 0, 0)]["mem_end"] == -1.0


def test_v_placement_latency_only_across_devices() -> None:
    problem = uniform_problem(p=2, m=1, placement="v", v=2, t_comm=1.0)
    dag = build_dag(problem)
    # stages 1 and 2 both live on device 1: no latency between them
    assert dag.edges[OpKey(K.F, 1, 0), OpKey(K.F, 2, 0)]["latency"] == 0.0
    assert dag.edges[OpKey(K.F, 2, 0), OpKey(K.F, 3, 0)]["latency"] == 1.0


def test_offload_and_recompute_ops_are_optional() -> None:
    problem = uniform_problem(p=2, m=2, offload=True, recompute=True)
    dag = build_dag(problem)
    offload = OpKey(K.OFFLOAD, 0, 1)
    assert dag.nodes[offload]["stream"] is Stream.D2H
    assert dag.nodes[offload]["optional"]
    assert dag.has_edge(OpKey(K.RELOAD, 0, 1), OpKey(K.B, 0, 1))
    assert dag.has_edge(OpKey(K.R, 0, 1), OpKey(K.B, 0, 1))
    assert len(required_ops(dag)) == 2 * 2 * 3
