//! What a session's events say is left to do, as pure state: the
//! dispatcher feeds it the history and then the live stream (the two
//! overlap; every event is taken once, by id), and asks which calls may run
//! now. A call that has a result in the session's events is never run
//! again, which is what lets a restarted dispatcher resume a session
//! without repeating a call.

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::Value;

/// The most event ids remembered per session (duplicates beyond it are
/// still caught by the answered set, which is bounded by the calls made).
const MAX_SEEN: usize = 100_000;

/// What the hosted side decided about a call before it reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Run it.
    Allow,
    /// Hold it until a person's `user.tool_confirmation`.
    Ask,
    /// Never run it.
    Deny,
}

impl Permission {
    fn parse(v: Option<&str>) -> Self {
        match v {
            Some("allow") => Permission::Allow,
            Some("deny") => Permission::Deny,
            // `ask`, and anything this build does not know, waits for a
            // person: the safe reading of an unknown decision.
            _ => Permission::Ask,
        }
    }
}

/// A call the session's agent made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The event id the result must name.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its input object.
    pub input: Value,
    /// `agent.custom_tool_use` rather than `agent.tool_use`.
    pub custom: bool,
    /// The thread it belongs to, if a subagent's.
    pub thread: Option<String>,
}

/// Why the session's run here is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// `session.status_terminated`.
    Terminated,
    /// `session.deleted`.
    Deleted,
}

#[derive(Debug)]
struct Held {
    call: ToolCall,
    permission: Permission,
}

/// The state of one session's calls.
#[derive(Debug, Default)]
pub struct Ledger {
    seen: HashSet<String>,
    seen_order: VecDeque<String>,
    answered: HashSet<String>,
    confirmed: HashMap<String, bool>,
    held: Vec<Held>,
    /// Idle with nothing for us to do (`end_turn` and the like) since the
    /// event with this index was observed; cleared by any later activity.
    idle: bool,
    ended: Option<Ended>,
    observed: u64,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one event into account; repeated events (same id) are ignored.
    /// Returns whether it was new.
    pub fn observe(&mut self, ev: &Value) -> bool {
        if let Some(id) = ev.get("id").and_then(Value::as_str) {
            if !self.seen.insert(id.to_owned()) {
                return false;
            }
            self.seen_order.push_back(id.to_owned());
            if self.seen_order.len() > MAX_SEEN
                && let Some(old) = self.seen_order.pop_front()
            {
                self.seen.remove(&old);
            }
        }
        self.observed += 1;
        let kind = ev.get("type").and_then(Value::as_str).unwrap_or("");
        let s = |k: &str| ev.get(k).and_then(Value::as_str).map(str::to_owned);
        match kind {
            "agent.tool_use" | "agent.custom_tool_use" => {
                self.idle = false;
                let Some(id) = s("id") else { return true };
                if self.answered.contains(&id) || self.held.iter().any(|h| h.call.id == id) {
                    return true;
                }
                let custom = kind == "agent.custom_tool_use";
                let permission = if custom {
                    // Custom tools carry no hosted decision.
                    Permission::Allow
                } else {
                    Permission::parse(ev.get("evaluated_permission").and_then(Value::as_str))
                };
                self.held.push(Held {
                    call: ToolCall {
                        id,
                        name: s("name").unwrap_or_default(),
                        input: ev.get("input").cloned().unwrap_or(Value::Null),
                        custom,
                        thread: s("session_thread_id"),
                    },
                    permission,
                });
            }
            "user.tool_result" => {
                if let Some(id) = s("tool_use_id") {
                    self.answer(&id);
                }
            }
            "user.custom_tool_result" => {
                if let Some(id) = s("custom_tool_use_id") {
                    self.answer(&id);
                }
            }
            "user.tool_confirmation" => {
                if let Some(id) = s("tool_use_id") {
                    let allow = ev.get("result").and_then(Value::as_str) == Some("allow");
                    self.confirmed.insert(id.clone(), allow);
                    if !allow {
                        // A denial is the call's answer: nothing is posted.
                        self.held.retain(|h| h.call.id != id);
                        self.answered.insert(id);
                    }
                }
            }
            "session.status_idle" => {
                let reason = ev
                    .pointer("/stop_reason/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                self.idle = reason != "requires_action";
            }
            "session.status_running" | "user.message" | "agent.message" => self.idle = false,
            "session.status_terminated" => self.ended = Some(Ended::Terminated),
            "session.deleted" => self.ended = Some(Ended::Deleted),
            "session.thread_status_terminated" => {
                if let Some(t) = s("session_thread_id") {
                    self.held
                        .retain(|h| h.call.thread.as_deref() != Some(t.as_str()));
                }
            }
            _ => {}
        }
        true
    }

    fn answer(&mut self, id: &str) {
        self.held.retain(|h| h.call.id != id);
        self.answered.insert(id.to_owned());
    }

    /// Records that we posted the call's result (the event will also come
    /// back on the stream; either is enough).
    pub fn posted(&mut self, id: &str) {
        self.answer(id);
    }

    /// The next call that may run now, in the order the agent made them:
    /// allowed by the hosted side, or confirmed by a person. Denied calls
    /// are dropped here, never returned.
    pub fn next_runnable(&mut self) -> Option<ToolCall> {
        let confirmed = &self.confirmed;
        let mut dropped = Vec::new();
        let mut pick = None;
        for (i, h) in self.held.iter().enumerate() {
            match h.permission {
                Permission::Deny => dropped.push(h.call.id.clone()),
                Permission::Allow => {
                    pick = Some(i);
                    break;
                }
                Permission::Ask => match confirmed.get(&h.call.id) {
                    Some(true) => {
                        pick = Some(i);
                        break;
                    }
                    Some(false) => dropped.push(h.call.id.clone()),
                    None => {}
                },
            }
        }
        let call = pick.map(|i| self.held[i].call.clone());
        for id in dropped {
            self.answer(&id);
        }
        call
    }

    /// Calls held for a person's confirmation.
    pub fn awaiting_confirmation(&self) -> usize {
        self.held
            .iter()
            .filter(|h| h.permission == Permission::Ask && !self.confirmed.contains_key(&h.call.id))
            .count()
    }

    /// Whether the call already has an answer.
    pub fn is_answered(&self, id: &str) -> bool {
        self.answered.contains(id)
    }

    /// Idle with nothing for this worker to do: the agent finished its turn.
    pub fn idle(&self) -> bool {
        self.idle && self.held.is_empty()
    }

    /// The session ended.
    pub fn ended(&self) -> Option<&Ended> {
        self.ended.as_ref()
    }

    /// Events taken into account.
    pub fn observed(&self) -> u64 {
        self.observed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool_use(id: &str, permission: &str) -> Value {
        json!({"id": id, "type": "agent.tool_use", "name": "bash",
               "input": {"command": "true"}, "evaluated_permission": permission})
    }

    #[test]
    fn an_answered_call_is_never_offered_again() {
        let mut l = Ledger::new();
        l.observe(&tool_use("t1", "allow"));
        l.observe(&json!({"id": "e2", "type": "user.tool_result", "tool_use_id": "t1"}));
        assert_eq!(l.next_runnable(), None);
        // The same tool_use seen again (history, then stream) stays answered.
        l.observe(&tool_use("t1", "allow"));
        assert_eq!(l.next_runnable(), None);
        assert!(l.is_answered("t1"));
    }

    #[test]
    fn a_result_seen_before_its_call_still_counts() {
        let mut l = Ledger::new();
        l.observe(&json!({"id": "e2", "type": "user.tool_result", "tool_use_id": "t1"}));
        l.observe(&tool_use("t1", "allow"));
        assert_eq!(l.next_runnable(), None);
    }

    #[test]
    fn ask_waits_for_a_person_and_deny_never_runs() {
        let mut l = Ledger::new();
        l.observe(&tool_use("a", "ask"));
        l.observe(&tool_use("d", "deny"));
        l.observe(&tool_use("b", "ask"));
        l.observe(&tool_use("x", "something-new"));
        assert_eq!(l.next_runnable(), None);
        assert_eq!(l.awaiting_confirmation(), 3);
        l.observe(&json!({"id": "c1", "type": "user.tool_confirmation", "tool_use_id": "b", "result": "allow"}));
        assert_eq!(l.next_runnable().map(|c| c.id), Some("b".into()));
        l.posted("b");
        l.observe(&json!({"id": "c2", "type": "user.tool_confirmation", "tool_use_id": "a", "result": "deny"}));
        assert_eq!(l.next_runnable(), None);
        assert!(l.is_answered("a") && l.is_answered("d"));
        assert_eq!(l.awaiting_confirmation(), 1);
    }

    #[test]
    fn calls_run_in_the_order_they_were_made() {
        let mut l = Ledger::new();
        l.observe(&tool_use("1", "allow"));
        l.observe(&tool_use("2", "allow"));
        assert_eq!(l.next_runnable().map(|c| c.id), Some("1".into()));
        l.posted("1");
        assert_eq!(l.next_runnable().map(|c| c.id), Some("2".into()));
    }

    #[test]
    fn idle_and_end_are_read_from_status_events() {
        let mut l = Ledger::new();
        l.observe(&tool_use("1", "ask"));
        l.observe(&json!({"id": "i1", "type": "session.status_idle", "stop_reason": {"type": "requires_action"}}));
        assert!(!l.idle());
        l.observe(&json!({"id": "c", "type": "user.tool_confirmation", "tool_use_id": "1", "result": "deny"}));
        l.observe(&json!({"id": "i2", "type": "session.status_idle", "stop_reason": {"type": "end_turn"}}));
        assert!(l.idle());
        l.observe(&json!({"id": "r", "type": "session.status_running"}));
        assert!(!l.idle());
        l.observe(&json!({"id": "t", "type": "session.status_terminated"}));
        assert_eq!(l.ended(), Some(&Ended::Terminated));
    }

    #[test]
    fn a_terminated_thread_drops_its_calls() {
        let mut l = Ledger::new();
        let mut ev = tool_use("1", "allow");
        ev["session_thread_id"] = json!("th_1");
        l.observe(&ev);
        l.observe(&json!({"id": "x", "type": "session.thread_status_terminated", "session_thread_id": "th_1"}));
        assert_eq!(l.next_runnable(), None);
    }

    #[test]
    fn duplicate_events_are_taken_once() {
        let mut l = Ledger::new();
        assert!(l.observe(&tool_use("1", "allow")));
        assert!(!l.observe(&tool_use("1", "allow")));
        assert_eq!(l.observed(), 1);
    }
}
