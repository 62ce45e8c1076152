//! The webhook's AdmissionReview decoder and decision,
//! `operator::admission::review::review` (the HTTP handler's whole body work), on
//! arbitrary bytes as a request body.
//!
//! Invariants: no panic; deterministic; a body that is not a review is an
//! `Err` (HTTP 400) saying so; a review always gets a review back that
//! serialises; an allowed request carries no message; every denial names a
//! path (`spec...` or `request.object`) first, and for a spec that decodes,
//! the denial is exactly the spec rules' and the session policy's findings,
//! each at a path under `spec`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use operator::policy::SessionPolicy;
use operator::validation::{Finding, check_spec, decode_spec};
use serde_json::Value;

fn names_a_path(message: &str) -> bool {
    ["spec", "request.object"].iter().any(|root| {
        message
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with([':', '.', '[']))
    })
}

fn check_finding(f: &Finding) {
    assert!(
        f.path == "spec" || f.path.starts_with("spec.") || f.path.starts_with("spec["),
        "a finding not under spec: {f:?}"
    );
    assert!(!f.message.is_empty(), "a finding without a message: {f:?}");
}

fuzz_target!(|data: &[u8]| {
    let policy = SessionPolicy::default();
    let first = operator::admission::review::review(data, &policy);
    let again = operator::admission::review::review(data, &policy);
    match (&first, &again) {
        (Ok((a, _)), Ok((b, _))) => assert_eq!(a, b, "decision is not deterministic"),
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("review is not deterministic"),
    }
    let (decision, review) = match first {
        Err(e) => {
            assert!(
                e.starts_with("not an AdmissionReview: ")
                    || e.starts_with("AdmissionReview without a request: "),
                "{e}"
            );
            return;
        }
        Ok(r) => r,
    };
    let answer = serde_json::to_value(&review).expect("the answer serialises");
    assert_eq!(
        answer.pointer("/response/allowed").and_then(Value::as_bool),
        Some(decision.allowed),
        "the answer says otherwise than the decision"
    );
    if decision.allowed {
        assert!(decision.message.is_none());
        return;
    }
    let message = decision.message.as_deref().expect("a denial has a message");
    assert!(
        names_a_path(message),
        "a denial that names no path: {message:?}"
    );

    // Recompute the findings of a spec that decodes.
    let Ok(body) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Some(spec) = body.pointer("/request/object/spec") else {
        return;
    };
    match decode_spec(spec.clone()) {
        Err(f) => {
            check_finding(&f);
            assert_eq!(message, f.to_string());
        }
        Ok(spec) => {
            let mut findings = check_spec(&spec);
            findings
                .errors
                .extend(operator::policy::check(&spec, &policy));
            findings.errors.iter().for_each(check_finding);
            assert_eq!(message, findings.denial(), "the denial is not the findings");
        }
    }
});
