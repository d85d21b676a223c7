"""Chapters 7, 8, 11, 22: pipeline timelines (simulated from the schedules as data, and one measured)."""
import os

from .draw import COLOURS, Picture, draw_timelines, load_script, run, stored_microbatches


def gpipe_timelines(quick):
    """Chapter 7: GPipe simulated and measured (2 thread ranks, m = 4)."""
    trace = os.path.join(os.environ.get("TMPDIR", "/tmp"), "pictures-gpipe.trace.json")
    (simulated, measured), text = run("07_pipelines/gpipe.py", "main", trace, threads=2)
    return [("GPipe simulated (time units)", simulated),
            ("GPipe measured, threads backend (seconds; the order is meaningful, the durations not)",
             measured)], text


def simulated_timelines(path):
    """`compute` for a script whose `simulate(say)` prints and returns [(title, Timeline)]."""
    def compute(quick):
        printed = []
        timelines = load_script(path).simulate(printed.append)
        return timelines, "\n".join(printed)
    return compute


def draw_timelines_only(plt, timelines, same_scale=True):
    return draw_timelines(plt, timelines, same_scale)[0]


def draw_gpipe_vs_1f1b(plt, timelines):
    """The two timelines, and below them what 1F1B saves: the micro-batches each schedule holds
    activations for on rank 0 (the most loaded stage) over the step."""
    fig, (ax,) = draw_timelines(plt, timelines, extra_rows=1)
    styles = {"gpipe": dict(color=COLOURS["backward"], lw=2), "1f1b": dict(color=COLOURS["forward"], lw=2)}
    for name, timeline in timelines:
        peaks = [int(stored_microbatches(timeline, r)[1].max()) for r in range(timeline.num_ranks)]
        times, counts = stored_microbatches(timeline, 0)
        ax.step(times, counts, where="post", label=f"{name}: peak per stage {peaks}", **styles.get(name, {}))
    ax.set_xlim(0, max(t.makespan for _, t in timelines))
    ax.set_ylabel("stored\nmicro-batches", fontsize=7)
    ax.tick_params(labelsize=7)
    ax.set_ylim(0, max(ax.get_ylim()[1], 1) * 1.6)
    ax.set_title("what 1F1B saves: rank 0's stored micro-batches (a forward adds one, its backward frees it)",
                 fontsize=8, loc="left")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    return fig


PICTURES = [
    Picture("gpipe_timeline", "07_pipelines", gpipe_timelines,
            lambda plt, data: draw_timelines_only(plt, data, same_scale=False)),  # time units vs seconds
    Picture("gpipe_vs_1f1b", "08_1f1b_recomputation", simulated_timelines("08_1f1b_recomputation/one_f_one_b.py"),
            draw_gpipe_vs_1f1b),
    Picture("interleaved", "08_1f1b_recomputation", simulated_timelines("08_1f1b_recomputation/interleaved.py"),
            draw_timelines_only),
    Picture("zero_bubble_timelines", "11_zero_bubble", simulated_timelines("11_zero_bubble/three_timelines.py"),
            draw_timelines_only),
    Picture("dualpipev_timelines", "22_dualpipe", simulated_timelines("22_dualpipe/v_timeline.py"),
            draw_timelines_only),
    Picture("dualpipe_timelines", "22_dualpipe", simulated_timelines("22_dualpipe/two_directions.py"),
            draw_timelines_only),
]
