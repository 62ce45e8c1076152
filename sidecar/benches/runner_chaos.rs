//! Reliability figures for the runner as a process over its socket. A
//! program that prints figures, not a test (its checks abort with the
//! evidence when a promise is broken):
//!
//! 1. kill -9 in the middle of writes and edits, `CHAOS_KILLS` times
//!    (default 1000): the target file is afterwards exactly the old or the
//!    new content, never torn or empty, and a restarted runner serves again.
//! 2. `LOAD_CONCURRENCY` (default 64) clients calling read, write, edit,
//!    glob, grep and bash in a mix for `LOAD_SECONDS` (default 60): calls,
//!    failures, p50/p99, the runner's peak RSS.
//!
//!     cargo bench -p sidecar --bench runner_chaos
//!
//! `SIDECAR_BIN` picks another build; `BENCH_DIR` where the workdir lives.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runner_api::{Client, Target};
use serde_json::json;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn bin() -> PathBuf {
    std::env::var_os("SIDECAR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_agent-sidecar")))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// xorshift64*: enough randomness for kill timings, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The runner's directories, kept across restarts (as in a pod).
struct Dirs {
    _root: tempfile::TempDir,
    socket: PathBuf,
    work: PathBuf,
    state: PathBuf,
    spill: PathBuf,
}

impl Dirs {
    fn new() -> Res<Self> {
        let root = match std::env::var_os("BENCH_DIR") {
            Some(d) => tempfile::tempdir_in(d)?,
            None => tempfile::tempdir()?,
        };
        let work = root.path().join("work");
        std::fs::create_dir_all(&work)?;
        Ok(Self {
            socket: root.path().join("runner.sock"),
            state: root.path().join("state"),
            spill: root.path().join("spill"),
            work,
            _root: root,
        })
    }
}

struct Runner(Child);

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start(d: &Dirs) -> Res<(Runner, Client)> {
    let _ = std::fs::remove_file(&d.socket);
    let child = Command::new(bin())
        .arg("serve")
        .arg("--socket")
        .arg(&d.socket)
        .arg("--workdir")
        .arg(&d.work)
        .arg("--state-dir")
        .arg(&d.state)
        .arg("--spill-dir")
        .arg(&d.spill)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?;
    let runner = Runner(child);
    for _ in 0..800 {
        if let Ok(mut c) = Client::connect(&Target::Unix(d.socket.clone())).await
            && c.health().await.unwrap_or(false)
        {
            return Ok((runner, c));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err("the runner did not become healthy".into())
}

/// Version `v` of the target file: 512 KiB whose every line names `v`, so
/// a mix of two versions or a cut is visible.
fn version(v: u64) -> String {
    let line = format!("version {v:08} ----------------------------------------------\n");
    line.repeat((512 << 10) / line.len())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn kills(n: u64, rng: &mut Rng) -> Res<()> {
    let d = Dirs::new()?;
    let target = d.work.join("target.txt");
    let mut current = 0u64;
    std::fs::write(&target, version(current))?;
    let (mut old_seen, mut new_seen, mut restarts) = (0u64, 0u64, Duration::ZERO);
    let started = Instant::now();
    for i in 0..n {
        let (runner, mut client) = start(&d).await?;
        let next = current + 1;
        let (tool, input) = if i % 2 == 0 {
            (
                "write",
                json!({"file_path": "target.txt", "content": version(next)}),
            )
        } else {
            // Every line changes: an edit of the whole version marker.
            (
                "edit",
                json!({"file_path": "target.txt", "old_string": format!("version {current:08}"),
                       "new_string": format!("version {next:08}"), "replace_all": true}),
            )
        };
        let input = input.to_string();
        let call =
            tokio::spawn(async move { client.run(&format!("c{i}"), tool, &input, true).await });
        // Kill at a random point of a call that takes a few milliseconds.
        tokio::time::sleep(Duration::from_micros(rng.below(6_000))).await;
        let mut runner = runner;
        let _ = runner.0.kill(); // SIGKILL
        let _ = runner.0.wait();
        let _ = call.await;
        let got = std::fs::read_to_string(&target)?;
        if got == version(current) {
            old_seen += 1;
        } else if got == version(next) {
            new_seen += 1;
            current = next;
        } else {
            let kept = d.work.join(format!("torn-{i}.txt"));
            std::fs::write(&kept, &got)?;
            return Err(format!(
                "kill {i}: {} is neither version {current} nor {next} ({} bytes; kept at {})",
                target.display(),
                got.len(),
                kept.display()
            )
            .into());
        }
        // The restarted runner serves the file it left.
        let t = Instant::now();
        let (_runner, mut client) = start(&d).await?;
        restarts += t.elapsed();
        let read = client
            .run(
                &format!("r{i}"),
                "read",
                &json!({"file_path": "target.txt", "view_range": [1, 1]}).to_string(),
                false,
            )
            .await?;
        if read.is_error || !read.content.contains(&format!("version {current:08}")) {
            return Err(format!("kill {i}: the restarted runner read {:?}", read.content).into());
        }
    }
    let leftovers = count_files(&d.work)?.saturating_sub(1);
    println!(
        "kill -9 during write/edit: {n} kills in {:.1} s; file afterwards old {old_seen}, new {new_seen}, torn or empty 0; restarted runner served every time (mean restart to healthy {:.1} ms); stray files left in the workdir: {leftovers}",
        started.elapsed().as_secs_f64(),
        restarts.as_secs_f64() * 1000.0 / n.max(1) as f64
    );
    Ok(())
}

fn count_files(dir: &Path) -> Res<usize> {
    Ok(std::fs::read_dir(dir)?.count())
}

async fn load(concurrency: u64, seconds: u64) -> Res<()> {
    let d = Dirs::new()?;
    for i in 0..concurrency {
        std::fs::write(d.work.join(format!("f{i}.txt")), "alpha\nbeta\ngamma\n")?;
    }
    let (runner, _) = start(&d).await?;
    let pid = runner.0.id();
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let socket = d.socket.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(&Target::Unix(socket)).await?;
            let (mut lat, mut failed, mut n) = (Vec::new(), 0u64, 0u64);
            let file = format!("f{w}.txt");
            while Instant::now() < end {
                let (tool, input) = match n % 6 {
                    0 => ("read", json!({"file_path": file})),
                    1 => (
                        "write",
                        json!({"file_path": file, "content": "alpha\nbeta\ngamma\n"}),
                    ),
                    2 => (
                        "edit",
                        json!({"file_path": file, "old_string": "beta", "new_string": "beta"}),
                    ),
                    3 => ("glob", json!({"pattern": "*.txt"})),
                    4 => ("grep", json!({"pattern": "gamma", "path": file})),
                    _ => ("bash", json!({"command": "echo hi"})),
                };
                let t = Instant::now();
                let r = client
                    .run(&format!("w{w}-{n}"), tool, &input.to_string(), true)
                    .await;
                lat.push(t.elapsed());
                match r {
                    Ok(res) if !res.is_error => {}
                    _ => failed += 1,
                }
                n += 1;
            }
            Ok::<_, runner_api::Error>((lat, failed))
        }));
    }
    let mut all = Vec::new();
    let mut failed = 0;
    for t in tasks {
        let (lat, f) = t.await??;
        all.extend(lat);
        failed += f;
    }
    all.sort();
    println!(
        "{concurrency} concurrent clients, mixed read/write/edit/glob/grep/bash for {seconds} s: {} calls ({:.0}/s), {failed} failed, p50 {:.2} ms, p99 {:.2} ms, runner peak RSS {:.1} MiB",
        all.len(),
        all.len() as f64 / seconds as f64,
        pct(&all, 0.5).as_secs_f64() * 1000.0,
        pct(&all, 0.99).as_secs_f64() * 1000.0,
        peak_rss_kib(pid) as f64 / 1024.0
    );
    if failed > 0 {
        return Err(format!("{failed} calls failed under load").into());
    }
    Ok(())
}

fn main() -> Res<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64
            | 1;
        let mut rng = Rng(seed);
        println!("binary: {}", bin().display());
        kills(env_u64("CHAOS_KILLS", 1000), &mut rng).await?;
        load(env_u64("LOAD_CONCURRENCY", 64), env_u64("LOAD_SECONDS", 60)).await?;
        Ok(())
    })
}
