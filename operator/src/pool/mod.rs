//! The AgentWarmPool wing: the reconciler that keeps each pool's unclaimed
//! pods, and its pure plan. It builds pool pods with the session wing's
//! pod builder (a warm pod must be the pod a session would get); the
//! session wing never imports this one.

pub mod controller;
pub mod plan;
pub mod pod;
