//! The project's own sources, checked: no import circles, the operator's
//! doors, and its function lengths. A failure names the file and line.

use std::path::PathBuf;

use structure::{Crate, MAX_OPERATOR_FUNCTION_LINES, OPERATOR_DOORS, cycles, long_functions};

fn src(krate: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(krate)
        .join("src")
}

fn read(krate: &str) -> Crate {
    match Crate::read(&src(krate)) {
        Ok(c) => c,
        Err(e) => panic!("{krate}: {e}"),
    }
}

fn assert_none(what: &str, found: Vec<String>) {
    assert!(found.is_empty(), "{what}:\n  {}", found.join("\n  "));
}

#[test]
fn no_import_circles() {
    for krate in ["operator", "sidecar", "kubectl-agent", "dispatcher"] {
        let c = read(krate);
        assert!(
            c.files.len() > 3,
            "{krate}: only {} files read",
            c.files.len()
        );
        assert_none(&format!("import circles in {krate}/src"), cycles(&c));
    }
}

#[test]
fn operator_wings_import_through_their_doors() {
    let c = read("operator");
    for wing in OPERATOR_DOORS.wings {
        assert!(
            c.files
                .keys()
                .any(|m| m.first().map(String::as_str) == Some(*wing)),
            "operator/src/{wing}/ holds no module"
        );
    }
    assert_none(
        "forbidden imports between the operator's wings",
        OPERATOR_DOORS.violations(&c),
    );
}

#[test]
fn operator_functions_fit_a_reader() {
    let c = read("operator");
    assert_none(
        "operator functions over the limit",
        long_functions(&c, MAX_OPERATOR_FUNCTION_LINES),
    );
}
