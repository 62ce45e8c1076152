//! The admission decision, as a pure function of an AdmissionReview.
//!
//! Only `.spec` is parsed: metadata and status are the API server's
//! business, and a webhook that decodes the whole object breaks on fields
//! it does not know.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use crate::policy::{self, SessionPolicy};
use crds::AgentSessionSpec;

use crate::validation::{Findings, check_spec, decode_spec};

/// What the webhook decided, before it is wrapped for the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub message: Option<String>,
    pub warnings: Vec<String>,
}

/// Decides on the object of one request: the spec's rules, then the
/// platform's session policy.
pub fn decide(req: &AdmissionRequest<DynamicObject>, session_policy: &SessionPolicy) -> Decision {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Decision {
            allowed: true,
            message: None,
            warnings: Vec::new(),
        };
    }
    let Some(obj) = req.object.as_ref() else {
        return deny("request.object: required but missing".into());
    };
    let Some(spec) = obj.data.get("spec") else {
        return deny("spec: required but missing".into());
    };
    let spec = match decode_spec(spec.clone()) {
        Ok(s) => s,
        Err(finding) => return deny(finding.to_string()),
    };
    let findings = verdict(&spec, session_policy);
    if findings.is_valid() {
        Decision {
            allowed: true,
            message: None,
            warnings: findings.warnings,
        }
    } else {
        Decision {
            allowed: false,
            message: Some(findings.denial()),
            warnings: findings.warnings,
        }
    }
}

/// The findings the webhook decides by: the spec's rules, then the
/// platform's session policy. The offline `check` calls this too, so its
/// verdict is the webhook's.
pub fn verdict(spec: &AgentSessionSpec, session_policy: &SessionPolicy) -> Findings {
    let mut findings = check_spec(spec);
    findings.errors.extend(policy::check(spec, session_policy));
    findings
}

fn deny(message: String) -> Decision {
    Decision {
        allowed: false,
        message: Some(message),
        warnings: Vec::new(),
    }
}

/// Answers one AdmissionReview body. A body that is not a review gets an
/// `Err` (the server answers 400); a review always gets a review back.
pub fn review(
    body: &[u8],
    session_policy: &SessionPolicy,
) -> Result<(Decision, AdmissionReview<DynamicObject>), String> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let req: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|e| format!("AdmissionReview without a request: {e}"))?;
    let decision = decide(&req, session_policy);
    let mut resp = AdmissionResponse::from(&req);
    if !decision.allowed {
        resp = resp.deny(decision.message.clone().unwrap_or_default());
    }
    if !decision.warnings.is_empty() {
        resp.warnings = Some(decision.warnings.clone());
    }
    Ok((decision, resp.into_review()))
}
