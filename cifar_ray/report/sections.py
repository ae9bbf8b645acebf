"""README.md as a document: each section function turns the `Report` into its blocks, LAYOUT lists them in page
order (a new section is one more entry), and `document` runs them. Definitions live in the last section, "How to read
this report", each said once there; the other sections only show and state."""

from __future__ import annotations

from collections.abc import Callable

from ..core.runlog import TIME_PER_EPOCH_RULE
from ..core.status import SETTLE_KEY
from ..core.text import counted
from .build import Report
from .compare import RUN_MATCH_RULE
from .document import Block, Bullets, Document, Figure, Heading, Paragraph
from .findings import findings
from .format import fmt_int, fmt_pct, fmt_value, last_line
from .header import setup_blocks, status_counts, title_blocks
from .interactions import TESTABLE_RULE
from .metrics import INCOMPLETE, PAIRED_METRICS
from .network import network_blocks
from .profile import profile_blocks
from .roofline import roofline_blocks
from .screen import answer_lines as screen_answers
from .screen import config_table, left_out_line
from .stats import OVERFIT_RULE
from .tables import (
    MAX_TRIAL_COLUMNS,
    cell_table,
    factor_breakdown_table,
    factor_table,
    has_train_eval,
    interaction_table,
    paired_table,
    trial_breakdown_table,
    trial_table,
)
from .verdicts import ALPHA, MAX_PAIRS, MIN_PAIRS, RATIO_BAND

Plots = dict[str, list[tuple[str, str]]]  # factor -> (file, caption) of its plots; "" -> the training curves
Section = Callable[[Report, Plots], list[Block]]

RUNNING_NOTE = (
    "Running train accuracy and loss are means over the epoch's training steps, taken with augmentation "
    "and dropout on while the weights still change, so they trail the model at the end of the epoch and "
    "can read below test accuracy: not a like-for-like comparison with the test metrics."
)

EVAL_NOTE = (
    "Eval train accuracy and loss evaluate the first `train_eval_size` training images{size} after each epoch "
    "exactly as the test set is (eval mode, no augmentation, the same code): the like-for-like comparison."
)


def train_metrics_note(report: Report) -> str:
    """What the train accuracy and loss columns measure: the running means, and the eval ones where logged."""
    if not has_train_eval(report):
        return f"{RUNNING_NOTE} These logs have no eval train metrics (train_eval_acc): the gap is not like-for-like."
    sizes = {
        t.config.get("train_eval_size")
        for t, basis in zip(report.run.trials, report.trials["train_basis"])
        if basis == "eval"
    }
    size = f" ({fmt_value(sizes.pop())} here; all of them when the training set is smaller)" if len(sizes) == 1 else ""
    return f"{RUNNING_NOTE} {EVAL_NOTE.format(size=size)}"


def _gap_note(report: Report) -> str:
    if not has_train_eval(report):
        return "Gap = final running train acc − final test acc (percentage points)."
    t = report.trials
    running = ((t["train_basis"] == "running") & (t["epochs_done"] > 0)).any()
    return "Gap = final eval train acc − final test acc (percentage points" + (
        "; † the running train acc: the trial logged no eval one)." if running else ")."
    )


def memory_note(report: Report) -> str:
    """What the two peak memory columns measure, worded from the trials' devices."""
    t = report.trials
    missing = ((t["epochs_done"] > 0) & t["peak_mem_total_mb"].isna()).any()
    return (
        f"Peak mem per worker: {report.memory_measure}, the largest over the workers and epochs: what must fit "
        "on one device. Peak mem, total over workers: the sum of every worker's peak (of every GPU's with "
        "strategy=dp), the largest over epochs: what running it occupies (at most: the workers may peak at "
        "different moments)" + ("; — where the logs have no total (peak_mem_total_mb)." if missing else ".")
    )


def _overfit_lines(report: Report) -> list[str]:
    lines = []
    for _, r in report.trials[report.trials["overfitting"]].iterrows():
        o = report.overfits[r["trial"]]
        basis = r["train_basis"]
        lines.append(
            f"`{r['trial']}` ({report.trial_label(r)}): test loss bottomed at {o.test_min:.4f} in epoch {o.min_epoch}, "
            f"then rose to {o.test_at_onset:.4f} in epoch {o.onset} "
            f"({100 * (o.test_at_onset / o.test_min - 1):+.1f} %) while {basis} train loss fell from "
            f"{o.train_at_min:.4f} to {o.train_at_onset:.4f}; final {basis} train − test accuracy gap "
            f"{fmt_pct(r['gap'])} pp" + ("." if basis == "eval" else " (running: not like-for-like).")
        )
    return lines


def _excluded_lines(report: Report) -> list[str]:
    lines = []
    for _, r in report.trials[report.trials["outcome"] != "finished"].iterrows():
        done, planned = r["epochs_done"], fmt_int(r["epochs_planned"])
        outcome, error = r["outcome"], last_line(r["error"])
        if outcome == "diverged":
            why = f"diverged at epoch {fmt_int(r['diverged_epoch'])} (non-finite loss)"
        elif outcome == "failed":
            why = f"failed after {done} of {counted(planned, 'epoch')}"
        elif outcome == "oom":
            why = f"ran out of memory after {done} of {counted(planned, 'epoch')}"
        elif outcome == "running":
            why = f"still running: {done} of {counted(planned, 'epoch')} so far"
        elif outcome == INCOMPLETE:
            why = f"incomplete: marked finished with {done} of {counted(planned, 'epoch')} logged"
        else:
            why = f"{outcome}: {done} of {counted(planned, 'epoch')}"
        lines.append(f"`{r['trial']}` ({report.trial_label(r)}): {why}" + (f" — `{error}`" if error else "") + ".")
    return lines


def title_section(report: Report, plots: Plots) -> list[Block]:
    return title_blocks(report)


def configurations_section(report: Report, plots: Plots) -> list[Block]:
    """`Configurations`: every configuration in one table (beyond 12: the best and the worst)."""
    left_out = left_out_line(report)
    return [Heading("Configurations"), config_table(report), *([Paragraph(left_out)] if left_out else [])]


def answers_section(report: Report, plots: Plots) -> list[Block]:
    """`Answers`: one short line per compared factor value, from the effect records; the details are below."""
    lines = screen_answers(report)
    if not lines:
        return []
    return [Heading("Answers"), Bullets(tuple(lines))]


def setup_section(report: Report, plots: Plots) -> list[Block]:
    return setup_blocks(report)


OVERVIEW = "overview"  # the plots key of the overview's figures (report/overview.py)


def overview_section(report: Report, plots: Plots) -> list[Block]:
    """`Plots`: test accuracy against wall-clock time, the speed-up against workers, train and test accuracy."""
    return [Heading("Plots"), *(Figure(file, caption) for file, caption in plots.get(OVERVIEW, []))]


def findings_section(report: Report, plots: Plots) -> list[Block]:
    counts = status_counts(report.trials)
    excluded = len(report.trials) - int((report.trials["outcome"] == "finished").sum())
    scope = (
        f"Aggregates use the {len(report.trials) - excluded} included trial(s); the {excluded} other(s) are listed "
        "under *Excluded trials*."
        if excluded
        else "The trial finished with every epoch logged and enters the aggregates."
        if counts["finished"] == 1
        else f"All {counts['finished']} trials finished with every epoch logged and enter the aggregates."
    )
    pairing = [Paragraph(f"**Pairing across runs.** {RUN_MATCH_RULE}")] if report.comparison else []
    return [Heading("Findings"), *pairing, Bullets(tuple(findings(report))), Paragraph(scope)]


def factor_sections(report: Report, plots: Plots) -> list[Block]:
    """Per factor: `Effect of key`: its paired effects, its per-value means, their step-time breakdown, its plots."""
    blocks: list[Block] = []
    for key in report.factors:
        blocks.append(Heading(f"Effect of `{key}`"))
        if len(report.effects[key][PAIRED_METRICS[0].column]):
            blocks.append(paired_table(report, key))
        blocks += [Paragraph("Per-value means:"), factor_table(report, key)]
        if report.breakdown:
            blocks += [Paragraph("Step-time breakdown (seconds per epoch):"), factor_breakdown_table(report, key)]
        blocks += [Figure(file, caption) for file, caption in plots.get(key, [])]
    return blocks


def interactions_section(report: Report, plots: Plots) -> list[Block]:
    """`Interactions`: each factor's effect on each metric tested across the other factors' values and cells; then
    `Effects per cell`, where an effect depends on them; nothing with fewer than two factors."""
    if not len(report.interactions.tests):
        return []
    blocks: list[Block] = [Heading("Interactions"), interaction_table(report)]
    if any(effect.cell for effect in report.records):
        blocks += [
            Heading("Effects per cell"),
            Paragraph(
                "Where an effect depends on the other factors, it is judged in each cell of them that holds pairs, "
                "each metric's cells as one Holm family:"
            ),
            cell_table(report),
        ]
    return blocks


def trials_section(report: Report, plots: Plots) -> list[Block]:
    breakdown = (
        [Heading("Step-time breakdown", 3), Paragraph("Mean seconds per epoch (share of the epoch time):")]
        + [trial_breakdown_table(report)]
        if report.breakdown
        else []
    )
    return [Heading("Trials"), trial_table(report), *breakdown]


def excluded_section(report: Report, plots: Plots) -> list[Block]:
    """`Excluded trials` with why each is excluded; nothing when every trial is included."""
    excluded = _excluded_lines(report)
    return [Heading("Excluded trials"), Bullets(tuple(excluded))] if excluded else []


def overfitting_section(report: Report, plots: Plots) -> list[Block]:
    flagged = _overfit_lines(report)
    return [Heading("Overfitting"), Bullets(tuple(flagged)) if flagged else Paragraph("No trial is flagged.")]


def curves_section(report: Report, plots: Plots) -> list[Block]:
    return [Heading("Training curves"), *(Figure(file, caption) for file, caption in plots.get("", []))]


def _looks_note(report: Report) -> str:
    """The accuracy verdicts of a sweep --until-settled run are its looks' (report/settle.py apply_looks)."""
    record = report.run.sweep.get(SETTLE_KEY) if not report.comparison else None
    if not record or not record.get("rounds"):
        return ""
    return (
        f" Not in this run: it added seeds until its comparisons settled (`--until-settled`), so each test is at "
        f"the level its repeated looks spend, {record['level']:.3g}, with no Holm, and a comparison's verdict is "
        "the one of the look that settled it (*Until settled*, above)."
    )


def how_to_read_section(report: Report, plots: Plots) -> list[Block]:
    """Every definition the report relies on, each once."""
    margin = fmt_value(round(100 * report.margin, 6))
    tested = (
        f"{report.test_images} here, from each trial's dataset and test_subset"
        if report.test_images
        else "unknown for these trials' dataset: no test-set part without a per-image log"
    )
    items = [
        "**Trials.** A trial is one training of one configuration with one seed. Included trials finished with every "
        "planned epoch logged; the others (failed, diverged, out of memory, incomplete: marked finished with fewer "
        "epochs logged than planned, or unfinished) enter no aggregate and are listed under *Excluded trials*.",
        "**Paired effect.** The effect of a factor's value is the mean difference (value − baseline) over matched "
        "pairs: an included trial with that value and the included trial with the baseline value and the same other "
        "keys and seed. *k of K pairs*: the pairs used of those the sweep planned; the lost ones say what removed "
        "them, which is part of the effect (a value that diverges loses its pairs).",
        "**95 % CI.** Student-t over the k pairs, with standard error sqrt(s² / k + v): s is the spread of the "
        "differences (the seeds' noise, which more pairs average out), v the shared test set's part, which they do "
        f"not: every trial is tested on the same n images (n = {tested}). Where the trials logged which images "
        "they got right, v is measured: the variance over images of the per-image difference averaged over the "
        "pairs, / n (it is small where the two models disagree on few images). Where not (older versions), v is "
        "bounded from the accuracies alone: (the mean over pairs of sqrt(p(1 − p)) + sqrt(q(1 − q)))² / (n − 1), "
        "true however the models disagree. Each effect says which. The interval beside an effect is the one its "
        "verdict used: at "
        f"1 − {ALPHA:.0%}/h where Holm's correction tests it at that level (marked *Holm*), the 1 − 2 × {ALPHA:.0%}/h "
        "one for an equivalence (90 % for h = 1, marked *equivalence (TOST)*); unmarked, 95 %.",
        "**Time and memory effects.** A ratio (value / baseline) of geometric means over the pairs: of the epoch "
        "times each trial's time/epoch reads (see *Columns*), and of its peak memory, one number per trial. Its "
        f"noise is the spread of the pairs' log ratios from {MIN_PAIRS} pairs on; with fewer pairs over seeds, that "
        "spread beyond what the trials' epochs explain added to the epochs' own noise, its degrees of freedom by "
        "Welch-Satterthwaite (*epoch noise and seed noise combined*: two seeds that agree keep a verdict one seed "
        "gave); one seed: for time, the spread of each trial's epochs about its own mean, *within-trial epoch noise "
        f"only*: it knows nothing of how another seed would run. Verdicts from {MIN_PAIRS - 1} degrees of freedom: "
        f"*faster*/*slower* (*less*/*more*), *no difference within {RATIO_BAND}* "
        "(two one-sided tests), *no practical difference* where the interval excludes no change but lies inside "
        "that band, else *not conclusive*, Holm-corrected "
        "within each measure. A time comparison that pairs a trial which shared a device with other trials (a node's "
        "CPUs or a GPU at the same time) with one that ran alone is *unfair* and not judged.",
        f"**Verdicts.** From {MIN_PAIRS} pairs on: *CI excludes 0* (two-sided t-test), *equivalent within ±{margin} "
        f"pp* (two one-sided tests against that margin; `cifar-ray report --margin PP`, default 1 pp), else *not "
        f"conclusive*; fewer pairs: *no verdict*. A value whose every trial failed, diverged or ran out of memory is "
        f"*failed*: that is its answer. Holm's correction across this report's accuracy comparisons "
        f"({report.comparisons} with {MIN_PAIRS} pairs or more) keeps the family-wise error at {ALPHA:.0%}, for each "
        "test." + _looks_note(report),
        f"**More seeds.** For an open comparison: the fewest pairs (at most {MAX_PAIRS}) at which its observed mean "
        f"and spread would be resolved either way at {ALPHA:.0%} / comparisons (Holm's strictest level, over the "
        "comparisons with any pair), the test set's part of its standard error held fixed (every seed is tested on "
        "the same images); in seeds per grid point at the pairs each seed adds, divided by the share of its ended "
        "pairs that were included (losses recur), its unfinished pairs counted as still to run. "
        "`cifar-ray sweep FILE --resume --repeats N` runs the new seeds and the unfinished trials; how long is the "
        "run's mean time per finished trial x trials / the most that ran at once. Where the test set's part alone "
        "keeps it open, no seed count is given: a larger `test_subset` would settle it.",
        "**Interactions.** Whether a factor's effect, on accuracy, time and memory alike, differs across the other "
        "factors: the pairs are split into strata by each other factor's values and, with two or more other factors, "
        "by every cell of their values (a pattern in one cell is not averaged away), and an F-type test compares the "
        "stratum means against the pair differences' spread pooled within the strata (plus the test set's noise); "
        "each metric's p-values are Holm-adjusted together, "
        f"significant below {ALPHA:.0%}. {TESTABLE_RULE} An effect that depends on the others is *depends* (unless "
        "it differs the same way in every cell: then only its size depends) and is judged per cell instead, each "
        "metric's cells one Holm family (*Effects per cell*): equal on average is not equal.",
        "**Fastest, Most accurate, Least memory, Best.** A configuration (the mean over its seeds) is named only "
        "where its lead over every other exceeds the t 95 % half-width of the seed noise (the pooled "
        "within-configuration std; for accuracy plus the shared test set's part of the difference, measured per image "
        "or bounded, which more seeds do not shrink); otherwise the candidates within noise "
        "are listed, and with no repeated configuration the noise is unknown and none is named. Fastest ranks the "
        "mean log time per epoch, and with no repeated configuration against the epochs' own noise. A configuration "
        "whose trials did not all finish says so first.",
        "**Per-value means.** Mean ± sample std (ddof=1; — for a single trial) over the included trials with each "
        "value, other keys and seeds pooled: they carry the other keys' effects too, so they are means, not effects.",
        f"**Columns.** Accuracies are at the last logged epoch (best: the highest, with its epoch); time/epoch is "
        f"{TIME_PER_EPOCH_RULE}; the trial table shows at most {MAX_TRIAL_COLUMNS} columns, trials.csv and "
        f"report.json have every one. {_gap_note(report)}",
        f"**Train metrics.** {train_metrics_note(report)}",
        f"**Memory.** {memory_note(report)}",
        f"**Overfitting.** {OVERFIT_RULE}",
    ]
    return [Heading("How to read this report"), Bullets(tuple(items))]


def roofline_section(report: Report, plots: Plots) -> list[Block]:
    return roofline_blocks(report)


def network_section(report: Report, plots: Plots) -> list[Block]:
    return network_blocks(report)


def profile_section(report: Report, plots: Plots) -> list[Block]:
    return profile_blocks(report)


# The page, in order: each entry gives its blocks (none to leave itself out).
LAYOUT: tuple[Section, ...] = (
    title_section,
    configurations_section,
    answers_section,
    setup_section,
    overview_section,
    factor_sections,
    findings_section,
    interactions_section,
    roofline_section,
    trials_section,
    network_section,
    excluded_section,
    overfitting_section,
    profile_section,
    curves_section,
    how_to_read_section,
)


def document(report: Report, plots: Plots) -> Document:
    """README.md's blocks: LAYOUT's sections in order."""
    return [block for section in LAYOUT for block in section(report, plots)]
