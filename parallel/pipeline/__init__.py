"""Pipeline parallelism: schedules as data, their checker, timelines."""
from .checker import ScheduleDeadlockError, ScheduleError, ScheduleReport, check_schedule, simulate
from .dualpipe import dualpipe, dualpipev
from .executor import Pipeline
from .partition import balance_by_cost, balance_by_parameters, balance_by_time, split_gpt, stages_for_rank
from .placement import num_stages, rank_and_chunk, stage_of
from .registry import SCHEDULES, get_schedule, placement_of
from .schedules import Action, gpipe, interleaved, one_f_one_b
from .timeline import Event, Timeline, bubble_theory, megatron_bubble_ratio
from .zero_bubble import zb_h1, zb_h2

__all__ = [
    "ScheduleDeadlockError",
    "ScheduleError",
    "ScheduleReport",
    "check_schedule",
    "simulate",
    "Pipeline",
    "balance_by_cost",
    "balance_by_parameters",
    "balance_by_time",
    "split_gpt",
    "stages_for_rank",
    "Action",
    "SCHEDULES",
    "get_schedule",
    "placement_of",
    "dualpipe",
    "dualpipev",
    "num_stages",
    "gpipe",
    "interleaved",
    "one_f_one_b",
    "rank_and_chunk",
    "stage_of",
    "Event",
    "Timeline",
    "bubble_theory",
    "megatron_bubble_ratio",
    "zb_h1",
    "zb_h2",
]
