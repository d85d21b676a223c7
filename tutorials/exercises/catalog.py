"""Which tests check each exercise: quick node ids (threads backend, a few seconds each).

Every listed test must fail when only its exercise is stubbed, and pass on the library;
tests/tutorials/test_exercises.py proves the first, the normal suite the second.
"""
OPS = "tests/minitensor/test_ops.py"
FUNCTIONAL = "tests/minitensor/test_functional.py"
COMM = "tests/parallel/test_comm.py"
REDUCER = "tests/parallel/data_parallel/test_reducer.py"
DATA_PARALLEL = "tests/parallel/data_parallel/test_ddp.py"
ZERO = "tests/parallel/data_parallel/test_zero.py"
TP_LAYERS = "tests/parallel/tensor_parallel/test_tp_layers.py"
SCHEDULES = "tests/parallel/pipeline/test_schedules.py"
MESH = "tests/parallel/test_mesh.py"
PLAN = "tests/parallel/plan"
FULLY_SHARDED = "tests/parallel/data_parallel/test_fully_sharded.py"

_TP_PAIR = f"{TP_LAYERS}::test_column_then_row_with_gathered_output_and_scattered_input_equal_two_dense_linears"
_TP_SPLIT = f"{TP_LAYERS}::test_column_then_row_keeping_the_split_between_them_equal_two_dense_linears"
_VOCAB = f"{TP_LAYERS}::test_vocab_parallel_embedding_and_cross_entropy_equal_dense_with_padding_and_ignore_index"
_DP = f"{DATA_PARALLEL}::test_equals_one_device_on_the_global_batch"
_REDUCER = f"{REDUCER}::test_reducer_sums_or_averages_every_gradient_over_the_group"
_RING = f"{COMM}::test_ring_all_reduce_equals_builtin_on_random_floats"
_GPIPE = f"{SCHEDULES}::test_gpipe_two_ranks_two_microbatches"
_1F1B = f"{SCHEDULES}::test_1f1b_two_ranks_three_microbatches"
_MESH = [f"{MESH}::test_coordinates_and_group_members[2-2-2]", f"{MESH}::test_coordinates_and_group_members[2-3-1]"]

TESTS = {
    "01.1": [f"{OPS}::test_matmul_batched_and_broadcast_forward_and_backward",
             f"{OPS}::test_matmul_of_transposed_views_uses_their_values",
             "tests/minitensor/test_split_backward.py::test_matmul_backward_parts_computes_only_the_wanted_gradients"],
    "02.1": [f"{FUNCTIONAL}::test_layer_norm"],
    "02.2": [f"{FUNCTIONAL}::test_cross_entropy_with_ignored_targets"],
    "02.3": [f"{FUNCTIONAL}::test_softmax_and_log_softmax",
             f"{FUNCTIONAL}::test_scaled_dot_product_attention"],
    "03.1": [_RING, f"{COMM}::test_the_ring_takes_2_n_minus_1_steps_on_every_rank[3]"],
    "03.2": [_RING, f"{COMM}::test_the_ring_takes_2_n_minus_1_steps_on_every_rank[3]"],
    "04.1": [f"{REDUCER}::test_bucket_packs_end_to_end_with_zero_padding_and_unpacks_in_place", _REDUCER,
             f"{REDUCER}::test_reducer_counts_a_missing_gradient_as_zeros_even_after_a_round_that_had_one"],
    "04.2": [_REDUCER, f"{REDUCER}::test_reducer_counts_a_missing_gradient_as_zeros_even_after_a_round_that_had_one", _DP],
    "04.3": [f"{DATA_PARALLEL}::test_unused_parameters_count_as_zero_and_backward_still_finishes_the_sync",
             f"{DATA_PARALLEL}::test_gpt_equals_one_device[2-2-0.002-True]"],
    "04.4": [f"{ZERO}::test_equals_adamw_on_one_device"],
    "05.1": [_TP_PAIR],
    "05.2": [_TP_PAIR, _TP_SPLIT],
    "05.3": [_TP_PAIR, _TP_SPLIT],
    "06.1": [_VOCAB],
    "06.2": [_VOCAB, f"{TP_LAYERS}::test_padding_columns_never_win_the_softmax"],
    "07.1": [_GPIPE, f"{SCHEDULES}::test_gpipe_runs_every_forward_before_any_backward[2-4]"],
    "07.2": [_GPIPE, _1F1B, f"{SCHEDULES}::test_a_compute_waits_for_exactly_the_work_it_reads"],
    "08.1": [_1F1B, f"{SCHEDULES}::test_1f1b_warmup_steady_cooldown"],
    "08.2": [_1F1B, f"{SCHEDULES}::test_1f1b_warmup_steady_cooldown"],
    "09.1": _MESH,
    "09.2": _MESH,
    "10.1": [f"{PLAN}/test_plan_cost.py::test_alpha_beta_collectives",
             f"{PLAN}/test_plan_cost.py::test_time_parts_and_bubble_fraction"],
    "10.2": [f"{PLAN}/test_plan_memory.py::test_in_flight_micro_batches",
             f"{PLAN}/test_plan_memory.py::test_in_flight_micro_batches_are_the_schedule_checkers_peaks"],
    "11.1": ["tests/parallel/pipeline/test_zero_bubble.py::test_zb_h1_two_ranks_three_microbatches",
             "tests/parallel/pipeline/test_zero_bubble.py::test_1f1b_at_equal_costs_idles_three_times_as_long",
             "tests/parallel/pipeline/test_zero_bubble.py::"
             "test_zb_h1_peak_activations_equal_1f1b_and_zb_h2_holds_at_most_2p_minus_1"],
    "16.1": ["tests/parallel/context_parallel/test_ring_attention.py::"
             "test_the_log_sum_exp_merge_of_two_blocks_is_softmax_over_both",
             "tests/parallel/context_parallel/test_ring_attention.py::"
             "test_each_rank_holds_its_slice_of_full_attention_and_its_gradients"],
    "14.1": [f"{FULLY_SHARDED}::test_gpt_equals_adamw_on_one_device[2]",
             f"{FULLY_SHARDED}::test_gpt_equals_adamw_on_one_device[3]"],
    "14.2": [f"{FULLY_SHARDED}::test_gathers_due_issues_in_order_with_prefetch_and_the_unread_tail",
             f"{FULLY_SHARDED}::test_the_gather_order_is_the_same_on_ranks_whose_backward_reads_different_uses"],
    "14.3": [f"{FULLY_SHARDED}::test_every_units_reduce_scatter_starts_before_the_schedule_ends[zero2]",
             f"{FULLY_SHARDED}::test_every_units_reduce_scatter_starts_before_the_schedule_ends[zero3-pp2]",
             "tests/parallel/hybrid/test_hybrid.py::"
             "test_zero_2_3_reduce_scatter_sequence_parallel_gradients_only_after_their_tp_sum[2]"],
    "12.1": ["tests/parallel/data_parallel/test_comm_hooks.py::test_error_feedback_loses_nothing[TopK-options0-True]",
             "tests/parallel/data_parallel/test_comm_hooks.py::test_a_hook_restored_from_its_state_continues_bitwise_alike"
             "[TopK-options1]"],
    "12.2": ["tests/parallel/data_parallel/test_comm_hooks.py::test_orthogonalize_gives_orthonormal_columns_spanning_the_same_space",
             "tests/parallel/data_parallel/test_comm_hooks.py::test_powersgd_at_full_rank_is_data_parallelism"],
    "13.1": ["tests/parallel/data_parallel/test_local_sgd.py::test_one_local_step_with_outer_lr_one_and_no_momentum_is_synchronous_sgd",
             "tests/parallel/data_parallel/test_local_sgd.py::test_diloco_equals_a_sequential_simulation_of_the_replicas"],
    "13.2": ["tests/parallel/data_parallel/test_parameter_server.py::test_the_schedule_keeps_the_bound_and_zero_staleness_is_synchronous",
             "tests/parallel/data_parallel/test_parameter_server.py::test_a_stale_run_replays_bit_for_bit_in_one_process[1]"],
    "15.1": ["tests/minitensor/test_amp.py::test_scaler_backs_off_on_overflow_and_grows_after_growth_interval_clean_steps",
             "tests/minitensor/test_amp.py::test_scale_stays_a_power_of_two_between_min_scale_and_its_growth",
             "tests/minitensor/test_amp.py::test_an_inf_or_nan_gradient_is_found_and_the_step_skipped"],
}

# --- chapter 17: smaller models (BERT's masking, pruning, distillation) ---
BERT_TESTS, PRUNE, DISTILL = "tests/minitensor/test_bert.py", "tests/minitensor/test_prune.py", "tests/minitensor/test_distill.py"
TESTS.update({
    "17.1": [f"{BERT_TESTS}::test_every_row_gets_the_same_count_of_labels_at_maskable_positions_only",
             f"{BERT_TESTS}::test_chosen_tokens_are_80_percent_mask_10_random_10_unchanged"],
    "17.2": [f"{PRUNE}::test_magnitude_pruning_reaches_the_requested_sparsity_exactly",
             f"{PRUNE}::test_global_scope_prunes_the_smallest_weights_of_all_matrices_together"],
    "17.3": [f"{PRUNE}::test_the_physically_pruned_model_equals_the_masked_one[heads-2-2-gpt]",
             f"{PRUNE}::test_the_physically_pruned_model_equals_the_masked_one[heads-1-1-bert]"],
    "17.4": [f"{DISTILL}::test_the_loss_is_the_formula",
             f"{DISTILL}::test_limits_alpha_one_is_the_cross_entropy_and_a_perfect_student_has_no_soft_loss"],
})

# --- chapter 18: operator graphs (capture, rewrites, fusion) ---
GRAPH_PASSES = "tests/minitensor/test_graph_passes.py"
TESTS.update({
    "18.1": [f"{GRAPH_PASSES}::test_common_subexpression_elimination_computes_a_repeat_once",
             f"{GRAPH_PASSES}::test_all_passes_on_a_gpt_keep_its_loss_and_gradients"],
    "18.2": [f"{GRAPH_PASSES}::test_bias_gelu_fusion_adds_the_bias_inside_the_gelu_kernel",
             f"{GRAPH_PASSES}::test_all_passes_on_a_gpt_keep_its_loss_and_gradients"],
})

# --- chapter 19: finding the strategy (the sharding search) ---
AUTO_SHARDING, AUTO_SEARCH = f"{PLAN}/test_auto_sharding.py", f"{PLAN}/test_auto_search.py"
TESTS.update({
    "19.1": [f"{AUTO_SHARDING}::test_reshard_seconds_are_the_planners_alpha_beta_formulas",
             f"{AUTO_SEARCH}::test_mlp_is_split_column_then_row_with_one_all_reduce[2]"],
    "19.2": [f"{AUTO_SEARCH}::test_the_search_finds_the_brute_force_minimum",
             f"{AUTO_SEARCH}::test_attention_is_split_by_heads_with_one_all_reduce[2]"],
})

# --- chapter 20: mixture of experts ---
MOE = "tests/minitensor/test_moe.py"
DEEPSEEK = "tests/minitensor/test_moe_deepseek.py"
LOSS_FREE = "tests/parallel/hybrid/test_loss_free_balance.py"
DISPATCH = "tests/parallel/expert_parallel/test_dispatch_per_rank.py"
TESTS.update({
    "20.1": [f"{MOE}::test_top_k_takes_the_largest_probabilities_lower_index_first_on_ties",
             f"{MOE}::test_the_balancing_loss_is_alpha_for_a_uniform_router_and_grows_with_imbalance",
             "tests/parallel/expert_parallel/test_expert_parallel.py::"
             "test_the_balancing_loss_split_over_ranks_is_the_whole_groups"],
    "20.2": [f"{MOE}::test_the_dispatch_order_sorts_kept_assignments_by_expert_in_token_order",
             f"{MOE}::test_the_layer_equals_its_definition_token_by_token[None-True]"],
    "20.3": [f"{DEEPSEEK}::test_the_bias_update_moves_against_the_load_in_float32",
             f"{LOSS_FREE}::test_the_bias_is_bitwise_one_devices_on_every_rank[config0-layout0]"],
    "20.4": [f"{DEEPSEEK}::test_the_bias_picks_experts_but_never_weights_them",
             f"{DEEPSEEK}::test_routing_equals_the_papers_equations_with_ties_and_idle_experts"],
    "20.5": [f"{DEEPSEEK}::test_device_limited_selection_keeps_the_groups_whose_best_scores_sum_largest",
             f"{DEEPSEEK}::test_routing_equals_the_papers_equations_with_ties_and_idle_experts"],
    "20.6": [f"{DISPATCH}::test_a_token_goes_once_to_each_rank_of_its_kept_experts",
             f"{DISPATCH}::test_the_dispatch_per_token_and_rank_equals_one_device"],
})

# --- chapter 21: flash attention ---
FLASH = "tests/minitensor/test_flash_attention.py"
_FLASH_TILES = f"{FLASH}::test_several_key_tiles_per_row_are_needed_and_merged"
_FLASH_EQUAL = f"{FLASH}::test_flash_attention_equals_the_dense_attention_output_lse_and_every_gradient"
TESTS.update({
    "21.1": [_FLASH_TILES, _FLASH_EQUAL],
    "21.2": [_FLASH_TILES, _FLASH_EQUAL],
})

# --- chapter 22: DualPipe and DualPipeV ---
DUALPIPE = "tests/parallel/pipeline/test_dualpipe.py"
TWO_WAYS = "tests/parallel/pipeline/test_dualpipe_bidirectional.py"
TESTS.update({
    "22.1": [f"{DUALPIPE}::test_dualpipev_order_for_4_ranks_and_10_micro_batches_equals_the_hand_derivation",
             f"{DUALPIPE}::test_dualpipev_is_deadlock_free_complete_and_holds_2p_plus_1_chunks"],
    "22.2": [f"{TWO_WAYS}::test_check_passes_on_threads_composed_with_every_axis",
             f"{TWO_WAYS}::test_both_copies_of_every_stage_stay_equal_after_optimizer_steps"],
})

# --- chapter 23: FP8 training ---
FP8 = "tests/minitensor/test_fp8.py"
TESTS.update({
    "23.1": [f"{FP8}::test_each_tile_takes_the_scale_of_its_own_amax",
             f"{FP8}::test_the_fp8_linear_is_the_plain_linear_when_every_operand_is_exact_in_fp8"],
    "23.2": [f"{FP8}::test_delayed_scaling_follows_the_amax_history",
             f"{FP8}::test_a_large_amax_leaves_the_history_after_its_length"],
    "23.3": ["tests/minitensor/test_narrow_moments.py::test_the_step_equals_the_adamw_equations_with_the_moments_stored_in_bf16",
             "tests/minitensor/test_narrow_moments.py::test_moments_in_the_parameters_dtype_are_bitwise_the_plain_optimizer"],
})
