"""Where a sweep stands, from its run folder alone: `cifar-ray status RUN_DIR` and the line a running sweep prints
after each trial ends. Both come from `sweep_state`, the one place that counts trials and estimates the ETA; for
sweep --until-settled also each comparison (questions): settled at which look, or open and the trials of the round
under way that are for it, read from sweep.json's settle record and the trials' states.

It reads sweep.json, each trial.json and metrics.jsonl (runlog), and imports neither torch nor Ray, nor pyarrow for
a local folder, so it answers in well under a second while the sweep runs elsewhere (`ray job submit`).

ETA = wall time per epoch x epochs left / trials at once, summed over the trial shapes (core/shapes.py: workers,
CPUs and GPUs per worker, backend, strategy: trials of one shape share its slots, and shapes share the cluster's
cores), where for each shape
- wall time per epoch: over its trials with a finished epoch since their (latest) start, the time from the start
  to the last epoch's end divided by those epochs, pooled (trial start-up included, unlike `epoch_time_s`); the
  whole sweep's while no trial of the shape has finished an epoch;
- epochs left: the epochs not yet logged of its trials that have not ended;
- trials at once: the most of its trials that have run at the same time so far (1 before any has started),
  capped by its trials left.
A shape that has not started yet will also pay its slots' start-up, which the ETA does not foresee.

A trial.json says "running" until its driver records the end; a driver that was killed never does. Such a trial
is shown as stalled: its run folder has no live driver (core/lease.py: the driver's lease is absent, or stale: no
heartbeat for 30 s, or its process on this host is gone), the sweep recorded its end or an interruption after the
trial started, or no epoch has ended for STALE_EPOCHS x its wall time per epoch (and at least STALE_MIN_S). A
sweep with trials left but none running nor started for as long (its driver was killed between trials) gets no ETA
either.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from . import lease, runlog
from .errors import RunFolderError
from .run import RunFolder
from .shapes import TrialShape, trial_shape
from .storage import StoragePath
from .text import counted, rough_duration, text_table

STALE_EPOCHS = 3
STALE_MIN_S = 600.0
ISO_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # runlog.now_iso's format (datetime.fromisoformat reads +0000 from 3.11 only)
# The states a trial is counted in, in the order the totals name them: runlog.STATUSES, plus stalled and incomplete
# (marked finished with an epoch's line lost: runlog.incomplete).
STATES = ("finished", "running", "stalled", "incomplete", "interrupted", "pending", "failed", "diverged", "oom")
UNFINISHED = ("running", "stalled", "incomplete", "interrupted", "pending")


@dataclass
class TrialState:
    trial: str
    swept: dict
    status: str  # as trial.json records it
    state: str  # one of STATES: the status, or stalled for a "running" trial that no longer progresses
    epochs_done: int
    epochs: int | None
    error: str | None  # the first line of a failed (or oom) trial's error
    diverged_epoch: int | None
    idle_s: float | None  # running or stalled: seconds since its last epoch ended (or since it started)


@dataclass
class ShapeEta:
    shape: dict  # the TrialShape's fields and values
    epoch_wall_s: float | None  # wall time per finished epoch, trial start-up included (see the module docstring)
    epochs_left: int
    at_once: int  # trials of the shape at once the ETA assumes
    eta_s: float | None


@dataclass
class SweepState:
    name: str
    run_dir: str
    started_at: str | None
    finished_at: str | None
    elapsed_s: float | None  # since the sweep started (to its end, if it ended)
    trials: list[TrialState]
    counts: dict[str, int]  # trials per state
    shapes: list[ShapeEta]  # the ETA's terms: the shapes with unfinished trials
    eta_s: float | None  # None: nothing left, nothing progressing, or no epoch finished yet
    eta: str  # the ETA in words, or why there is none; "" when nothing is left
    stopped: bool  # trials are left but none progresses: the sweep's driver stopped (--resume continues it)
    driver_gone: str | None = None  # why the run has no live driver (lease absent or stale), read while trials run
    settled: str = ""  # sweep --until-settled: where its looks stand (settle_text); "" for another sweep
    questions: list[Question] = field(default_factory=list)  # sweep --until-settled: each comparison (questions)
    more_coming: bool = False  # load_state: a live driver holds the run and no look of --until-settled stopped it


@dataclass
class Question:
    """One comparison of a sweep --until-settled, as its trials end: its verdict at the look that settled it, or
    open, with the trials the round under way added for it (`trials`), how many of them ended and which run."""

    comparison: str  # its label: `workers=2 vs 1`
    verdict: str  # the look's verdict (report/verdicts.py), or OPEN_QUESTION
    look: int  # the look that settled it, or the last look
    seeds: int  # the seeds per configuration at that look
    trials: list[str] = field(default_factory=list)  # the round under way's trials for it ([]: none runs for it)
    ended: int = 0
    running: list[str] = field(default_factory=list)


def _unix(iso: str | None) -> float | None:
    try:
        return datetime.strptime(iso, ISO_FORMAT).timestamp()
    except (TypeError, ValueError):
        return None


def _epochs_since_start(trial: runlog.TrialLog) -> list[dict]:
    """The epochs that ended in the trial's latest attempt (a resumed trial starts again, after its earlier epochs)."""
    started = trial.record.started_unix
    if started is None:
        return []
    return [row for row in trial.epochs if isinstance(row.get("end_unix"), (int, float)) and row["end_unix"] >= started]


def _epoch_wall(trials: list[runlog.TrialLog]) -> float | None:
    spans = [
        (rows[-1]["end_unix"] - t.record.started_unix, len(rows)) for t in trials if (rows := _epochs_since_start(t))
    ]
    return sum(span for span, _ in spans) / sum(n for _, n in spans) if spans else None


def _last_activity(trial: runlog.TrialLog) -> float | None:
    times = [trial.record.started_unix, *(row.get("end_unix") for row in trial.epochs)]
    times = [t for t in times if isinstance(t, (int, float))]
    return max(times) if times else None


def _most_at_once(trials: list[runlog.TrialLog], states: list[str], now: float) -> int:
    """The most trials that have run at the same time: each from its start to its last epoch's end (a warm slot
    takes its next trial before the driver records the last one finished), a live one to now."""
    events = []
    for trial, state in zip(trials, states):
        start = trial.record.started_unix
        end = now if state == "running" else _last_activity(trial)
        if start is not None and end is not None and end > start:
            events += [(start, 1), (end, -1)]
    running = most = 0
    for _, step in sorted(events):  # at a tie an end (-1) sorts before a start
        running += step
        most = max(most, running)
    return most


def trial_times(run: runlog.RunLog) -> tuple[float, int] | None:
    """The mean wall time of `run`'s finished trials (each from its latest start to its last epoch's end) and the
    most of them that ran at once: what more trials like them would take; None when none recorded its times."""
    done = [t for t in run.trials if t.status == "finished" and t.record.started_unix is not None]
    walls = [_last_activity(t) - t.record.started_unix for t in done]
    if not walls or not max(walls) > 0:
        return None
    return sum(walls) / len(walls), max(_most_at_once(done, [t.status for t in done], 0.0), 1)


def _stale(idle: float | None, epoch_wall: float | None) -> bool:
    """Nothing for `idle` seconds where an epoch takes `epoch_wall`; never without an epoch to compare with."""
    return idle is not None and epoch_wall is not None and idle > max(STALE_EPOCHS * epoch_wall, STALE_MIN_S)


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def _shapes_left(trials: list[runlog.TrialLog], states: list[TrialState]) -> list[TrialShape]:
    return list(dict.fromkeys(trial_shape(t.config) for t, s in zip(trials, states) if s.state in UNFINISHED))


def _shape_eta(
    shape: TrialShape, trials: list[runlog.TrialLog], states: list[TrialState], sweep_wall: float | None, now: float
) -> ShapeEta:
    members = [(t, s) for t, s in zip(trials, states) if trial_shape(t.config) == shape]
    left = [s for _, s in members if s.state in UNFINISHED]
    wall = _epoch_wall([t for t, _ in members]) or sweep_wall
    at_once = max(min(_most_at_once([t for t, _ in members], [s.state for _, s in members], now), len(left)), 1)
    epochs_left = sum(max((s.epochs or 0) - s.epochs_done, 0) for s in left)
    return ShapeEta(asdict(shape), wall, epochs_left, at_once, None if wall is None else wall * epochs_left / at_once)


def sweep_state(run: runlog.RunLog, now: float, driver_gone: str | None = None) -> SweepState:
    """Every trial's state and the totals of `run` at Unix time `now`; `driver_gone`: why no live driver holds the
    run folder (lease.driver_gone), None when one does or it was not asked."""
    sweep = run.sweep
    ended = max(filter(None, [_unix(sweep.get("finished_at")), sweep.get("interrupted_unix")]), default=None)
    epoch_wall = _epoch_wall(run.trials)
    states = []
    for trial in run.trials:
        state, idle = trial.status, None
        if trial.status == "running":
            last = _last_activity(trial)
            idle = None if last is None else now - last
            gone = driver_gone is not None or ended is not None and ended > (trial.record.started_unix or 0)
            state = "stalled" if gone or _stale(idle, _epoch_wall([trial]) or epoch_wall) else "running"
        elif trial.incomplete:
            state = "incomplete"
        states.append(
            TrialState(
                trial=trial.name,
                swept=trial.swept,
                status=trial.status,
                state=state,
                epochs_done=len(trial.epochs),
                epochs=trial.config.get("epochs"),
                error=_first_line(trial.record.error) if trial.status in ("failed", "oom") else None,
                diverged_epoch=trial.record.diverged_epoch,
                idle_s=idle,
            )
        )
    counts = {state: sum(t.state == state for t in states) for state in STATES}
    unfinished = [t for t in states if t.state in UNFINISHED]
    shapes = [_shape_eta(shape, run.trials, states, epoch_wall, now) for shape in _shapes_left(run.trials, states)]
    started = _unix(sweep.get("started_at"))
    last = max(filter(None, [started, *map(_last_activity, run.trials)]), default=None)
    idle = None if last is None else now - last
    eta_s, eta = None, ""
    stopped = bool(
        unfinished
        and not counts["running"]
        and (counts["stalled"] or counts["interrupted"] or ended or _stale(idle, epoch_wall))
    )
    if stopped:
        why = driver_gone or "its driver stopped?"  # lease.driver_gone says "its driver ... is gone" itself
        eta = f"no ETA: no trial is progressing ({why}); `cifar-ray sweep FILE --resume` continues it"
    elif unfinished and epoch_wall is None:
        eta = "ETA unknown (no epoch has finished yet)"
    elif unfinished:
        eta_s = sum(shape.eta_s for shape in shapes)
        eta = f"ETA ~{rough_duration(eta_s)}"
    end = _unix(sweep.get("finished_at")) or now
    return SweepState(
        name=sweep.get("name", run.path.name),
        run_dir=str(run.path),
        started_at=sweep.get("started_at"),
        finished_at=sweep.get("finished_at"),
        elapsed_s=None if started is None else end - started,
        trials=states,
        counts=counts,
        shapes=shapes,
        eta_s=eta_s,
        eta=eta,
        stopped=stopped,
        driver_gone=driver_gone,
        settled=settle_text(sweep.get(SETTLE_KEY) or {}),
        questions=questions(sweep.get(SETTLE_KEY) or {}, states),
    )


def looks_stopped(sweep: dict) -> bool:
    """Whether a look of sweep --until-settled stopped its rounds: no trial comes after."""
    looks = (sweep.get(SETTLE_KEY) or {}).get("rounds")
    return bool(looks and looks[-1]["stop"])


SETTLE_KEY = "settle"  # sweep.json's record of sweep --until-settled's looks (report/settle.py writes them)
SETTLED, MAX_SEEDS, BUDGET, TESTSET = "settled", "max-seeds", "budget", "test set"  # why its rounds ended


def settle_text(settle: dict) -> str:
    """sweep --until-settled's looks in one line, for status, the terminal and the report: `settled after 5 seeds
    (3 looks)`, `stopped at the budget with 2 comparisons open (...)`, or while a round runs, what the last look
    settled and what is open; "" before the first look."""
    looks = settle.get("rounds") or []
    if not looks:
        return ""
    last = looks[-1]
    seeds = max((v["seeds"] for v in last["verdicts"].values()), default=settle["first_seeds"])
    n_looks = counted(len(looks), "look")
    still = len(last["open"])
    open_text = f"with {counted(still, 'comparison')} open"
    if last["stop"] is None:
        return (
            f"until settled: look {len(looks)} settled {len(last['verdicts']) - still} of {len(last['verdicts'])} "
            f"comparisons (open: {', '.join(last['open'])}); round {len(looks) + 1} adds {last['trials']} trials, "
            f"to {last['seeds']} seeds"
        )
    estimate = f"~{rough_duration(last['estimate_s'])}" if last["estimate_s"] is not None else "unknown"
    return {
        SETTLED: f"settled after {counted(seeds, 'seed')} ({n_looks})",
        MAX_SEEDS: f"stopped at --max-seeds {settle['max_seeds']} {open_text} ({n_looks})",
        BUDGET: f"stopped at the budget {open_text} ({counted(seeds, 'seed')}, {n_looks}; the next round's "
        f"estimate {estimate} would pass it)",
        TESTSET: f"stopped {open_text} that the shared test set's noise keeps open whatever the seeds "
        f"({counted(seeds, 'seed')}, {n_looks})",
    }[last["stop"]]


OPEN_QUESTION = "open"  # a comparison no look has settled yet (its record says report.verdicts.OPEN)


def questions(settle: dict, trials: list[TrialState]) -> list[Question]:
    """Each comparison of sweep --until-settled's last look (sweep.json's settle record, settle_text's), in its
    order: settled (at the look that settled it) or open; for the open ones, when a round is under way, the trials it
    added for them (the round's `questions`), how many ended, which run. [] before the first look."""
    looks = settle.get("rounds") or []
    if not looks:
        return []
    last, states = looks[-1], {t.trial: t for t in trials}
    round_trials = last.get("questions", {}) if last["stop"] is None else {}
    result = []
    for label, verdict in last["verdicts"].items():
        is_open = label in last["open"]
        names = round_trials.get(label, []) if is_open else []
        known = [states[name] for name in names if name in states]
        result.append(
            Question(
                comparison=label,
                verdict=OPEN_QUESTION if is_open else verdict["verdict"],
                look=verdict["round"],
                seeds=verdict["seeds"],
                trials=names,
                ended=sum(t.state not in UNFINISHED for t in known),
                running=[t.trial for t in known if t.state == "running"],
            )
        )
    return result


def question_state(question: Question) -> str:
    """`open, 3 of 8 added trials ended; running t012-..., t013-...` while a round runs for it, else its verdict at
    its look: `differs at 3 seeds (look 1)`, `open at 10 seeds (look 4)`."""
    if not question.trials:
        return f"{question.verdict} at {counted(question.seeds, 'seed')} (look {question.look})"
    running = f"; running {', '.join(question.running)}" if question.running else ""
    return f"{question.verdict}, {question.ended} of {counted(len(question.trials), 'added trial')} ended{running}"


def question_text(question: Question) -> str:
    return f"{question.comparison}: {question_state(question)}"


def round_line(state: SweepState) -> str:
    """The round under way of a sweep --until-settled in one line, for the line a running sweep prints after each
    trial ends: each open comparison's added trials ended and running; "" when no round is under way."""
    running = [question_text(q) for q in state.questions if q.trials]
    return f"until settled, this round: {'; '.join(running)}" if running else ""


def totals_line(state: SweepState, explain: bool = False, elapsed: str = "elapsed") -> str:
    """`[3/12 done · 2 running · 6 pending · 1 failed] 25 min elapsed · ETA ~14 min`; `explain` adds how the
    ETA is computed, `elapsed` what the elapsed time measures."""
    counts = [f"{state.counts['finished']}/{len(state.trials)} done"]
    counts += [f"{n} {name}" for name, n in state.counts.items() if n and name != "finished"]
    parts = [] if state.elapsed_s is None else [f"{rough_duration(state.elapsed_s)} {elapsed}"]
    eta = state.eta
    if explain and state.eta_s is not None:
        terms = [f"{rough_duration(s.epoch_wall_s)} x {s.epochs_left} / {s.at_once}" for s in state.shapes]
        per_shape = ", summed over trial shapes" if len(terms) > 1 else ""
        eta += f" (wall time per epoch x epochs left / trials at once{per_shape}: {' + '.join(terms)})"
    parts += [eta] if eta else []
    return f"[{' · '.join(counts)}] {' · '.join(parts)}".rstrip()


def progress_lines(run_dir: runlog.Where, now: float, session_started: float | None) -> tuple[str, str]:
    """What a running sweep prints after each trial ends, all at Unix time `now` (one clock read: the elapsed time
    and the ETA of the same moment): the counts, this session's running time since `session_started` (not the time
    since the run's first session began; None: left out) and the ETA; and for a round of sweep --until-settled, its
    round_line ("" otherwise)."""
    state = sweep_state(runlog.load_run(run_dir), now)
    session_s = None if session_started is None else now - session_started
    return totals_line(replace(state, elapsed_s=session_s), elapsed="elapsed this session"), round_line(state)


def swept_text(swept: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in swept.items())


def _state_text(trial: TrialState) -> str:
    if trial.state == "running":  # the epoch under way; the last one until the driver records the trial's end
        return f"running: epoch {min(trial.epochs_done + 1, trial.epochs or trial.epochs_done + 1)} of {trial.epochs}"
    if trial.state == "stalled":
        since = "last epoch" if trial.epochs_done else "started"
        idle = "" if trial.idle_s is None else f", {since} {rough_duration(trial.idle_s)} ago"
        return f"running per trial.json, but stalled{idle}"
    if trial.state == "incomplete":
        missing = f"{trial.epochs_done} of {trial.epochs} epochs in {runlog.EPOCHS_FILE}"
        return f"incomplete: finished per trial.json, but only {missing}; --resume trains it again"
    if trial.state in ("failed", "oom"):
        return f"{trial.state}: {trial.error or 'see ' + runlog.ERROR_FILE}"
    if trial.state == "diverged" and trial.diverged_epoch:
        return f"diverged at epoch {trial.diverged_epoch}"
    return trial.state


def holds_run(run_dir: StoragePath) -> bool:
    return RunFolder(run_dir).holds_run()


def no_run_message(run_dir: StoragePath, waited_s: float | None = None) -> str:
    waited = f" after waiting {waited_s:g} s" if waited_s is not None else ""
    return (
        f"{run_dir} holds no run{waited}: no {runlog.SWEEP_FILE} there; a run folder (--storage DIR --name NAME: "
        f"DIR/NAME) holds {runlog.SWEEP_FILE} and a folder per trial with {runlog.TRIAL_FILE} and "
        f"{runlog.EPOCHS_FILE}"
    )


def load_state(run_dir: runlog.Where, now: float | None = None) -> SweepState:
    """The state of the run in `run_dir`; RunFolderError when it holds no sweep.json."""
    run_dir = StoragePath.of(run_dir)
    if not holds_run(run_dir):
        raise RunFolderError(no_run_message(run_dir))
    run, now = runlog.load_run(run_dir), time.time() if now is None else now
    running = any(trial.status == "running" for trial in run.trials)
    gone = lease.driver_gone(run_dir, now)
    # A live driver with every trial ended may add more: --until-settled's next round (the lease spans its rounds).
    more = gone is None and not looks_stopped(run.sweep)
    return replace(sweep_state(run, now, gone if running else None), more_coming=more)


def render(run_dir: runlog.Where, as_json: bool = False, now: float | None = None) -> str:
    """`cifar-ray status`: a line per trial and the totals, or all of it as one JSON object."""
    state = load_state(run_dir, now)
    return json.dumps(asdict(state)) if as_json else state_table(state)


def _epochs_text(trial: TrialState) -> str:
    return f"{trial.epochs_done}/{trial.epochs or '?'} epochs"


def state_table(state: SweepState) -> str:
    """The sweep's name, a line per trial and the totals."""
    rows = [(t.trial, swept_text(t.swept), _state_text(t), _epochs_text(t)) for t in state.trials]
    since = f", started {state.started_at}" if state.started_at else ""
    lines = [f"{state.name}: {len(state.trials)} trial{'s' * (len(state.trials) != 1)}{since}"]
    lines += text_table(rows, pad_last=False).splitlines()
    lines.append(totals_line(state, explain=True))
    lines += [state.settled] if state.settled else []
    lines += [f"  {question_text(q)}" for q in state.questions]
    return "\n".join(lines)


WATCH_INTERVAL_S = 5.0
# How long --watch waits for a run to appear: started with the sweep, it looks before the sweep has written
# sweep.json, which comes after Ray starts (4 to 20 s here).
WATCH_WAIT_S = 60.0
WAIT_POLL_S = 1.0  # how often it looks meanwhile: the table comes within a second of the run
CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, screen cleared: the next table replaces the last, as watch(1) does


def has_ended(state: SweepState) -> bool:
    """Nothing more will happen: every trial has a final status and no live driver may add more (a round of
    --until-settled), or none can progress (the sweep was stopped)."""
    return state.stopped or not (state.more_coming or any(state.counts[name] for name in UNFINISHED))


@dataclass(frozen=True)
class Clock:
    """What `watch` reads the time with and waits with; None: time.time and time.sleep, looked up at the call (tests
    replace them, or give a fake clock)."""

    now: Callable[[], float] | None = None
    sleep: Callable[[float], None] | None = None


def watch(
    run_dir: runlog.Where,
    interval_s: float,
    write: Callable[[str], None],
    in_place: bool,
    clock: Clock = Clock(),
    wait_s: float = WATCH_WAIT_S,
) -> SweepState:
    """`cifar-ray status --watch`: the status read again every `interval_s` seconds until the sweep ends; returns its
    last state. A folder that holds no run yet is waited for, up to `wait_s` seconds (saying so), then refused.
    `in_place` (a terminal): each table replaces the last. Else plain appended lines, for a log: the table
    once, then per refresh in which something changed a line per changed trial and the totals, each after the time."""
    pause, now_of = clock.sleep or time.sleep, clock.now or time.time
    run_dir = StoragePath.of(run_dir)
    if not holds_run(run_dir):
        write(f"waiting up to {wait_s:g} s for {run_dir} to hold a run (its {runlog.SWEEP_FILE}); Ctrl-C stops\n")
        deadline = now_of() + wait_s
        while not holds_run(run_dir):
            if now_of() >= deadline:
                raise RunFolderError(no_run_message(run_dir, wait_s))
            pause(min(WAIT_POLL_S, interval_s, deadline - now_of()))
    shown: dict[str, str] = {}
    while True:
        now = now_of()
        state = load_state(run_dir, now)
        stamp = time.strftime("%H:%M:%S", time.localtime(now))
        rows = {t.trial: f"{_state_text(t)}, {_epochs_text(t)}" for t in state.trials}
        rows |= {q.comparison: question_state(q) for q in state.questions}  # --until-settled's, as trials end
        if in_place:
            title = f"{stamp} · every {interval_s:g} s until the sweep ends · Ctrl-C stops watching"
            write(f"{CLEAR_SCREEN}{title}\n\n{state_table(state)}\n")
        elif not shown:
            write(state_table(state) + "\n")
        elif changed := [f"{stamp} {name}: {text}" for name, text in rows.items() if shown.get(name) != text]:
            write("\n".join([*changed, f"{stamp} {totals_line(state)}"]) + "\n")
        shown = rows
        if has_ended(state):
            return state
        pause(interval_s)
