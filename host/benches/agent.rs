//! The host's overhead per agent turn, and many concurrent workers making tool calls.
//!
//! Needs the built plugins (`bash scripts/setup`). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench agent`.
//!
//! - `agent_turn/no_tool`: one user message on a new channel whose scripted model answers
//!   in text: starting the channel (its stored history read from SQLite), the request built
//!   from history, the dispatch, the history appended to SQLite, and the idle wait. The
//!   scripted model itself costs about a microsecond, so this is the host's overhead per
//!   turn.
//! - `agent_turn/one_wasm_tool`: the same channel, offered `file_read` by its profile,
//!   whose model calls it once before answering: one more model round and one sandboxed
//!   tool call (fresh instance, audit row).
//! - Then N = 100 and 1000 workers are spawned by one channel at once, each making 10
//!   `file_read` calls and reporting done; the benchmark prints the wall time, tool calls
//!   per second and the process's peak RSS after each.
//!
//! `-- telemetry` runs only the cost of traces: the one-tool turn's p50 and the 1000
//! workers' wall time with traces off and on, exported to a receiver on loopback (which
//! answers every batch at once), and their ratios. Traces start once per process, so each
//! mode runs in a process of its own; the two take their steps in turn (a turn, a run of
//! workers), so that both see the same machine; then again with the places swapped, so
//! that whatever favours one place cancels out. `-- telemetry-same` runs two processes
//! with traces off the same way: what the method itself reads as a difference.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::agent::{Event, Runtime};
use capstan_host::app::AgentBuilder;
use capstan_host::config::Config;
use capstan_host::llm::{Script, ScriptedProvider};
use capstan_host::plugin::ArtifactCache;
use capstan_host::services::WorkerState;
use criterion::Criterion;
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

const TEXT_ONLY: &str = r#"
[[step]]
process = "channel"
reply = "ok"
repeat = true
"#;

#[path = "support/percentiles.rs"]
mod percentiles;
#[path = "support/scripts.rs"]
mod scripts;

use percentiles::p50_p99;
use scripts::ONE_TOOL;

/// A runtime in `dir` playing `script`, with the channel also offered `file_read`.
fn start(
    tokio: &Tokio,
    dir: &Path,
    script: &str,
    workers: u32,
) -> (Arc<Runtime>, mpsc::UnboundedReceiver<Event>) {
    let toml = format!(
        "[limits]\nmax_workers_per_channel = {workers}\nmax_turns = 4\ncontext_window_tokens = 100000000\nmax_open_conversations = 1000000\n\
         [profiles.channel]\ntools = [\"reply\", \"spawn_worker\", \"file_read\"]\ncapabilities = [\"fs.read\"]\n"
    );
    let config = Config::parse(&toml, &dir.join("capstan.toml")).unwrap();
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    std::fs::write(config.agent.workspace.join("data.txt"), "bench data\n").unwrap();
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins");
    assert!(
        plugins.join("files.wasm").is_file(),
        "run `bash scripts/setup` first"
    );
    let provider = ScriptedProvider::new(Script::parse(script, "bench").unwrap(), "bench");
    let agent = tokio
        .block_on(
            AgentBuilder::new(config)
                // Compiled once for every agent of every run: compiling is not measured.
                .cache(ArtifactCache::new(plugins.join("../bench-component-cache")))
                .plugins_dir(plugins)
                .provider(Arc::new(provider))
                .build(),
        )
        .expect("the agent starts");
    (agent.runtime, agent.events)
}

/// The two turns the benchmark compares.
const TURNS: [(&str, &str, &str); 2] = [
    ("no_tool", TEXT_ONLY, "hello"),
    ("one_wasm_tool", ONE_TOOL, "read it"),
];

/// One agent playing one of [`TURNS`], and how many turns it has taken.
struct TurnAgent {
    rt: Arc<Runtime>,
    events: mpsc::UnboundedReceiver<Event>,
    message: &'static str,
    turns: u64,
    _dir: tempfile::TempDir,
}

impl TurnAgent {
    fn new(tokio: &Tokio, (_, script, message): (&str, &str, &'static str)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (rt, events) = start(tokio, dir.path(), script, 4);
        TurnAgent {
            rt,
            events,
            message,
            turns: 0,
            _dir: dir,
        }
    }

    /// One user message, until its channel is idle. Ten messages per channel, then a new
    /// one: conversations of a realistic length (up to 20 messages of history), so the
    /// figure does not grow with the run.
    fn turn(&mut self, tokio: &Tokio) {
        self.turns += 1;
        let channel = format!("c{}", self.turns / 10);
        tokio.block_on(async {
            self.rt
                .send_user_message(&channel, self.message)
                .await
                .unwrap();
            self.rt.wait_idle(&channel).await;
        });
        while self.events.try_recv().is_ok() {}
    }
}

fn bench_turns(c: &mut Criterion, tokio: &Tokio) {
    let mut group = c.benchmark_group("agent_turn");
    for turn in TURNS {
        let name = turn.0;
        let mut agent = TurnAgent::new(tokio, turn);
        group.bench_function(name, |b| b.iter(|| agent.turn(tokio)));
        agent.check_and_stop(tokio);
    }
    group.finish();
}

impl TurnAgent {
    /// Checks that the turns taken were stored, then stops the agent.
    fn check_and_stop(self, tokio: &Tokio) {
        // Unless a filter left this benchmark out.
        if self.turns >= 20 {
            let history = tokio.block_on(
                self.rt
                    .services()
                    .history
                    .load(&capstan_host::ids::ProcessId::channel("c1").session()),
            );
            let stored = history.unwrap().len();
            assert!(stored >= 20, "every turn was stored: {stored}");
        }
        self.rt.shutdown();
    }
}

/// Both turns, interleaved one for one on two agents, so that both see the same machine:
/// p50 and p99 of each and their ratio.
fn turn_percentiles(tokio: &Tokio) {
    const ROUNDS: usize = 5000;
    let mut agents = TURNS.map(|turn| TurnAgent::new(tokio, turn));
    let mut times: [Vec<Duration>; 2] = std::array::from_fn(|_| Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        for (agent, times) in agents.iter_mut().zip(&mut times) {
            let started = Instant::now();
            agent.turn(tokio);
            times.push(started.elapsed());
        }
    }
    let [text, tool] = times.each_mut().map(|t| p50_p99(t));
    println!("\nagent turn, {ROUNDS} interleaved rounds (us)");
    println!("        no_tool  p50 {:8.1}  p99 {:8.1}", text.0, text.1);
    println!("  one_wasm_tool  p50 {:8.1}  p99 {:8.1}", tool.0, tool.1);
    println!(
        "          ratio  p50 {:7.2}x  p99 {:7.2}x",
        tool.0 / text.0,
        tool.1 / text.1
    );
    for agent in agents {
        agent.check_and_stop(tokio);
    }
}

/// Peak resident set size of this process so far, from /proc.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Spawns `n` workers making ten calls each; their wall time.
fn concurrent_workers(tokio: &Tokio, n: u32) -> Duration {
    const CALLS: usize = 10;
    let reads: Vec<String> = (0..CALLS)
        .map(|_| r#"{ name = "file_read", arguments = { path = "data.txt" } }"#.to_owned())
        .collect();
    let spawns: Vec<String> = (0..n)
        .map(|i| {
            format!(r#"{{ name = "spawn_worker", arguments = {{ task = "bench task {i}" }} }}"#)
        })
        .collect();
    let script = format!(
        "[[step]]\nprocess = \"channel\"\nwhen = \"go\"\ntool_calls = [{spawns}, {{ name = \"reply\", arguments = {{ text = \"started\" }} }}]\n\n\
         [[step]]\nprocess = \"worker\"\nwhen = \"bench task\"\nrepeat = true\ntool_calls = [{reads}]\n\n\
         [[step]]\nprocess = \"worker\"\nwhen = \"bench data\"\nrepeat = true\ntool_calls = [{{ name = \"set_status\", arguments = {{ state = \"done\", message = \"ok\" }} }}]\n\n\
         [[step]]\nprocess = \"channel\"\nreply = \"noted\"\nrepeat = true\n",
        spawns = spawns.join(", "),
        reads = reads.join(", "),
    );
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut events) = start(tokio, dir.path(), &script, n);
    let drain = tokio.spawn(async move {
        let mut done = 0;
        while let Some(event) = events.recv().await {
            if matches!(
                &event,
                Event::WorkerEnded {
                    state: WorkerState::Done,
                    ..
                }
            ) {
                done += 1;
            }
        }
        done
    });
    let started = Instant::now();
    tokio.block_on(async {
        rt.send_user_message("main", "go").await.unwrap();
        rt.wait_idle("main").await;
    });
    let elapsed = started.elapsed();
    let calls = tokio
        .block_on(rt.services().audit.recent(u32::MAX))
        .unwrap()
        .iter()
        .filter(|a| a.tool == "file_read" && a.outcome == "ok")
        .count();
    rt.shutdown();
    drop(rt);
    let done = tokio.block_on(drain).unwrap();
    assert_eq!(done, n as usize, "every worker finished");
    assert_eq!(calls, n as usize * CALLS, "every call succeeded");
    println!(
        "{n:>5} workers x {CALLS} calls: {:>7.2} s, {:>7.0} tool calls/s, peak RSS {:.0} MiB",
        elapsed.as_secs_f64(),
        calls as f64 / elapsed.as_secs_f64(),
        peak_rss_mib()
    );
    elapsed
}

/// Every batch an OTLP/HTTP receiver took, as it came.
type Taken = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// An OTLP/HTTP receiver on loopback that answers each batch with 200 at once: the URL,
/// and the bodies it has taken (read once the run ends, so as not to weigh on it).
async fn receiver() -> (String, Taken) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let taken = Taken::default();
    let kept = taken.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if stream.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    kept.lock().unwrap().push(body);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if stream.get_mut().write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, taken)
}

/// One mode of `-- telemetry`, measured in a process of its own: traces are started
/// once per process, and a process that never starts them is what "off" means.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Traces {
    Off,
    On,
}

/// The line a measuring process answers each step with: this, then its figure.
const MEASURED: &str = "measured:";

/// A measuring process of `-- telemetry`, driven one step at a time over its standard
/// streams.
struct Measuring {
    child: std::process::Child,
    steps: std::io::BufReader<std::process::ChildStdout>,
}

impl Measuring {
    fn spawn(mode: Traces) -> Self {
        let mode = match mode {
            Traces::Off => "off",
            Traces::On => "on",
        };
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["telemetry-process", mode])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let steps = std::io::BufReader::new(child.stdout.take().unwrap());
        Measuring { child, steps }
    }

    /// Runs `step` (`turn`, `warm`, `workers` or `end`) and returns its figure.
    fn step(&mut self, step: &str) -> f64 {
        use std::io::{BufRead, Write};
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{step}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.steps.read_line(&mut line).unwrap();
            assert!(read > 0, "the measuring process ended during `{step}`");
            if let Some(figure) = line.trim().strip_prefix(MEASURED) {
                return figure.trim().parse().unwrap();
            }
        }
    }
}

/// What one pair of measuring processes gave, each figure by slot.
struct Pair {
    turn_p50: [f64; 2],
    /// Each run of workers' wall time.
    workers: [Vec<f64>; 2],
    cpu: [f64; 2],
    exported: [f64; 2],
}

/// Two processes in `modes` take their steps in turn, one turn (or one run of workers)
/// at a time, the first to go changing each round: both see the same machine, so its
/// drift (a few percent within seconds on a shared host) weighs on both alike.
fn pair(modes: [Traces; 2]) -> Pair {
    const TURNS: usize = 3000;
    const WARM_TURNS: usize = 1000;
    const WORKER_RUNS: usize = 5;
    let mut processes = modes.map(Measuring::spawn);
    let mut rounds = |count: usize, step: &str| -> [Vec<f64>; 2] {
        let mut figures = [Vec::with_capacity(count), Vec::with_capacity(count)];
        for round in 0..count {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for at in order {
                let figure = processes[at].step(step);
                figures[at].push(figure);
            }
        }
        figures
    };
    rounds(WARM_TURNS, "turn");
    rounds(1, "warm");
    let turns = rounds(TURNS, "turn");
    let workers = rounds(WORKER_RUNS, "workers");
    let cpu = processes.each_mut().map(|process| process.step("cpu"));
    let exported = processes.each_mut().map(|process| process.step("end"));
    for mut process in processes {
        assert!(process.child.wait().unwrap().success());
    }
    for (mode, exported) in modes.iter().zip(exported) {
        if *mode == Traces::Off {
            assert_eq!(exported, 0.0, "nothing is exported with traces off");
        }
    }
    Pair {
        turn_p50: turns.each_ref().map(|times| median(times)),
        workers,
        cpu,
        exported,
    }
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (values[(n - 1) / 2] + values[n / 2]) / 2.0
}

/// `-- telemetry`: see the [module](self). A process in mode `b` is measured against one
/// in mode `a` twice, once in the second slot and once in the first: whatever favours one
/// slot (the method's own reading, which `-- telemetry-same` shows) weighs once each way,
/// and the geometric mean of the two ratios is free of it.
fn telemetry_overhead(a: Traces, b: Traces) {
    let runs = [pair([a, b]), pair([b, a])];
    // Slot of `b`, then of `a`, in each run.
    let slots = [(1, 0), (0, 1)];
    let [a_name, b_name] = [a, b].map(|mode| format!("{mode:?}").to_lowercase());
    println!(
        "traces {a_name} vs {b_name}: two processes taking their steps in turn, {b_name} second, then first; \
         {} and {} bytes of spans exported",
        runs[0].exported[1], runs[1].exported[0]
    );
    let percent = |ratio: f64| format!("{:+.1}%", (ratio - 1.0) * 100.0);
    let both = |ratios: [f64; 2]| (ratios[0] * ratios[1]).sqrt();
    // `figures` by run, as [a, b]; `ratios` b over a by run.
    let row = |label: &str, figures: [[f64; 2]; 2], ratios: [f64; 2], unit: &str| {
        println!(
            "  {label:<34} {a_name} -> {b_name}: {:9.3} -> {:9.3} {unit} ({}), {:9.3} -> {:9.3} {unit} ({});  both: {}",
            figures[0][0],
            figures[0][1],
            percent(ratios[0]),
            figures[1][0],
            figures[1][1],
            percent(ratios[1]),
            percent(both(ratios)),
        );
    };
    let by_mode = |figure: &dyn Fn(&Pair) -> [f64; 2]| {
        [0, 1].map(|i| {
            let (b_at, a_at) = slots[i];
            let f = figure(&runs[i]);
            [f[a_at], f[b_at]]
        })
    };
    let ratios = |figures: [[f64; 2]; 2]| figures.map(|[a, b]| b / a);
    let turns = by_mode(&|p| p.turn_p50);
    row(
        "one_wasm_tool turn, p50 of 3000",
        turns,
        ratios(turns),
        "us",
    );
    // Each run of workers against the run beside it, which saw the same machine.
    let paired: [Vec<f64>; 2] = [0, 1].map(|i| {
        let (b_at, a_at) = slots[i];
        let run = &runs[i];
        run.workers[a_at]
            .iter()
            .zip(&run.workers[b_at])
            .map(|(a, b)| b / a)
            .collect()
    });
    row(
        "1000 workers x 10, median of 5 pairs",
        by_mode(&|p| p.workers.each_ref().map(|walls| median(walls))),
        paired.each_ref().map(|ratios| median(ratios)),
        "s",
    );
    let cpu = by_mode(&|p| p.cpu);
    row("CPU time of the whole process", cpu, ratios(cpu), "s");
    let spread: Vec<String> = paired.iter().flatten().map(|r| percent(*r)).collect();
    println!("  workers, run by run: {}", spread.join(" "));
}

/// One process of `-- telemetry`, with traces `mode`: reads steps from its standard
/// input and answers each with [`MEASURED`] and its figure. `turn`: one one-tool turn
/// (microseconds); `warm`: 100 workers; `workers`: 1000 workers and every span of theirs
/// sent (seconds); `end`: traces stopped, and the bytes of spans the receiver took, once
/// it is checked that every `file_read` call's span reached it.
fn telemetry_process(tokio: &Tokio, mode: Traces) {
    let taken = (mode == Traces::On).then(|| {
        let (url, taken) = tokio.block_on(receiver());
        let settings = capstan_host::telemetry::TraceSettings {
            otlp_endpoint: Some(url),
            content: false,
            service_name: "bench".into(),
        };
        let started = tokio.block_on(async { capstan_host::telemetry::start_traces(&settings) });
        assert!(started.unwrap(), "traces are on");
        taken
    });
    let mut agent = TurnAgent::new(tokio, TURNS[1]);
    let mut calls = 0;
    for step in std::io::stdin().lines() {
        let figure = match step.unwrap().trim() {
            "turn" => {
                let started = Instant::now();
                agent.turn(tokio);
                calls += 1;
                started.elapsed().as_secs_f64() * 1e6
            }
            step @ ("warm" | "workers") => {
                let n = if step == "warm" { 100 } else { 1000 };
                let started = Instant::now();
                concurrent_workers(tokio, n);
                capstan_host::telemetry::flush_traces();
                calls += n as usize * 10;
                started.elapsed().as_secs_f64()
            }
            // The CPU time this process has used so far, in seconds.
            "cpu" => {
                // utime and stime, in clock ticks of 10 ms, after the command's name.
                let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
                let fields: Vec<f64> = stat[stat.rfind(')').unwrap() + 2..]
                    .split(' ')
                    .skip(11)
                    .take(2)
                    .map(|field| field.parse().unwrap())
                    .collect();
                (fields[0] + fields[1]) / 100.0
            }
            "end" => {
                agent.check_and_stop(tokio);
                capstan_host::telemetry::shutdown_traces();
                let bodies = taken.as_ref().map(|taken| taken.lock().unwrap());
                let bodies = bodies.as_deref().map_or(&[][..], Vec::as_slice);
                // Every call's span arrived: none was dropped from a full queue.
                let name = b"execute_tool file_read";
                let spans: usize = bodies
                    .iter()
                    .map(|body| body.windows(name.len()).filter(|w| w == name).count())
                    .sum();
                if mode == Traces::On {
                    assert_eq!(
                        spans, calls,
                        "one span per file_read call reached the receiver"
                    );
                }
                println!("{MEASURED} {}", bodies.iter().map(Vec::len).sum::<usize>());
                return;
            }
            other => panic!("no such step: {other}"),
        };
        println!("{MEASURED} {figure}");
    }
}

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|arg| arg == "telemetry-process") {
        let mode = match args.get(at + 1).map(String::as_str) {
            Some("on") => Traces::On,
            _ => Traces::Off,
        };
        telemetry_process(&tokio, mode);
        return;
    }
    if args.iter().any(|arg| arg == "telemetry-same") {
        telemetry_overhead(Traces::Off, Traces::Off);
        return;
    }
    if args.iter().any(|arg| arg == "telemetry") {
        telemetry_overhead(Traces::Off, Traces::On);
        return;
    }
    // First, so the peak RSS they print is theirs, not the turn benchmark's.
    println!(
        "concurrent workers (multi-thread runtime, {} threads)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for n in [100, 1000] {
        concurrent_workers(&tokio, n);
    }
    println!();
    let mut c = Criterion::default().configure_from_args();
    bench_turns(&mut c, &tokio);
    c.final_summary();
    turn_percentiles(&tokio);
}
