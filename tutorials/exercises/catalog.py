"""Which tests check each exercise: quick node ids (threads backend, a few seconds each).

Every listed test must fail when only its exercise is stubbed, and pass on the library;
tests/tutorials/test_exercises.py proves the first, the normal suite the second.
"""
OPS = "tests/minitensor/test_ops.py"
FUNCTIONAL = "tests/minitensor/test_functional.py"
COMM = "tests/parallel/test_comm.py"
REDUCER = "tests/parallel/test_reducer.py"
DATA_PARALLEL = "tests/parallel/test_data_parallel.py"
ZERO = "tests/parallel/test_zero.py"
TP_LAYERS = "tests/parallel/tensor_parallel/test_tp_layers.py"
SCHEDULES = "tests/parallel/pipeline/test_schedules.py"
MESH = "tests/parallel/test_mesh.py"
PLAN = "tests/parallel/plan"

_TP_PAIR = f"{TP_LAYERS}::test_column_then_row_with_gathered_output_and_scattered_input_equal_two_dense_linears"
_VOCAB = f"{TP_LAYERS}::test_vocab_parallel_embedding_and_cross_entropy_equal_dense_with_padding_and_ignore_index"
_DP = f"{DATA_PARALLEL}::test_equals_one_device_on_the_global_batch"
_REDUCER = f"{REDUCER}::test_reducer_sums_or_averages_every_gradient_over_the_group"
_RING = f"{COMM}::test_ring_all_reduce_equals_builtin_on_random_floats"
_GPIPE = f"{SCHEDULES}::test_gpipe_two_ranks_two_microbatches"
_1F1B = f"{SCHEDULES}::test_1f1b_two_ranks_three_microbatches"
_MESH = [f"{MESH}::test_coordinates_and_group_members[2-2-2]", f"{MESH}::test_coordinates_and_group_members[2-3-1]"]

TESTS = {
    "01.1": [f"{OPS}::test_matmul_batched_and_broadcast_forward_and_backward",
             f"{OPS}::test_matmul_of_transposed_views_uses_their_values"],
    "02.1": [f"{FUNCTIONAL}::test_layer_norm"],
    "02.2": [f"{FUNCTIONAL}::test_cross_entropy_with_ignored_targets"],
    "02.3": [f"{FUNCTIONAL}::test_softmax_and_log_softmax",
             f"{FUNCTIONAL}::test_scaled_dot_product_attention"],
    "03.1": [_RING],
    "03.2": [_RING],
    "04.1": [f"{REDUCER}::test_bucket_packs_end_to_end_with_zero_padding_and_unpacks_in_place", _REDUCER],
    "04.2": [_REDUCER, f"{REDUCER}::test_reducer_counts_a_missing_gradient_as_zeros_even_after_a_round_that_had_one", _DP],
    "04.3": [f"{DATA_PARALLEL}::test_unused_parameters_count_as_zero_and_backward_still_finishes_the_sync",
             f"{DATA_PARALLEL}::test_gpt_equals_one_device[2-2-0.002-True]"],
    "04.4": [f"{ZERO}::test_equals_adamw_on_one_device"],
    "05.1": [_TP_PAIR],
    "05.2": [_TP_PAIR],
    "05.3": [_TP_PAIR],
    "06.1": [_VOCAB],
    "06.2": [_VOCAB, f"{TP_LAYERS}::test_padding_columns_never_win_the_softmax"],
    "07.1": [_GPIPE],
    "07.2": [_GPIPE, _1F1B],
    "08.1": [_1F1B, f"{SCHEDULES}::test_1f1b_warmup_steady_cooldown"],
    "08.2": [_1F1B, f"{SCHEDULES}::test_1f1b_warmup_steady_cooldown"],
    "09.1": _MESH,
    "09.2": _MESH,
    "10.1": [f"{PLAN}/test_plan_cost.py::test_alpha_beta_collectives",
             f"{PLAN}/test_plan_cost.py::test_time_parts_and_bubble_fraction"],
    "10.2": [f"{PLAN}/test_plan_memory.py::test_in_flight_micro_batches",
             f"{PLAN}/test_plan_memory.py::test_in_flight_micro_batches_are_the_schedule_checkers_peaks"],
    "14.1": ["tests/minitensor/test_amp.py::test_scaler_backs_off_on_overflow_and_grows_after_growth_interval_clean_steps",
             "tests/minitensor/test_amp.py::test_scale_stays_a_power_of_two_between_min_scale_and_its_growth",
             "tests/minitensor/test_amp.py::test_an_inf_or_nan_gradient_is_found_and_the_step_skipped"],
}
