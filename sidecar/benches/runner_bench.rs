//! Runner figures over the real socket: per-tool latency (median, p99) for
//! small inputs, calls per second at concurrency 1 and 16, idle RSS and the
//! binary's size. A program that prints numbers, not a test: nothing here
//! asserts a time.
//!
//!     cargo bench -p sidecar --bench runner_bench
//!
//! `SIDECAR_BIN=/path/to/agent-sidecar` benchmarks another build of the
//! binary (e.g. the static one from build-static.sh); `BENCH_ITERS` sets the
//! iterations per tool (default 1000, bash 300); `BENCH_DIR` where the
//! workdir lives (default the system temp dir).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runner_api::{Client, Target};
use serde_json::json;

struct Server {
    child: Child,
    _dir: tempfile::TempDir,
    socket: PathBuf,
    work: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin() -> PathBuf {
    std::env::var_os("SIDECAR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_agent-sidecar")))
}

async fn start(extra: &[&str]) -> Result<Server, Box<dyn std::error::Error>> {
    // BENCH_DIR=/dev/shm separates the runner's cost from the disk's: on
    // ext4, renaming over an existing file starts writeback (auto_da_alloc).
    let dir = match std::env::var_os("BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("src"))?;
    let socket = dir.path().join("runner.sock");
    let child = Command::new(bin())
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .arg("--workdir")
        .arg(&work)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--spill-dir")
        .arg(dir.path().join("spill"))
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()?;
    let server = Server {
        child,
        _dir: dir,
        socket,
        work,
    };
    for _ in 0..400 {
        if let Ok(mut c) = Client::connect(&Target::Unix(server.socket.clone())).await
            && c.health().await.unwrap_or(false)
        {
            return Ok(server);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err("runner did not become healthy".into())
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `bash` with a shell parked ahead of each call, next to a runner that
/// starts every call's shell when the call arrives, and to a bare
/// `bash -c true` spawned from this process: interleaved call by call, so
/// the machine's load falls on all three alike.
async fn bash_side_by_side(
    parked: &mut Client,
    count: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let cold_server = start(&["--no-parked-shell"]).await?;
    let mut cold = Client::connect(&Target::Unix(cold_server.socket.clone())).await?;
    let input = json!({"command": "echo hi"}).to_string();
    let (mut a, mut b, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..count + 10 {
        let t = Instant::now();
        parked.run(&format!("p{i}"), "bash", &input, false).await?;
        let pa = t.elapsed();
        let t = Instant::now();
        cold.run(&format!("q{i}"), "bash", &input, false).await?;
        let pb = t.elapsed();
        let t = Instant::now();
        let st = tokio::process::Command::new("/bin/bash")
            .args(["--noprofile", "--norc", "-c", "true"])
            .status()
            .await?;
        let pc = t.elapsed();
        if !st.success() {
            return Err("bash -c true failed".into());
        }
        if i >= 10 {
            a.push(pa);
            b.push(pb);
            bare.push(pc);
        }
    }
    for v in [&mut a, &mut b, &mut bare] {
        v.sort();
    }
    println!("bash `echo hi`, interleaved, n={count}:");
    println!(
        "  parked shell          p50 {:>9}  p99 {:>9}",
        us(pct(&a, 0.5)),
        us(pct(&a, 0.99))
    );
    println!(
        "  shell per call        p50 {:>9}  p99 {:>9}",
        us(pct(&b, 0.5)),
        us(pct(&b, 0.99))
    );
    println!(
        "  bare `bash -c true`   p50 {:>9}  p99 {:>9}",
        us(pct(&bare, 0.5)),
        us(pct(&bare, 0.99))
    );
    println!(
        "  parked / per call {:.2}, parked / bare spawn {:.2}",
        pct(&a, 0.5).as_secs_f64() / pct(&b, 0.5).as_secs_f64(),
        pct(&a, 0.5).as_secs_f64() / pct(&bare, 0.5).as_secs_f64()
    );
    Ok(())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let server = start(&[]).await?;
    let pid = server.child.id();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle_start = rss_kib(pid, "VmRSS");

    std::fs::write(server.work.join("small.txt"), "hello\nworld\n")?;
    std::fs::write(server.work.join("src/lib.rs"), "fn main() {}\n")?;
    let target = Target::Unix(server.socket.clone());
    let mut client = Client::connect(&target).await?;
    let cases: Vec<(&str, &str, serde_json::Value, usize)> = vec![
        ("read", "read", json!({"file_path": "small.txt"}), iters),
        (
            "write",
            "write",
            json!({"file_path": "out.txt", "content": "hello\n"}),
            iters,
        ),
        (
            "edit",
            "edit",
            json!({"file_path": "small.txt", "old_string": "o", "new_string": "o", "replace_all": true}),
            iters,
        ),
        ("glob", "glob", json!({"pattern": "**/*.rs"}), iters),
        (
            "grep",
            "grep",
            json!({"pattern": "hello", "path": "small.txt"}),
            iters.div_ceil(3),
        ),
        (
            "bash true",
            "bash",
            json!({"command": "true"}),
            iters.div_ceil(3),
        ),
    ];
    println!("binary: {}", bin().display());
    println!("workdir: {}", server.work.display());
    println!(
        "binary size: {:.1} MiB",
        std::fs::metadata(bin())?.len() as f64 / (1 << 20) as f64
    );
    println!("{:<10} {:>6} {:>10} {:>10}", "tool", "n", "p50", "p99");
    // The floors: the transport alone (health), then a Run that the gate
    // answers without running a tool; each tool row less the second is the
    // tool's own share.
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        client.health().await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "{:<10} {iters:>6} {:>10} {:>10}",
        "health",
        us(pct(&lat, 0.5)),
        us(pct(&lat, 0.99))
    );
    let mut lat = Vec::with_capacity(iters);
    for i in 0..iters {
        let t = Instant::now();
        client
            .run(&format!("u{i}"), "no_such_tool", "{}", false)
            .await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "{:<10} {iters:>6} {:>10} {:>10}",
        "run, gate",
        us(pct(&lat, 0.5)),
        us(pct(&lat, 0.99))
    );
    let mut n = 0u64;
    for (label, tool, input, count) in &cases {
        let input = input.to_string();
        // Warm-up: first-call costs (grep's PCRE probe, page cache) excluded.
        for _ in 0..10 {
            n += 1;
            client.run(&format!("w{n}"), tool, &input, false).await?;
        }
        let mut lat = Vec::with_capacity(*count);
        for _ in 0..*count {
            n += 1;
            let id = format!("b{n}");
            let t = Instant::now();
            let r = client.run(&id, tool, &input, false).await?;
            lat.push(t.elapsed());
            if r.is_error {
                return Err(format!("{label} failed: {}", r.content).into());
            }
        }
        lat.sort();
        println!(
            "{label:<10} {count:>6} {:>10} {:>10}",
            us(pct(&lat, 0.5)),
            us(pct(&lat, 0.99))
        );
    }

    for (label, tool, input) in [
        (
            "read",
            "read",
            json!({"file_path": "small.txt"}).to_string(),
        ),
        ("bash true", "bash", json!({"command": "true"}).to_string()),
    ] {
        for conc in [1usize, 16] {
            let total = if tool == "bash" { 600 } else { 4000 };
            let per = total / conc;
            let t = Instant::now();
            let mut tasks = Vec::new();
            for w in 0..conc {
                let mut c = Client::connect(&target).await?;
                let input = input.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..per {
                        let id = format!("c{conc}-{w}-{i}");
                        c.run(&id, tool, &input, false).await?;
                    }
                    Ok::<_, runner_api::Error>(())
                }));
            }
            for task in tasks {
                task.await??;
            }
            let rate = (per * conc) as f64 / t.elapsed().as_secs_f64();
            println!("{label:<10} concurrency {conc:>2}: {rate:>8.0} calls/s");
        }
    }
    bash_side_by_side(&mut client, iters.div_ceil(3)).await?;
    drop(client);
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "idle RSS: {:.1} MiB at start, {:.1} MiB after the run (peak {:.1} MiB)",
        idle_start as f64 / 1024.0,
        rss_kib(pid, "VmRSS") as f64 / 1024.0,
        rss_kib(pid, "VmHWM") as f64 / 1024.0
    );
    Ok(())
}
