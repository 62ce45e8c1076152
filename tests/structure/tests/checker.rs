//! The checker itself, on small trees written for each case: it must find
//! what it is there to find (a check that never fails shows nothing).

use std::path::Path;

use structure::{Crate, Doors, OPERATOR_DOORS, cycles, long_functions};

fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let full = dir.path().join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
        std::fs::write(full, text).expect("write");
    }
    dir
}

fn read(dir: &Path) -> Crate {
    Crate::read(dir).expect("read")
}

#[test]
fn a_two_file_circle_is_found_with_its_lines() {
    let t = tree(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n"),
        ("b.rs", "pub struct B;\n\nfn f() { let _ = crate::a::A; }\n"),
    ]);
    let found = cycles(&read(t.path()));
    assert_eq!(
        found,
        vec!["{a.rs, b.rs}, e.g. a.rs (line 1) -> b.rs (line 3) -> a.rs".to_owned()]
    );
}

#[test]
fn a_circle_through_super_and_a_macro_is_found() {
    let t = tree(&[
        ("lib.rs", "pub mod w;\npub mod c;\n"),
        ("w/mod.rs", "pub mod x;\npub use x::X;\n"),
        (
            "w/x.rs",
            "pub struct X;\nfn f() { g!(super::super::c::C); }\n",
        ),
        (
            "c.rs",
            "pub struct C;\nfn h() -> serde_json::Value { serde_json::json!({ crate::w::K: 1 }) }\n",
        ),
    ]);
    let found = cycles(&read(t.path()));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("w/x.rs") && found[0].contains("c.rs"),
        "{found:?}"
    );
}

#[test]
fn a_one_way_tree_has_no_circle() {
    let t = tree(&[
        (
            "lib.rs",
            "pub mod a;\npub mod b;\npub mod error;\npub use a::A;\npub use error::Error;\nmod f { pub fn h() { crate::b::g(); } }\n",
        ),
        (
            "a.rs",
            "use crate::b::B;\npub struct A(B);\n#[cfg(test)]\nmod tests { use super::*; }\n",
        ),
        (
            "b.rs",
            "pub struct B;\npub(crate) fn g() -> crate::Error { todo!() }\n",
        ),
        ("error.rs", "pub struct Error;\n"),
        ("main.rs", "use crate::nothing; fn main() {}\n"),
    ]);
    assert_eq!(cycles(&read(t.path())), Vec::<String>::new());
}

fn operator_tree(extra: (&str, &str)) -> tempfile::TempDir {
    tree(&[
        (
            "lib.rs",
            "pub mod cli;\npub mod names;\npub mod session;\npub mod pool;\npub mod admission;\npub mod mcp;\n",
        ),
        (
            "cli.rs",
            "use crate::pool::controller; use crate::session::controller as s;\n",
        ),
        ("names.rs", "pub const L: &str = \"l\";\n"),
        ("session/mod.rs", "pub mod controller;\npub mod pod;\n"),
        (
            "session/controller.rs",
            "use crate::names::L; use crate::mcp::client;\n",
        ),
        ("session/pod.rs", "pub fn build() {}\n"),
        ("pool/mod.rs", "pub mod controller;\n"),
        ("pool/controller.rs", "use crate::session::pod::build;\n"),
        ("admission/mod.rs", "pub mod review;\n"),
        ("admission/review.rs", "use crate::names;\n"),
        ("mcp/mod.rs", "pub mod client;\n"),
        ("mcp/client.rs", "pub fn list() {}\n"),
        extra,
    ])
}

#[test]
fn the_allowed_doors_pass() {
    let t = operator_tree(("status.rs", "pub fn s() {}\n"));
    assert_eq!(
        OPERATOR_DOORS.violations(&read(t.path())),
        Vec::<String>::new()
    );
}

#[test]
fn every_forbidden_door_is_named() {
    let cases: [(&str, &str, &str); 5] = [
        (
            "session/claim.rs",
            "use crate::pool::controller;\n",
            "the session wing imports the pool wing",
        ),
        (
            "admission/check.rs",
            "fn f() { crate::session::pod::build(); }\n",
            "the admission wing imports the session wing",
        ),
        (
            "mcp/guard.rs",
            "use crate::pool;\n",
            "the mcp wing imports the pool wing",
        ),
        (
            "context.rs",
            "use crate::session::pod::{self, build};\n",
            "the base wing imports the session wing",
        ),
        (
            "session/x.rs",
            "fn f() { let _ = serde_json::json!({ super::super::pool::controller::K: 1 }); }\n",
            "the session wing imports the pool wing",
        ),
    ];
    for (path, text, says) in cases {
        let t = operator_tree((path, text));
        let found = OPERATOR_DOORS.violations(&read(t.path()));
        assert_eq!(found.len(), 1, "{path}: {found:?}");
        assert!(
            found[0].starts_with(&format!("{path}:")) && found[0].contains(says),
            "{path}: {found:?}"
        );
    }
}

#[test]
fn doors_are_one_way() {
    let doors = Doors {
        wings: &["a", "b"],
        allowed: &[("b", &["a"])],
        wiring: &[],
    };
    let t = tree(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a/mod.rs", "use crate::b;\n"),
        ("b/mod.rs", "use crate::a;\n"),
    ]);
    let found = doors.violations(&read(t.path()));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("a/mod.rs:1: the a wing imports the b wing"),
        "{found:?}"
    );
}

#[test]
fn long_functions_are_measured_doc_to_brace() {
    let body = "    let x = 1;\n".repeat(77);
    let text = format!(
        "/// Fits.\nfn fits() {{\n{}}}\n\nstruct S;\nimpl S {{\n    /// Too long,\n    /// with its doc.\n    fn too_long(&self) {{\n{body}    }}\n}}\n",
        "    let y = 2;\n".repeat(77)
    );
    let t = tree(&[("lib.rs", &text)]);
    let found = long_functions(&read(t.path()), 80);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("S::too_long is 81 lines"), "{found:?}");
}

#[test]
fn an_unparsable_file_is_an_error_naming_it() {
    let t = tree(&[("lib.rs", "pub mod a;\n"), ("a.rs", "fn (\n")]);
    let e = Crate::read(t.path()).expect_err("must not parse");
    assert!(e.to_string().contains("a.rs"), "{e}");
}
