//! Condition bookkeeping every writer of this project's statuses shares
//! (the operator for sessions and pools, the dispatcher for environments),
//! so `lastTransitionTime` means the same everywhere: when the status last
//! changed, not when the condition was last written.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Gives each condition of `now` the transition time of the same type in
/// `previous` when its status did not change (pure).
pub fn keep_transition_times(now: &mut [Condition], previous: &[Condition]) {
    for c in now {
        if let Some(p) = previous
            .iter()
            .find(|p| p.type_ == c.type_ && p.status == c.status)
        {
            c.last_transition_time = p.last_transition_time.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn cond(t: &str, status: &str, secs: i64) -> Condition {
        Condition {
            type_: t.into(),
            status: status.into(),
            last_transition_time: Time(Timestamp::from_second(secs).unwrap()),
            message: String::new(),
            reason: "R".into(),
            observed_generation: None,
        }
    }

    #[test]
    fn a_status_that_held_keeps_its_time_and_a_change_takes_the_new_one() {
        let previous = [cond("Ready", "True", 10), cond("Degraded", "False", 20)];
        let mut now = vec![
            cond("Ready", "True", 99),
            cond("Degraded", "True", 99),
            cond("New", "True", 99),
        ];
        keep_transition_times(&mut now, &previous);
        let secs: Vec<i64> = now
            .iter()
            .map(|c| c.last_transition_time.0.as_second())
            .collect();
        assert_eq!(secs, [10, 99, 99]);
    }
}
