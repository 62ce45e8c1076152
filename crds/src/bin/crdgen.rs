//! Prints a CRD as YAML: `cargo run -p crds --bin crdgen [-- agentwarmpools|agentenvironments|agentcheckpoints] > FILE`
//! (the AgentSession CRD without an argument).

fn main() -> std::process::ExitCode {
    let which = std::env::args().nth(1);
    let yaml = match which.as_deref() {
        None | Some("agentsessions") => crds::crd_yaml(),
        Some("agentwarmpools") => crds::pool_crd_yaml(),
        Some("agentenvironments") => crds::environment_crd_yaml(),
        Some("agentcheckpoints") => crds::checkpoint_crd_yaml(),
        Some(other) => {
            eprintln!(
                "crdgen: unknown CRD {other:?}; say agentsessions, agentwarmpools, agentenvironments or agentcheckpoints"
            );
            return std::process::ExitCode::from(2);
        }
    };
    match yaml {
        Ok(yaml) => {
            print!("{yaml}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: cannot render the CRD: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
