"""What every experiment of bench/orion_bench.py shares: the bundle's programs, orion-server
started and stopped, the MPS daemon, arms run one process each under orion-run or bare, CPU
pinning, rounds in rotating order, JSONL rows and median [min, max] summaries.

  import harness
  server = harness.Server(bundle, work, log, admin_port=50091, mode="priority").start()
  ...
  server.stop()
  rows = harness.read_rows(path, "priority")     # a bad line stops: EXPERIMENT: PATH:LINE: why
"""
import atexit
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
ENTRY = os.path.join(BENCH, "orion_bench.py")
# The PyTorch services and trainers, one process per role (serve, train, --driven).
MODELS = os.path.join(BENCH, "workloads", "torch_models.py")


def experiment_command(name, *argv):
    """The argv that runs experiment `name` of this checkout in a new process."""
    return [sys.executable, ENTRY, name, *argv]


# ---- the bundle (tools/bundle.sh) -----------------------------------------------------------

def double_bench_paths(build, interposers, experiment):
    """For the CPU-only launch benchmarks on the CUDA test double: BUILD's orion-server, orion-run,
    orion-bench-launch and test double, and the interposer libraries to measure (default:
    BUILD's), all absolute. Exits naming what is missing."""
    b = os.path.abspath(build)
    paths = {"build": b, "server": os.path.join(b, "server/orion-server"),
             "run": os.path.join(b, "tools/orion-run"),
             "bench": os.path.join(b, "bench/orion-bench-launch"),
             "double": os.path.join(b, "tests/cuda_double/lib")}
    libs = [os.path.abspath(x) for x in interposers] or [
        os.path.join(b, "interpose/liborion_interpose.so")]
    folders = (paths["build"], paths["double"])
    missing = [v for v in list(paths.values()) + libs
               if not (os.path.isdir(v) if v in folders else os.path.isfile(v))]
    if missing:
        sys.exit(f"{experiment}: missing {', '.join(missing)} (cmake --build {b})")
    return paths, libs


def add_double_bench_args(parser, verb):
    """The arguments the CPU-only launch benchmarks share: BUILD, --interposer (repeatable),
    --label, --out and --table."""
    parser.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    parser.add_argument("--interposer", action="append", default=[],
                        help=f"a liborion_interpose.so to {verb} (repeatable; default: BUILD's)")
    parser.add_argument("--label", default="", help="the build's name in the rows")
    parser.add_argument("--out", help="append the rows to this JSONL file")
    parser.add_argument("--table", help="print the table of a rows file and exit")


def double_bench_rows(args, paths, libs, measure):
    """The rows of a CPU-only launch benchmark: one a library and priority (high, best effort:
    alone on the GPU, never held), naming the build (--label), the library and the priority, then
    what measure(lib, priority) returns; each appended to --out as it comes."""
    rows = []
    for lib in libs:
        for priority in ("high", "best-effort"):
            row = {"label": args.label or os.path.basename(paths["build"]),
                   "interposer": shown_path(lib), "priority": priority, **measure(lib, priority)}
            rows.append(row)
            if args.out:
                append_row(args.out, row)
    return rows


def shown_path(path):
    """An absolute `path` as a row names it: relative to the repository inside it."""
    shown = os.path.relpath(path, ROOT)
    return path if shown.startswith("..") else shown


def lib_env(bundle):
    """What the bundle's server and orion-ctl need in their environment."""
    return {"LD_LIBRARY_PATH": os.path.join(bundle, "lib")}


def snapshot_every(path, server, seconds=5.0, pids=()):
    """Every `seconds` until the returned event is set, appended to `path`: orion-ctl policy and
    clients, the orion_ series of /metrics (no buckets) and, for each process of `pids` (a
    callable giving them, or a list), each thread's state and user/system ticks (what the gate
    and the processes did while the run went on; a stall shows there). A part that fails is
    written down in its place, never raised: a snapshot must never end the run."""
    stop = threading.Event()

    def part(what, read):
        try:
            return read()
        except BaseException as e:  # SystemExit from Server.ctl included (it names itself)
            return f"{e}\n" if str(e).startswith(what) else f"{what} failed: {e}\n"

    def metrics():
        text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
        return "".join(l for l in text.splitlines(True)
                       if l.startswith("orion_") and "bucket" not in l)

    def loop():
        while not stop.wait(seconds):
            text = (f"== t={time.monotonic():.1f}\n"
                    + part("orion-ctl policy", lambda: server.ctl("policy"))
                    + part("orion-ctl clients", lambda: server.ctl("clients"))
                    + part("/metrics", metrics)
                    + part("threads", lambda: "".join(
                        thread_states(p) for p in (pids() if callable(pids) else pids))))
            with open(path, "a") as f:
                f.write(text)

    threading.Thread(target=loop, daemon=True).start()
    return stop


def thread_states(pid):
    """A process's threads, a line each: tid, name, state, user and system ticks (/proc)."""
    lines = [f"-- pid {pid}\n"]
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            lines.append(f"{tid} {name} {fields[0]} {fields[11]} {fields[12]}\n")
    except (OSError, ValueError):
        lines.append("(gone)\n")
    return "".join(lines)


def orion_run(bundle, priority, interposer=None, run_args=()):
    """The prefix that runs a command under the interposer, registered at `priority`."""
    return [os.path.join(bundle, "orion-run"), "--interposer",
            interposer or os.path.join(bundle, "liborion_interpose.so"), "--priority", priority,
            *run_args, "--"]


# ORION_BENCH_SWITCH's words (contract::BenchSwitch) by name, each with its arm's name in
# cpu-tax's in-process rows; bench_switch_part gives the part of the launch path it leaves out.
BENCH_SWITCHES = {
    # Word 0 is the path as usual: an arm of it is the A/A control of the others.
    "as-usual": (0, "in-process, as usual (an A/A control)"),
    "bypass": (1, "in-process bypass"),
    "no-hold": (2, "in-process, no timed launch held"),
    "no-timing": (3, "in-process, no launch timed"),
    "no-launch-records": (4, "in-process, no launch recorded"),
    "no-ring-prefetch": (5, "in-process, the ring's next entry not prefetched"),
    "after-registration": (6, "in-process, launches cut short after the registration"),
    "before-clock": (7, "in-process, launches cut short before the clock"),
    "no-clock": (8, "in-process, no clock read (the thread's first reading kept)"),
    "no-hp-notes": (9, "in-process, nothing published to the high-priority gate entry"),
    "no-context-query": (10, "in-process, the thread's last context kept (no cuCtxGetCurrent)"),
}


def bench_switch_part(name):
    """What the arm of switch `name` leaves out, without cpu-tax's "in-process" ("bypass",
    "launches cut short after the registration", ...)."""
    label = BENCH_SWITCHES[name][1]
    return label.removeprefix("in-process, ").removeprefix("in-process ")


def bench_switch_names(text, where):
    """A comma-separated list of BENCH_SWITCHES names; exits naming one it does not know."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in BENCH_SWITCHES:
            sys.exit(f"{where}: unknown switch {n!r}; known: {', '.join(sorted(BENCH_SWITCHES))}")
    return names


def write_bench_switch(path, name):
    """A file holding switch `name`'s word, for ORION_BENCH_SWITCH; returns the path."""
    with open(path, "wb") as f:
        f.write(BENCH_SWITCHES[name][0].to_bytes(4, "little"))
    return path


# The keys of orion-server's config that Server writes itself.
SERVER_WRITES = ("socket_path", "admin_address", "metrics_address", "mode")


class Server:
    """orion-server from a bundle, its socket and config in `work`, its output to `log` (a file).
    `admin_port` 0 lets the server pick (no orion-ctl then); `mode` None keeps the server's
    default (priority). `prefix` runs it under a program that execs it (taskset -c 0); `popen`
    replaces subprocess.Popen (to pin it by role); `program` is the server binary where it is
    not the bundle's (a build tree's server/orion-server)."""

    def __init__(self, bundle, work, log, admin_port=0, mode=None, extra="", prefix=(),
                 popen=None, program=None):
        self.bundle, self.work, self.log = bundle, work, log
        self.program = program or os.path.join(bundle, "orion-server")
        self.admin_port, self.mode, self.extra = admin_port, mode, extra
        self.prefix, self.popen = list(prefix), popen or (lambda argv, **kw: subprocess.Popen(argv, **kw))
        self.socket = os.path.join(work, "orion.sock")
        self.proc = None

    @property
    def metrics_url(self):
        return f"http://127.0.0.1:{self.admin_port + 1}/metrics"

    @property
    def admin(self):
        return f"127.0.0.1:{self.admin_port}"

    def start(self):
        cfg = os.path.join(self.work, "server.yaml")
        metrics = self.admin_port + 1 if self.admin_port else 0
        with open(cfg, "w") as f:
            f.write(f"socket_path: {self.socket}\nadmin_address: 127.0.0.1:{self.admin_port}\n"
                    f"metrics_address: 127.0.0.1:{metrics}\n"
                    + (f"mode: {self.mode}\n" if self.mode else "") + self.extra)
        self.proc = self.popen(self.prefix + [self.program, "--config", cfg],
                               env=dict(os.environ, **lib_env(self.bundle)),
                               stdout=self.log, stderr=self.log)
        atexit.register(self.stop)  # however the run ends (orion_bench.py: SIGTERM included)
        for _ in range(200):
            if os.path.exists(self.socket):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"orion-server did not start; see {getattr(self.log, 'name', 'its log')}"
                         f"{self.log_tail()}")

    def log_tail(self, lines=8):
        """The end of the server's log, quoted for an error (its file is often in a temporary
        folder the run removes); empty where the log is not a named file."""
        name = getattr(self.log, "name", None)
        if not isinstance(name, str):
            return ""
        try:
            self.log.flush()
            with open(name, errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            return ""
        return "".join(f"\n  {line}" for line in tail)

    def ctl(self, *argv):
        """orion-ctl against this server; its output, or exit naming the command."""
        r = subprocess.run([os.path.join(self.bundle, "orion-ctl"), "--server", self.admin, *argv],
                           env=dict(os.environ, **lib_env(self.bundle)), capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SystemExit(f"orion-ctl {' '.join(argv)} failed: {r.stderr.strip()}")
        return r.stdout

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- the MPS daemon -------------------------------------------------------------------------

def start_mps_daemon(work, cpus=None):
    """Starts the MPS control daemon (every GPU) with its pipe and log folders in `work`, on
    `cpus` if given. Returns (the environment its clients need, None), or (None, why not)."""
    pipe, logd = os.path.join(work, "mps-pipe"), os.path.join(work, "mps-log")
    os.makedirs(pipe, exist_ok=True)
    os.makedirs(logd, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logd}
    try:
        r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=dict(os.environ, **env),
                           capture_output=True, text=True,
                           preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        why = None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")
    except OSError as e:
        why = str(e)
    if why:
        return None, f"MPS daemon failed to start: {why}"
    time.sleep(1)
    return env, None


def stop_mps_daemon(env):
    """Stops the daemon start_mps_daemon started (env: what it returned)."""
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True,
                   env=dict(os.environ, **env), capture_output=True)
    time.sleep(2)


# The trainer's MPS settings in the mps-cap and orion-mps configurations: client priority 1
# (below normal) and a share of the SMs.
def mps_best_effort_env(percent=50):
    return {"CUDA_MPS_CLIENT_PRIORITY": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percent)}


# ---- CPU pinning ----------------------------------------------------------------------------

def taskset(cpus):
    """The prefix that pins a command to `cpus` (a core, "2", or a list)."""
    return ["taskset", "-c", cpus if isinstance(cpus, str) else ",".join(map(str, cpus))]


def cpu_list(text):
    """The cores of a taskset-style list ("2", "2,3", "4-7,9"); ValueError where it is not one."""
    cores = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{text!r} is not a list of cores")
        cores.extend(range(int(low), int(high if dash else low) + 1))
    return cores


def cpu_ticks(cores):
    """/proc/stat's counters (user, nice, system, idle, iowait, irq, softirq, steal), summed over
    `cores`; None where unreadable."""
    try:
        with open("/proc/stat") as f:
            rows = {l.split()[0]: [int(x) for x in l.split()[1:9]]
                    for l in f if l.startswith("cpu")}
        return [sum(rows[f"cpu{c}"][i] for c in cores) for i in range(8)]
    except (OSError, KeyError, ValueError, IndexError):
        return None


def pin(pid, cpus, what):
    """Pins a started process (before it starts its own threads: they inherit it)."""
    try:
        os.sched_setaffinity(pid, cpus)
    except OSError as e:
        print(f"warning: cannot pin {what} to cores {sorted(cpus)}: {e}", file=sys.stderr)


# ---- rounds ---------------------------------------------------------------------------------

def rotated(items, turn):
    """`items` starting `turn` places later (wrapping): each round starts one arm later, so the
    host's drift within a round does not fall on the same arm every time."""
    if not items:
        return list(items)
    turn %= len(items)
    return list(items[turn:]) + list(items[:turn])


def parse_result(text):
    """The `result k=v ...` line a workload prints (numbers as floats), or None."""
    for line in text.splitlines():
        if line.startswith("result "):
            out = {}
            for kv in line.split()[1:]:
                k, _, v = kv.partition("=")
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
            return out
    return None


# ---- summaries ------------------------------------------------------------------------------

def quantile(sorted_values, p):
    """The p-quantile (0..1) of sorted values, nearest rank below."""
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def spread(values, digits=2, suffix="x"):
    """"median{suffix} [min, max]" of the values, or "-" without any."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return "-"
    return f"{statistics.median(xs):.{digits}f}{suffix} [{xs[0]:.{digits}f}, {xs[-1]:.{digits}f}]"


def median_interval(values, resamples=4000, seed=1, digits=3):
    """The bootstrap 95% interval of the median of `values` (seeded: a table renders the same
    every time), as "[low, high]"."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    low, high = medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def markdown_table(header, rows):
    """A Markdown table: `header` a list of column names, `rows` lists of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---- JSONL ----------------------------------------------------------------------------------

def append_row(path, row):
    """Appends one JSON object as one line (a run cut short leaves its earlier rows whole)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_runs(paths, tool, lenient=False):
    """The rows of several runs of one experiment, pooled: each run's rounds numbered on from
    the run before (read_rows for each file)."""
    rows = []
    for path in paths:
        offset = max((r["round"] for r in rows), default=0)
        rows += [dict(r, round=r["round"] + offset) for r in read_rows(path, tool, lenient)]
    return rows


def read_rows(path, tool, lenient=False, check=None, rerun=None):
    """The rows of a JSONL file (one JSON object a line; blank lines skipped). A line that does
    not parse stops with `TOOL: PATH:LINE: why` and what to run once it is mended; `lenient` (a
    run's own results, whose last line is half written when the run was cut short) leaves it out
    with a note instead. `check(row)` returns what is wrong with a parsed row, or None. `rerun`
    is the command named in that message (default: the experiment's --table on the file). A
    path ending in .gz is read through gzip (large rows kept compressed in docs/data)."""
    try:
        f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    except OSError as e:
        sys.exit(f"{tool}: {path}: cannot read ({e.strerror})")
    rows = []
    with f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                problem = None if isinstance(row, dict) else "not a JSON object"
            except json.JSONDecodeError as e:
                problem = f"not JSON ({e.msg})"
            if problem is None and check is not None:
                problem = check(row)
            if problem is None:
                rows.append(row)
            elif lenient:
                print(f"{tool}: {path}:{number}: {problem}; left out", file=sys.stderr)
            else:
                again = rerun or f"python3 bench/orion_bench.py {tool} --table {path}"
                sys.exit(f"{tool}: {path}:{number}: {problem}; mend or delete that line, then "
                         f"run: {again}")
    return rows
