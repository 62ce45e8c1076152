//! A bare HTTPS client for the API server, from the harness's admin
//! kubeconfig (certificates embedded, as `cluster.sh` writes it). For the
//! scale benchmark, where a `kubectl` process per request would cost more
//! than the control plane under test: thousands of creates, a watch read
//! as a stream, and the API server's `/metrics`.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use base64::Engine;
use reqwest::blocking::{Client, Response};
use serde_json::Value;

/// The API server as the admin kubeconfig reaches it.
#[derive(Debug, Clone)]
pub struct ApiServer {
    pub server: String,
    client: Client,
    ca_pem: Vec<u8>,
    identity_pem: Vec<u8>,
}

/// What a request came back with.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// The value of `key:` on the first line that carries it (kubeconfig
/// fields we need are scalars on one line).
fn field<'a>(text: &'a str, key: &str) -> Result<&'a str, String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
        .ok_or_else(|| format!("the kubeconfig has no {key}"))
}

fn decoded(text: &str, key: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(field(text, key)?)
        .map_err(|e| format!("the kubeconfig's {key} is not base64: {e}"))
}

impl ApiServer {
    /// From a kubeconfig file with `server`, `certificate-authority-data`,
    /// `client-certificate-data` and `client-key-data`.
    pub fn from_kubeconfig(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let server = field(&text, "server")?.trim_end_matches('/').to_owned();
        let ca_pem = decoded(&text, "certificate-authority-data")?;
        let mut identity_pem = decoded(&text, "client-certificate-data")?;
        identity_pem.extend_from_slice(b"\n");
        identity_pem.extend(decoded(&text, "client-key-data")?);
        let client = Self::build(&ca_pem, &identity_pem, Some(Duration::from_secs(60)))?;
        Ok(Self {
            server,
            client,
            ca_pem,
            identity_pem,
        })
    }

    fn build(ca: &[u8], identity: &[u8], timeout: Option<Duration>) -> Result<Client, String> {
        let ca = reqwest::Certificate::from_pem(ca).map_err(|e| format!("CA: {e}"))?;
        let id = reqwest::Identity::from_pem(identity).map_err(|e| format!("identity: {e}"))?;
        let mut b = Client::builder()
            .use_rustls_tls()
            .add_root_certificate(ca)
            .identity(id)
            .pool_max_idle_per_host(64);
        b = match timeout {
            Some(t) => b.timeout(t),
            None => b.timeout(None::<Duration>),
        };
        b.build().map_err(|e| format!("HTTP client: {e}"))
    }

    fn send(&self, req: reqwest::blocking::RequestBuilder) -> Reply {
        match req.send() {
            Ok(r) => {
                let status = r.status().as_u16();
                Reply {
                    status,
                    body: r.text().unwrap_or_default(),
                }
            }
            Err(e) => Reply {
                status: 0,
                body: e.to_string(),
            },
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        self.send(self.client.get(format!("{}{path}", self.server)))
    }

    pub fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(
            self.client
                .post(format!("{}{path}", self.server))
                .json(body),
        )
    }

    pub fn delete(&self, path: &str) -> Reply {
        self.send(self.client.delete(format!("{}{path}", self.server)))
    }

    /// A JSON merge patch.
    pub fn merge_patch(&self, path: &str, body: &Value) -> Reply {
        self.send(
            self.client
                .patch(format!("{}{path}", self.server))
                .header("Content-Type", "application/merge-patch+json")
                .body(body.to_string()),
        )
    }

    /// Every item of a list, page by page (`limit` per page).
    pub fn list_all(&self, path: &str, limit: usize) -> Result<Vec<Value>, String> {
        let mut items = Vec::new();
        let mut cont = String::new();
        let sep = if path.contains('?') { '&' } else { '?' };
        loop {
            let r = self.get(&format!("{path}{sep}limit={limit}&continue={cont}"));
            let v = r
                .json()
                .filter(|_| r.ok())
                .ok_or_else(|| format!("list {path}: {} {}", r.status, r.body))?;
            items.extend(v["items"].as_array().cloned().unwrap_or_default());
            match v["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => cont = c.to_owned(),
                _ => return Ok(items),
            }
        }
    }

    /// Opens a watch (`path` with `watch=1`) and hands every event to
    /// `on_event` until it returns false or the stream ends (the API
    /// server closes watches after a while: the caller reopens).
    pub fn watch(
        &self,
        path: &str,
        mut on_event: impl FnMut(&Value) -> bool,
    ) -> Result<(), String> {
        let client = Self::build(&self.ca_pem, &self.identity_pem, None)?;
        let resp: Response = client
            .get(format!("{}{path}", self.server))
            .send()
            .map_err(|e| format!("watch {path}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("watch {path}: {}", resp.status()));
        }
        for line in BufReader::new(resp).lines() {
            let line = line.map_err(|e| format!("watch {path}: {e}"))?;
            if line.is_empty() {
                continue;
            }
            let Ok(ev) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if !on_event(&ev) {
                break;
            }
        }
        Ok(())
    }

    /// The API server's /metrics text.
    pub fn metrics(&self) -> String {
        self.get("/metrics").body
    }
}

/// The sum of the samples of `metric` in a Prometheus text `exposition`
/// whose labels include every `key="value"` of `labels`.
pub fn metric_sum(exposition: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(metric)?;
            let (lbls, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels
                .iter()
                .all(|(k, v)| lbls.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn sums_the_samples_whose_labels_match() {
        let text = "# HELP x\nx_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"1\",b=\"3\"} 4\nx_total{a=\"2\"} 10\nx_totals 7\n";
        assert_eq!(metric_sum(text, "x_total", &[("a", "1")]), 7.0);
        assert_eq!(metric_sum(text, "x_total", &[]), 17.0);
        assert_eq!(metric_sum(text, "x_total", &[("b", "3")]), 4.0);
        assert_eq!(metric_sum(text, "y", &[]), 0.0);
    }
}
