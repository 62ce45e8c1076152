//! `sanitize_text`, `truncate_runes`, `cap_output` and the spill helpers.

use proptest::prelude::*;
use toolset::{
    MAX_OUTPUT_BYTES, cap_output, cap_output_with_notice, sanitize_text, spill_file_name,
    spill_notice, truncate_runes,
};

#[test]
fn sanitize_strips_every_nul_and_nothing_else() {
    assert_eq!(sanitize_text("a\0b\0\0c"), "abc");
    assert_eq!(sanitize_text("\0"), "");
    assert!(matches!(
        sanitize_text("plain é"),
        std::borrow::Cow::Borrowed("plain é")
    ));
}

#[test]
fn truncate_backs_off_to_a_char_boundary() {
    let s = "aé€😀"; // 1 + 2 + 3 + 4 bytes
    let want = [
        "",
        "a",
        "a",
        "aé",
        "aé",
        "aé",
        "aé€",
        "aé€",
        "aé€",
        "aé€",
        "aé€😀",
        "aé€😀",
    ];
    for (n, w) in want.iter().enumerate() {
        assert_eq!(truncate_runes(s, n), *w, "n={n}");
    }
}

#[test]
fn cap_leaves_short_output_alone_and_marks_a_cut() {
    let short = "x".repeat(MAX_OUTPUT_BYTES);
    assert!(matches!(cap_output(&short), std::borrow::Cow::Borrowed(_)));
    let long = "y".repeat(MAX_OUTPUT_BYTES + 1);
    let capped = cap_output(&long);
    assert!(capped.len() <= MAX_OUTPUT_BYTES);
    assert!(capped.ends_with(&format!(
        "[output truncated: {} bytes in all]",
        MAX_OUTPUT_BYTES + 1
    )));
    assert!(capped.starts_with("yyyy"));
}

#[test]
fn the_spill_notice_names_the_file_and_the_size() {
    let n = spill_notice("/tmp/agent-output/toolu_1.txt", 5_000_000);
    assert!(n.contains("/tmp/agent-output/toolu_1.txt"));
    assert!(n.contains("5000000 bytes"));
    assert!(n.contains("100 KiB"));
    let long = "z".repeat(3 * MAX_OUTPUT_BYTES);
    let capped = cap_output_with_notice(&long, &n);
    assert!(capped.len() <= MAX_OUTPUT_BYTES);
    assert!(capped.ends_with(&format!("\n{n}")));
}

#[test]
fn a_notice_longer_than_the_budget_is_itself_cut() {
    let notice = "é".repeat(MAX_OUTPUT_BYTES);
    let text = "a".repeat(MAX_OUTPUT_BYTES + 10);
    let capped = cap_output_with_notice(&text, &notice);
    assert!(capped.len() <= MAX_OUTPUT_BYTES);
}

#[test]
fn spill_file_names_accept_plain_ids_only() {
    assert_eq!(
        spill_file_name("toolu_01A-b.c").expect("ok"),
        "toolu_01A-b.c.txt"
    );
    for bad in [
        "",
        ".hidden",
        "a/b",
        "../x",
        "a b",
        "a\0b",
        "é",
        &"x".repeat(129),
    ] {
        let err = spill_file_name(bad).expect_err(bad);
        assert!(err.to_string().starts_with("call id "), "{err}");
    }
    assert!(spill_file_name(&"x".repeat(128)).is_ok());
}

proptest! {
    /// At every byte offset of multi-byte text, the cut is a prefix on a
    /// char boundary, at most n bytes, and as long as the boundary allows.
    #[test]
    fn truncation_never_splits_a_char(s in "\\PC{0,40}", n in 0usize..200) {
        let t = truncate_runes(&s, n);
        prop_assert!(t.len() <= n);
        prop_assert!(s.starts_with(t));
        if t.len() < s.len() {
            let next = s[t.len()..].chars().next().map_or(0, char::len_utf8);
            prop_assert!(t.len() + next > n, "backed off further than needed");
        }
    }

    #[test]
    fn truncation_at_every_offset_of_mixed_width_text(reps in 1usize..20) {
        let s = "aé€😀".repeat(reps);
        for n in 0..=s.len() + 1 {
            let t = truncate_runes(&s, n);
            prop_assert!(s.is_char_boundary(t.len()) && t.len() <= n);
        }
    }

    /// The cap holds for any text size and notice, and keeps a prefix.
    #[test]
    fn cap_never_exceeds_the_budget(
        unit in "\\PC{1,4}",
        reps in 0usize..60_000,
        notice in "\\PC{0,300}",
    ) {
        let s = unit.repeat(reps);
        let capped = cap_output_with_notice(&s, &notice);
        prop_assert!(capped.len() <= MAX_OUTPUT_BYTES);
        if s.len() <= MAX_OUTPUT_BYTES {
            prop_assert_eq!(&*capped, s.as_str());
        } else {
            let head = capped.strip_suffix(&format!("\n{notice}")).expect("notice at the end");
            prop_assert!(s.starts_with(head));
            prop_assert!(head.len() + 4 > MAX_OUTPUT_BYTES - 1 - notice.len());
        }
    }

    #[test]
    fn sanitize_then_cap_leaves_no_nul(s in "[a\\x00é]{0,500}") {
        let clean = sanitize_text(&s);
        prop_assert!(!clean.contains('\0'));
        prop_assert!(!cap_output(&clean).contains('\0'));
        prop_assert_eq!(clean.chars().count(), s.chars().filter(|c| *c != '\0').count());
    }
}
