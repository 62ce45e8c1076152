//! Durations written the way Go writes them (`45m`, `1h30m`, `1.5s`), since
//! that is the syntax operators of the platform this re-creates already use
//! for stall budgets, and the way messages print them back.

use std::time::Duration;

/// A parsed duration: its sign and magnitude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Signed {
    pub(crate) negative: bool,
    pub(crate) magnitude: Duration,
}

/// Parses `[-+]?(\d*(\.\d*)?unit)+` with units ns, us, µs, ms, s, m, h, or a
/// bare `0`, as Go's `time.ParseDuration` does: the same syntax and the same
/// range (a magnitude of at most 2^63-1 ns, 2^63 ns when negative). A
/// fraction is truncated to whole nanoseconds exactly where Go computes it in
/// `float64`, so the two can differ by a nanosecond per fractional
/// component. `None` when the text is not a duration at all.
pub(crate) fn parse(text: &str) -> Option<Signed> {
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Some(Signed {
            negative,
            magnitude: Duration::ZERO,
        });
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.bytes().take_while(u8::is_ascii_digit).count();
                a.split_at(n)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return None;
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(after.len(), |(i, _)| i);
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().ok()?
        };
        // The fraction as one numerator over a power of ten, scaled and
        // truncated once: dividing the unit by ten per digit would drop the
        // remainder of every step (a digit of an hour's 13th decimal place
        // was worth 3 ns instead of 3.6). Digits past the 25th cannot move
        // the result by a nanosecond and are read but not counted, as Go
        // stops counting them once its accumulator would overflow.
        let (mut numerator, mut denominator) = (0u128, 1u128);
        for digit in frac_part.bytes().take(25) {
            numerator = numerator * 10 + u128::from(digit - b'0');
            denominator *= 10;
        }
        let nanos = whole
            .checked_mul(scale)?
            .checked_add(numerator * scale / denominator)?;
        total = total.checked_add(nanos)?;
        rest = after;
    }
    // Go's Duration is an int64 of nanoseconds: it refuses a magnitude past
    // that (about 292 years), where -2^63 ns is the one negative extra.
    let limit = if negative {
        1u128 << 63
    } else {
        (1u128 << 63) - 1
    };
    if total > limit {
        return None;
    }
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    let sub = u32::try_from(total % 1_000_000_000).ok()?;
    Some(Signed {
        negative,
        magnitude: Duration::new(secs, sub),
    })
}

/// Formats like Go's `time.Duration.String`: `41m0s`, `1h0m0s`, `1.5s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}\u{b5}s", decimal(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", decimal(nanos, 1_000_000));
    }
    let total_secs = d.as_secs();
    let (h, m) = (total_secs / 3600, (total_secs % 3600) / 60);
    let s = decimal(
        u128::from(total_secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos()),
        1_000_000_000,
    );
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// `value / unit` with its fraction, trailing zeros dropped.
fn decimal(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn parses_go_durations() {
        let ok = |t: &str, neg: bool, d: Duration| {
            assert_eq!(
                parse(t),
                Some(Signed {
                    negative: neg,
                    magnitude: d
                }),
                "{t}"
            );
        };
        ok("30m", false, secs(1800));
        ok("1h30m", false, secs(5400));
        ok("+90s", false, secs(90));
        ok("-30m", true, secs(1800));
        ok("0", false, Duration::ZERO);
        ok("-0", true, Duration::ZERO);
        ok("1.5h", false, secs(5400));
        ok(".5s", false, Duration::from_millis(500));
        ok("1.s", false, secs(1));
        ok("250ms", false, Duration::from_millis(250));
        ok("3us", false, Duration::from_micros(3));
        ok("3\u{b5}s", false, Duration::from_micros(3));
        ok("3\u{3bc}s", false, Duration::from_micros(3));
        ok("7ns", false, Duration::from_nanos(7));
        ok("1h1m1s1ms", false, Duration::from_millis(3_661_001));
        // Go gives 9 ns (25 * 0.36) and 25 ns (7 * 3.6); the fraction used
        // to lose the remainder of dividing the unit by ten at every digit
        // and gave 6 ns and 21 ns (found porting Go's algorithm for the
        // duration fuzz target).
        ok("0.0000000000025h", false, Duration::from_nanos(9));
        ok("0.000000000007h", false, Duration::from_nanos(25));
        // Go's range: 2^63-1 ns, and 2^63 ns when negative.
        ok(
            "9223372036854775807ns",
            false,
            Duration::from_nanos(i64::MAX as u64),
        );
        ok(
            "-9223372036854775808ns",
            true,
            Duration::from_nanos(1 << 63),
        );
        ok(
            "2562047h47m16.854775807s",
            false,
            Duration::from_nanos(i64::MAX as u64),
        );
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for t in [
            "",
            "-",
            "+",
            "30",
            "30mm",
            "m",
            "1x",
            ".s",
            "1h 30m",
            " 30m",
            "30m ",
            "--30m",
            "1e3s",
            "99999999999999999999999h",
            // Past Go's int64 nanoseconds.
            "2562048h",
            "9223372036854775808ns",
        ] {
            assert_eq!(parse(t), None, "{t:?}");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(secs(41 * 60)), "41m0s");
        assert_eq!(format_duration(secs(3600)), "1h0m0s");
        assert_eq!(format_duration(secs(5400)), "1h30m0s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_micros(3)), "3\u{b5}s");
        assert_eq!(format_duration(Duration::from_nanos(7)), "7ns");
        assert_eq!(format_duration(secs(45)), "45s");
    }

    #[test]
    fn format_then_parse_round_trips() {
        for d in [
            secs(1),
            secs(61),
            secs(3601),
            Duration::from_millis(1234),
            Duration::from_nanos(1_000_000_001),
        ] {
            let parsed = parse(&format_duration(d)).expect("parses");
            assert_eq!(parsed.magnitude, d);
        }
    }
}
