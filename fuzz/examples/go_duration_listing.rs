//! Prints the Go-duration port's answer for every file in a directory, one
//! line each (`<hex>\t<nanoseconds or error>`), to compare with what Go's
//! own `time.ParseDuration` answers for the same files (docs/reliability.md):
//!
//!     cargo +nightly run --manifest-path fuzz/Cargo.toml --example go_duration_listing -- DIR

use agentplane_fuzz::go_parse_duration;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: go_duration_listing DIR");
        std::process::exit(2);
    };
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.sort();
    for p in paths {
        let bytes = std::fs::read(&p)?;
        let Ok(s) = std::str::from_utf8(&bytes) else {
            continue;
        };
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        match go_parse_duration(s) {
            Some(d) if d.negative && d.nanos != 0 => println!("{hex}\t-{}", d.nanos),
            Some(d) => println!("{hex}\t{}", d.nanos),
            None => println!("{hex}\terror"),
        }
    }
    Ok(())
}
