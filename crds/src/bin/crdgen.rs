//! Prints the AgentSession CRD as YAML (`cargo run -p crds --bin crdgen > FILE`).

fn main() -> std::process::ExitCode {
    match crds::crd_yaml() {
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
