//! `agent-operator check -f`, run as the binary a CI pipeline runs.

use std::process::Command;

fn check(path: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-operator"))
        .args(["check", "-f", path])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_example_passes_and_prints_the_status_the_operator_would_write() {
    let (code, stdout, stderr) = check("../examples/session.yaml");
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["valid"], true);
    assert_eq!(report["status"]["policies"]["write"], "always_ask");
    assert_eq!(report["status"]["tools"].as_array().map(Vec::len), Some(6));
    assert_eq!(
        report["status"]["toolsets"][0]["configs"][0]["enabled"],
        true
    );
}

#[test]
fn invalid_sessions_exit_1_with_path_named_errors() {
    let (code, _, stderr) = check("tests/fixtures/invalid-sessions.yaml");
    assert_eq!(code, 1);
    assert!(
        stderr.contains("misspelt-policy: spec.tools[0].configs[0].permission_polciy: unknown key"),
        "{stderr}"
    );
    assert!(
        stderr.contains("unevaluable-policy: spec.tools[0].default_config.permission_policy.type"),
        "{stderr}"
    );
}

#[test]
fn a_missing_file_is_exit_2() {
    let (code, _, stderr) = check("nope.yaml");
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot read nope.yaml"), "{stderr}");
}
