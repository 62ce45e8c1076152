//! Stall budgets: the floor, the default check and the environment parse.

use std::time::Duration;

use toolset::{
    DEFAULT_STALL_BUDGET, DEFAULT_TIMEOUT, MAX_OUTPUT_BYTES, MAX_TIMEOUT, METRIC_TOOL_DURATION,
    check_stall_default, parse_stall_timeout, stall_floor,
};

const MIN: Duration = Duration::from_secs(60);

#[test]
fn constants_are_the_seeds() {
    assert_eq!(MAX_OUTPUT_BYTES, 100 * 1024);
    assert_eq!(DEFAULT_TIMEOUT, 2 * MIN);
    assert_eq!(MAX_TIMEOUT, 10 * MIN);
    assert_eq!(DEFAULT_STALL_BUDGET, 3 * MAX_TIMEOUT);
    assert_eq!(METRIC_TOOL_DURATION, "tool.execution.duration");
    assert_eq!(
        toolset::DEFAULT_AGENT_TOOLSET_POLICY.as_str(),
        "always_allow"
    );
    assert_eq!(toolset::DEFAULT_MCP_TOOLSET_POLICY.as_str(), "always_ask");
}

#[test]
fn the_floor_is_the_longest_step_plus_a_minute_never_below_one_bash_call() {
    assert_eq!(stall_floor(Duration::ZERO), MAX_TIMEOUT + MIN);
    assert_eq!(stall_floor(5 * MIN), MAX_TIMEOUT + MIN);
    assert_eq!(stall_floor(MAX_TIMEOUT), MAX_TIMEOUT + MIN);
    assert_eq!(stall_floor(40 * MIN), 41 * MIN);
    assert_eq!(stall_floor(Duration::MAX), Duration::MAX);
    // The default clears the floor of every deployment's own step.
    assert!(DEFAULT_STALL_BUDGET >= stall_floor(MAX_TIMEOUT));
}

#[test]
fn the_default_is_checked_against_a_lengthened_step() {
    check_stall_default(
        "EXEC_STALL",
        "REPO_CLONE_TIMEOUT",
        DEFAULT_STALL_BUDGET,
        20 * MIN,
    )
    .expect("clears");
    check_stall_default(
        "EXEC_STALL",
        "REPO_CLONE_TIMEOUT",
        DEFAULT_STALL_BUDGET,
        29 * MIN,
    )
    .expect("exactly the floor");
    let err = check_stall_default(
        "EXEC_STALL",
        "REPO_CLONE_TIMEOUT",
        DEFAULT_STALL_BUDGET,
        40 * MIN,
    )
    .expect_err("outgrown");
    assert_eq!(
        err.to_string(),
        "EXEC_STALL is unset and its default (30m0s) is below the floor of 41m0s that REPO_CLONE_TIMEOUT (40m0s) needs; set EXEC_STALL to at least 41m0s or lower REPO_CLONE_TIMEOUT"
    );
}

#[test]
fn parse_table() {
    let ok = |v: &str, want: Duration| {
        assert_eq!(
            parse_stall_timeout("STALL", v, Duration::ZERO).expect(v),
            want,
            "{v}"
        );
    };
    ok("", DEFAULT_STALL_BUDGET);
    ok("45m", 45 * MIN);
    ok("1h30m", 90 * MIN);
    ok("11m", 11 * MIN);
    ok("+2h", 120 * MIN);

    let err = |v: &str, longest: Duration| {
        parse_stall_timeout("STALL", v, longest)
            .expect_err(v)
            .to_string()
    };
    // A typo is called a typo...
    for typo in ["30mm", "30", "abc", "-", "1h 30m", " 45m", "forever", "off"] {
        let msg = err(typo, Duration::ZERO);
        assert!(msg.contains("not a duration"), "{typo}: {msg}");
        assert!(
            msg.starts_with(&format!("STALL={typo:?}")),
            "names the variable: {msg}"
        );
    }
    // ...and a sign problem a sign problem: no off switch.
    for neg in ["-30m", "0", "0s", "-0"] {
        let msg = err(neg, Duration::ZERO);
        assert!(
            msg.contains("must be positive") && msg.contains("no off switch"),
            "{neg}: {msg}"
        );
        assert!(!msg.contains("not a duration"), "{neg}");
    }
    // Under the floor: names the floor.
    let msg = err("10m", Duration::ZERO);
    assert!(
        msg.contains("below the floor of 11m0s") && msg.contains("at least 11m0s"),
        "{msg}"
    );
    let msg = err("45m", 60 * MIN);
    assert!(msg.contains("1h1m0s"), "{msg}");
    parse_stall_timeout("STALL", "61m", 60 * MIN).expect("at the floor");
}
