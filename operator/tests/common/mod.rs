//! What several table tests share: the operator's pod settings as the
//! tests' cluster uses them, and a fixed "now".

// Each test crate uses its own subset.
#![allow(dead_code)]

use k8s_openapi::jiff::Timestamp;
use operator::sandbox::PodConfig;

/// The pod settings of the test cluster's operator, with no defaults.
pub fn cfg() -> PodConfig {
    PodConfig {
        runner_image: "localhost/agentplane/runner:dev".into(),
        image_pull_policy: "IfNotPresent".into(),
        default_resources: None,
        default_workspace_limit: None,
        egress: operator::sandbox::EgressPolicy::default(),
        read_only_root: false,
        disk: operator::sandbox::DiskBounds::default(),
        host_users: None,
        watch: operator::sandbox::RunnerWatch::default(),
        gateway: false,
    }
}

/// A fixed moment, so that conditions' times are stable.
pub fn now() -> Timestamp {
    Timestamp::from_second(1_000).expect("t")
}
