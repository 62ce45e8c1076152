//! The Go-duration parser (Go `time.ParseDuration`, used by
//! `ParseStallTimeout`): `toolset::fuzzing::parse_duration`,
//! `format_duration` and `parse_stall_timeout`.
//!
//! Invariants: no panic; it accepts exactly what Go accepts (a port of Go's
//! algorithm is the oracle, checked against Go 1.26.8) with the same sign
//! and the same value, up to one nanosecond per fractional component, where
//! Go rounds through float64 -- except where Go's uint64 sum wraps around
//! (`9223372036854775808ns9223372036854775808ns` is 0s in Go), which is
//! refused here;
//! every accepted value round-trips through `format_duration` (Go's
//! `Duration.String`) exactly, in both parsers; a stall budget is refused
//! with a message naming its variable, and an accepted one is the parsed
//! value and clears the floor.
#![no_main]

use std::time::Duration;

use agentplane_fuzz::{GoDuration, go_parse_duration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ours = toolset::fuzzing::parse_duration(text);
    let go = go_parse_duration(text);
    match (ours, go) {
        (None, None) => {}
        // Go's sum wrapped to a small value it then accepts; refusing is right.
        (None, Some(g)) if g.wrapped => {}
        (Some((_, d)), Some(g)) if g.wrapped => {
            panic!("{text:?}: Go's sum wrapped, yet accepted here as {d:?}")
        }
        (
            Some((neg, d)),
            Some(GoDuration {
                negative: gneg,
                nanos: gnanos,
                fractions,
                ..
            }),
        ) => {
            let nanos = d.as_nanos();
            let diff = nanos.abs_diff(u128::from(gnanos));
            assert!(
                diff <= u128::from(fractions),
                "{text:?}: {nanos} ns here, {gnanos} ns in Go"
            );
            if gnanos != 0 || nanos != 0 {
                assert_eq!(neg, gneg, "{text:?}: sign");
            }
        }
        (Some((_, d)), None) => {
            // Only where Go's float64 fraction lands a nanosecond lower, under
            // the int64 limit.
            assert!(
                d.as_nanos() >= (1u128 << 63) - 64,
                "{text:?}: accepted here ({d:?}), refused by Go"
            );
        }
        (None, Some(GoDuration { nanos: gnanos, .. })) => {
            assert!(
                u128::from(gnanos) >= (1u128 << 63) - 64,
                "{text:?}: refused here, {gnanos} ns in Go"
            );
        }
    }
    if let Some((neg, d)) = ours {
        // Go's String() of a negative duration is "-" and the magnitude's.
        let neg = neg && !d.is_zero();
        let shown = format!(
            "{}{}",
            if neg { "-" } else { "" },
            toolset::format_duration(d)
        );
        assert_eq!(
            toolset::fuzzing::parse_duration(&shown),
            Some((neg, d)),
            "{text:?} -> {shown:?} does not parse back"
        );
        // Go reads what Duration.String wrote, exactly, when it is in range.
        if let Some(g) = go_parse_duration(&shown) {
            assert_eq!(u128::from(g.nanos), d.as_nanos(), "{shown:?} in Go");
        }
    }
    let longest = Duration::from_secs(u64::from(data.first().copied().unwrap_or(0)) * 60);
    match toolset::parse_stall_timeout("STALL", text, longest) {
        Ok(d) => {
            assert!(d >= toolset::stall_floor(longest));
            if !text.is_empty() {
                assert_eq!(ours, Some((false, d)));
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("STALL="), "names no variable: {msg:?}");
        }
    }
});
