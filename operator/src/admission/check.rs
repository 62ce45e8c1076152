//! `agent-operator check -f FILE`: the webhook's verdict and the status the
//! operator would write, offline, for CI pipelines and humans.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::admission::review;
use crate::policy::{self, SessionPolicy};
use crate::resolution::{self, Listings};
use crate::validation;

/// The verdict on one manifest document.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub name: String,
    pub errors: Vec<String>,
    pub report: Value,
}

/// Checks every AgentSession in a (multi-document) YAML or JSON text under
/// the platform's session `policy`, as the webhook does. Other kinds are
/// skipped; a document that is not YAML is an error.
pub fn check_manifest(text: &str, policy: &SessionPolicy) -> Result<Vec<Verdict>, String> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|e| format!("document {}: {e}", i + 1))?;
        if value.is_null() {
            continue;
        }
        if value.get("kind").and_then(Value::as_str) != Some("AgentSession") {
            continue;
        }
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("(unnamed)")
            .to_owned();
        let spec_value = value.get("spec").cloned().unwrap_or(Value::Null);
        let spec = match validation::decode_spec(spec_value) {
            Ok(s) => s,
            Err(finding) => {
                let error = finding.to_string();
                out.push(Verdict {
                    name: name.clone(),
                    errors: vec![error.clone()],
                    report: json!({"name": name, "valid": false, "errors": [error]}),
                });
                continue;
            }
        };
        let entries = validation::entries(&spec);
        let findings = review::verdict(&spec, policy);
        let denied = policy::check(&spec, policy);
        let errors: Vec<String> = findings.errors.iter().map(ToString::to_string).collect();
        let offline: Listings = resolution::servers_to_list(&spec, &entries)
            .into_iter()
            .map(|(server, _)| (server, Err("not listed: offline check".to_owned())))
            .collect();
        let mut res = resolution::resolve(&spec, &entries, &offline);
        resolution::apply_policy(&mut res, &denied);
        let conditions: Vec<Value> = res
            .conditions
            .iter()
            .map(|c| json!({"type": c.type_, "status": if c.status {"True"} else {"False"}, "reason": c.reason, "message": c.message}))
            .collect();
        let report = json!({
            "name": name,
            "valid": errors.is_empty(),
            "errors": errors,
            "warnings": findings.warnings,
            "status": {
                "toolsets": res.toolsets,
                "tools": res.tools,
                "policies": res.policies,
                "conditions": conditions,
            }
        });
        out.push(Verdict {
            name,
            errors,
            report,
        });
    }
    Ok(out)
}
