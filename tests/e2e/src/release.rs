//! The chart installed for one test or benchmark: a fresh release (an
//! earlier run's leftover under the same name is uninstalled first), the
//! operator's log and a namespace's objects printed when asked (a failing
//! run's evidence), and the release uninstalled when it is dropped, so a
//! panic still leaves the cluster as it found it.

use crate::{Kubectl, helm, root};

/// One installed release of `charts/agentplane`.
#[derive(Debug)]
pub struct Release {
    k: Kubectl,
    pub name: String,
    pub namespace: String,
}

impl Release {
    /// `helm install NAME charts/agentplane -n NAMESPACE --create-namespace
    /// --wait` with `extra` arguments (`--set ...`); panics with helm's
    /// output when it fails.
    pub fn install(k: &Kubectl, name: &str, namespace: &str, extra: &[&str]) -> Self {
        let release = Self {
            k: k.clone(),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        };
        release.uninstall();
        let chart = root().join("charts/agentplane");
        let mut args = vec![
            "install",
            name,
            chart.to_str().expect("the chart's path is UTF-8"),
            "-n",
            namespace,
            "--create-namespace",
            "--wait",
            "--timeout",
            "5m",
        ];
        args.extend_from_slice(extra);
        let r = helm(k, &args);
        assert!(r.ok, "helm install {name}: {}\n{}", r.stdout, r.stderr);
        release
    }

    fn uninstall(&self) {
        let _ = helm(
            &self.k,
            &["uninstall", &self.name, "-n", &self.namespace, "--wait"],
        );
    }

    /// Prints the operator's last `lines` log lines and, for each of
    /// `kinds`, the objects of that kind in `ns` as YAML (to stderr).
    pub fn dump(&self, lines: usize, ns: &str, kinds: &[&str]) {
        self.print_logs("agentplane-operator", lines);
        for kind in kinds {
            let r = self.k.run(&["-n", ns, "get", kind, "-o", "yaml"], None);
            eprintln!("{}{}", r.stdout, r.stderr);
        }
    }

    /// Prints the last `lines` log lines of the release's pods of `app`
    /// (`app.kubernetes.io/name`), each line prefixed with its pod.
    pub fn print_logs(&self, app: &str, lines: usize) {
        let tail = format!("--tail={lines}");
        let selector = format!("app.kubernetes.io/name={app}");
        let logs = self.k.run(
            &[
                "-n",
                &self.namespace,
                "logs",
                "-l",
                &selector,
                &tail,
                "--prefix",
            ],
            None,
        );
        eprintln!("{}{}", logs.stdout, logs.stderr);
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.uninstall();
    }
}
