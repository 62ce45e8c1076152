//! A work item's sandbox: an `AgentSession` owned by its environment, whose
//! `spec.tools` is the hosted session agent's toolset, so the admission
//! webhook validates it and the operator materialises it in `status` as
//! for any session. Named after the work item, so creating it again (a
//! retry, a restarted dispatcher) finds the same object; labelled and
//! annotated so a restarted dispatcher finds its runs.

use std::collections::BTreeMap;
use std::time::Duration;

use crds::{AgentEnvironment, AgentSession, SessionPhase};
use futures::StreamExt;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Label of an environment's sessions: the environment's UID.
pub const ENVIRONMENT_LABEL: &str = "agentplane.dev/environment-uid";
/// The hosted work item a session serves.
pub const WORK_ANNOTATION: &str = "agentplane.dev/work-id";
/// The hosted session it serves.
pub const SESSION_ANNOTATION: &str = "agentplane.dev/claude-session-id";
/// The toolset type the sandbox serves.
pub const AGENT_TOOLSET: &str = "agent_toolset_20260401";

/// The AgentSession's name for a work item: stable, DNS-safe, short.
pub fn session_name(environment_uid: &str, work_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(environment_uid.as_bytes());
    h.update([0]);
    h.update(work_id.as_bytes());
    format!("ma-{}", &hex::encode(h.finalize())[..20])
}

/// The tools the sandbox runs.
pub const SANDBOX_TOOLS: [&str; 6] = ["bash", "read", "write", "edit", "glob", "grep"];

/// The entries of the hosted agent's `tools[]` that the sandbox serves,
/// rebuilt in the form the plane's toolset takes: the built-in toolset
/// only. MCP toolsets run on the hosted side (their calls never reach a
/// worker) and custom tools belong to the client that declared them; both
/// stay out of the sandbox's toolset. A retrieved session carries its
/// toolset resolved, with more than the plane's schema: each config has a
/// `type`, and the hosted toolset also lists `web_fetch` and `web_search`,
/// which run on the hosted side. Each object is rebuilt from the three
/// fields the schema defines (`name`, `enabled`, `permission_policy`), for
/// the six sandbox tools.
///
/// The hosted API also has an `auto` permission policy (the server judges
/// each call and evaluates it to allow, ask or deny), which the toolset
/// this plane validates does not know. The hosted side is the gate for
/// these sessions -- the dispatcher sends only calls it evaluated to allow
/// or a person confirmed -- so `auto` becomes `always_allow` here;
/// `always_ask` stays, and the dispatcher approves a call at the gateway
/// only after the person's confirmation arrived.
pub fn sandbox_tools(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some(AGENT_TOOLSET))
        .map(|t| {
            let mut out = serde_json::Map::new();
            out.insert("type".into(), Value::String(AGENT_TOOLSET.into()));
            if let Some(d) = t.get("default_config").filter(|d| d.is_object()) {
                out.insert(
                    "default_config".into(),
                    Value::Object(config_fields(d, false)),
                );
            }
            let configs: Vec<Value> = t
                .get("configs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|c| {
                    c.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| SANDBOX_TOOLS.contains(&n))
                })
                .map(|c| Value::Object(config_fields(c, true)))
                .collect();
            if !configs.is_empty() {
                out.insert("configs".into(), Value::Array(configs));
            }
            Value::Object(out)
        })
        .collect()
}

/// `name` (for a config), `enabled` and `permission_policy`, the policy's
/// `auto` made `always_allow`.
fn config_fields(c: &Value, named: bool) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    let keys: &[&str] = if named {
        &["name", "enabled", "permission_policy"]
    } else {
        &["enabled", "permission_policy"]
    };
    for k in keys {
        if let Some(v) = c.get(*k) {
            out.insert((*k).to_owned(), v.clone());
        }
    }
    if let Some(p) = out.get_mut("permission_policy")
        && p.get("type").and_then(Value::as_str) == Some("auto")
    {
        *p = serde_json::json!({"type": "always_allow"});
    }
    out
}

/// The AgentSession for a work item of `env`.
pub fn build(
    env: &AgentEnvironment,
    work_id: &str,
    session_id: &str,
    tools: &[Value],
) -> Result<AgentSession> {
    let uid = env
        .uid()
        .ok_or_else(|| Error::Sandbox("the environment has no UID yet".into()))?;
    let owner = env
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Sandbox("the environment has no owner reference".into()))?;
    let mut spec = env.spec.sandbox.template.session_spec();
    spec.tools = sandbox_tools(tools);
    spec.warm_pool = env.spec.sandbox.warm_pool.clone();
    let mut s = AgentSession::new(&session_name(&uid, work_id), spec);
    s.metadata = ObjectMeta {
        name: s.metadata.name.take(),
        namespace: env.namespace(),
        labels: Some(BTreeMap::from([
            (ENVIRONMENT_LABEL.to_owned(), uid.clone()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "agentplane-dispatcher".to_owned(),
            ),
        ])),
        annotations: Some(BTreeMap::from([
            (WORK_ANNOTATION.to_owned(), work_id.to_owned()),
            (SESSION_ANNOTATION.to_owned(), session_id.to_owned()),
        ])),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    };
    Ok(s)
}

/// Whether `s` is the sandbox this environment made for `work_id`: owned
/// by the environment's UID and annotated with the item. Anything else
/// under the same name is not ours to use or delete.
pub fn is_ours(s: &AgentSession, environment_uid: &str, work_id: &str) -> bool {
    s.owner_references()
        .iter()
        .any(|o| o.uid == environment_uid && o.controller == Some(true))
        && s.annotations().get(WORK_ANNOTATION).map(String::as_str) == Some(work_id)
}

/// Creates the session, or finds the one made earlier for the same item
/// (then `false`: calls of an earlier run may have started in it).
pub async fn ensure(
    api: &Api<AgentSession>,
    want: &AgentSession,
    environment_uid: &str,
    work_id: &str,
) -> Result<(AgentSession, bool)> {
    match api.create(&PostParams::default(), want).await {
        Ok(s) => Ok((s, true)),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let name = want.name_any();
            let s = api.get(&name).await?;
            if is_ours(&s, environment_uid, work_id) {
                Ok((s, false))
            } else {
                Err(Error::Sandbox(format!(
                    "an AgentSession named {name} exists and is not this environment's for work item {work_id}"
                )))
            }
        }
        Err(kube::Error::Api(e)) if (400..500).contains(&e.code) => Err(Error::Sandbox(format!(
            "the plane refused the session's sandbox: {}",
            e.message
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Waits until the session is Ready, or says why it will not be.
pub async fn wait_ready(
    api: &Api<AgentSession>,
    name: &str,
    limit: Duration,
) -> Result<AgentSession> {
    let mut w = std::pin::pin!(watcher::watch_object(api.clone(), name).boxed());
    let wait = async {
        while let Some(ev) = w.next().await {
            match ev {
                Ok(Some(s)) => {
                    let phase = s.status.as_ref().and_then(|st| st.phase);
                    match phase {
                        Some(SessionPhase::Ready) => return Ok(s),
                        Some(SessionPhase::Invalid | SessionPhase::Failed) => {
                            return Err(Error::Sandbox(format!(
                                "the session's sandbox is {}: {}",
                                if phase == Some(SessionPhase::Invalid) {
                                    "Invalid"
                                } else {
                                    "Failed"
                                },
                                condition_message(&s)
                            )));
                        }
                        _ => {}
                    }
                }
                Ok(None) => {
                    return Err(Error::Sandbox(format!(
                        "the AgentSession {name} was deleted"
                    )));
                }
                Err(e) => tracing::debug!(error = %e, "watching the session; retrying"),
            }
        }
        Err(Error::Sandbox("the watch of the session ended".into()))
    };
    tokio::time::timeout(limit, wait).await.map_err(|_| {
        Error::Sandbox(format!(
            "the session's sandbox was not Ready within {}s",
            limit.as_secs()
        ))
    })?
}

fn condition_message(s: &AgentSession) -> String {
    s.status
        .as_ref()
        .map(|st| {
            st.conditions
                .iter()
                .filter(|c| c.status == "False")
                .map(|c| format!("{}: {}", c.type_, c.message))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "no reason given".into())
}

/// Deletes the session if it is still the one we made (UID precondition).
pub async fn release(api: &Api<AgentSession>, s: &AgentSession) -> Result<()> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: s.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&s.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The environment's sessions a restarted dispatcher resumes: the work and
/// session ids of each, from objects the environment owns.
pub fn resumable(
    sessions: &[AgentSession],
    environment_uid: &str,
) -> Vec<(AgentSession, String, String)> {
    sessions
        .iter()
        .filter(|s| s.meta().deletion_timestamp.is_none())
        .filter_map(|s| {
            let work = s.annotations().get(WORK_ANNOTATION)?.clone();
            let session = s.annotations().get(SESSION_ANNOTATION)?.clone();
            is_ours(s, environment_uid, &work).then(|| (s.clone(), work, session))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{AgentEnvironmentSpec, EnvironmentSandbox, KeySecretRef, WarmPoolTemplate};
    use serde_json::json;

    fn env() -> AgentEnvironment {
        let template: WarmPoolTemplate = serde_json::from_value(json!({"image": "img"})).unwrap();
        let mut e = AgentEnvironment::new(
            "prod",
            AgentEnvironmentSpec {
                environment_id: "env_1".into(),
                key_secret_ref: KeySecretRef {
                    name: "k".into(),
                    key: "key".into(),
                },
                sandbox: EnvironmentSandbox {
                    warm_pool: Some("pool".into()),
                    template,
                },
                max_concurrent_sessions: 4,
                idle_seconds: 60,
                memory: None,
                paused: None,
            },
        );
        e.metadata.namespace = Some("team".into());
        e.metadata.uid = Some("uid-1".into());
        e
    }

    #[test]
    fn the_sandbox_serves_only_the_built_in_toolset() {
        let tools = vec![
            json!({"type": "agent_toolset_20260401", "configs": [{"name": "write", "permission_policy": {"type": "always_ask"}}]}),
            json!({"type": "mcp_toolset", "mcp_server_name": "gh"}),
            json!({"type": "custom", "name": "lookup", "input_schema": {"type": "object"}}),
        ];
        let s = build(&env(), "work_1", "sesn_1", &tools).unwrap();
        assert_eq!(s.spec.tools, sandbox_tools(&tools[..1]));
        assert_eq!(s.spec.tools.len(), 1);
        assert_eq!(s.spec.image, "img");
        assert_eq!(s.spec.warm_pool.as_deref(), Some("pool"));
        assert_eq!(s.namespace().as_deref(), Some("team"));
        assert!(is_ours(&s, "uid-1", "work_1"));
        assert!(!is_ours(&s, "uid-2", "work_1"));
        assert!(!is_ours(&s, "uid-1", "work_2"));
        assert_eq!(resumable(&[s], "uid-1").len(), 1);
    }

    #[test]
    fn a_resolved_hosted_toolset_is_rebuilt_in_the_planes_form() {
        let tools = vec![json!({"type": "agent_toolset_20260401",
        "default_config": {"enabled": true, "permission_policy": {"type": "always_allow"}, "extra": 1},
        "configs": [
            {"type": "bash", "name": "bash", "enabled": true, "permission_policy": {"type": "always_ask"}},
            {"type": "web_search", "name": "web_search", "enabled": true, "permission_policy": {"type": "always_allow"}}
        ]})];
        assert_eq!(
            sandbox_tools(&tools),
            vec![json!({"type": "agent_toolset_20260401",
                "default_config": {"enabled": true, "permission_policy": {"type": "always_allow"}},
                "configs": [{"name": "bash", "enabled": true, "permission_policy": {"type": "always_ask"}}]})]
        );
    }

    #[test]
    fn the_hosted_auto_policy_becomes_always_allow_and_always_ask_stays() {
        let tools = vec![json!({"type": "agent_toolset_20260401",
            "default_config": {"permission_policy": {"type": "auto"}},
            "configs": [{"name": "bash", "permission_policy": {"type": "auto"}},
                        {"name": "write", "permission_policy": {"type": "always_ask"}}]})];
        let out = sandbox_tools(&tools);
        assert_eq!(
            out[0]["default_config"]["permission_policy"]["type"],
            "always_allow"
        );
        assert_eq!(
            out[0]["configs"][0]["permission_policy"]["type"],
            "always_allow"
        );
        assert_eq!(
            out[0]["configs"][1]["permission_policy"]["type"],
            "always_ask"
        );
    }

    #[test]
    fn names_are_stable_per_item_and_dns_safe() {
        let a = session_name("uid-1", "work_1");
        assert_eq!(a, session_name("uid-1", "work_1"));
        assert_ne!(a, session_name("uid-1", "work_2"));
        assert_ne!(a, session_name("uid-2", "work_1"));
        assert!(
            a.len() <= 63
                && a.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        );
    }
}
